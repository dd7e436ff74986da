"""The glue between a matched statement and kvest's kernels.

``make_<kind>`` (one per kind of :mod:`kvest.sglang.registry`) returns the
function a rewritten statement calls with the statement's inputs and the global
names it reads.  It answers only when everything is as the kernel was proven
for -- the builtins and helpers are the objects kvest checked, scalars are
exact Python ints, the requests an exact list or tuple, every length an exact
int the kernel reads -- and returns :data:`DECLINED` otherwise, so that
upstream's own statement runs (outside any handler: its exceptions carry no
trace of kvest) and gives upstream's answer or exception; or :data:`HANDED`,
where a batch too small to gain goes to upstream's statement on purpose.  A
statement's glue counts nothing: the rewritten function keeps each call's
outcome in a local of its own and counts it once, when the call ends
(:func:`kvest.sglang.rewrite.rebuild`).  A whole-function replacement makes one
decision per call and counts it there, once.

Whole-function replacements (``get_num_new_pages``, and
``page_aligned_decode_alloc_lens`` for callers that turn its lists straight
into int32 tensors) wrap the original the same way: kvest answers or the
original runs.
"""

from __future__ import annotations

import builtins
import enum
import functools
import gc
import operator
import time
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import kvest
from kvest.sglang import monitor
from kvest.sglang.patterns import Pattern
from kvest.sglang.registry import KINDS

__all__ = ["DECLINED", "HANDED", "make_alloc_lens_int32", "make_num_new_pages"]


class _Declined:
    """What a glue returns when upstream's statement must answer."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "kvest.sglang.glue.DECLINED"


DECLINED: Any = _Declined()


class _Handed:
    """What a glue returns when a batch too small to gain goes to upstream's
    statement on purpose (counted as ``upstream``, not as a fallback)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "kvest.sglang.glue.HANDED"


HANDED: Any = _Handed()

_SUM, _MAX, _ENUMERATE, _ZIP = builtins.sum, builtins.max, builtins.enumerate, builtins.zip
_SEQUENCES = (list, tuple)
_itemgetter = operator.itemgetter
_INT_LIMITS = {np.dtype(np.int64): 2**63 - 1, np.dtype(np.int32): 2**31 - 1}

_STATE = monitor.STATE
_failed = monitor.kernel_failed  # (a decline is nothing more; anything else is counted)
_UPSTREAM, _KERNEL, _FALLBACK = monitor.UPSTREAM, monitor.KERNEL, monitor.FALLBACK


# The compiled twins of the glues that run at every batch size, each standing
# for its compiled kernel: where kvest's kernel is another function when the
# plan is made (the pure-Python build; a test's stand-in; the benchmark's
# replayed answers), the glue is the Python function here, which calls it.
_COMPILED: dict[Any, Any] = {}
_GLOBALS_RESOLVE: Any = None
if kvest.IMPLEMENTATION == "cython":
    from kvest import _reqs
    from kvest.sglang import _glue

    _COMPILED = {_reqs.decode_new_tokens_from_reqs: _glue._DecodeCountGlue,
                 _reqs.spec_v2_new_tokens_from_reqs: _glue._SpecV2TotalGlue,
                 _reqs.beam_groups_from_reqs: _glue._BeamTailGlue,
                 _reqs.decode_alloc_plan_from_reqs: _glue._AllocLensGlue}
    _GLOBALS_RESOLVE = _glue._globals_resolve


def _hooked(glue: Any, name: str, kernel: Any) -> Callable[..., Any]:
    """A compiled glue's ``run``, the glue told where its kernel's exceptions
    go (:func:`kvest.sglang.monitor.kernel_failed`, which counts a failure)."""
    glue.failed = functools.partial(_failed, name, kernel)
    return glue.run


def _sized(glue: Callable[..., Any], below: int) -> Callable[..., Any]:
    """``glue``, telling the rewrite its crossover: the rewritten function
    checks a list's size itself, before the call, and runs upstream's
    statement where the glue answers :data:`HANDED`
    (:func:`kvest.sglang.rewrite.rebuild`)."""
    glue.kvest_below = below  # type: ignore[attr-defined]
    return glue


def _commits(glue: Callable[..., Any]) -> Callable[..., Any]:
    """``glue``, a writer's: once it starts it is the call's answer (it never
    hands back), so the rewrite counts the kernel before calling it."""
    glue.kvest_commits = True  # type: ignore[attr-defined]
    return glue


def _below(kind: str) -> int:
    """The batch size from which the kind's kernel answers (0: every size): its
    registry crossover, unless the plan asked for kernels at every size."""
    return KINDS[kind].upstream_below if _STATE.handoff else 0


def _first_call() -> None:
    monitor.announce()


def make_decode_count(pattern: Pattern, name: str, checked: dict[str, Any]
                      ) -> Callable[..., Any]:
    """``n = sum(1 for r in requests if <C> % page_size == 0)``: pages, not tokens."""
    kernel = kvest.decode_new_tokens_from_reqs
    layout, below = pattern.layout, _below(pattern.kind)
    compiled = _COMPILED.get(kernel)
    if compiled is not None and not below:
        return _hooked(compiled(DECLINED, _STATE, _first_call, _SUM, layout), name, kernel)

    def decode_count(requests: Any, page_size: Any, sum_: Any) -> int:
        if not _STATE.announced:
            _first_call()
        if type(requests) in _SEQUENCES and len(requests) < below:
            return HANDED  # too small to gain: upstream's (counted as upstream)
        if sum_ is _SUM and type(requests) in _SEQUENCES and type(page_size) is int \
                and page_size >= 1:
            try:
                tokens = kernel(requests, page_size, layout=layout, exact_ints=True, pure=True)
            except Exception as error:
                _failed(name, kernel, error, (requests, page_size))
            else:
                return tokens // page_size
        return DECLINED

    return _sized(decode_count, below)


def make_select_requests(pattern: Pattern, name: str, checked: dict[str, Any]
                         ) -> Callable[..., Any]:
    """``requests = owner.reqs if selected is None else [owner.reqs[i] for i in selected]``:
    the list built in one C call (``operator.itemgetter``, list indexing's own
    semantics) where ``owner.reqs`` is a plain list held in the instance's
    ``__dict__`` -- so reading it once equals reading it per index, as no
    Python code runs in between: the indices are exact ints in an exact list or
    tuple, or an integer ndarray (an index with ``__index__`` of its own could
    rebind ``owner.reqs`` between two reads of upstream's comprehension)."""

    def select_requests(owner: Any, selected: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        if selected is None:
            return owner.reqs
        if _plain_indices(selected) and not _lookup_is_special(type(owner), "reqs"):
            try:
                reqs = owner.__dict__["reqs"]
                if type(reqs) is list:
                    n = len(selected)
                    chosen = (list(_itemgetter(*selected)(reqs)) if n > 1
                              else [reqs[selected[0]]] if n else [])
                    return chosen
            except Exception as error:  # upstream's comprehension raises its own
                _failed(name, _itemgetter, error, (selected,))
        return DECLINED

    return select_requests


_EXACT_INT = frozenset({int})
_NOTHING = object()


def plain_reqs(owner: Any) -> Any:
    """``owner.reqs`` where reading it runs no Python code (so that reading it
    again gives the same object), else ``None``: the class's getattr is the
    generic one, and its MRO defines nothing under ``reqs`` but a slot (the
    instance dict's entry, or the slot's value).  The compiled glue and size
    check read it so (``kv_plain_attr``, reqroute.h)."""
    cls = type(owner)
    if cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__"):
        return None
    defined = next((k.__dict__["reqs"] for k in cls.__mro__ if "reqs" in k.__dict__), _NOTHING)
    if defined is _NOTHING:
        return getattr(owner, "__dict__", {}).get("reqs")
    if type(defined) is types.MemberDescriptorType:
        return getattr(owner, "reqs", None)  # (a slot's own get: no code of the caller's)
    return None


def _plain_indices(selected: Any) -> bool:
    """Indices whose use as list indices runs no Python code."""
    kind = type(selected)
    if kind is np.ndarray:
        return selected.ndim == 1 and selected.dtype.kind in "iu"
    return exact_ints(selected)


def _lookup_is_special(cls: type, name: str) -> bool:
    """Whether ``obj.name`` might not be ``obj.__dict__[name]``: a custom
    ``__getattribute__``, or a data descriptor (a property, a slot) on the class.
    Worked out once per class and version tag (``name`` is always ``"reqs"``
    here): CPython gives the class a new tag whenever it or a base changes."""
    tag = _type_version(cls)
    if tag:
        known = _SPECIAL.get(cls)
        if known is not None and known[0] == tag:
            return known[1]
    special = cls.__getattribute__ is not object.__getattribute__
    if not special:
        for klass in cls.__mro__:
            if name in klass.__dict__:
                kind = type(klass.__dict__[name])
                special = hasattr(kind, "__set__") or hasattr(kind, "__delete__")
                break
    if tag:
        if len(_SPECIAL) >= 64:
            _SPECIAL.clear()
        _SPECIAL[cls] = (tag, special)
    return special


def _exact_ints_rule(values: Any) -> bool:
    """Whether ``values`` is an exact list or tuple of exact ints: iterating it
    and comparing its items with ints runs no Python code
    (``kvest.sglang._glue._exact_ints`` in C)."""
    return type(values) in _SEQUENCES and set(map(type, values)) <= _EXACT_INT


# class -> (its version tag, whether its "reqs" lookup is special)
_SPECIAL: dict[type, tuple[int, bool]] = {}
try:
    from kvest.sglang._glue import _exact_ints as exact_ints
    from kvest.sglang._glue import _type_version
except ImportError:  # the pure-Python build: worked out each time
    exact_ints = _exact_ints_rule

    def _type_version(cls: type) -> int:
        return 0


def make_spec_v2_total(pattern: Pattern, name: str, checked: dict[str, Any]
                       ) -> Callable[..., Any]:
    """``for r in requests: total += ceil_align(max(A, C + R), p) - ceil_align(A, p)``
    (as upstream spells it), R being ``reserve_factor`` times the reserve read."""
    kernel = kvest.spec_v2_new_tokens_from_reqs
    factor, layout = pattern.reserve_factor, pattern.layout
    ceil_align, ceil_div = checked["ceil_align"], checked["ceil_div"]
    home = ceil_align.__globals__
    # A helper's code replaced in place (an autoreload) keeps its identity.
    align_code, div_code = ceil_align.__code__, ceil_div.__code__
    below = _below(pattern.kind)
    compiled = _COMPILED.get(kernel)
    if compiled is not None and not below:
        return _hooked(compiled(DECLINED, _STATE, _first_call, _MAX, layout, factor, ceil_align,
                                ceil_div), name, kernel)

    def spec_v2_total(total: Any, requests: Any, page_size: Any, reserve: Any, max_: Any,
                      ceil_align_: Any) -> int:
        if not _STATE.announced:
            _first_call()
        if type(requests) in _SEQUENCES and len(requests) < below:
            return HANDED  # too small to gain: upstream's (counted as upstream)
        if (max_ is _MAX and ceil_align_ is ceil_align and home.get("ceil_div") is ceil_div
                and ceil_align.__code__ is align_code and ceil_div.__code__ is div_code
                and type(total) is int and type(requests) in _SEQUENCES
                and type(page_size) is int and page_size >= 1 and type(reserve) is int
                and reserve >= 0):
            try:
                tokens = kernel(requests, page_size, factor * reserve, layout=layout,
                                exact_ints=True, pure=True)
            except Exception as error:
                _failed(name, kernel, error, (requests, page_size, reserve))
            else:
                return total + tokens
        return DECLINED

    return _sized(spec_v2_total, below)


def make_beam_rows(pattern: Pattern, name: str, checked: dict[str, Any]) -> Callable[..., Any]:
    """``return sum(r.beam_group.num_member_rows for r in reqs if r.beam_group is not None)``."""
    kernel = kvest.beam_member_rows_from_reqs
    below = _below(pattern.kind)

    def beam_rows(reqs: Any, sum_: Any) -> int:
        if not _STATE.announced:
            _first_call()
        if type(reqs) in _SEQUENCES and len(reqs) < below:
            return HANDED  # too small to gain: upstream's (counted as upstream)
        if sum_ is _SUM and type(reqs) in _SEQUENCES:
            try:
                rows = kernel(reqs, exact_ints=True, pure=True)
            except Exception as error:
                _failed(name, kernel, error, (reqs,))
            else:
                return rows
        return DECLINED

    return beam_rows


def make_alloc_lens_loop(pattern: Pattern, name: str, checked: dict[str, Any]
                         ) -> Callable[..., Any]:
    """The loop filling ``cur[i] = A``, ``nxt[i] = max(A, ceil_align(C + R, p))``
    and adding ``nxt - cur`` to a total: the plan kernel, then the two lists
    written whole (only once every value is known)."""
    kernel = kvest.decode_alloc_plan_from_reqs
    layout, below = pattern.layout, _below(pattern.kind)

    def alloc_lens_loop(reqs: Any, reserve: Any, page_size: Any, cur: Any, nxt: Any,
                        total: Any, enumerate_: Any, max_: Any) -> int:
        if not _STATE.announced:
            _first_call()
        if type(reqs) in _SEQUENCES and len(reqs) < below:
            return HANDED  # too small to gain: upstream's (counted as upstream)
        if (enumerate_ is _ENUMERATE and max_ is _MAX and type(reqs) in _SEQUENCES
                and type(cur) is list and type(nxt) is list
                and len(cur) == len(reqs) == len(nxt) and type(total) is int
                and type(page_size) is int and page_size >= 1 and type(reserve) is int
                and reserve >= 0):
            try:
                plan = kernel(reqs, page_size, reserve, page_aligned=True, layout=layout,
                              exact_ints=True, pure=True)
            except Exception as error:
                _failed(name, kernel, error, (reqs, page_size, reserve))
            else:
                if len(plan.cur) == len(cur):  # the requests did not change meanwhile
                    cur[:] = plan.cur.tolist()
                    nxt[:] = plan.nxt.tolist()
                    return total + plan.num_tokens
        return DECLINED

    return _sized(alloc_lens_loop, below)


# ------------------------------------------------------------------ loops that write

_NESTED_LENGTHS = (("kv", "kv_allocated_len"), ("kv", "kv_committed_len"))
_ALLOCATED = ("kv", "kv_allocated_len")


def _adding_loop(name: str, kind: str, paths: tuple[tuple[str, ...], ...], fixed: Any
                 ) -> Callable[..., Any]:
    """``for req in owner.reqs: req.<path> += delta`` for each path, ``delta``
    the glue's argument or ``fixed``.

    kvest's writer keeps the loop's every semantic (Python's ``+=`` on whatever
    the values are, properties and ``__setattr__`` taken as ``setattr`` takes
    them, the same requests written before an exception, a request whose code
    changed the batch seen as the loop sees it), so once it has started it never
    hands back: it finishes as the loop would, exceptions included, and nothing
    is ever written twice.  (Pure mode, which checks every request before the
    first write, costs a scan of each request's ``__dict__`` keys: more than the
    loop itself, tools/cachegrind_hotspots.py.)  A batch smaller than the kind's
    crossover never gets here: the rewritten function checks ``owner.reqs``
    first (reading it only where that runs no code) and runs upstream's loop."""
    add, below = kvest.add_to_attrs, _below(kind)

    def adding_loop(owner: Any, delta: Any = fixed) -> Any:
        if not _STATE.announced:
            _first_call()
        reqs = owner.reqs  # the loop's iterable, read once as the loop reads it
        add(reqs, paths, delta)  # (the writer never hands back once it starts)
        return None

    return _commits(_sized(adding_loop, below))


def make_add_lengths_loop(pattern: Pattern, name: str, checked: dict[str, Any]
                          ) -> Callable[..., Any]:
    """``for req in owner.reqs: req.kv.kv_allocated_len += d; req.kv.kv_committed_len += d``."""
    return _adding_loop(name, pattern.kind, _NESTED_LENGTHS, None)


def make_max_allocated_loop(pattern: Pattern, name: str, checked: dict[str, Any]
                            ) -> Callable[..., Any]:
    """``for req, v in zip(reqs, values, strict=True): req.kv.kv_allocated_len =
    max(req.kv.kv_allocated_len, v)`` (semantics as above; ``zip`` and ``max``
    must be the builtins).  Upstream's loop looks ``max`` up again on every
    pass, kvest's writer once: so it writes in pure mode, where no code of the
    caller's runs (no property, no comparison of a value's own, no finalizer)
    that could rebind ``max`` in the middle of the loop; a call pure mode
    refuses is upstream's loop's, declined before any write."""
    raise_to = kvest.max_into_attr

    def max_allocated_loop(reqs: Any, values: Any, zip_: Any, max_: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        if zip_ is not _ZIP or max_ is not _MAX:
            return DECLINED
        try:
            raise_to(reqs, _ALLOCATED, values, strict=True, pure=True)
        except kvest.ImpureRequest:
            return DECLINED  # (raised before any write)
        return None

    return _commits(max_allocated_loop)


def make_batch_idx_loop(pattern: Pattern, name: str, checked: dict[str, Any]
                        ) -> Callable[..., Any]:
    """``for req in owner.reqs: req.decode_batch_idx += 1`` (0.5.19 on; before,
    the same loop also adds 1 to the flat lengths: the pattern's paths)."""
    return _adding_loop(name, pattern.kind, pattern.paths, 1)


def make_beam_tail_loop(pattern: Pattern, name: str, checked: dict[str, Any]
                        ) -> Callable[..., Any]:
    """``for i, req in enumerate(owner.reqs): group = req.beam_group; if group is
    None or ...: continue; ...`` (SGLang's ``append_beam_tail``).  With no
    request in a beam group the loop only reads each ``beam_group``, which the
    kernel does, once each, the same way; with one, upstream's loop runs (and
    reads them again: SGLang's ``beam_group`` is a plain attribute).
    ``owner.reqs`` must be a plain list read where reading it runs no code
    (:func:`plain_reqs`), so that reading it here and again in upstream's loop
    give the same list, and ``enumerate`` the builtin."""
    kernel = kvest.beam_groups_from_reqs
    below = _below(pattern.kind)
    compiled = _COMPILED.get(kernel)
    if compiled is not None and not below:
        return _hooked(compiled(DECLINED, _STATE, _first_call, _ENUMERATE), name, kernel)

    def beam_tail_loop(owner: Any, enumerate_: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        if enumerate_ is _ENUMERATE:
            reqs = plain_reqs(owner)
            if type(reqs) is list:
                try:
                    groups = kernel(reqs, pure=True)
                except Exception as error:  # upstream's loop raises its own
                    _failed(name, kernel, error, (reqs,))
                else:
                    if groups == 0:
                        return None
        return DECLINED

    return _sized(beam_tail_loop, below)


# ------------------------------------------------------------------ writers in shadow mode
#
# In shadow mode a writer's statement runs once, upstream's.  Before it, its dry
# run works out what kvest's writer would write -- the kernel itself, run on
# kvest's own copies of the lengths it reads (read only where reading runs no
# code of the caller's) -- and after it, :func:`shadow_check` compares that
# with what upstream's statement wrote (kvest.sglang.rewrite.rebuild's
# ``shadow`` form).  A dry run that cannot read a request so declines: that call
# is not compared.


class Write(NamedTuple):
    """One attribute a writer writes: ``owner.attr`` (the real object), its value
    before, and kvest's copy of ``owner`` holding what kvest would write."""

    owner: Any
    attr: str
    before: int
    copy: Any


class DryRun(NamedTuple):
    """What kvest would do: the writes, the values of the statement's variables
    it says the statement leaves as they are (``keeps``), its time, and what
    the reproduction shows of the inputs."""

    writes: tuple[Write, ...]
    keeps: tuple[Any, ...]
    kvest_ns: int
    inputs: str


class _Copy:
    """kvest's own copy of a request (or of its ``kv``): plain attributes only."""


class _NotPlain(Exception):
    """A read would run code of the caller's: the call is not compared."""


class Route(enum.Enum):
    """How ``obj.name`` is read where that runs no code of the caller's."""

    DICT = "the instance dict"
    SLOT = "a slot"
    CODE = "code of the caller's"  # (not read)


# (class, name) -> (the class's version tag, its Route): worked out once per tag
_ROUTES: dict[tuple[type, str], tuple[int, Route]] = {}


def _route(cls: type, name: str) -> Route:
    tag = _type_version(cls)
    if tag:
        known = _ROUTES.get((cls, name))
        if known is not None and known[0] == tag:
            return known[1]
    route = Route.CODE
    if cls.__getattribute__ is object.__getattribute__ and not hasattr(cls, "__getattr__"):
        defined = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), _NOTHING)
        route = (Route.DICT if defined is _NOTHING
                 else Route.SLOT if type(defined) is types.MemberDescriptorType else Route.CODE)
    if tag:
        if len(_ROUTES) >= 256:
            _ROUTES.clear()
        _ROUTES[(cls, name)] = (tag, route)
    return route


def plain_attr(obj: Any, name: str) -> Any:
    """``obj.name`` where reading it runs no code of the caller's (as
    :func:`plain_reqs` reads ``reqs``: the generic getattr, nothing under the
    name on the class but a slot), else :class:`_NotPlain`."""
    route = _route(type(obj), name)
    if route is Route.DICT:
        found = getattr(obj, "__dict__", {}).get(name, _NOTHING)
    elif route is Route.SLOT:
        found = getattr(obj, name, _NOTHING)  # (a slot's own get: no code of the caller's)
    else:
        raise _NotPlain(name)
    if found is _NOTHING:
        raise _NotPlain(name)
    return found


def _mirror(reqs: Any, paths: tuple[tuple[str, ...], ...]
            ) -> tuple[list[_Copy], tuple[Write, ...]]:
    """kvest's copies of ``reqs`` along ``paths`` (one copy per distinct object,
    so that a request listed twice, or two requests sharing one ``kv``, are
    written as upstream writes them), and every leaf an exact int.  Collections
    are held off meanwhile (as the compiled kernels hold them): no finalizer
    runs between reads, so each class's route, worked out once, holds."""
    memo: dict[int, _Copy] = {}
    leaves: dict[tuple[int, str], Write] = {}
    routes: dict[tuple[type, str], Route] = {}

    def read(obj: Any, name: str) -> Any:
        key = (type(obj), name)
        route = routes.get(key)
        if route is None:
            route = routes[key] = _route(type(obj), name)
        found = (obj.__dict__.get(name, _NOTHING) if route is Route.DICT
                 else getattr(obj, name, _NOTHING) if route is Route.SLOT else _NOTHING)
        if found is _NOTHING:
            raise _NotPlain(name)
        return found

    def copy_of(obj: Any) -> _Copy:
        found = memo.get(id(obj))
        if found is None:
            found = memo[id(obj)] = _Copy()
        return found

    collecting = gc.isenabled()
    gc.disable()
    try:
        copies = []
        for req in reqs:
            copies.append(copy_of(req))
            for path in paths:
                obj = req
                for name in path[:-1]:
                    inner = read(obj, name)
                    setattr(copy_of(obj), name, copy_of(inner))
                    obj = inner
                key = (id(obj), path[-1])
                if key not in leaves:
                    value = read(obj, path[-1])
                    if type(value) is not int:
                        raise _NotPlain(path[-1])
                    owner = copy_of(obj)
                    setattr(owner, path[-1], value)
                    leaves[key] = Write(obj, path[-1], value, owner)
    finally:
        if collecting:
            gc.enable()
    return copies, tuple(leaves.values())


def _dry(name: str, kernel: Any, work: Callable[..., Any]) -> Callable[..., Any]:
    """A dry run: ``work(*args)`` (the kernel on kvest's copies) as a
    :class:`DryRun`, timed, or :data:`DECLINED` where a request is not plain
    (or the kernel declines; any other exception is kvest's failure, counted)."""

    def dry(*args: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        start = time.perf_counter_ns()
        try:
            writes, keeps, inputs = work(*args)
        except _NotPlain:
            return DECLINED
        except Exception as error:
            _failed(name, kernel, error, args[:1])
            return DECLINED
        return DryRun(writes, keeps, time.perf_counter_ns() - start, inputs)

    return dry


def _adding_dry(name: str, paths: tuple[tuple[str, ...], ...], fixed: Any
                ) -> Callable[..., Any]:
    """``for req in owner.reqs: req.<path> += delta``, on kvest's copies."""
    add = kvest.add_to_attrs

    def work(owner: Any, delta: Any = fixed) -> tuple[tuple[Write, ...], tuple[()], str]:
        reqs = plain_reqs(owner)
        if type(reqs) is not list or type(delta) is not int:
            raise _NotPlain("reqs")
        copies, writes = _mirror(reqs, paths)
        add(copies, paths, delta, pure=True)
        return writes, (), f"delta {delta}"

    return _dry(name, add, work)


def make_add_lengths_loop_dry(pattern: Pattern, name: str, checked: dict[str, Any]
                              ) -> Callable[..., Any]:
    return _adding_dry(name, _NESTED_LENGTHS, None)


def make_batch_idx_loop_dry(pattern: Pattern, name: str, checked: dict[str, Any]
                            ) -> Callable[..., Any]:
    return _adding_dry(name, pattern.paths, 1)


def make_max_allocated_loop_dry(pattern: Pattern, name: str, checked: dict[str, Any]
                                ) -> Callable[..., Any]:
    """``req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, v)`` on kvest's copies."""
    raise_to = kvest.max_into_attr

    def work(reqs: Any, values: Any, zip_: Any, max_: Any
             ) -> tuple[tuple[Write, ...], tuple[()], str]:
        if zip_ is not _ZIP or max_ is not _MAX or type(reqs) not in _SEQUENCES \
                or not exact_ints(values) or len(values) != len(reqs):
            raise _NotPlain("values")  # (zip's own ValueError is upstream's to raise)
        copies, writes = _mirror(reqs, (_ALLOCATED,))
        raise_to(copies, _ALLOCATED, values, strict=True, pure=True)
        return writes, (), f"values {list(values)[:64]}"

    return _dry(name, raise_to, work)


def make_beam_tail_loop_dry(pattern: Pattern, name: str, checked: dict[str, Any]
                            ) -> Callable[..., Any]:
    """The beam tail loop kvest skips when no request is in a beam group: with
    none, kvest's answer is that the loop leaves its running offset as it
    was; with one, upstream's loop runs in mode on too (not compared)."""
    kernel = kvest.beam_groups_from_reqs

    def work(owner: Any, enumerate_: Any, keeps: Any) -> tuple[tuple[()], tuple[Any], str]:
        reqs = plain_reqs(owner)
        if enumerate_ is not _ENUMERATE or type(reqs) is not list or type(keeps) is not tuple \
                or kernel(reqs, pure=True) != 0:
            raise _NotPlain("reqs")  # (an offset not bound yet: _NOTHING, not a tuple)
        return (), keeps, f"{len(reqs)} requests, none in a beam group"

    dry = _dry(name, kernel, work)
    dry.kvest_keeps = ("offset",)  # type: ignore[attr-defined]
    return dry


def shadow_check(name: str) -> Callable[..., None]:
    """What the rewritten function calls after upstream's writer ran:
    ``check(dry, start[, keeps])``, ``dry`` the statement's :class:`DryRun` (or
    :data:`DECLINED`: nothing compared), ``start`` the clock before upstream's
    statement, ``keeps`` the values now of the variables the dry run says the
    statement leaves as they are (a tuple).  Never raises: it runs inside
    SGLang's step."""

    def check(dry: Any, start: int, keeps: Any = ()) -> None:
        if type(dry) is not DryRun:
            return
        upstream_ns = time.perf_counter_ns() - start
        try:
            got = [_read_back(w) for w in dry.writes]
            wanted = [w.copy.__dict__.get(w.attr, _NOTHING) for w in dry.writes]
            same = got == wanted and _kept(keeps, dry.keeps)
        except Exception:
            got, wanted, same = [], [], False
        monitor.record(name, same, dry.kvest_ns, upstream_ns,
                       lambda: _write_report(dry, got, wanted, keeps))

    return check


def _kept(now: Any, before: tuple[Any, ...]) -> bool:
    """Whether each variable is still the very object it was (``is``: for an int
    offset, the same value; anything else the loop rebinds it to differs)."""
    return type(now) is tuple and len(now) == len(before) and all(
        a is b or (type(a) is int and type(b) is int and a == b)
        for a, b in zip(now, before, strict=True))


def _read_back(write: Write) -> Any:
    try:
        return plain_attr(write.owner, write.attr)
    except _NotPlain:
        return _NOTHING  # (upstream's statement made it unreadable: a mismatch)


def _write_report(dry: DryRun, got: list[Any], wanted: list[Any], keeps: tuple[Any, ...]
                  ) -> str:
    """The first differing writes (before, kvest's, upstream's) and the inputs."""
    differ = [(w.attr, w.before, k, u) for w, k, u in zip(dry.writes, wanted, got, strict=True)
              if k != u][:16]
    kept = "" if _kept(keeps, dry.keeps) else (
        f"; kvest says the loop leaves {dry.keeps!r}, upstream's made it {keeps!r}")
    return (f"{len(differ)} of {len(dry.writes)} writes differ (attribute, before, kvest, "
            f"upstream): {differ}{kept}; {dry.inputs}; lengths before "
            f"{[w.before for w in dry.writes][:128]}{monitor._config()}")


# ------------------------------------------------------------------ whole functions

def _resolution(fn: Any, pattern: Pattern) -> tuple[dict[str, Any], tuple[str, ...],
                                                      tuple[Any, ...]]:
    """``fn``'s globals, the global names its pattern reads, and the object
    each must still resolve to: the builtin for a builtin's name, else what it
    was when kvest planned."""
    namespace = fn.__globals__
    names = tuple(pattern.globals)
    expected = tuple(getattr(builtins, n) if hasattr(builtins, n)
                     else namespace.get(n, _NOTHING) for n in names)
    return namespace, names, expected


def _resolver(fn: Any, pattern: Pattern) -> Callable[[], bool]:
    """Whether every global name ``fn`` reads (the pattern's, from its syntax
    tree) still resolves, as a global lookup in ``fn`` would, to the object kvest
    proved its version with (:func:`_resolution`): a module-level ``def max``
    or ``max = ...``, before or after import, says no."""
    namespace, names, expected = _resolution(fn, pattern)
    if _GLOBALS_RESOLVE is not None and type(namespace) is dict:  # the same, in C
        return functools.partial(_GLOBALS_RESOLVE, namespace, names, expected, _NOTHING)
    missing = _NOTHING

    def resolves() -> bool:
        home = namespace.get("__builtins__", builtins)
        table = home if type(home) is dict else vars(home)
        for name, obj in zip(names, expected, strict=True):
            value = namespace.get(name, missing)
            if value is missing:
                value = table.get(name, missing)
            if value is not obj:
                return False
        return True

    return resolves


def make_num_new_pages(original: Callable[..., Any], pattern: Pattern, tensor: type,
                       name: str) -> Callable[..., Any]:
    """``get_num_new_pages`` on kvest for int32/int64 CPU tensors.

    The tensors are read through ``Tensor.numpy()`` (no copy; kvest never
    imports torch).  Upstream computes in the tensors' own dtype, so where its
    ``seq_lens + page_size - 1`` would wrap around -- or anything else is
    unusual: other dtypes, shapes, devices, page sizes -- the original answers.
    """
    pages, limits = kvest.num_new_pages, _INT_LIMITS
    resolves, count = _resolver(original, pattern), monitor.spot(name).tally.count

    def get_num_new_pages(seq_lens: Any, page_size: Any, prefix_lens: Any = None,
                          decode: Any = False) -> Any:
        if not _STATE.announced:
            _first_call()
        answer = _NOTHING
        try:
            if type(seq_lens) is tensor and type(page_size) is int and page_size >= 1 \
                    and type(decode) is bool and resolves():
                seq = seq_lens.numpy()
                limit = limits.get(seq.dtype)
                if limit is not None and page_size <= limit and seq.ndim == 1:
                    if decode:
                        answer = pages(seq, page_size, decode=True)
                    elif type(prefix_lens) is tensor:
                        prefix = prefix_lens.numpy()
                        prefix_limit = limits.get(prefix.dtype)
                        if prefix_limit is not None and page_size <= prefix_limit and (
                                page_size == 1 or (
                                    _at_most(seq, limit - page_size + 1)
                                    and _at_most(prefix, prefix_limit - page_size + 1))):
                            answer = pages(seq, page_size, prefix)
        except Exception as error:
            _failed(name, pages, error, (seq_lens, page_size, prefix_lens, decode))
            answer = _NOTHING
        if answer is not _NOTHING:
            count(_KERNEL)  # (the call's one decision: counted once, here)
            return answer
        count(_FALLBACK)
        return original(seq_lens, page_size, prefix_lens, decode)

    return get_num_new_pages


def _at_most(values: np.ndarray, bound: int) -> bool:
    return values.size == 0 or int(values.max()) <= bound


def _lists_twin(plan: Callable[..., Any], name: str) -> Callable[..., Any]:
    """The int32 callers' alloc lens below ``lists_below`` as upstream's lists,
    through ``plan`` (``_glue._AllocLensGlue.run``'s small batches, in Python)."""

    def plan_lists(reqs: Any, page_size: Any, reserve: Any, layout: Any) -> Any:
        try:
            result = plan(reqs, page_size, reserve, page_aligned=True, layout=layout,
                          exact_ints=True, pure=True)
        except Exception as error:
            _failed(name, plan, error, (reqs, page_size, reserve))
            return None
        return result.cur.tolist(), result.nxt.tolist(), result.num_tokens

    return plan_lists


def make_alloc_lens_int32(original: Callable[..., Any], pattern: Pattern, name: str
                          ) -> Callable[..., Any]:
    """``page_aligned_decode_alloc_lens`` as int32 arrays, one pass over the requests.

    Only for callers that turn the two lists straight into int32 tensors (read
    from their source): ``torch.tensor(array, dtype=torch.int32)`` makes the
    same tensor without a Python loop.  Below the kind's ``lists_below``
    requests the kernel's rows come back as upstream's lists (the caller's
    tensors are made faster from a few ints in a list than from an array).
    A length that does not fit int32 makes kvest decline, and the original's
    lists go to the caller, whose ``torch.tensor`` then fails as it always did.
    """
    plan, int32, tally = kvest.decode_alloc_plan_from_reqs, np.int32, monitor.spot(name).tally
    layout, resolves = pattern.layout, _resolver(original, pattern)
    below, count = _below(pattern.kind), tally.count
    lists_below = KINDS[pattern.kind].lists_below
    lists = _lists_twin(plan, name)
    compiled = _COMPILED.get(plan)
    namespace, names, expected = _resolution(original, pattern)
    if compiled is not None and not below and type(namespace) is dict:
        run = _hooked(compiled(tally, DECLINED, _STATE, _first_call, namespace, names,
                               expected, _NOTHING, layout, lists_below), name, plan)

        def alloc_lens(reqs: Any, *, reserve: Any, page_size: Any) -> Any:
            answer = run(reqs, reserve, page_size)  # (counts the call)
            if answer is DECLINED:
                return original(reqs, reserve=reserve, page_size=page_size)
            return answer

        alloc_lens.__name__ = alloc_lens.__qualname__ = "page_aligned_decode_alloc_lens"
        return alloc_lens

    def page_aligned_decode_alloc_lens(reqs: Any, *, reserve: Any, page_size: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        if type(reqs) in _SEQUENCES and len(reqs) < below:
            count(_UPSTREAM)
            return original(reqs, reserve=reserve, page_size=page_size)
        if type(reqs) in _SEQUENCES and type(reserve) is int and reserve >= 0 \
                and type(page_size) is int and page_size >= 1 and resolves():
            if len(reqs) < lists_below:
                answer = lists(reqs, page_size, reserve, layout)
                if answer is not None:
                    count(_KERNEL)
                    return answer
            else:
                try:
                    result = plan(reqs, page_size, reserve, page_aligned=True, dtype=int32,
                                  layout=layout, exact_ints=True, pure=True)
                except Exception as error:
                    _failed(name, plan, error, (reqs, page_size, reserve))
                else:
                    count(_KERNEL)
                    return result.cur, result.nxt, result.num_tokens
        count(_FALLBACK)
        return original(reqs, reserve=reserve, page_size=page_size)

    return page_aligned_decode_alloc_lens


# ------------------------------------------------------------------ any other kind

def make_kernel(pattern: Pattern, name: str, checked: dict[str, Any]) -> Callable[..., Any]:
    """The glue of a kind with no ``make_<kind>`` of its own: a reader whose
    registry :class:`~kvest.sglang.registry.Kind` names its ``function``.  The
    function is called with the statement's inputs, in the kind's order, and
    answers what the statement binds (or returns); it raises where it cannot
    answer exactly as the statement would, and upstream's statement then runs.
    Every global name the statement reads must still be the builtin or the
    helper kvest checked when it planned."""
    kind = KINDS[pattern.kind]
    if kind.writes or kind.function is None:
        raise LookupError(f"{kind.name}: a writer, or no kernel: it needs a glue of its own")
    kernel, below = kind.function.resolve(), _below(pattern.kind)
    reads = tuple(pattern.globals if kind.reads is None else kind.reads)
    expected = tuple(checked.get(g, getattr(builtins, g, _NOTHING)) for g in reads)
    count = len(kind.inputs)
    sized = kind.inputs.index(kind.sized) if kind.sized in kind.inputs else None

    def kernel_glue(*args: Any) -> Any:
        if not _STATE.announced:
            _first_call()
        if sized is not None and type(args[sized]) in _SEQUENCES and len(args[sized]) < below:
            return HANDED  # too small to gain: upstream's (counted as upstream)
        if len(args) == count + len(expected) and all(
                got is want for got, want in zip(args[count:], expected, strict=True)):
            try:
                return kernel(*args[:count])
            except Exception as error:
                _failed(name, kernel, error, args[:count])
        return DECLINED

    return _sized(kernel_glue, below) if sized is not None else kernel_glue
