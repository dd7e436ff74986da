"""Issue 37, item 4 (the core's side): the kinds of the hidden round, each as
precise tests against the plain Python loop.

The oracle is the loop itself -- ``for req in reqs: ... req.kv.kv_committed_len
...`` for the readers (the reference rule for ``layout=None``), and literally
``for req in reqs: req.kv.kv_allocated_len += d`` /
``req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, v)`` for the writers
-- run on a twin world built the same way: same answer or exception, same
final state, same Python-visible calls in the same order.  Every test runs
against the compiled build and the pure-Python twin (``kvest.reference``), and
the compiled one also through its other walks: runs (two or more requests of
one class), the backward walk (a whole list of ``_backward_walks``'s minimum),
the address-ordered walk (a shuffled selection via ``indices`` of
``_address_order``'s minimum); the minimums are lowered inside the tests and
restored.

Kinds:
1. a colliding instance-dict key (hashes like ``kv`` or a length's name, its
   ``__eq__`` runs Python code: answers True, or False with a side effect, or
   raises);
2. a property / ``__index__`` that shrinks the list in the middle of a walk;
3. partial writes on error (the plan's int32 ``out=`` buffers; the writers);
4. pure mode's judgement (refuse iff the loop would run the caller's code);
5. extra reads (the number and order of Python-visible reads);
6. process state (the collector) after all of the above, threads included.
"""

from __future__ import annotations

import gc
import operator
import random
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

import kvest
from kvest import reference

try:
    from kvest import _reqs as _compiled_reqs
except ImportError:  # the pure-Python build
    _compiled_reqs = None

IMPLS = [kvest, reference]
IMPL_IDS = ["compiled", "twin"]
OTHER = {kvest: reference, reference: kvest}
P, R = 16, 4
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------- the walks

class _Walks:
    """Lowers the compiled walks' thresholds for a test, and restores them."""

    def __init__(self, backward: int | None = None, address: int | None = None):
        self.backward, self.address = backward, address

    def __enter__(self):
        if _compiled_reqs is not None:
            self.saved = (_compiled_reqs._backward_walks()[1],
                          _compiled_reqs._address_order()[2])
            if self.backward is not None:
                _compiled_reqs._backward_walks(min_requests=self.backward)
            if self.address is not None:
                _compiled_reqs._address_order(min_requests=self.address)
        return self

    def __exit__(self, *exc):
        if _compiled_reqs is not None:
            _compiled_reqs._backward_walks(min_requests=self.saved[0])
            _compiled_reqs._address_order(min_requests=self.saved[1])


def _counters() -> tuple:
    if _compiled_reqs is None:
        return (0, 0, 0)
    done, _ = _compiled_reqs._backward_walks()
    walks, gave_up, _ = _compiled_reqs._address_order()
    return (done, walks, gave_up)


# "walk" parameters: how a batch is handed over, and which walk of the
# compiled build it is meant to reach.
#   one       a single request
#   run       plain requests of the class first, the odd one later (a run
#             breaks at it, or reads past it)
#   backward  a whole list, the backward walk's minimum lowered to 2
#   address   a shuffled selection (indices), the address-order minimum lowered
WALKS = ["one", "run", "backward", "address"]


def _walk_args(walk: str, n: int) -> tuple[list[int] | None, _Walks]:
    """(indices, threshold context) for a batch of n requests."""
    if walk == "address":
        order = list(range(n))
        random.Random(n).shuffle(order)
        return order, _Walks(address=2)
    if walk == "backward":
        return None, _Walks(backward=2)
    return None, _Walks()


def _padded(make: Callable[[int], Any], n: int, pad: Callable[[], Any]) -> list[Any]:
    """n objects from make(i), with 450 objects from pad() (the same class:
    the same allocator pool) made between each two, so that consecutive ones
    lie 32 KiB or more apart and a shuffled selection of them is read by the
    address-ordered walk."""
    out, padding = [], []
    for i in range(n):
        out.append(make(i))
        padding.append([pad() for _ in range(450)])
    out.append(padding)  # (kept alive by the caller's list until it is dropped)
    return out


# ------------------------------------------------------------ the plain loops

def _read_len(req: Any, attr: str, where: str) -> Any:
    """One length as the loop reads it (the reference rule for layout=None).

    Every read is ``getattr()``, never attribute syntax: CPython 3.11's
    specializing interpreter turns a warm ``req.kv`` into LOAD_ATTR_WITH_HINT,
    which reads the instance dict's entry at a remembered index when the key
    there is the name itself -- skipping a colliding key's ``__eq__`` exactly
    as kvest's dict-entry read does -- so the syntax's outcome depends on how
    often the line ran before.  ``getattr()`` is the lookup the language
    defines (and the one the issue names: "CPython's own lookup")."""
    if where == "flat":
        return getattr(req, attr)
    if where == "nested":
        return getattr(getattr(req, "kv"), attr)  # noqa: B009 (see above)
    try:
        return getattr(req, attr)
    except AttributeError:
        return getattr(getattr(req, "kv"), attr)  # noqa: B009 (see above)


_WHERE = {None: ("either", "either"), "flat": ("flat", "flat"),
          "mixed": ("flat", "nested"), "nested": ("nested", "nested")}


def _ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


def _selected(reqs: list[Any], indices: list[int] | None) -> list[Any]:
    return list(reqs) if indices is None else [reqs[i] for i in indices]


def loop_decode(reqs, p, indices=None, *, layout=None):
    at_c, _ = _WHERE[layout]
    count = 0
    for req in (reqs if indices is None else [reqs[i] for i in indices]):
        if operator.index(_read_len(req, "kv_committed_len", at_c)) % p == 0:
            count += 1
    return count * p


def loop_spec_v2(reqs, p, r, indices=None, *, layout=None):
    at_c, at_a = _WHERE[layout]
    total = 0
    for req in (reqs if indices is None else [reqs[i] for i in indices]):
        c = operator.index(_read_len(req, "kv_committed_len", at_c))
        a = operator.index(_read_len(req, "kv_allocated_len", at_a))
        total += _ceil_align(max(a, c + r), p) - _ceil_align(a, p)
    return total


def loop_plan(reqs, p, r, indices=None, *, layout=None):
    at_c, at_a = _WHERE[layout]
    cur, nxt = [], []
    for req in (reqs if indices is None else [reqs[i] for i in indices]):
        c = operator.index(_read_len(req, "kv_committed_len", at_c))
        a = operator.index(_read_len(req, "kv_allocated_len", at_a))
        cur.append(a)
        nxt.append(max(a, _ceil_align(c + r, p)))
    tokens = sum(x - y for x, y in zip(nxt, cur, strict=True))
    pages = sum(-(-x // p) - -(-y // p) for x, y in zip(nxt, cur, strict=True))
    return cur, nxt, tokens, pages


def loop_add(reqs, path, delta):
    names = path.split(".")
    for req in reqs:
        owner = req
        for name in names[:-1]:
            owner = getattr(owner, name)
        value = getattr(owner, names[-1])
        value += delta
        setattr(owner, names[-1], value)


def loop_max(reqs, path, values):
    names = path.split(".")

    def owner_of(req):
        for name in names[:-1]:
            req = getattr(req, name)
        return req

    for req, v in zip(reqs, values, strict=True):
        new = max(getattr(owner_of(req), names[-1]), v)
        setattr(owner_of(req), names[-1], new)


LOOPS = {
    "decode": (loop_decode, "decode_new_tokens_from_reqs", (P,)),
    "spec_v2": (loop_spec_v2, "spec_v2_new_tokens_from_reqs", (P, R)),
    "plan": (loop_plan, "decode_alloc_plan_from_reqs", (P, R)),
}


def _result(value: Any) -> Any:
    if isinstance(value, kvest.AllocPlan):
        return (value.cur.tolist(), value.nxt.tolist(), value.num_tokens, value.num_pages)
    return value


def run_loop(fn: str, reqs, indices=None, layout=None) -> tuple:
    loop, _, args = LOOPS[fn]
    try:
        return ("ok", loop(reqs, *args, indices, layout=layout))
    except Exception as exc:
        return ("raise", exc)


def run_impl(impl, fn: str, reqs, indices=None, layout=None, **kwargs) -> tuple:
    _, name, args = LOOPS[fn]
    try:
        return ("ok", _result(getattr(impl, name)(reqs, *args, indices, layout=layout,
                                                  **kwargs)))
    except Exception as exc:
        return ("raise", exc)


def same_as_loop(got: tuple, want: tuple) -> None:
    """The implementation's outcome against the loop's: the same value; or, where
    the loop raised the caller's own exception while reading, kvest's TypeError
    naming the request with that exception chained (the contract's rule for a
    read that fails); any other exception the same type."""
    if want[0] == "ok":
        assert got[0] == "ok", f"the loop answered {want[1]!r}, kvest raised {got[1]!r}"
        assert got[1] == want[1]
        return
    exc = want[1]
    assert got[0] == "raise", f"the loop raised {exc!r}, kvest answered {got[1]!r}"
    if isinstance(exc, (AttributeError, TypeError, ValueError, OverflowError, IndexError)):
        assert type(got[1]) is type(exc), (got[1], exc)
    else:  # the caller's own exception, from a read: TypeError, chained
        assert type(got[1]) is TypeError, got[1]
        assert isinstance(got[1].__cause__, type(exc)), (got[1], got[1].__cause__)


# ============================================================================
# 1. A colliding instance-dict key
# ============================================================================

class CollidingStr(str):
    """A str subclass that hashes like ``target`` and whose ``__eq__`` is Python
    code: it logs, then answers per its mode ("true", "false", "raise")."""

    def __new__(cls, target: str, log: list, chars: str | None = None):
        self = super().__new__(cls, target if chars is None else chars)
        self.target, self.log, self.mode = target, log, "false"
        return self

    def __hash__(self):
        return hash(self.target)

    def __eq__(self, other):
        self.log.append(("eq", self.target))
        if self.mode == "raise":
            raise RuntimeError("a colliding key's __eq__")
        return self.mode == "true"

    def __ne__(self, other):
        return not self.__eq__(other)


class CollidingObj:
    """Any object (not a str) that hashes like ``target``, ``__eq__`` as above."""

    def __init__(self, target: str, log: list, chars: str | None = None):
        self.target, self.log, self.mode = target, log, "false"

    def __hash__(self):
        return hash(self.target)

    def __eq__(self, other):
        self.log.append(("eq", self.target))
        if self.mode == "raise":
            raise RuntimeError("a colliding key's __eq__")
        return self.mode == "true"


KEYS = {"str": CollidingStr, "obj": CollidingObj}


_PADS: list = []


def _classes():
    """Fresh classes for one world (so that no memo or hint of another test's
    classes is in play; the tests learn their own hints first)."""

    class KV:
        __slots__ = ("kv_allocated_len", "kv_committed_len")

        def __init__(self, c, a):
            self.kv_committed_len, self.kv_allocated_len = c, a

        def state(self):
            return (self.kv_committed_len, self.kv_allocated_len)

    class Req:
        pass

    return KV, Req


def _collision_world(*, n: int, odd: list[int], target: str, key: str, mode: str,
                     padded: bool = False, flat: bool = True,
                     after: bool = False) -> tuple[list[Any], list, list]:
    """n requests of one class, each with req.kv and the flat lengths, each in
    its instance dict at the same positions (entry 1 onward: "rid" or the
    colliding key first).  Requests at `odd` hold the colliding key, inserted
    before `target` (so that it comes first in `target`'s probe sequence; with
    `after`, inserted after it: the lookup then finds the name first and never
    compares the key), under it other values: KV(33, 40) for "kv", 33 / 40 for
    a length (each gives another answer than the plain values).  A target
    "kv.<length>" puts the key in req.kv's own dict (req.kv then a plain
    dict-based object, its lengths in its dict after "tag" or the key).
    Returns (reqs, the log of __eq__ calls, the keys)."""
    KV, Req = _classes()
    inner = target.startswith("kv.")
    name = target[3:] if inner else target
    log: list = []
    keys = []

    class KVd:
        def state(self):
            return (self.kv_committed_len, self.kv_allocated_len)

    def kv_of(i, odd_one):
        c, a = 16 + (i % 3), 16 + 4 * (i % 5)
        if not inner:
            return KV(c, a)
        kv = KVd()
        d = kv.__dict__
        if odd_one and not after:
            k = KEYS[key](name, log)
            keys.append(k)
            d[k] = {"kv_committed_len": 33, "kv_allocated_len": 40}[name]
        else:
            d["tag"] = i
        d["kv_committed_len"], d["kv_allocated_len"] = c, a
        if odd_one and after:
            k = KEYS[key](name, log)
            keys.append(k)
            d[k] = {"kv_committed_len": 33, "kv_allocated_len": 40}[name]
        return kv

    def make(i):
        req = Req()
        d = req.__dict__
        late = None
        if i in odd and not inner:
            k = KEYS[key](target, log)
            keys.append(k)
            value = {"kv": KV(33, 40), "kv_committed_len": 33, "kv_allocated_len": 40}[target]
            if after:
                late = (k, value)
                d["rid"] = i
            else:
                d[k] = value
        else:
            d["rid"] = i
        d["kv"] = kv_of(i, i in odd)
        if flat:
            d["kv_committed_len"] = 16 + (i % 3)
            d["kv_allocated_len"] = 16 + 4 * (i % 5)
        if late is not None:
            d[late[0]] = late[1]
        return req

    if padded:
        reqs = _padded(make, n, Req)
        _PADS.append(reqs.pop())  # the padding outlives the world's use
        del _PADS[:-2]
    else:
        reqs = [make(i) for i in range(n)]
    for k in keys:
        k.mode = mode
    del log[:]  # the calls made while the dicts were built
    return reqs, log, keys


def _entries(obj: Any) -> Any:
    """What an object holds, read without any lookup (no key's __eq__ runs):
    a slots KV's two slots, a dict-based one's dict entries."""
    if hasattr(type(obj), "__slots__") and "kv_committed_len" in type(obj).__slots__:
        return (type(obj).kv_committed_len.__get__(obj), type(obj).kv_allocated_len.__get__(obj))
    if type(obj).__name__ == "KVd":
        return [(type(k).__name__, str(k) if isinstance(k, str) else "", v)
                for k, v in dict.items(object.__getattribute__(obj, "__dict__"))]
    return obj


def _state(reqs) -> list:
    """Every request's instance dict as it stands: keys (their kind) and values,
    read without lookups."""
    out = []
    for req in reqs:
        row = []
        for k, v in dict.items(object.__getattribute__(req, "__dict__")):
            row.append((type(k).__name__, str(k) if isinstance(k, str) else "", _entries(v)))
        out.append(row)
    return out


READ_FNS = ["decode", "spec_v2", "plan"]
COLLISIONS = [("kv", "nested"), ("kv", None), ("kv", "mixed"),
              ("kv_committed_len", None), ("kv_committed_len", "flat"),
              ("kv_allocated_len", "flat"), ("kv_allocated_len", None),
              ("kv.kv_committed_len", "nested"), ("kv.kv_allocated_len", "mixed")]


def _flat(target: str, layout) -> bool:
    """Whether the world's requests hold the flat lengths: not where the
    collision is on req.kv (or in it) and layout=None would then never read
    req.kv."""
    return not (target.startswith("kv") and not target.startswith("kv_") and layout is None)


def _batch(walk: str) -> tuple[int, list[int]]:
    """(batch size, the requests holding the colliding key) for a walk."""
    if walk == "one":
        return 1, [0]
    if walk == "run":
        return 6, [3, 4]  # three plain requests start a run; the key is on later ones
    return 12, [5, 9]


def _reader_cases(modes, keys) -> list:
    """(fn, target, layout, key, mode, walk) where the function reads the
    colliding name (decode reads no kv_allocated_len); the object key on one
    request only, and a raising __eq__ on one request and a run (the str key
    and the other modes cover the other walks)."""
    return [pytest.param(fn, target, layout, key, mode, walk,
                         id=f"{fn}-{target}-{layout}-{key}-{mode}-{walk}")
            for fn in READ_FNS for target, layout in COLLISIONS for key in keys
            for mode in modes for walk in WALKS
            if not (fn == "decode" and target.endswith("kv_allocated_len"))
            and not (key == "obj" and walk != "one")
            and not (mode == "raise" and walk in ("backward", "address"))]


@pytest.mark.parametrize(("fn", "target", "layout", "key", "mode", "walk"),
                         _reader_cases(["true", "false", "raise"], list(KEYS)))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_readers(impl, fn, target, layout, key, mode, walk):
    """The loop's lookup meets the colliding key first and calls its __eq__:
    "true" reads the value under it, "false" reads on (the call is a side
    effect), "raise" fails the read.  kvest: the same answer or exception, and
    the same __eq__ calls."""
    n, odd = _batch(walk)
    indices, walks = _walk_args(walk, n)

    def world():
        return _collision_world(n=n, odd=odd, target=target, key=key, mode=mode,
                                padded=walk == "address", flat=_flat(target, layout))

    with walks:
        # Hints learned first, on this world's classes, from plain requests
        # (the scheduler's steady state): a second call reads by them.
        reqs, log, keys = world()
        for k in keys:
            k.mode = "false"
        for _ in range(3):  # (and the twin's own Python lines warm)
            run_impl(impl, fn, reqs, indices, layout)
        for k in keys:
            k.mode = mode
        del log[:]
        got = run_impl(impl, fn, reqs, indices, layout)
        got_log = list(log)
        reqs2, log2, _ = _loop_world(world)
        want = run_loop(fn, reqs2, indices, layout)
    same_as_loop(got, want)
    assert got_log == log2, f"__eq__ calls: kvest {len(got_log)}, the loop {len(log2)}"


def _loop_world(world):
    reqs, log, keys = world()
    return reqs, log, keys


@pytest.mark.parametrize("walk", ["one", "run"])
@pytest.mark.parametrize("mode", ["true", "raise"])
@pytest.mark.parametrize(("target", "layout"), [("kv", "nested"), ("kv_committed_len", "flat"),
                                                ("kv.kv_allocated_len", "nested")])
@pytest.mark.parametrize("fn", READ_FNS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_after_the_name(impl, fn, target, layout, mode, walk):
    """The colliding key sits after the name in its probe sequence: CPython's
    lookup finds the name first (by identity) and never compares the key, so
    nothing of the caller's runs and the plain values are read.  kvest the
    same: no __eq__ call (none may be added by a fix that compares keys)."""
    n, odd = _batch(walk)
    reqs, log, keys = _collision_world(n=n, odd=odd, target=target, key="str", mode="false",
                                       after=True)
    for _ in range(2):
        run_impl(impl, fn, reqs, None, layout)
    for k in keys:
        k.mode = mode
    del log[:]
    got = run_impl(impl, fn, reqs, None, layout)
    got_log = list(log)
    reqs, log, _ = _collision_world(n=n, odd=odd, target=target, key="str", mode=mode,
                                    after=True)
    want = run_loop(fn, reqs, None, layout)
    same_as_loop(got, want)
    assert got_log == log == []


@pytest.mark.parametrize(("fn", "target", "layout", "key", "mode", "walk"),
                         _reader_cases(["true", "false"], ["str"]))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_pure_refuses(impl, fn, target, layout, key, mode, walk):
    """pure=True: the loop would run the key's __eq__ (its lookup compares it),
    so kvest must raise ImpureRequest naming that request, and run no __eq__."""
    n, odd = _batch(walk)
    indices, walks = _walk_args(walk, n)
    with walks:
        reqs, log, keys = _collision_world(n=n, odd=odd, target=target, key="str",
                                           mode="false", padded=walk == "address",
                                           flat=_flat(target, layout))
        for _ in range(3):
            run_impl(impl, fn, reqs, indices, layout)  # hints learned (non-pure)
        for k in keys:
            k.mode = mode
        del log[:]
        got = run_impl(impl, fn, reqs, indices, layout, pure=True)
    assert log == [], f"pure mode ran the caller's __eq__ {len(log)} times"
    first = min(odd) if indices is None else min(indices.index(i) for i in odd)
    pos = first if indices is None else indices[first]
    assert got[0] == "raise" and type(got[1]) is kvest.ImpureRequest, got
    assert str(got[1]).startswith(f"reqs[{pos}] cannot be read"), got[1]


WRITES = [("add", "kv.kv_allocated_len", "kv"), ("max", "kv.kv_allocated_len", "kv"),
          ("add", "kv_allocated_len", "kv_allocated_len"),
          ("max", "kv_allocated_len", "kv_allocated_len"),
          ("add", "kv.kv_allocated_len", "kv.kv_allocated_len"),
          ("max", "kv.kv_allocated_len", "kv.kv_allocated_len"),
          ("add", ("kv.kv_allocated_len", "kv.kv_committed_len"), "kv")]
WRITE_IDS = [f"{w}-{'+'.join(p) if isinstance(p, tuple) else p}-{t}" for w, p, t in WRITES]


def _write(impl_or_loop, how: str, reqs, path: str, n: int, **kwargs):
    values = [40 + i for i in range(n)]
    try:
        if impl_or_loop is None and isinstance(path, tuple):
            for req in reqs:
                for p in path:
                    loop_add([req], p, 1)
        elif impl_or_loop is None:
            (loop_add(reqs, path, 1) if how == "add" else loop_max(reqs, path, values))
        elif how == "add":
            impl_or_loop.add_to_attrs(reqs, path, 1, **kwargs)
        else:
            impl_or_loop.max_into_attr(reqs, path, values, **kwargs)
    except Exception as exc:
        return ("raise", type(exc), str(exc))
    return ("ok",)


@pytest.mark.parametrize("walk", ["one", "run"])
@pytest.mark.parametrize("mode", ["true", "false", "raise"])
@pytest.mark.parametrize("key", list(KEYS))
@pytest.mark.parametrize(("how", "path", "target"), WRITES, ids=WRITE_IDS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_writers(impl, how, path, target, key, mode, walk):
    """add_to_attrs / max_into_attr against the loop itself: the same objects
    written (the KV under the colliding key where its __eq__ says True), the
    same __eq__ calls, the same exception, the same state after it."""
    n, odd = _batch(walk)

    def world():
        return _collision_world(n=n, odd=odd, target=target, key=key, mode="false")

    for _ in range(3):
        reqs, log, keys = world()
        _write(impl, how, reqs, path, n)  # hints learned on plain keys' answers
    reqs, log, keys = world()
    for k in keys:
        k.mode = mode
    got = _write(impl, how, reqs, path, n)
    got_log = list(log)
    got_state = _state(reqs)

    reqs, log, keys = world()
    for k in keys:
        k.mode = mode
    want = _write(None, how, reqs, path, n)
    assert got == want
    assert got_state == _state(reqs)
    assert got_log == log, f"__eq__ calls: kvest {len(got_log)}, the loop {len(log)}"


@pytest.mark.parametrize("mode", ["true", "false"])
@pytest.mark.parametrize(("how", "path", "target"), WRITES, ids=WRITE_IDS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_writers_pure_refuse(impl, how, path, target, mode):
    """pure=True: ImpureRequest before any write, no __eq__ run, nothing changed."""
    n, odd = _batch("run")
    reqs, log, keys = _collision_world(n=n, odd=odd, target=target, key="str", mode="false")
    _write(impl, how, reqs, path, n)  # hints learned
    reqs, log, keys = _collision_world(n=n, odd=odd, target=target, key="str", mode="false")
    before = _state(reqs)
    for k in keys:
        k.mode = mode
    got = _write(impl, how, reqs, path, n, pure=True)
    assert log == [], f"pure mode ran the caller's __eq__ {len(log)} times"
    assert got[:2] == ("raise", kvest.ImpureRequest), got
    assert got[2].startswith(f"reqs[{odd[0]}] cannot be written"), got[2]
    for k in keys:
        k.mode = "false"
    assert _state(reqs) == before


# ============================================================================
# 3. Partial writes on error
# ============================================================================

def _plan_world(n: int, bad: int, what: str):
    KV, Req = _classes()
    # Routes and hints learned first on these classes (the steady state; the
    # compiled memo outlives a call): the quick reads, runs and the backward
    # walk then take the plain requests.
    warm = []
    for _ in range(2):
        req = Req()
        req.kv = KV(16, 16)
        warm.append(req)
    kvest.decode_alloc_plan_from_reqs(warm, P, R, layout="nested")
    reqs = []
    for _ in range(n):
        req = Req()
        req.kv = KV(16, 16)
        reqs.append(req)
    if what == "nxt":  # cur fits int32, nxt = ceil_align(C + R) does not
        reqs[bad].kv.kv_committed_len = INT32_MAX - 10
    elif what == "cur":  # cur (A) does not fit int32
        reqs[bad].kv.kv_allocated_len = INT32_MAX + 5
    elif bad == 0:  # "total": C + R past int64 at row 0
        reqs[0].kv.kv_committed_len = 2**63 - 2
    else:  # "total": the int64 total passes its limit at the second huge row
        reqs[0].kv.kv_committed_len = 2**62
        reqs[bad].kv.kv_committed_len = 2**62 + 2**61
    return reqs


def _loop_plan_buffers(reqs, indices, dtype, n):
    """What the loop leaves in the buffers: every row before the first that
    overflows (its buffer's dtype, or the int64 total), and nothing else."""
    limit = int(np.iinfo(dtype).max)
    cur, nxt = np.full(n, -7, dtype), np.full(n, -7, dtype)
    total = 0
    for j, req in enumerate(_selected(reqs, indices)):
        c, a = req.kv.kv_committed_len, req.kv.kv_allocated_len
        x = max(a, _ceil_align(c + R, P))
        total += x - a
        if c + R > 2**63 - 1 or a > limit or x > limit or total > 2**63 - 1:
            break
        cur[j], nxt[j] = a, x
    return cur.tolist(), nxt.tolist()


PLAN_WALKS = {
    # (layout, indices, thresholds): which walk of the compiled build
    "one-by-one": (None, None, _Walks),                    # layout=None: no runs
    "run": ("nested", None, _Walks),                       # runs, forward
    "backward": ("nested", None, lambda: _Walks(backward=2)),
    "indices": ("nested", [5, 4, 3, 2, 1, 0], _Walks),     # runs over selected rows
}


@pytest.mark.parametrize(("what", "dtype"), [("nxt", np.int32), ("cur", np.int32),
                                             ("total", np.int64)],
                         ids=["nxt-int32", "cur-int32", "total-int64"])
@pytest.mark.parametrize("bad", [0, 1, 4])
@pytest.mark.parametrize("walk", list(PLAN_WALKS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_plan_out_buffers_after_an_overflow(impl, walk, bad, what, dtype):
    """The plan raises OverflowError at the first row that overflows, and the
    out= buffers hold exactly the rows before it: never that row's cur (its
    nxt failed), never a row after it (a backward walk that gave up)."""
    n = 6
    layout, indices, ctx = PLAN_WALKS[walk]
    reqs = _plan_world(n, bad, what)
    cur, nxt = np.full(n, -7, dtype), np.full(n, -7, dtype)
    with ctx(), pytest.raises(OverflowError):
        impl.decode_alloc_plan_from_reqs(reqs, P, R, indices, out=(cur, nxt), layout=layout)
    assert (cur.tolist(), nxt.tolist()) == _loop_plan_buffers(reqs, indices, dtype, n)


@pytest.mark.parametrize("walk", ["run", "backward"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_plan_out_buffers_large_batch(impl, walk):
    """The same at the walks' real sizes (2,048 requests, untouched thresholds):
    an nxt overflow at row 1,500."""
    n, bad = 2048, 1500
    reqs = _plan_world(n, bad, "nxt")
    if walk == "run":
        reqs = [*reqs[:-1], reqs[-1]]
        KV2, Req2 = _classes()
        odd = Req2()
        odd.kv = KV2(16, 16)
        reqs[-1] = odd  # still the backward walk's size; forward if it gives up
    cur, nxt = np.full(n, -7, np.int32), np.full(n, -7, np.int32)
    with pytest.raises(OverflowError):
        impl.decode_alloc_plan_from_reqs(reqs, P, R, out=(cur, nxt), layout="nested")
    assert cur.tolist() == [16] * bad + [-7] * (n - bad)
    assert nxt.tolist() == [32] * bad + [-7] * (n - bad)


# ------------------------------------------------------- the walks are reached

@pytest.mark.skipif(_compiled_reqs is None or kvest.IMPLEMENTATION != "cython"
                    or not _compiled_reqs._DICT_ENTRIES,
                    reason="the walks: the compiled kernels reading dict entries directly")
@pytest.mark.parametrize("walk", ["backward", "address"])
def test_the_walks_named_here_are_taken(walk):
    """The "backward" and "address" parameters above reach those walks."""
    n, _ = _batch(walk)
    indices, walks = _walk_args(walk, n)
    reqs, _, _ = _collision_world(n=n, odd=[], target="kv", key="str", mode="false",
                                  padded=walk == "address")
    with walks:
        kvest.decode_new_tokens_from_reqs(reqs, P, indices, layout="nested")  # hints
        before = _counters()
        kvest.decode_new_tokens_from_reqs(reqs, P, indices, layout="nested")
        after = _counters()
    if walk == "backward":
        assert after[0] == before[0] + 1
    else:
        assert after[1] == before[1] + 1


# ============================================================================
# 6. Process state: the collector
# ============================================================================

def _slots_kv():
    class KV:
        __slots__ = ("kv_allocated_len", "kv_committed_len")

        def __init__(self, c, a):
            self.kv_committed_len, self.kv_allocated_len = c, a

    return KV


def _dropping_classes(on_del: Callable[[], None]) -> Callable[[], list]:
    """A maker of batches whose second and fourth requests' req.kv property
    replaces the request in the list: the walk's own reference is then the
    last, and releasing it runs __del__ -- the caller's code, which must run
    with the caller's collector state."""
    KV = _slots_kv()

    class Plain:
        def __init__(self):
            self.kv = KV(16, 20)

    class Dropped:
        def __init__(self, box, i):
            self.box, self.i, self._kv = box, i, KV(16, 20)

        @property
        def kv(self):
            self.box[0][self.i] = Plain()  # the list lets go of this request
            return self._kv

        def __del__(self):
            on_del()

    def make():
        box: list = [None]
        reqs = [Plain(), Dropped(box, 1), Plain(), Dropped(box, 3)]
        box[0] = reqs
        return reqs

    return make


def _dropping_world(impl, call: str, on_del: Callable[[], None]) -> list:
    """A batch as above, its classes' routes and hints learned first by a call
    on another batch of them (the steady state: the scheduler's classes are
    met every step)."""
    armed = [False]
    make = _dropping_classes(lambda: on_del() if armed[0] else None)
    DEL_CALLS[call](impl, make())
    armed[0] = True
    return make()


DEL_CALLS = {
    "decode": lambda impl, r: impl.decode_new_tokens_from_reqs(r, P, layout="nested"),
    "spec_v2": lambda impl, r: impl.spec_v2_new_tokens_from_reqs(r, P, R, layout="nested"),
    "spec_v2-either": lambda impl, r: impl.spec_v2_new_tokens_from_reqs(r, P, R),
    "spec_v2-indices": lambda impl, r: impl.spec_v2_new_tokens_from_reqs(
        r, P, R, [0, 1, 2, 3], layout="nested"),
    "plan": lambda impl, r: impl.decode_alloc_plan_from_reqs(r, P, R, layout="nested"),
    "plan-int32": lambda impl, r: impl.decode_alloc_plan_from_reqs(r, P, R, layout="nested",
                                                                    dtype=np.int32),
    "add": lambda impl, r: impl.add_to_attrs(r, "kv.kv_allocated_len", 1),
    "add-two": lambda impl, r: impl.add_to_attrs(
        r, ("kv.kv_allocated_len", "kv.kv_committed_len"), 1),
    "max": lambda impl, r: impl.max_into_attr(r, "kv.kv_allocated_len", [40] * len(r)),
}


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-on", "gc-off"])
@pytest.mark.parametrize("call", list(DEL_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_finalizer_of_a_dropped_request_sees_the_callers_collector(impl, call, enabled):
    """A request its own property drops from the list is released by the walk
    (its last reference): its __del__ is the caller's code, and runs with the
    caller's collector state -- never with the collections kvest holds off."""
    seen: list[bool] = []
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        reqs = _dropping_world(impl, call, lambda: seen.append(gc.isenabled()))
        DEL_CALLS[call](impl, reqs)
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [enabled, enabled], seen
    assert after is enabled


@pytest.mark.parametrize("call", list(DEL_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_another_threads_gc_disable_is_kept(impl, call):
    """Thread A's call releases a dropped request, whose __del__ lets thread B
    run (a sleep, as any Python code may switch threads); B calls
    gc.disable().  The process's last word on the collector is B's: after A's
    call it stays disabled, as it does after the plain loop."""
    in_del, b_done = threading.Event(), threading.Event()
    fired = []

    def on_del():
        if not fired:
            fired.append(1)
            in_del.set()
            while not b_done.is_set():
                time.sleep(0)

    def b():
        in_del.wait(5)
        gc.disable()
        b_done.set()

    was = gc.isenabled()
    gc.enable()
    try:
        thread = threading.Thread(target=b)
        thread.start()
        reqs = _dropping_world(impl, call, on_del)
        DEL_CALLS[call](impl, reqs)
        thread.join(5)
        after = gc.isenabled()
    finally:
        b_done.set()
        (gc.enable if was else gc.disable)()
    assert fired, "the finalizer did not run"
    assert after is False, "another thread's gc.disable() was undone"


def _switching_world(n: int, raise_at: int | None):
    """Requests whose properties switch threads (time.sleep(0)) and record
    the collector state they see; one may raise."""
    KV = _slots_kv()
    seen: list[bool] = []

    class Req:
        def __init__(self, i):
            self.i, self._kv = i, KV(16 + i % 3, 20)

        @property
        def kv(self):
            seen.append(gc.isenabled())
            time.sleep(0)
            if self.i == raise_at:
                raise RuntimeError("property")
            return self._kv

    return [Req(i) for i in range(n)], seen


@pytest.mark.parametrize("raise_at", [None, 5], ids=["answers", "raises"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_two_threads_leave_the_collector_as_it_was(impl, raise_at):
    """Two threads run every kernel over requests whose properties switch
    threads; one thread's kernels raise part-way.  Every property saw the
    collector on, and it is on afterwards."""
    calls = [c for c in DEL_CALLS.values()]
    errors: list[BaseException] = []
    seen_all: list[bool] = []

    def worker(raising):
        try:
            for _ in range(20):
                for call in calls:
                    reqs, seen = _switching_world(8, raise_at if raising else None)
                    try:
                        call(impl, reqs)
                    except (RuntimeError, TypeError):
                        if not raising:
                            raise
                    seen_all.extend(seen)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    was = gc.isenabled()
    gc.enable()
    try:
        threads = [threading.Thread(target=worker, args=(k == 1,)) for k in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert not errors, errors
    assert after is True
    assert seen_all and all(seen_all), f"{seen_all.count(False)} reads saw the collector off"


# ============================================================================
# 4. Pure mode's judgement
# ============================================================================
#
# pure=True must refuse (ImpureRequest) exactly where the loop would run code
# of the caller's, answer the loop's answer everywhere else, run nothing of the
# caller's either way, and the compiled build and the twin must say the same.

PURE_READS = {
    "decode": lambda impl, r, **kw: impl.decode_new_tokens_from_reqs(r, P, **kw),
    "spec_v2": lambda impl, r, **kw: impl.spec_v2_new_tokens_from_reqs(r, P, R, **kw),
    "plan": lambda impl, r, **kw: _result(impl.decode_alloc_plan_from_reqs(r, P, R, **kw)),
    "add": lambda impl, r, **kw: (impl.add_to_attrs(r, "kv.kv_allocated_len", 1, **kw),
                                  [x.kv.kv_allocated_len for x in r])[1],
    "max": lambda impl, r, **kw: (impl.max_into_attr(r, "kv.kv_allocated_len", [40] * len(r),
                                                     **kw),
                                  [x.kv.kv_allocated_len for x in r])[1],
}


def _outcome(call) -> tuple:
    try:
        return ("ok", call())
    except Exception as exc:
        return ("raise", type(exc), str(exc))


def _dict_property_classes(where: str):
    """A request class whose __dict__ is a property (in its own body, with or
    without a plain base class between it and object, or a base's); its
    instances still keep their attributes in the real instance dict, which
    generic getattr/setattr read and write without asking the property."""
    log: list = []

    class KV:
        def __init__(self, c, a):
            self.kv_committed_len, self.kv_allocated_len = c, a

    class Base:
        if where == "base":
            @property
            def __dict__(self):
                log.append("__dict__")
                return {}

    class Req(Base if where != "body-no-base" else object):
        if where in ("body", "body-no-base"):
            @property
            def __dict__(self):
                log.append("__dict__")
                return {}

        def __init__(self, c, a):
            self.kv = KV(c, a)

    return Req, log


@pytest.mark.parametrize("where", ["body", "body-no-base", "base"])
@pytest.mark.parametrize("fn", list(PURE_READS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_dict_property_class(impl, fn, where):
    """Generic getattr never asks a class's __dict__ property (it reads the
    instance dict at the type's dict offset): the loop runs no code of the
    caller's.  The twin cannot see that dict without the property, so pure
    mode refuses such a class (the safe answer: the drop-in then runs
    upstream's statement) -- in both builds alike, the property never called,
    nothing written; without pure mode, the loop's answer."""
    Req, log = _dict_property_classes(where)
    kw = {} if fn in ("add", "max") else {"layout": "nested"}
    want = _outcome(lambda: PURE_READS[fn](impl, [Req(16, 20), Req(17, 33)], **kw))
    del log[:]
    assert _outcome(lambda: PURE_READS[fn](impl, [Req(16, 20), Req(17, 33)], **kw)) == want
    log_plain = list(log)
    del log[:]
    got = _outcome(lambda: PURE_READS[fn](impl, [Req(16, 20), Req(17, 33)], pure=True, **kw))
    other = _outcome(lambda: PURE_READS[fn](OTHER[impl], [Req(16, 20), Req(17, 33)],
                                            pure=True, **kw))
    assert log == [] and log_plain == []
    assert got[:2] == other[:2], (got, other)
    assert got == want or got[:2] == ("raise", kvest.ImpureRequest), got


_PURE_LOG: list = []


def _log(event) -> None:
    if not _MUTED[0]:
        _PURE_LOG.append(event)


def _change_cases():
    """(name, make, change): make() -> (reqs, the kw a call takes); change(reqs)
    makes the next pure read need the caller's code (the loop would run it)."""

    def plain_classes():
        class KV:
            def __init__(self, c, a):
                self.kv_committed_len, self.kv_allocated_len = c, a

        class Req:
            def __init__(self, c, a):
                self.kv = KV(c, a)

        return KV, Req

    def getattr_hook(owner):
        def make():
            KV, Req = plain_classes()
            return [Req(16, 20), Req(17, 33)], (Req if owner == "req" else KV)

        def change(cls):
            def __getattr__(self, name):
                _log(("__getattr__", name))
                raise AttributeError(name)

            cls.__getattr__ = __getattr__
        return make, change

    def getattribute_hook():
        def make():
            _, Req = plain_classes()
            return [Req(16, 20), Req(17, 33)], Req

        def change(cls):
            def __getattribute__(self, name):
                _log(("__getattribute__", name))
                return object.__getattribute__(self, name)

            cls.__getattribute__ = __getattribute__
        return make, change

    def property_on_class():
        def make():
            KV, Req = plain_classes()
            return [Req(16, 20), Req(17, 33)], KV

        def change(cls):
            def prop(name):
                def get(self):
                    _log(("get", name))
                    return self.__dict__[name]

                def put(self, v):
                    _log(("set", name))
                    self.__dict__[name] = v

                return property(get, put)

            cls.kv_committed_len = prop("kv_committed_len")
            cls.kv_allocated_len = prop("kv_allocated_len")
        return make, change

    def class_assignment(what):
        def make():
            _, Req = plain_classes()
            reqs = [Req(16, 20), Req(17, 33)]
            return reqs, reqs

        def change(reqs):
            class Other:
                @property
                def kv(self):
                    _log("Other.kv")
                    return self.__dict__["kv"]

            class OtherKV:
                @property
                def kv_committed_len(self):
                    _log("OtherKV")
                    return self.__dict__["kv_committed_len"]

                @property
                def kv_allocated_len(self):
                    _log("OtherKV")
                    return self.__dict__["kv_allocated_len"]

            if what == "req":
                reqs[1].__class__ = Other
            else:
                reqs[1].kv.__class__ = OtherKV
        return make, change

    def base_swap():
        def make():
            class Base:
                pass

            class KV(Base):
                def __init__(self, c, a):
                    self.kv_committed_len, self.kv_allocated_len = c, a

            class Req:
                def __init__(self, c, a):
                    self.kv = KV(c, a)

            return [Req(16, 20), Req(17, 33)], KV

        def change(cls):
            class Hooked:
                def __getattr__(self, name):
                    _log(("__getattr__", name))
                    raise AttributeError(name)

                @property
                def kv_committed_len(self):
                    _log("base property")
                    return 1

            cls.__bases__ = (Hooked,)
        return make, change

    return {
        "getattr-added-to-req": getattr_hook("req"),
        "getattr-added-to-kv": getattr_hook("kv"),
        "getattribute-added": getattribute_hook(),
        "property-added-to-kv-class": property_on_class(),
        "req-class-assigned": class_assignment("req"),
        "kv-class-assigned": class_assignment("kv"),
        "kv-bases-swapped": base_swap(),
    }


CHANGES = _change_cases()


# The calls of the pure-mode judgement tests: (kvest's call, the loop), each
# given the requests and the layout; the writers' state is read afterwards
# with the log muted.
_MUTED = [False]

_JUDGED = {
    "decode": (lambda t, r, lay, **kw: t.decode_new_tokens_from_reqs(r, P, layout=lay, **kw),
               lambda r, lay: loop_decode(r, P, layout=lay)),
    "spec_v2": (lambda t, r, lay, **kw: t.spec_v2_new_tokens_from_reqs(r, P, R, layout=lay,
                                                                       **kw),
                lambda r, lay: loop_spec_v2(r, P, R, layout=lay)),
    "plan": (lambda t, r, lay, **kw: _result(t.decode_alloc_plan_from_reqs(r, P, R, layout=lay,
                                                                           **kw)),
             lambda r, lay: loop_plan(r, P, R, layout=lay)),
    "add": (lambda t, r, lay, **kw: t.add_to_attrs(r, "kv.kv_allocated_len", 1, **kw),
            lambda r, lay: loop_add(r, "kv.kv_allocated_len", 1)),
    "max": (lambda t, r, lay, **kw: t.max_into_attr(r, "kv.kv_allocated_len", [40] * len(r),
                                                    **kw),
            lambda r, lay: loop_max(r, "kv.kv_allocated_len", [40] * len(r))),
}


def _judged_state(reqs) -> list:
    _MUTED[0] = True
    try:
        # getattr(): never the specialized attribute syntax (see _read_len)
        return [(getattr(getattr(r, "kv"), "kv_committed_len"),  # noqa: B009
                 getattr(getattr(r, "kv"), "kv_allocated_len")) for r in reqs]  # noqa: B009
    finally:
        _MUTED[0] = False


@pytest.mark.parametrize(("fn", "layout"), [(fn, lay) for fn in _JUDGED
                                            for lay in (("nested", None)
                                                        if fn in ("decode", "spec_v2", "plan")
                                                        else ("nested",))])
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_after_a_change_between_calls(impl, change, fn, layout):
    """A first pure call answers (the compiled build keeps what it worked
    out); then the class, the request's class or req.kv's class changes.
    pure=True must refuse (ImpureRequest naming the request) exactly where the
    loop now runs code of the caller's, and otherwise answer what the loop
    answers (a __getattr__ runs only for a name generic getattr does not find:
    with layout="nested" every name is found, with layout=None the flat names
    are not); it runs nothing of the caller's either way; both builds alike."""
    make, mutate = CHANGES[change]
    mine, loop = _JUDGED[fn]
    assigned = change.endswith("assigned")

    def world():
        reqs, target = make()
        first = _outcome(lambda: mine(impl, reqs, layout, pure=True))
        assert first[0] == "ok", first  # (and what was worked out is kept)
        mutate(reqs if assigned else target)
        return reqs

    # What the loop does on a world changed the same way.
    del _PURE_LOG[:]
    reqs = world()
    want = _outcome(lambda: loop(reqs, layout))
    loop_ran = bool(_PURE_LOG)
    want_state = _judged_state(reqs)

    reqs = world()
    del _PURE_LOG[:]
    got = _outcome(lambda: mine(impl, reqs, layout, pure=True))
    assert _PURE_LOG == [], f"pure mode ran the caller's code: {_PURE_LOG}"
    if loop_ran:
        assert got[:2] == ("raise", kvest.ImpureRequest), got
        assert got[2].startswith(f"reqs[{1 if assigned else 0}] cannot be"), got[2]
    else:
        # The loop runs no code here.  Pure mode answers the loop's answer, or
        # refuses where it cannot tell so (a __getattr__ on the class, bases
        # changed under req.kv: the safe answer, nothing written) -- in both
        # builds alike.
        reqs_other = world()
        other = _outcome(lambda: mine(OTHER[impl], reqs_other, layout, pure=True))
        assert got[:2] == other[:2], (got, other)
        if got[0] == "ok":
            assert want[0] == "ok", (got, want)
            if fn in ("decode", "spec_v2", "plan"):
                assert got[1] == want[1]
            assert _judged_state(reqs) == want_state
        else:
            assert got[:2] == ("raise", kvest.ImpureRequest), got
            assert _judged_state(reqs) == _judged_state(world())


@pytest.mark.parametrize("fn", list(PURE_READS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_slots_with_dict(impl, fn):
    """__slots__ naming "kv" and "__dict__", the lengths in req.kv's slots or
    dict: the loop runs no code; pure answers the loop's answer."""
    class KV:
        __slots__ = ("__dict__", "kv_committed_len")

        def __init__(self, c, a):
            self.kv_committed_len = c
            self.kv_allocated_len = a  # in the instance dict

    class Req:
        __slots__ = ("__dict__", "kv")

        def __init__(self, c, a):
            self.kv = KV(c, a)

    kw = {} if fn in ("add", "max") else {"layout": "nested"}
    want = _outcome(lambda: PURE_READS[fn](impl, [Req(16, 20), Req(17, 33)], **kw))
    got = _outcome(lambda: PURE_READS[fn](impl, [Req(16, 20), Req(17, 33)], pure=True, **kw))
    assert got == want


# ============================================================================
# 2. The list shrinks in the middle of a walk
# ============================================================================
#
# The loop is ``for req in reqs`` (a list iterator reads the size at every
# step), and with indices ``[reqs[i] for i in indices]`` (the contract's
# words: the selection is made before any request is read).  The plan, sized
# before its first row, raises IndexError when the list shrinks below that
# size (docs/contract.md, "The container").

SHRINKS = ["tail", "head", "all", "swap"]


def _shrinking_world(n: int, k: int, source: str, how: str, log: list):
    """n requests (nested layout, slots KV) of one class, plain but for
    request k, whose read of `source` changes the list once:
      tail  del reqs[k + 1:]        head  del reqs[:2]
      all   del reqs[:]             swap  reqs[:] = reqs[2:] + two new ones
    `source`: "property" (req.kv on k's own class), "kv-class" (a property on
    its req.kv's class), "index" (its kv_committed_len's __index__),
    "collider" (a key of its dict that hashes like "kv", __eq__ False)."""
    KV = _slots_kv()
    box: list = [None]
    done = [False]

    def change():
        if done[0]:
            return
        done[0] = True
        log.append(("shrink", k))
        reqs = box[0]
        if how == "tail":
            del reqs[k + 1:]
        elif how == "head":
            del reqs[:2]
        elif how == "all":
            del reqs[:]
        else:
            reqs[:] = reqs[2:] + [Req(i) for i in (100, 101)]

    class PropKV:
        def __init__(self, c, a):
            self._c, self.kv_allocated_len = c, a

        @property
        def kv_committed_len(self):
            change()
            return self._c

    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            change()
            return self.v

    class Req:
        def __init__(self, i):
            self.rid = i
            self.kv = KV(16 * (i % 2), 16 + i)

    class PropReq(Req):
        @property
        def kv(self):
            change()
            return self.__dict__["_kv"]

        @kv.setter
        def kv(self, value):
            self.__dict__["_kv"] = value

    class Eq(CollidingStr):
        __hash__ = CollidingStr.__hash__

        def __eq__(self, other):
            if self.mode == "on":
                change()
            return False

    reqs = [Req(i) for i in range(n)]
    if source == "property":
        reqs[k] = PropReq(k)
    elif source == "kv-class":
        reqs[k].kv = PropKV(16, 20)
    elif source == "index":
        reqs[k].kv.kv_committed_len = Index(16)
    else:
        req = Req.__new__(Req)
        key = Eq("kv", [])
        req.__dict__[key] = None
        req.kv, req.rid = KV(16, 20), k  # "kv" second, as in the plain requests
        key.mode = "on"
        reqs[k] = req
    box[0] = reqs
    return reqs


SHRINK_FNS = {
    "decode": lambda impl, r, idx: impl.decode_new_tokens_from_reqs(r, P, idx, layout="nested"),
    "spec_v2": lambda impl, r, idx: impl.spec_v2_new_tokens_from_reqs(r, P, R, idx,
                                                                      layout="nested"),
    "plan": lambda impl, r, idx: _result(impl.decode_alloc_plan_from_reqs(r, P, R, idx,
                                                                          layout="nested")),
    "plan-out32": lambda impl, r, idx: _result(impl.decode_alloc_plan_from_reqs(
        r, P, R, idx, layout="nested",
        out=(np.full(len(r) if idx is None else len(idx), -7, np.int32),
             np.full(len(r) if idx is None else len(idx), -7, np.int32)))),
}


def _loop_iterating(fn: str, reqs: list, indices):
    """The loop over the list as a for loop (or the selection) reads it; the
    plan's rows as lists.  ("ok", value) or ("raise", exc); for the plan also
    how many rows the loop read (the plan must raise its shrink error where
    that is fewer than the size it was made for)."""
    m = len(reqs) if indices is None else len(indices)
    sel = reqs if indices is None else [reqs[i] for i in indices]
    name = "plan" if fn.startswith("plan") else fn
    try:
        value = LOOPS[name][0](sel, *LOOPS[name][2], None, layout="nested")
    except Exception as exc:
        return ("raise", exc), None
    return ("ok", value), (m, len(value[0]) if name == "plan" else None)


@pytest.mark.parametrize("walk", ["list", "backward"])
@pytest.mark.parametrize("how", SHRINKS)
@pytest.mark.parametrize("source", ["property", "kv-class", "index", "collider"])
@pytest.mark.parametrize("k", [1, 37])
@pytest.mark.parametrize("fn", list(SHRINK_FNS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_list_shrinks_mid_walk(impl, fn, k, source, how, walk):
    """The same requests read as the for loop reads them: the count or sum of
    exactly those (never one past the end, no exception the loop does not
    raise), and for the plan its shrink error naming the rows the loop read."""
    n = 40
    ctx = _Walks(backward=2) if walk == "backward" else _Walks()

    def world(log):
        reqs = _shrinking_world(n, k, source, how, log)
        if walk == "run-at-1":  # a request of another class first: runs start at row 1
            KV = _slots_kv()

            class Other:
                def __init__(self):
                    self.kv = KV(16, 16)

            reqs[0] = Other() if k != 0 else reqs[0]
        return reqs

    with ctx:
        warm = world([])
        for _ in range(2):  # routes and hints learned on this world's classes
            _outcome(lambda: SHRINK_FNS[fn](impl, warm, None))
        got_log: list = []
        got = _outcome(lambda: SHRINK_FNS[fn](impl, world(got_log), None))
    want_log: list = []
    want, rows = _loop_iterating(fn, world(want_log), None)
    assert got_log == want_log
    if fn.startswith("plan") and want[0] == "ok" and rows[1] < rows[0]:
        assert got[:2] == ("raise", IndexError), got
        assert got[2] == (f"reqs shrank while the plan sized for its {rows[0]} rows was "
                          f"filled: {rows[1]} rows were read"), got
        return
    same_as_loop(("ok", got[1]) if got[0] == "ok" else ("raise", got[1](got[2])), want)


@pytest.mark.parametrize("how", SHRINKS)
@pytest.mark.parametrize("source", ["property", "index"])
@pytest.mark.parametrize("fn", list(SHRINK_FNS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_list_shrinks_mid_walk_with_indices(impl, fn, source, how):
    """With indices the loop is ``[reqs[i] for i in indices]`` (README and
    contract: "selects requests as [reqs[i] for i in indices] would"): the
    selection is made before any request is read, so a request's property
    that shrinks or shifts the list changes nothing of what is read.  (NOTE:
    tests/test_hostile.py::test_list_shrunk_by_a_property_during_a_call_with_indices
    pins the opposite -- a TypeError -- today: one of the two must go.)"""
    n, k = 40, 5
    indices = list(range(n))
    random.Random(7).shuffle(indices)
    indices.remove(k)
    indices.insert(3, k)  # request k read fourth
    got = _outcome(lambda: SHRINK_FNS[fn](impl, _shrinking_world(n, k, source, how, []),
                                          indices))
    want, _ = _loop_iterating(fn, _shrinking_world(n, k, source, how, []), indices)
    same_as_loop(("ok", got[1]) if got[0] == "ok" else ("raise", got[1](got[2])), want)


# ============================================================================
# 5. Extra reads: the number and order of Python-visible reads
# ============================================================================

def _read_world(log: list, *, fail_first: int = 0, fresh: bool = True, flat: bool = False):
    """Two requests whose every Python-visible access logs itself: req.kv a
    property (a fresh KV object each read, or the same one), the lengths
    properties of KV (getter and setter), optionally flat properties too.
    Request 0's req.kv raises RuntimeError on its first `fail_first` reads."""

    class KV:
        __slots__ = ("a", "c", "tag")

        def __init__(self, c, a, tag):
            self.c, self.a, self.tag = c, a, tag

        @property
        def kv_committed_len(self):
            log.append(("get C", self.tag))
            return self.c

        @kv_committed_len.setter
        def kv_committed_len(self, v):
            log.append(("set C", self.tag, v))
            self.c = v

        @property
        def kv_allocated_len(self):
            log.append(("get A", self.tag))
            return self.a

        @kv_allocated_len.setter
        def kv_allocated_len(self, v):
            log.append(("set A", self.tag, v))
            self.a = v

    class Req:
        def __init__(self, i, c, a, fail):
            self.i, self.fail, self.count = i, fail, 0
            self._kv = KV(c, a, (i, 0))

        @property
        def kv(self):
            self.count += 1
            log.append(("kv", self.i))
            if self.fail:
                self.fail -= 1
                raise RuntimeError("req.kv failed once")
            if fresh:
                kv = KV(self._kv.c, self._kv.a, (self.i, self.count))
                self._kv = kv  # what is written through it is kept
                return kv
            return self._kv

    if flat:
        def flat_prop(name, attr):
            def get(self):
                log.append((f"get flat {name}", self.i))
                return getattr(self._kv, attr)

            return property(get)

        Req.kv_committed_len = flat_prop("C", "c")
        Req.kv_allocated_len = flat_prop("A", "a")

    return [Req(0, 16, 20, fail_first), Req(1, 33, 36, 0)]


READ_CALLS = {
    f"{fn}-{layout}": (fn, layout)
    for fn in ("decode", "spec_v2", "plan") for layout in (None, "nested", "mixed", "flat")
}


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-kv", "same-kv"])
@pytest.mark.parametrize("fail_first", [0, 1, 2], ids=["no-fail", "fails-once", "fails-twice"])
@pytest.mark.parametrize(("call", "flat"), [
    pytest.param(call, flat, id=f"{call}-{'flat-too' if flat else 'nested-only'}")
    for call in READ_CALLS for flat in (False, True)
    if flat or READ_CALLS[call][1] in (None, "nested")])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_reader_reads_as_the_loop(impl, call, flat, fail_first, fresh):
    """Every Python-visible read the loop makes, in its order, and no other:
    req.kv once per length read (it is the caller's property: reading it
    again may give another object, or fail), the length once.  A property
    that fails once fails the call (TypeError naming the read, the
    RuntimeError chained), as the loop fails -- never read again to succeed."""
    fn, layout = READ_CALLS[call]
    got_log: list = []
    got = run_impl(impl, fn, _read_world(got_log, fail_first=fail_first, fresh=fresh,
                                         flat=flat), None, layout)
    want_log: list = []
    want = run_loop(fn, _read_world(want_log, fail_first=fail_first, fresh=fresh, flat=flat),
                    None, layout)
    same_as_loop(got, want)
    assert got_log == want_log


WRITE_CALLS = {
    "add": lambda t, reqs: t.add_to_attrs(reqs, "kv.kv_allocated_len", 1)
    if t is not None else loop_add(reqs, "kv.kv_allocated_len", 1),
    "add-two-paths": lambda t, reqs: t.add_to_attrs(
        reqs, ("kv.kv_allocated_len", "kv.kv_committed_len"), 1)
    if t is not None else [loop_add([r], p, 1) for r in reqs
                           for p in ("kv.kv_allocated_len", "kv.kv_committed_len")],
    "max-grows": lambda t, reqs: t.max_into_attr(reqs, "kv.kv_allocated_len", [40, 41])
    if t is not None else loop_max(reqs, "kv.kv_allocated_len", [40, 41]),
    "max-keeps": lambda t, reqs: t.max_into_attr(reqs, "kv.kv_allocated_len", [1, 2])
    if t is not None else loop_max(reqs, "kv.kv_allocated_len", [1, 2]),
    "max-ties": lambda t, reqs: t.max_into_attr(reqs, "kv.kv_allocated_len", [20, 36])
    if t is not None else loop_max(reqs, "kv.kv_allocated_len", [20, 36]),
}


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-kv", "same-kv"])
@pytest.mark.parametrize("fail_first", [0, 1, 2], ids=["no-fail", "fails-once", "fails-twice"])
@pytest.mark.parametrize("call", list(WRITE_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_writer_reads_as_the_loop(impl, call, fail_first, fresh):
    """The writers' statements read and write what the loop's do, in its
    order: ``req.kv`` once per ``+=`` and twice per ``max`` statement (the
    right side, then the store's target), the length once, the store once;
    the same exception, the same objects written before it."""
    got_log: list = []
    reqs = _read_world(got_log, fail_first=fail_first, fresh=fresh)
    got = _outcome(lambda: WRITE_CALLS[call](impl, reqs))
    got_state = [(r._kv.c, r._kv.a) for r in reqs]
    want_log: list = []
    reqs = _read_world(want_log, fail_first=fail_first, fresh=fresh)
    want = _outcome(lambda: WRITE_CALLS[call](None, reqs))
    assert (got[0], got[1:2]) == (want[0], want[1:2]) if want[0] == "raise" else got[0] == "ok"
    assert got_state == [(r._kv.c, r._kv.a) for r in reqs]
    assert got_log == want_log


class _LoggedInt(int):
    """An int subclass whose comparisons and additions log themselves."""

    log: ClassVar[list] = []

    def __gt__(self, other):
        _LoggedInt.log.append(("gt", int(self), int(other)))
        return int(self) > int(other)

    def __lt__(self, other):
        _LoggedInt.log.append(("lt", int(self), int(other)))
        return int(self) < int(other)

    def __add__(self, other):
        _LoggedInt.log.append(("add", int(self), int(other)))
        return _LoggedInt(int(self) + int(other))

    __radd__ = __add__

    def __index__(self):
        _LoggedInt.log.append(("index", int(self)))
        return int(self)


@pytest.mark.parametrize("where", ["values", "lengths"])
@pytest.mark.parametrize("call", ["add", "max-grows", "max-keeps", "max-ties"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_writer_operators_as_the_loop(impl, call, where):
    """Values and lengths whose operators log: the loop's max calls v > cur
    once, += calls __add__/__radd__ once; the writers the same, in order."""
    def world():
        KV = _slots_kv()

        class Req:
            def __init__(self, c, a):
                self.kv = KV(c, a)

        cast = _LoggedInt if where == "lengths" else int
        return [Req(cast(16), cast(20)), Req(cast(33), cast(36))]

    def values(vs):
        return [(_LoggedInt(v) if where == "values" else v) for v in vs]

    calls = {
        "add": (lambda t, r: t.add_to_attrs(r, "kv.kv_allocated_len", values([1])[0]),
                lambda r: loop_add(r, "kv.kv_allocated_len", values([1])[0])),
        "max-grows": (lambda t, r: t.max_into_attr(r, "kv.kv_allocated_len", values([40, 41])),
                      lambda r: loop_max(r, "kv.kv_allocated_len", values([40, 41]))),
        "max-keeps": (lambda t, r: t.max_into_attr(r, "kv.kv_allocated_len", values([1, 2])),
                      lambda r: loop_max(r, "kv.kv_allocated_len", values([1, 2]))),
        "max-ties": (lambda t, r: t.max_into_attr(r, "kv.kv_allocated_len", values([20, 36])),
                     lambda r: loop_max(r, "kv.kv_allocated_len", values([20, 36]))),
    }
    mine, loop = calls[call]
    _LoggedInt.log = []
    reqs = world()
    mine(impl, reqs)
    got = (list(_LoggedInt.log), [(type(r.kv.kv_allocated_len), r.kv.kv_allocated_len)
                                  for r in reqs])
    _LoggedInt.log = []
    reqs = world()
    loop(reqs)
    want = (list(_LoggedInt.log), [(type(r.kv.kv_allocated_len), r.kv.kv_allocated_len)
                                   for r in reqs])
    assert got == want


# ------------------------------------------ kind 1 at the walks' real sizes

@pytest.mark.parametrize("mode", ["true", "false"])
@pytest.mark.parametrize("walk", ["backward", "address"])
@pytest.mark.parametrize("fn", READ_FNS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_at_2048(impl, fn, walk, mode):
    """2,048 requests, the thresholds untouched (a whole list: the backward
    walk; a shuffled selection of all of them: the address-ordered walk),
    colliding "kv" keys on requests 1,500 and 1,501."""
    n, odd = 2048, [1500, 1501]
    if fn == "plan" and walk == "address":
        pytest.skip("the plan is never read in address order")
    indices = None
    if walk == "address":
        indices = list(range(n))
        random.Random(3).shuffle(indices)
    reqs, log, keys = _collision_world(n=n, odd=odd, target="kv", key="str", mode="false")
    for k in keys:
        k.mode = "false"
    run_impl(impl, fn, reqs, indices, "nested")  # hints learned
    for k in keys:
        k.mode = mode
    del log[:]
    got = run_impl(impl, fn, reqs, indices, "nested")
    got_log = list(log)
    reqs, log, _ = _collision_world(n=n, odd=odd, target="kv", key="str", mode=mode)
    want = run_loop(fn, reqs, indices, "nested")
    same_as_loop(got, want)
    assert got_log == log


# ============================================================================
# 3. (writers) The same requests written before an exception as the loop
# ============================================================================

def _failing_write_world(n: int, bad: int, how: str):
    """n requests of one class (req.kv a slots KV, as SGLang 0.5.19+), all
    plain (the quick paths take them) but request `bad`, which fails its
    statement: its req.kv missing ("missing"), a property that raises
    ("property"), a length whose + raises ("operator"), a value of another
    type (max: a str, "type")."""
    KV = _slots_kv()

    class Req:
        def __init__(self, c, a):
            self.kv = KV(c, a)

    class Failing(Req):
        @property
        def kv(self):
            raise RuntimeError("req.kv")

        @kv.setter
        def kv(self, value):
            self.__dict__["_kv"] = value

    class BadInt(int):
        def __add__(self, other):
            raise RuntimeError("+")

        __radd__ = __add__

        def __gt__(self, other):
            raise RuntimeError(">")

        __lt__ = __gt__

    reqs = [Req(16 + i, 20 + i) for i in range(n)]
    if how == "missing":
        del reqs[bad].kv
    elif how == "property":
        reqs[bad] = Failing(1, 1)
    elif how == "operator":
        reqs[bad].kv.kv_allocated_len = BadInt(5)
    return reqs


@pytest.mark.parametrize("how", ["missing", "property", "operator", "type", "strict"])
@pytest.mark.parametrize("bad", [0, 3, 70])
@pytest.mark.parametrize("writer", ["add", "add-two-paths", "max"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_writers_leave_what_the_loop_leaves(impl, writer, bad, how):
    """An exception at request `bad` (after a run of plain requests the quick
    path writes): the same exception, the requests before it written, the one
    at it as far as its statement got, none after."""
    n = 80
    if writer.startswith("add") and how in ("type", "strict"):
        pytest.skip("max only")

    def values():
        vs = [30 + i for i in range(n)]
        if how == "type":
            vs[bad] = "a str"
        if how == "strict":
            vs = vs[:bad]
        return vs

    def call(target, reqs):
        if writer == "add":
            return (target.add_to_attrs(reqs, "kv.kv_allocated_len", 7) if target
                    else loop_add(reqs, "kv.kv_allocated_len", 7))
        if writer == "add-two-paths":
            paths = ("kv.kv_allocated_len", "kv.kv_committed_len")
            if target:
                return target.add_to_attrs(reqs, paths, 7)
            for req in reqs:
                for p in paths:
                    loop_add([req], p, 7)
            return None
        return (target.max_into_attr(reqs, "kv.kv_allocated_len", values()) if target
                else loop_max(reqs, "kv.kv_allocated_len", values()))

    def state(reqs):
        out = []
        for r in reqs:
            kv = r.__dict__.get("kv", r.__dict__.get("_kv"))
            out.append(None if kv is None else (kv.kv_committed_len, kv.kv_allocated_len))
        return out

    reqs = _failing_write_world(n, bad, how)
    _outcome(lambda: call(impl, _failing_write_world(n, bad, how)))  # routes learned
    got = _outcome(lambda: call(impl, reqs))
    got_state = state(reqs)
    reqs = _failing_write_world(n, bad, how)
    want = _outcome(lambda: call(None, reqs))
    assert got[:2] == want[:2], (got, want)
    assert got_state == state(reqs)


# ------------------------------------- kind 1 in the class dict (type lookup)

def _class_collision_world(target: str, mode: str, n: int = 3):
    """Requests of a class whose own dict (its namespace, copied by type())
    holds a key hashing like `target` with a Python __eq__; the instance dicts
    hold the values, put there without any type lookup (so that the type's
    method cache knows nothing of the name yet)."""
    log: list = []
    key = CollidingStr(target, log)
    KV = _slots_kv()
    Req = type("Req", (), {key: KV(33, 40) if target == "kv" else 33})
    reqs = []
    for i in range(n):
        req = Req.__new__(Req)
        d = object.__getattribute__(req, "__dict__")
        d["kv"] = KV(16 + i, 20)
        d["kv_committed_len"], d["kv_allocated_len"] = 16 + i, 20
        reqs.append(req)
    key.mode = mode
    return reqs, log


CLASS_CALLS = {
    "decode": (lambda t, r, lay, **kw: t.decode_new_tokens_from_reqs(r, P, layout=lay, **kw),
               lambda r, lay: loop_decode(r, P, layout=lay)),
    "spec_v2": (lambda t, r, lay, **kw: t.spec_v2_new_tokens_from_reqs(r, P, R, layout=lay,
                                                                       **kw),
                lambda r, lay: loop_spec_v2(r, P, R, layout=lay)),
    "plan": (lambda t, r, lay, **kw: _result(t.decode_alloc_plan_from_reqs(r, P, R, layout=lay,
                                                                           **kw)),
             lambda r, lay: loop_plan(r, P, R, layout=lay)),
    "add": (lambda t, r, lay, **kw: t.add_to_attrs(
        r, "kv.kv_allocated_len" if lay == "nested" else "kv_allocated_len", 1, **kw),
        lambda r, lay: loop_add(r, "kv.kv_allocated_len" if lay == "nested"
                                else "kv_allocated_len", 1)),
    "max": (lambda t, r, lay, **kw: t.max_into_attr(
        r, "kv.kv_allocated_len" if lay == "nested" else "kv_allocated_len", [30] * len(r),
        **kw),
        lambda r, lay: loop_max(r, "kv.kv_allocated_len" if lay == "nested"
                                else "kv_allocated_len", [30] * len(r))),
}


@pytest.mark.parametrize(("target", "layout"), [("kv", "nested"), ("kv_committed_len", "flat"),
                                                ("kv_allocated_len", "flat")])
@pytest.mark.parametrize("call", list(CLASS_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_in_the_class_dict_raising(impl, call, target, layout):
    """The class's own dict holds a key hashing like the name whose __eq__
    raises.  CPython's type lookup (_PyType_Lookup) swallows the error, finds
    nothing and caches nothing, so every getattr/setattr of the name runs that
    __eq__ again.  kvest: the loop's answer and the same number of __eq__
    calls (a route memoized past the first lookup skips the later ones)."""
    if call == "decode" and target == "kv_allocated_len":
        return
    mine, loop = CLASS_CALLS[call]
    reqs, log = _class_collision_world(target, "raise")
    got = _outcome(lambda: mine(impl, reqs, layout))
    got_log = list(log)
    reqs, log = _class_collision_world(target, "raise")
    want = _outcome(lambda: loop(reqs, layout))
    assert got[0] == want[0] == "ok", (got, want)
    if call in ("decode", "spec_v2", "plan"):
        assert got[1] == want[1]
    assert len(got_log) == len(log), f"__eq__ calls: kvest {len(got_log)}, the loop {len(log)}"


@pytest.mark.parametrize("mode", ["false", "true", "raise"])
@pytest.mark.parametrize(("target", "layout"), [("kv", "nested"), ("kv_committed_len", "flat"),
                                                ("kv_allocated_len", "flat")])
@pytest.mark.parametrize("call", list(CLASS_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_colliding_key_in_the_class_dict_pure(impl, call, target, layout, mode):
    """pure=True: the type lookup the loop makes would run the key's __eq__,
    so kvest refuses (ImpureRequest naming reqs[0]) -- and runs no __eq__ to
    find that out (the compiled route work-out calls _PyType_Lookup, which
    runs it; the twin skips the key and answers)."""
    if call == "decode" and target == "kv_allocated_len":
        return
    mine, _ = CLASS_CALLS[call]
    reqs, log = _class_collision_world(target, mode)
    got = _outcome(lambda: mine(impl, reqs, layout, pure=True))
    assert log == [], f"pure mode ran the caller's __eq__ {len(log)} times"
    assert got[:2] == ("raise", kvest.ImpureRequest), got
    assert got[2].startswith("reqs[0] cannot be"), got


@pytest.mark.parametrize("n", [6, 2048])
@pytest.mark.parametrize("how", ["missing", "property", "negative", "a-str", "int-subclass"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_plan_out_buffers_after_a_failed_read(impl, how, n):
    """The plan's out= buffers after request k fails to read (no attribute, a
    property that raises, a negative length, a str) -- a whole list, so the
    compiled build first tries its backward walk (threshold lowered for 6
    rows), which writes rows from the end until it meets request k: the
    buffers must hold the rows before k and nothing else, as the loop leaves
    them.  (An int subclass does not fail: then every row is written.)"""
    k = n - 3 if n > 6 else 2
    KV = _slots_kv()

    class Req:
        def __init__(self, c, a):
            self.kv = KV(c, a)

    class Raising(Req):
        @property
        def kv(self):
            raise RuntimeError("req.kv")

    # Routes and hints learned first (a scheduler's steady state): the
    # backward walk's quick reads then take the plain requests.
    kvest.decode_alloc_plan_from_reqs([Req(16, 16), Req(16, 16)], P, R, layout="nested")
    reqs = [Req(16, 16 + i % 7) for i in range(n)]
    if how == "missing":
        reqs[k] = object()
    elif how == "property":
        reqs[k] = Raising.__new__(Raising)
    elif how == "negative":
        reqs[k].kv.kv_allocated_len = -1
    elif how == "a-str":
        reqs[k].kv.kv_allocated_len = "16"
    else:
        class Int(int):
            pass

        reqs[k].kv.kv_allocated_len = Int(16 + k % 7)
    cur, nxt = np.full(n, -7, np.int64), np.full(n, -7, np.int64)
    with _Walks(backward=2 if n == 6 else None):
        got = _outcome(lambda: impl.decode_alloc_plan_from_reqs(reqs, P, R, out=(cur, nxt),
                                                                layout="nested"))
    rows = n if how == "int-subclass" else k
    want_cur = [16 + i % 7 for i in range(rows)] + [-7] * (n - rows)
    want_nxt = [max(16 + i % 7, 32) for i in range(rows)] + [-7] * (n - rows)
    assert (got[0] == "ok") is (how == "int-subclass"), got
    assert cur.tolist() == want_cur
    assert nxt.tolist() == want_nxt


# ------------------------------------------------- kind 2 for the writers

@pytest.mark.parametrize("target", ["reqs", "values"])
@pytest.mark.parametrize("how", SHRINKS)
@pytest.mark.parametrize("source", ["property", "operator"])
@pytest.mark.parametrize("k", [37])
@pytest.mark.parametrize("writer", ["add", "add-two-paths", "max", "max-not-strict"])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_writers_while_a_list_shrinks(impl, writer, k, source, how, target):
    """Request k's req.kv property (or its length's __add__ / a value's __gt__)
    shrinks or shifts the requests list or the values list in the middle of
    the walk (after a run of quick-path writes): the loop's iterators read
    the sizes at every step; the writers must write exactly the requests the
    loop writes, and raise what zip raises."""
    if target == "values" and not writer.startswith("max"):
        return
    n = 40

    def world():
        KV = _slots_kv()
        box: dict = {}
        done = [False]

        def change():
            if done[0]:
                return
            done[0] = True
            seq = box[target]
            if how == "tail":
                del seq[k + 1:]
            elif how == "head":
                del seq[:2]
            elif how == "all":
                del seq[:]
            else:
                seq[:] = seq[2:] + seq[:2]

        class Loud(int):
            def __add__(self, other):
                change()
                return int(self) + other

            __radd__ = __add__

            def __gt__(self, other):
                change()
                return int(self) > other

            def __lt__(self, other):
                change()
                return int(self) < other

        class Req:
            def __init__(self, i):
                self.i = i
                self.kv = KV(16 + i, 20 + i)

        class PropReq(Req):
            @property
            def kv(self):
                change()
                return self.__dict__["_kv"]

            @kv.setter
            def kv(self, value):
                self.__dict__["_kv"] = value

        reqs = [Req(i) for i in range(n)]
        values = [30 + i for i in range(n)]
        if source == "property":
            reqs[k] = PropReq(k)
        elif writer.startswith("max"):
            values[k] = Loud(30 + k)
        else:
            reqs[k].kv.kv_allocated_len = Loud(20 + k)
        box["reqs"], box["values"] = reqs, values
        return reqs, values

    def call(t, reqs, values):
        paths = {"add": "kv.kv_allocated_len",
                 "add-two-paths": ("kv.kv_allocated_len", "kv.kv_committed_len")}
        if writer in paths:
            if t is not None:
                return t.add_to_attrs(reqs, paths[writer], 1)
            ps = paths[writer] if isinstance(paths[writer], tuple) else (paths[writer],)
            for req in reqs:
                for p in ps:
                    loop_add([req], p, 1)
            return None
        strict = writer == "max"
        if t is not None:
            return t.max_into_attr(reqs, "kv.kv_allocated_len", values, strict=strict)
        names = ("kv", "kv_allocated_len")
        for req, v in zip(reqs, values, strict=strict):
            new = max(getattr(getattr(req, names[0]), names[1]), v)
            setattr(getattr(req, names[0]), names[1], new)
        return None

    def state(reqs_all):
        return [(type(r.__dict__.get("kv", r.__dict__.get("_kv"))).kv_allocated_len.__get__(
            r.__dict__.get("kv", r.__dict__.get("_kv"))),) for r in reqs_all]

    reqs, values = world()
    _outcome(lambda: call(impl, *world()))  # routes learned
    every = list(reqs)
    got = _outcome(lambda: call(impl, reqs, values))
    got_state = state(every)
    reqs, values = world()
    every = list(reqs)
    want = _outcome(lambda: call(None, reqs, values))
    assert got[:2] == want[:2], (got, want)
    assert got_state == state(every)


def _metaclass_cases():
    """(name, make): requests of classes made by metaclasses of several kinds;
    make() -> reqs.  Whether the loop runs the caller's code is measured, not
    assumed (the log)."""

    def kv_class():
        class KV:
            def __init__(self, c, a):
                self.kv_committed_len, self.kv_allocated_len = c, a

        return KV

    def with_meta(meta, body=None):
        def make():
            KV = kv_class()
            Req = meta("Req", (), dict(body or {}))
            reqs = []
            for i in range(2):
                req = Req.__new__(Req)
                kv = KV(16 + i, 20 + 13 * i)
                try:  # a slot, or the instance dict
                    object.__setattr__(req, "kv", kv)
                except AttributeError:  # a property without a setter in the way
                    object.__getattribute__(req, "__dict__")["kv"] = kv
                reqs.append(req)
            return reqs
        return make

    class LoudMeta(type):
        def __getattribute__(cls, name):
            _log(("meta getattribute", name))
            return super().__getattribute__(name)

    class PropertyBase:
        @property
        def kv(self):
            _log("PropertyBase.kv")
            return self.__dict__["kv"]

    class MroMeta(type):
        def mro(cls):
            return [cls, PropertyBase, object]

    class DescriptorMeta(type):
        @property
        def kv(cls):  # a class attribute of the metaclass: not seen by instances
            _log("DescriptorMeta.kv")
            return None

    class PrepareMeta(type):
        @classmethod
        def __prepare__(mcls, name, bases):
            return {"__slots__": ("kv", "__dict__")}

    return {
        "meta-getattribute": with_meta(LoudMeta),
        "meta-mro-with-a-property": with_meta(MroMeta),
        "meta-class-property": with_meta(DescriptorMeta),
        "meta-prepare-slots": with_meta(PrepareMeta, {"__slots__": ("kv", "__dict__")}),
    }


METAS = _metaclass_cases()


@pytest.mark.parametrize("fn", list(_JUDGED))
@pytest.mark.parametrize("meta", list(METAS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_metaclasses(impl, meta, fn):
    """Classes made by metaclasses: a metaclass's own __getattribute__ or
    class-level property does not touch instance reads (the loop runs nothing
    of the caller's: pure answers); a metaclass whose mro() puts a property
    class in the way does (pure refuses); both builds alike."""
    mine, loop = _JUDGED[fn]
    reqs = METAS[meta]()
    del _PURE_LOG[:]
    want = _outcome(lambda: loop(reqs, "nested"))
    loop_ran = bool(_PURE_LOG)
    want_state = _judged_state(reqs)
    reqs = METAS[meta]()
    del _PURE_LOG[:]
    got = _outcome(lambda: mine(impl, reqs, "nested", pure=True))
    assert _PURE_LOG == [], f"pure mode ran the caller's code: {_PURE_LOG}"
    if loop_ran:
        assert got[:2] == ("raise", kvest.ImpureRequest), got
    else:
        assert got[0] == want[0] == "ok", (got, want)
        if fn in ("decode", "spec_v2", "plan"):
            assert got[1] == want[1]
        assert _judged_state(reqs) == want_state


@pytest.mark.parametrize("kv_kind", ["slots", "dict"])
@pytest.mark.parametrize("call", list(DEL_CALLS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_finalizer_of_a_fresh_kv_sees_the_callers_collector(impl, call, kv_kind):
    """req.kv a property returning a fresh object each read (its only
    reference is the reader's): kvest releases it, and its __del__ -- the
    caller's code -- runs with the caller's collector state, never under
    kvest's hold (dict-based req.kv: the hold its dict read took; slots: the
    writers' int arithmetic's)."""
    seen: list[bool] = []
    armed = [False]

    if kv_kind == "slots":
        class KV:
            __slots__ = ("__weakref__", "kv_allocated_len", "kv_committed_len")

            def __init__(self, c, a):
                self.kv_committed_len, self.kv_allocated_len = c, a

            def __del__(self):
                if armed[0]:
                    seen.append(gc.isenabled())
    else:
        class KV:
            def __init__(self, c, a):
                self.kv_committed_len, self.kv_allocated_len = c, a

            def __del__(self):
                if armed[0]:
                    seen.append(gc.isenabled())

    class Req:
        def __init__(self, c, a):
            self.c, self.a = c, a

        @property
        def kv(self):
            return KV(self.c, self.a)

    DEL_CALLS[call](impl, [Req(16, 20) for _ in range(4)])  # routes learned
    was = gc.isenabled()
    gc.enable()
    try:
        armed[0] = True
        DEL_CALLS[call](impl, [Req(16 + i, 20 + i) for i in range(4)])
        armed[0] = False
        after = gc.isenabled()
    finally:
        armed[0] = False
        (gc.enable if was else gc.disable)()
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} finalizers saw it off"
    assert after is True
