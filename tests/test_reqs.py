"""Request-object kernels against an oracle written here, on every way a request
can hold its lengths.

The oracle reads each request as the contract says (``req.<name>``, else
``req.kv.<name>``; or only where ``layout`` says) with plain ``getattr`` and
computes with Python ints; both implementations must give its value or raise
its exception type, and must agree with each other (``check_same``, which
also checks that no argument was modified).  The compiled kernel reads
attributes through per-type shortcuts (instance-dict probes, slot offsets,
remembered dict positions): the request kinds below cover each shortcut and
every case where it must not be taken.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import random
import sys

import numpy as np
import pytest
from helpers import INT64_MAX, check_same, outcome, page_sizes, reserves
from hypothesis import event, example, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from request_standins import (
    LAYOUT_OF,
    FlatReq,
    MixedReq,
    NestedReq,
    ReqKvInfo,
    TinyFlat,
    TinyNested,
)

import kvest
from kvest import reference

IMPLS = [kvest, reference]
IMPL_IDS = ["kvest", "reference"]
WHERE = {None: ("either", "either"), "flat": ("flat", "flat"),
         "mixed": ("flat", "nested"), "nested": ("nested", "nested")}
COMPILED = kvest.IMPLEMENTATION == "cython"
compiled_only = pytest.mark.skipif(not COMPILED, reason="the compiled kernels' walk order")


def _reads_entries() -> bool:
    """Whether the installed compiled kernels read dict entries directly."""
    try:
        from kvest import _reqs
    except ImportError:
        return False
    return bool(_reqs._DICT_ENTRIES)


# The address-order and backward walks are taken only where dict entries are
# read directly (3.11-3.13, the private build).
orders_only = pytest.mark.skipif(not (COMPILED and _reads_entries()),
                                 reason="the order policies need direct dict reads")


@pytest.fixture(autouse=True)
def address_order_from_two():
    """Batches of two and more that are out of address order take the compiled
    kernels' reordered walk here, and the others the backward walk (by default
    only batches of thousands do)."""
    if not COMPILED:
        yield
        return
    from kvest import _reqs

    least, least_backward = _reqs._address_order()[2], _reqs._backward_walks()[1]
    _reqs._address_order(2)
    _reqs._backward_walks(2)
    try:
        yield
    finally:
        _reqs._address_order(least)
        _reqs._backward_walks(least_backward)


# ------------------------------------------------------------------ the oracle

def _read(req, attr, where):
    try:
        if where == "either":
            try:
                value = getattr(req, attr)
            except AttributeError:
                try:
                    value = getattr(req.kv, attr)
                except AttributeError:
                    raise AttributeError(attr) from None
        else:
            value = getattr(req.kv if where == "nested" else req, attr)
    except AttributeError:
        raise
    except Exception as exc:
        # The contract: a read that fails otherwise (a property of the caller's)
        # is a TypeError naming the request, never the property's own exception.
        raise TypeError(attr) from exc
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("bool")
    value = operator.index(value)
    if value < 0:
        raise ValueError("negative")
    if value > INT64_MAX:
        raise OverflowError("int64")
    return value


def _fits(value):
    if value > INT64_MAX:
        raise OverflowError("int64")
    return value


def _rows(reqs, indices):
    if indices is None:
        return list(reqs)
    n = len(reqs)
    for i in indices:
        if not -n <= i < n:
            raise IndexError(i)
    return [reqs[i] for i in indices]


def _ceil(x, p):
    return -(-x // p)


def oracle(fn, reqs, p, r=0, indices=None, layout=None, page_aligned=True):
    at_c, at_a = WHERE[layout]
    rows = _rows(reqs, indices)
    if fn == "decode":
        count = sum(_read(q, "kv_committed_len", at_c) % p == 0 for q in rows)
        return _fits(count * p)
    total = pages = 0
    cur, nxt = [], []
    for q in rows:
        c = _read(q, "kv_committed_len", at_c)
        a = _read(q, "kv_allocated_len", at_a)
        need = _fits(c + r)
        if fn == "spec_v2":
            tokens = _fits(_ceil(max(a, need), p) * p) - _ceil(a, p) * p
            total = _fits(total + tokens)
            continue
        if page_aligned:
            need = _fits(_ceil(need, p) * p)
        cur.append(a)
        nxt.append(max(a, need))
        total = _fits(total + nxt[-1] - a)
        pages += _ceil(nxt[-1], p) - _ceil(a, p)
    if fn == "spec_v2":
        return total
    return (cur, nxt, total, pages)


def expect(fn, *args, **kwargs):
    try:
        return "ok", oracle(fn, *args, **kwargs)
    except Exception as exc:  # the oracle's exception type is the expectation
        return "raise", type(exc)


def check(fn, reqs, p, r=0, indices=None, layout=None, page_aligned=True):
    """Both implementations against the oracle and each other."""
    want = expect(fn, reqs, p, r, indices, layout, page_aligned)
    if currently_in_test_context():
        event(f"{want[0]} {getattr(want[1], '__name__', '')}".strip())
    if fn == "spec_v2":
        got = check_same("spec_v2_new_tokens_from_reqs", reqs, p, r, indices, layout=layout)
    elif fn == "decode":
        got = check_same("decode_new_tokens_from_reqs", reqs, p, indices, layout=layout)
    else:
        got = check_same("decode_alloc_plan_from_reqs", reqs, p, r, indices=indices,
                         layout=layout, page_aligned=page_aligned)
    # The oracle decides the value or the exception type; check_same has
    # already held the two implementations to the same message.
    assert got[:2] == want, f"{fn}: got {got}, the oracle says {want}"


# ---------------------------------------------------------- request kinds
# Each takes the committed and allocated values (MISSING: not set at all).

MISSING = object()


def _set(obj, name, value):
    if value is not MISSING:
        setattr(obj, name, value)


class Slotted:
    __slots__ = ("kv_allocated_len", "kv_committed_len")


class SlottedKV:
    __slots__ = ("kv_allocated_len", "kv_committed_len", "spare")


class WithProperties:
    """Lengths served by properties over private attributes."""

    def __init__(self, c, a):
        self._c, self._a = c, a

    @property
    def kv_committed_len(self):
        if self._c is MISSING:
            raise AttributeError("kv_committed_len")
        return self._c

    @property
    def kv_allocated_len(self):
        if self._a is MISSING:
            raise AttributeError("kv_allocated_len")
        return self._a


class PropertyFallsBack:
    """A flat property that raises AttributeError: the reads go on to req.kv."""

    def __init__(self, c, a):
        self.kv = TinyFlat(MISSING, MISSING)
        _set(self.kv, "kv_committed_len", c)
        _set(self.kv, "kv_allocated_len", a)

    @property
    def kv_committed_len(self):
        raise AttributeError("not here")


class PropertyRaises:
    """A property that raises something else: that exception comes out."""

    def __init__(self, c, a):
        self.kv_allocated_len = a

    @property
    def kv_committed_len(self):
        raise LookupError("broken")


class KvProperty:
    """req.kv computed on every read (the twin reads it once per length)."""

    def __init__(self, c, a):
        self._kv = TinyFlat(MISSING, MISSING)
        _set(self._kv, "kv_committed_len", c)
        _set(self._kv, "kv_allocated_len", a)

    @property
    def kv(self):
        return self._kv


class GetattrHook:
    """__getattr__ answers for names the instance lacks."""

    def __init__(self, c, a):
        self._values = {"kv_committed_len": c, "kv_allocated_len": a}

    def __getattr__(self, name):
        value = self.__dict__.get("_values", {}).get(name, MISSING)
        if value is MISSING:
            raise AttributeError(name)
        return value


class NonDataDescriptor:
    def __get__(self, obj, owner=None):
        return 7


class ShadowedDescriptor:
    """A non-data descriptor on the class, an instance value that shadows it."""

    kv_committed_len = NonDataDescriptor()
    kv_allocated_len = NonDataDescriptor()

    def __init__(self, c, a):
        _set(self, "kv_committed_len", c)
        _set(self, "kv_allocated_len", a)


class ClassDefault:
    """A plain class attribute stands in when the instance has none."""

    kv_committed_len = 12
    kv_allocated_len = 20

    def __init__(self, c, a):
        _set(self, "kv_committed_len", c)
        _set(self, "kv_allocated_len", a)


class FlatSubclass(FlatReq):
    """A subclass that turns one inherited dict attribute into a property."""

    @property
    def kv_committed_len(self):
        if self._c is MISSING:
            raise AttributeError("kv_committed_len")
        return self._c

    @kv_committed_len.setter
    def kv_committed_len(self, value):
        self._c = value


@dataclasses.dataclass(slots=True)
class ReqKvInfoSub(ReqKvInfo):
    extra: int = 0


def _slotted(c, a):
    req = Slotted()
    _set(req, "kv_committed_len", c)
    _set(req, "kv_allocated_len", a)
    return req


def _nested_slotted(c, a):
    req = TinyNested(0, 0)
    req.kv = SlottedKV()  # unset slots read as missing, as getattr says
    _set(req.kv, "kv_committed_len", c)
    _set(req.kv, "kv_allocated_len", a)
    return req


def _release(cls):
    def make(c, a):
        req = cls(0 if c is MISSING else c, 0 if a is MISSING else a)
        kv = getattr(req, "kv", None)
        for name, value in (("kv_committed_len", c), ("kv_allocated_len", a)):
            if value is MISSING:
                if name in vars(req):
                    delattr(req, name)
                elif kv is not None and hasattr(kv, name):
                    delattr(kv, name)  # an unset slot
        return req
    return make


def _nested_sub(c, a):
    req = NestedReq(0, 0)
    req.kv = ReqKvInfoSub()
    _set(req.kv, "kv_committed_len", c)
    _set(req.kv, "kv_allocated_len", a)
    if c is MISSING:
        del req.kv.kv_committed_len
    if a is MISSING:
        del req.kv.kv_allocated_len
    return req


def _kv_none(c, a):
    req = TinyNested(0, 0)
    req.kv = None
    return req


KINDS = {
    "flat-0.5.11": _release(FlatReq),
    "mixed-0.5.17": _release(MixedReq),
    "nested-0.5.23": _release(NestedReq),
    "tiny-flat": _release(TinyFlat),
    "tiny-nested": _release(TinyNested),
    "slots": _slotted,
    "nested-slots": _nested_slotted,
    "nested-slots-subclass": _nested_sub,
    "properties": WithProperties,
    "property-falls-back": PropertyFallsBack,
    "property-raises": PropertyRaises,
    "kv-property": KvProperty,
    "getattr-hook": GetattrHook,
    "shadowed-descriptor": ShadowedDescriptor,
    "class-default": ClassDefault,
    "flat-subclass": FlatSubclass,
    "kv-none": _kv_none,
}


class Index:
    """An integer by __index__ only."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


lengths = st.one_of(
    st.integers(0, 2**21), st.integers(0, 300),
    st.sampled_from([0, 1, 2**29 - 1, 2**29, 2**31, 2**62, INT64_MAX]),
)
odd_values = st.one_of(
    st.integers(-(2**70), -1), st.integers(INT64_MAX + 1, 2**70),
    st.builds(np.int64, st.integers(0, 2**40)), st.builds(np.int32, st.integers(0, 2**20)),
    st.builds(Index, st.integers(-5, 2**64)),
    st.sampled_from([True, False, np.bool_(True), 1.0, 2.5, None, "3", MISSING]),
)


@st.composite
def requests(draw, kinds=tuple(KINDS), odd=True):
    """A batch of a few request kinds, many requests of each."""
    chosen = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(0, 40))
    values = st.one_of(lengths, odd_values) if odd else lengths
    # Odd values rarely, so that most batches get past their first request.
    value = st.integers(0, 39).flatmap(lambda k: values if k == 0 else lengths)
    batch = [KINDS[draw(st.sampled_from(chosen))](draw(value), draw(value)) for _ in range(n)]
    # Often out of address order: the compiled kernels then walk it reordered
    # (the fixture below lets batches of any size do so).
    return draw(st.permutations(batch)) if draw(st.booleans()) else batch


@st.composite
def selections(draw, reqs):
    if draw(st.booleans()):
        return None
    n = len(reqs)
    rows = st.integers(-n - 2, n + 1) if draw(st.integers(0, 9)) == 0 or not n \
        else st.integers(-n, n - 1)
    picked = draw(st.lists(rows, max_size=2 * n + 2))
    form = draw(st.sampled_from(["list", "tuple", "int64", "int32"]))
    if form == "list":
        return picked
    if form == "tuple":
        return tuple(picked)
    return np.array(picked, dtype=form)


layouts = st.sampled_from([None, None, "flat", "mixed", "nested"])


@given(st.data(), requests(), page_sizes, reserves, layouts)
@example(None, [FlatReq(2**63 - 1, 0), FlatReq(1, 0)], 1, 0, None)
def test_spec_v2(data, reqs, p, r, layout):
    indices = data.draw(selections(reqs)) if data is not None else None
    check("spec_v2", reqs, p, r, indices, layout)


@given(st.data(), requests(), page_sizes, layouts)
def test_decode(data, reqs, p, layout):
    check("decode", reqs, p, 0, data.draw(selections(reqs)), layout)


@given(st.data(), requests(), page_sizes, reserves, layouts, st.booleans())
def test_alloc_plan(data, reqs, p, r, layout, aligned):
    check("plan", reqs, p, r, data.draw(selections(reqs)), layout, aligned)


@given(st.sampled_from([FlatReq, MixedReq, NestedReq, TinyFlat, TinyNested]),
       st.lists(st.tuples(lengths, lengths), max_size=50), page_sizes, reserves)
def test_release_layouts_agree(cls, pairs, p, r):
    """Each release's own layout gives what the default search gives."""
    reqs = [cls(c, a) for c, a in pairs]
    layout = LAYOUT_OF[cls]
    for impl in IMPLS:
        for name, args in (("spec_v2_new_tokens_from_reqs", (reqs, p, r)),
                           ("decode_new_tokens_from_reqs", (reqs, p))):
            fn = getattr(impl, name)
            assert outcome(fn, args, {"layout": layout}) == outcome(fn, args, {})


@given(requests(odd=False), page_sizes, reserves)
def test_from_reqs_equal_array_functions(reqs, p, r):
    def length(req, attr):
        try:
            return _read(req, attr, "either")
        except Exception:
            return None

    c = [length(q, "kv_committed_len") for q in reqs]
    a = [length(q, "kv_allocated_len") for q in reqs]
    if None in c or None in a:
        return
    # Value, or exception type: the array functions word messages by argument
    # name and row (committed[3]), the request-object ones by request (reqs[3]).
    assert outcome(kvest.spec_v2_new_tokens_from_reqs, (reqs, p, r), {})[:2] == outcome(
        reference.spec_v2_new_tokens, (c, a, p, r), {})[:2]
    assert outcome(kvest.decode_new_tokens_from_reqs, (reqs, p), {})[:2] == outcome(
        reference.decode_new_tokens, (c, p), {})[:2]
    plan = outcome(kvest.decode_alloc_plan_from_reqs, (reqs, p, r), {})
    assert plan[:2] == outcome(reference.decode_alloc_plan, (c, a, p, r), {})[:2]


# ------------------------------------------------------- types that change

def _mutations():
    """(description, function changing the class) pairs, applied between calls."""
    def add_property(cls):
        cls.kv_committed_len = property(lambda self: 5)

    def add_raising_property(cls):
        def boom(self):
            raise AttributeError("gone")
        cls.kv_committed_len = property(boom)

    def add_class_value(cls):
        cls.kv_allocated_len = 10**6

    def add_getattr(cls):
        cls.__getattr__ = lambda self, name: 9 if name.startswith("kv_") else None

    def add_kv_property(cls):
        cls.kv = property(lambda self: TinyFlat(2, 3))

    def remove(cls):
        for name in ("kv_committed_len", "kv_allocated_len", "__getattr__", "kv"):
            if name in vars(cls):
                delattr(cls, name)

    return [add_property, add_raising_property, add_class_value, add_getattr,
            add_kv_property, remove]


@pytest.mark.parametrize("base", [FlatReq, NestedReq, TinyFlat, TinyNested])
@given(st.lists(st.sampled_from(_mutations()), max_size=6),
       st.lists(st.tuples(lengths, lengths), min_size=1, max_size=20), page_sizes)
def test_types_mutated_between_calls(base, changes, pairs, p):
    # A fresh subclass per example: the mutations never leak out.
    cls = type(f"Mutable{base.__name__}", (base,), {})
    reqs = [cls(c, a) for c, a in pairs]
    check("spec_v2", reqs, p, 16)
    for change in changes:
        change(cls)
        check("spec_v2", reqs, p, 16)
        check("decode", reqs, p)
        check("plan", reqs, p, 16)


def test_the_managed_dict_read_agreed_at_import():
    """The managed-dict read (three words before the object, fence.h) is taken
    only once its import-time check agreed with CPython's own lookup: on the
    default build of 3.11 to 3.13 it does."""
    from kvest import _reqs, _writes

    private = not _reqs._PUBLIC_API_ONLY and (3, 11) <= sys.version_info[:2] <= (3, 13)
    assert _reqs._MANAGED_DICT == _writes._MANAGED_DICT == private


def test_dict_entries_read_where_they_sit():
    """Lengths in instance dicts of every kind the entry read meets: split
    tables (few attributes), combined ones with str keys and with a non-str key,
    entries deleted and added back (a learned hint then points elsewhere), each
    request's dict in its own order."""
    from kvest import _reqs, _writes

    private = not _reqs._PUBLIC_API_ONLY and (3, 11) <= sys.version_info[:2] <= (3, 13)
    assert _reqs._DICT_ENTRIES == _writes._DICT_ENTRIES == private

    class Req:
        pass

    rng = random.Random(7)
    reqs = []
    for i in range(64):
        req = Req()
        names = [f"a{j}" for j in range(rng.choice((0, 3, 40)))]
        rng.shuffle(names)
        for name in names[: len(names) // 2]:
            setattr(req, name, -i)
        req.kv_committed_len = rng.randrange(0, 200)
        req.kv_allocated_len = req.kv_committed_len + rng.randrange(0, 20)
        for name in names[len(names) // 2:]:
            setattr(req, name, i)
        if i % 7 == 3:
            del req.kv_committed_len
            req.kv_committed_len = 16 * i
        if i % 11 == 5:
            req.__dict__[i] = "a key that is not a str"
        reqs.append(req)
    for _ in range(3):  # hints learned on the first call, used on the next ones
        for pure in (False, True):
            c = [r.kv_committed_len for r in reqs]
            a = [r.kv_allocated_len for r in reqs]
            assert kvest.decode_new_tokens_from_reqs(reqs, 16, pure=pure) == \
                reference.decode_new_tokens(c, 16)
            assert kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 5, pure=pure) == \
                reference.spec_v2_new_tokens(c, a, 16, 5)
        kvest.add_to_attrs(reqs, (("kv_allocated_len",),), 1)
        assert [r.kv_allocated_len for r in reqs] == [x + 1 for x in a]


def test_types_reborn_at_the_same_address():
    """Routes worked out for a type outlive its call, keyed by type and version
    tag: a new class where a freed one lay (slots where it kept a dict, or the
    other way round) is worked out anew."""
    import gc

    for round_ in range(40):
        slotted = round_ % 2 == 0
        body = ({"__slots__": ("kv_committed_len", "kv_allocated_len")} if slotted else {})
        cls = type(f"Reborn{round_}", (), body)
        reqs = []
        for c in (round_, 16, 17):
            req = cls()
            req.kv_committed_len, req.kv_allocated_len = c, c + round_ % 5
            reqs.append(req)
        for pure in (False, True):
            for impl in IMPLS:
                assert impl.decode_new_tokens_from_reqs(reqs, 16, pure=pure) == \
                    16 * sum(1 for r in reqs if r.kv_committed_len % 16 == 0)
                assert impl.spec_v2_new_tokens_from_reqs(reqs, 16, 3, pure=pure) == \
                    reference.spec_v2_new_tokens([r.kv_committed_len for r in reqs],
                                                 [r.kv_allocated_len for r in reqs], 16, 3)
        del reqs, req, cls
        gc.collect()


def test_type_mutated_during_a_call():
    """A property that changes another request type mid-call: later requests see it."""
    class Victim(TinyFlat):
        pass

    class Saboteur:
        kv_allocated_len = 0

        @property
        def kv_committed_len(self):
            Victim.kv_committed_len = property(lambda self: 1000)
            return 0

    def batch():
        return [Victim(16, 16), Saboteur(), Victim(16, 16)]

    for impl in IMPLS:
        for name in ("kv_committed_len",):
            if name in vars(Victim):
                delattr(Victim, name)
        # 16 -> 32 | 0 | 1000 + 16 = 1016 -> 1024, minus 16
        assert impl.spec_v2_new_tokens_from_reqs(batch(), 16, 16) == 16 + 16 + 1008


def test_kv_property_read_as_often_as_the_twin_reads_it():
    class Counting:
        reads = 0

        @property
        def kv(self):
            Counting.reads += 1
            return TinyFlat(5, 8)

    counts = []
    for impl in IMPLS:
        Counting.reads = 0
        impl.spec_v2_new_tokens_from_reqs([Counting(), Counting()], 16, 4)
        counts.append(Counting.reads)
    assert counts[0] == counts[1] == 4


def test_list_changed_during_the_walk():
    """A request that empties the list: the walk stops where a list iterator does,
    and the request itself, whose only other reference was the list's, stays
    alive until both its lengths are read (a regression memcheck found)."""

    class Emptier:
        freed = False

        def __init__(self, batch):
            self.batch = batch

        def __del__(self):
            Emptier.freed = True

        @property
        def kv_committed_len(self):
            self.batch.clear()
            return 16

        @property
        def kv_allocated_len(self):
            assert not Emptier.freed, "read after the request was freed"
            return 0

    for impl in IMPLS:
        Emptier.freed = False
        reqs: list = []
        reqs.extend([Emptier(reqs), TinyFlat(1, 1), TinyFlat(2, 2)])
        assert impl.spec_v2_new_tokens_from_reqs(reqs, 16, 0) == 16
        assert Emptier.freed  # and it is freed afterwards: no reference kept


# ---------------------------------------------------------- fixed cases

GOOD = [TinyFlat(5, 8), TinyNested(16, 16), _slotted(31, 32), WithProperties(40, 48),
        TinyFlat(np.int64(3), np.int32(3))]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_accepted_request_kinds(impl):
    # (5,8): 16-16 | (16,16): 32-16 | (31,32): 48-32 | (40,48): 48-48 | (3,3): 16-16
    assert impl.spec_v2_new_tokens_from_reqs(GOOD, 16, 6) == 32
    assert impl.spec_v2_new_tokens_from_reqs(iter(GOOD), 16, 6) == 32
    assert impl.spec_v2_new_tokens_from_reqs(tuple(GOOD), 16, 6) == 32
    assert impl.decode_new_tokens_from_reqs(GOOD, 16) == 16
    assert impl.spec_v2_new_tokens_from_reqs(GOOD, 16, 6, [1, -1, 1]) == 32
    assert impl.spec_v2_new_tokens_from_reqs(GOOD, 16, 6, np.array([], np.int64)) == 0
    plan = impl.decode_alloc_plan_from_reqs(GOOD, 16, 6, dtype=np.int32)
    assert plan.cur.dtype == plan.nxt.dtype == np.int32
    assert plan.cur.tolist() == [8, 16, 32, 48, 3]
    assert plan.nxt.tolist() == [16, 32, 48, 48, 16]
    assert (plan.num_tokens, plan.num_pages) == (53, 2)
    assert impl.decode_alloc_plan_from_reqs(GOOD, 16, 6).cur.dtype == np.int64


BAD_REQS = [
    ([TinyFlat(1, 1), object()], AttributeError),
    ([_release(TinyFlat)(1, MISSING)], AttributeError),
    ([_kv_none(1, 1)], AttributeError),
    ([_nested_slotted(MISSING, 4)], AttributeError),  # an unset slot
    ([TinyFlat(1.0, 1)], TypeError),
    ([TinyFlat(True, 1)], TypeError),
    ([TinyFlat(None, 1)], TypeError),
    ([TinyFlat("3", 1)], TypeError),
    ([PropertyRaises(1, 1)], TypeError),  # the property's LookupError, named and wrapped
    ([TinyFlat(-1, 0)], ValueError),
    ([TinyFlat(0, -1)], ValueError),
    ([TinyFlat(2**63, 0)], OverflowError),
    ([TinyFlat(2**63 - 1, 0)], OverflowError),
    # A huge row (checked path) then a small one (fast path) past int64.
    ([TinyFlat(2**63 - 1, 0), TinyFlat(1, 0)], OverflowError),
    (None, TypeError),
    (5, TypeError),
]


@pytest.mark.parametrize(("reqs", "exc"), BAD_REQS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_bad_requests(impl, reqs, exc):
    with pytest.raises(exc):
        impl.spec_v2_new_tokens_from_reqs(reqs, 16, 6)
    check_same("spec_v2_new_tokens_from_reqs", reqs, 16, 6)
    check_same("decode_new_tokens_from_reqs", reqs, 16)
    check_same("decode_alloc_plan_from_reqs", reqs, 16, 6)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_bad_arguments(impl):
    reqs = [TinyFlat(1, 1)] * 3
    with pytest.raises(IndexError, match=r"indices\[1\]"):
        impl.spec_v2_new_tokens_from_reqs(reqs, 16, 6, [0, 3])
    with pytest.raises(IndexError):
        impl.decode_new_tokens_from_reqs(reqs, 16, (-4,))
    with pytest.raises(TypeError):
        impl.decode_new_tokens_from_reqs(reqs, 16, [0.0])
    with pytest.raises(TypeError, match="sequence"):
        impl.spec_v2_new_tokens_from_reqs(iter(reqs), 16, 6, [0])
    with pytest.raises(ValueError, match="layout"):
        impl.spec_v2_new_tokens_from_reqs(reqs, 16, 6, layout="sideways")
    with pytest.raises(TypeError, match="layout"):
        impl.decode_new_tokens_from_reqs(reqs, 16, layout=1)
    with pytest.raises(TypeError, match="dtype"):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 6, dtype=np.float64)
    with pytest.raises(TypeError, match="dtype"):
        impl.decode_alloc_plan_from_reqs(
            reqs, 16, 6, dtype=np.int32, out=(np.empty(3, np.int64), np.empty(3, np.int64)))
    with pytest.raises(ValueError):
        impl.decode_alloc_plan_from_reqs(
            reqs, 16, 6, out=(np.empty(2, np.int64), np.empty(2, np.int64)))
    shared = np.empty(3, np.int64)
    with pytest.raises(ValueError):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 6, out=(shared, shared))


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_plan_out_buffers_and_int32_overflow(impl):
    reqs = [TinyNested(100, 90), TinyNested(2**31 - 10, 2**31 + 5)]
    cur, nxt = np.empty(2, np.int64), np.empty(2, np.int32)
    with pytest.raises(TypeError, match="same dtype"):  # as decode_alloc_plan's out=
        impl.decode_alloc_plan_from_reqs(reqs, 16, 64, out=(cur, nxt))
    cur, nxt = np.empty(2, np.int32), np.empty(2, np.int32)
    with pytest.raises(OverflowError, match=r"out\[0\]\[1\]"):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 64, out=(cur, nxt))
    cur, nxt = np.empty(1, np.int32), np.empty(1, np.int32)
    with pytest.raises(OverflowError, match=r"out\[1\]\[0\]"):  # cur fits, nxt does not
        impl.decode_alloc_plan_from_reqs([TinyNested(2**31 - 10, 5)], 16, 64, out=(cur, nxt))
    with pytest.raises(OverflowError, match=r"out\[0\]\[0\]"):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 0, dtype="int32", indices=[1])
    plan = impl.decode_alloc_plan_from_reqs(reqs, 16, 64, indices=[0, 0], dtype="int32")
    assert plan.cur.tolist() == [90, 90] and plan.nxt.tolist() == [176, 176]
    cur, nxt = np.zeros(1, np.int32), np.zeros(1, np.int32)
    plan = impl.decode_alloc_plan_from_reqs(reqs[:1], 16, 64, out=(cur, nxt), layout="nested")
    assert plan.cur is cur and plan.nxt is nxt and nxt[0] == 176
    unaligned = impl.decode_alloc_plan_from_reqs(reqs[:1], 16, 64, page_aligned=False)
    assert unaligned.nxt.tolist() == [164] and unaligned.num_pages * 16 == 80


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("n", [3, 2047, 2048, 4096])
def test_int32_plan_overflow_names_the_request(impl, n):
    """Whichever walk a batch's size picks, an int32 row that does not fit
    names the request it came from, beside the row it was for."""
    reqs = [TinyNested(5, 8) for _ in range(n)]
    reqs[n // 2] = TinyNested(2**31 - 10, 2**31 + 5)
    with pytest.raises(OverflowError, match=rf"^reqs\[{n // 2}\]: out\[0\]\[{n // 2}\] "):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 64, dtype="int32")
    with pytest.raises(OverflowError, match=rf"^reqs\[{n // 2}\]: out\[0\]\[1\] "):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 64, [0, n // 2], dtype="int32")


def test_bad_request_messages_name_the_position():
    for impl in IMPLS:
        with pytest.raises(AttributeError, match=r"reqs\[1\]"):
            impl.spec_v2_new_tokens_from_reqs([TinyFlat(1, 1), object()], 16, 6)
        with pytest.raises(ValueError, match=r"reqs\[0\]"):
            impl.decode_new_tokens_from_reqs([TinyFlat(-1, 0)], 16)
        with pytest.raises(ValueError, match=r"reqs\[2\]"):
            impl.decode_new_tokens_from_reqs([TinyFlat(-1, 0)] * 3, 16, [-1])
        with pytest.raises(AttributeError, match=r"reqs\[0\] has no \.kv\.kv_committed_len"):
            impl.decode_new_tokens_from_reqs([TinyFlat(1, 1)], 16, layout="nested")


# ------------------------------------------------------------- beam rows

class BeamGroup:
    """Stands in for SGLang's BeamGroup: num_member_rows is a property."""

    def __init__(self, rows):
        self._rows = rows

    @property
    def num_member_rows(self):
        if isinstance(self._rows, Exception):
            raise self._rows
        return self._rows


class BeamProperty(TinyNested):
    """beam_group computed on every read (upstream's expression reads it twice)."""

    reads = 0

    def __init__(self, group):
        super().__init__(0, 0)
        self._group = group

    @property
    def beam_group(self):
        type(self).reads += 1
        return self._group


def _beam_req(kind, group):
    if kind == "missing":
        return TinyFlat(0, 0)
    if kind == "property":
        return BeamProperty(group)
    req = _release(NestedReq if kind == "nested" else TinyFlat)(0, 0)
    req.beam_group = group
    return req


beam_values = st.one_of(
    st.integers(0, 64), st.integers(-(2**70), 2**70),
    st.builds(np.int64, st.integers(-5, 5)), st.sampled_from([2.5, LookupError("rows")]),
)
beam_groups = st.one_of(st.none(), st.none(), st.builds(BeamGroup, beam_values))


@st.composite
def beam_batches(draw):
    kinds = st.sampled_from(["nested", "tiny", "property", "nested", "tiny"]
                            + (["missing"] if draw(st.integers(0, 4)) == 0 else []))
    return [_beam_req(draw(kinds), draw(beam_groups)) for _ in range(draw(st.integers(0, 30)))]


def _beam_oracle(reqs, indices):
    total = 0
    for r in _rows(reqs, indices):
        if r.beam_group is not None:
            total += r.beam_group.num_member_rows
    return total


def _typed(fn, *args):
    kind, value = outcome(fn, args, {})[:2]
    return kind, (type(value), repr(value)) if kind == "ok" else value


def _groups_oracle(reqs, indices):
    return sum(1 for r in _rows(reqs, indices) if r.beam_group is not None)


# SGLang's num_beam_member_rows, and append_beam_tail's skip test counted.
@pytest.mark.parametrize(("name", "oracle"), [("beam_member_rows_from_reqs", _beam_oracle),
                                              ("beam_groups_from_reqs", _groups_oracle)])
@given(data=st.data(), reqs=beam_batches())
def test_beam_readers(name, oracle, data, reqs):
    """The same answer or exception as upstream's expression, with a property
    read as often as upstream reads it."""
    indices = data.draw(selections(reqs))
    want = _typed(oracle, reqs, indices)
    event(want[0])
    for impl in IMPLS:
        BeamProperty.reads = 0
        assert _typed(getattr(impl, name), reqs, indices) == want
        reads = BeamProperty.reads
        BeamProperty.reads = 0
        _typed(oracle, reqs, indices)
        assert reads == BeamProperty.reads


def test_beam_groups_fixed():
    reqs = [_beam_req("nested", None), _beam_req("nested", BeamGroup(3)),
            _beam_req("tiny", BeamGroup(0)), _beam_req("property", None)]
    for impl in IMPLS:
        assert impl.beam_groups_from_reqs(reqs) == 2
        assert impl.beam_groups_from_reqs(reqs, [0, 3, -4]) == 0
        assert impl.beam_groups_from_reqs(reqs, np.array([1, 1])) == 2
        assert impl.beam_groups_from_reqs(iter(reqs)) == 2
        assert impl.beam_groups_from_reqs([]) == 0
        with pytest.raises(AttributeError, match=r"reqs\[4\] has no .beam_group"):
            impl.beam_groups_from_reqs([*reqs, TinyFlat(1, 1)])
        with pytest.raises(IndexError):
            impl.beam_groups_from_reqs(reqs, [4])


def test_beam_member_rows_fixed():
    reqs = [_beam_req("nested", None), _beam_req("nested", BeamGroup(3)),
            _beam_req("tiny", BeamGroup(4)), _beam_req("nested", None)]
    for impl in IMPLS:
        assert impl.beam_member_rows_from_reqs(reqs) == 7
        assert impl.beam_member_rows_from_reqs(reqs, [1, 1, -2]) == 10
        assert impl.beam_member_rows_from_reqs([]) == 0
        with pytest.raises(AttributeError):
            impl.beam_member_rows_from_reqs([*reqs, TinyFlat(1, 1)])
        big = impl.beam_member_rows_from_reqs([_beam_req("tiny", BeamGroup(2**62))] * 3)
        assert big == 3 * 2**62 and type(big) is int


# ------------------------------------------------------- references kept

def _refcounts(objs):
    import sys

    return [sys.getrefcount(o) for o in objs]


def test_no_reference_leaked_or_lost():
    """Every path (fast reads, slow values, errors) leaves reference counts as they were."""
    import gc

    big, odd = 2**70, Index(40)
    reqs = [_release(NestedReq)(10**6 + 5, 10**6 + 9), _release(FlatReq)(17, 20),
            _release(MixedReq)(33, 40), _nested_slotted(7, 9), KvProperty(3, 4),
            WithProperties(5, 8), TinyFlat(odd, 50), TinyNested(np.int64(3), 3)]
    bad = [*reqs, TinyFlat(big, 1)]
    for r in reqs:
        r.beam_group = BeamGroup(2)
    watched = [*reqs, *(getattr(r, "kv", None) for r in reqs), big, odd, reqs[0].kv]
    calls = [
        lambda: kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 8),
        lambda: kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 8, [0, -1, 3, 3]),
        lambda: kvest.decode_new_tokens_from_reqs(reqs, 16),
        lambda: kvest.decode_alloc_plan_from_reqs(reqs, 16, 8, dtype=np.int32),
        lambda: kvest.decode_new_tokens_from_reqs(reqs[:1], 16, layout="nested"),
        lambda: kvest.beam_member_rows_from_reqs(reqs, (1, 2)),
        lambda: kvest.spec_v2_new_tokens_from_reqs(bad, 16, 8),
        lambda: kvest.decode_alloc_plan_from_reqs(bad, 16, 8),
        lambda: kvest.decode_new_tokens_from_reqs(reqs, 16, layout="flat"),
    ]
    for call in calls:  # warm up: caches, interned names, the plan's arrays
        outcome(call, (), {})
    gc.collect()
    before = _refcounts(watched)
    for _ in range(50):
        for call in calls:
            outcome(call, (), {})
    gc.collect()
    assert _refcounts(watched) == before


# ------------------------------------------------------- the walk's order
# A batch out of address order is read in address order (addrorder.h), where
# that cannot show: only reads that run no code, into a count kept aside until
# the walk ends.  Anything else gives up and walks in the given order.

def _scattered(make, n, seed=0):
    """n requests from make(i) spread over megabytes, as a server's are (the
    radix sort then takes more than one pass), in a shuffled order; and what
    holds the memory between them."""
    import random

    reqs, filler = [], []
    for i in range(n):
        reqs.append(make(i))
        filler.append([make(i) for _ in range(40)])
    random.Random(seed).shuffle(reqs)
    ids = [id(q) for q in reqs]
    assert ids != sorted(ids)
    assert (max(ids) - min(ids)) >> 8 >= 1 << 11, "the batch should need two radix passes"
    return reqs, filler


def _reqs_module():
    from kvest import _reqs

    return _reqs


def _walks():
    return _reqs_module()._address_order()[:2]


def _beamless(req):
    """req, with ``beam_group = None`` where it can hold one and has none."""
    if hasattr(req, "__dict__") and not hasattr(req, "beam_group"):
        req.beam_group = None
    return req


ORDERED_KINDS = {
    "nested-0.5.23": lambda i: _release(NestedReq)(i * 37 % 4099, i * 37 % 4099 + i % 9),
    "flat-0.5.11": lambda i: _beamless(_release(FlatReq)(i * 11 % 1031, i * 11 % 1031 + i % 3)),
    "tiny-nested": lambda i: _beamless(_release(TinyNested)(i * 5 % 64, i * 5 % 64 + 2)),
    "slots": lambda i: _slotted(i % 50, i % 50 + 17),
    "nested-slots": lambda i: _beamless(_nested_slotted(i % 33, 40)),
}


@compiled_only
@pytest.mark.parametrize("kind", list(ORDERED_KINDS))
def test_scattered_batches_are_read_in_address_order(kind):
    """Whole batches and selections: the oracle's numbers, the reordered walk
    taken every time (after the first call, which learns where the names sit)."""
    reqs, _filler = _scattered(ORDERED_KINDS[kind], 700)
    layout = {"nested-0.5.23": "nested", "tiny-nested": "nested",
              "nested-slots": "nested"}.get(kind)
    rows = [*range(len(reqs) - 1, -1, -1), 3, 3, -1]
    beams = (kvest.beam_groups_from_reqs, kvest.beam_member_rows_from_reqs) \
        if hasattr(reqs[0], "beam_group") else ()
    check("decode", reqs, 16, 0, None, layout)  # learns where the names sit
    check("spec_v2", reqs, 16, 7, None, layout)
    for beam in beams:
        beam(reqs)
    before = _walks()
    for indices in (None, rows, tuple(rows), np.array(rows)):
        check("decode", reqs, 16, 0, indices, layout)
        check("spec_v2", reqs, 16, 7, indices, layout)
        for beam in beams:
            assert beam(reqs, indices) == 0  # beam_group is None: read without code
    after = _walks()
    # (read in order where dict entries are not read directly: the public API)
    taken = 4 * (2 + len(beams)) if _reqs_module()._DICT_ENTRIES else 0
    assert (after[0] - before[0], after[1] - before[1]) == (taken, 0)


@compiled_only
def test_plan_rows_keep_the_given_order():
    """The plan's rows are positional: never the reordered walk."""
    reqs, _filler = _scattered(ORDERED_KINDS["nested-0.5.23"], 300)
    before = _walks()
    check("plan", reqs, 16, 7, None, "nested")
    check("plan", reqs, 16, 7, [5, 1, -3], "nested")
    assert _walks() == before


@orders_only
@pytest.mark.parametrize("spoiler", ["property", "negative", "np.int64", "missing", "huge",
                                     "beam group"])
def test_a_request_the_pure_read_cannot_take_gives_up(spoiler):
    """One request that needs Python (a property, a value the input rule
    judges, a missing name, an overflow, a beam group's rows): the walk gives
    up, and the walk in the given order answers -- the same value, or the same
    exception naming the same position as the twin's."""
    reqs, _filler = _scattered(lambda i: _beamless(_release(TinyNested)(i % 40, 40)), 500, seed=1)
    # The spoilers sit late in the given order and early in address order,
    # twice, so that an error names the first in the given order.
    lowest = sorted(range(len(reqs)), key=lambda i: id(reqs[i]))[:40]
    late = [i for i in lowest if i > len(reqs) // 2][:2]
    assert len(late) == 2
    for i in late:
        if spoiler == "property":
            reqs[i] = _beamless(WithProperties(i % 40, 40))
        elif spoiler == "negative":
            reqs[i].kv.kv_committed_len = -1
        elif spoiler == "np.int64":
            reqs[i].kv.kv_committed_len = np.int64(5)
        elif spoiler == "missing":
            del reqs[i].kv.kv_committed_len
        elif spoiler == "huge":
            reqs[i].kv.kv_committed_len = INT64_MAX
        else:
            reqs[i].beam_group = BeamGroup(3)
    check("decode", reqs, 16, 0, None, "nested")  # learns where the names sit
    kvest.beam_groups_from_reqs(reqs)
    before = _walks()
    check("decode", reqs, 16, 0, None, "nested")
    check("spec_v2", reqs, 16, 7, None, "nested")
    rows = check_same("beam_member_rows_from_reqs", reqs)
    assert rows == ("ok", 6 if spoiler == "beam group" else 0)
    after = _walks()
    if spoiler in ("beam group", "huge"):
        # Only one call needs more: the rows' sum (Python's), the spec-v2
        # total (an overflow); the decode count takes any int64.
        assert after[0] - before[0] == 2 and after[1] - before[1] == 1
    elif spoiler == "property":  # WithProperties is no nested request: read flat
        assert after[1] > before[1]
    else:
        assert after[0] - before[0] == 1 and after[1] - before[1] == 2


def _jumps_far(batch):
    """The address-order walk's rule (docs/development.md): more than one step
    in 8 jumps 32 KiB or more."""
    ids = [id(q) for q in batch]
    return sum(abs(a - b) >= 1 << 15 for a, b in itertools.pairwise(ids)) > len(batch) // 8


@compiled_only
def test_small_or_near_batches_keep_the_given_order():
    """Only a batch that jumps around memory is reordered: one made request
    after request (here also reversed) is walked as given, where the allocator
    put it close together (pymalloc does; a sanitizer's allocator may not), and
    so is one below the least size."""
    from kvest import _reqs

    shuffled, _filler = _scattered(ORDERED_KINDS["nested-0.5.23"], 60)
    made_together = [_release(NestedReq)(i, i + 1) for i in range(60)]
    least = _reqs._address_order()[2]
    try:
        kvest.decode_new_tokens_from_reqs(shuffled, 16, layout="nested")  # the hints
        for batch in (made_together, made_together[::-1], shuffled):
            before = _walks()
            kvest.decode_new_tokens_from_reqs(batch, 16, layout="nested")
            assert _walks()[0] - before[0] == (_jumps_far(batch) if _reqs._DICT_ENTRIES else 0)
        assert _jumps_far(shuffled)
        _reqs._address_order(61)
        before = _walks()
        kvest.decode_new_tokens_from_reqs(shuffled, 16, layout="nested")
        assert _walks() == before  # too small
    finally:
        _reqs._address_order(least)


@orders_only
def test_reordered_walks_keep_reference_counts():
    import gc

    reqs, _filler = _scattered(ORDERED_KINDS["nested-0.5.23"], 400)
    watched = [*reqs, *(q.kv for q in reqs)]
    calls = [lambda: kvest.decode_new_tokens_from_reqs(reqs, 16, layout="nested"),
             lambda: kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 8, layout="nested"),
             lambda: kvest.beam_groups_from_reqs(reqs, list(range(399, -1, -1)))]
    for call in calls:  # learns where the names sit
        call()
    gc.collect()
    before = _refcounts(watched)
    walks = _walks()
    for _ in range(20):
        for call in calls:
            call()
    gc.collect()
    assert _walks()[0] == walks[0] + 60
    assert _refcounts(watched) == before


# ---------------------------------------------------------------- pure mode
# pure=True: no code of the caller's may run.  A profile hook sees every
# Python function called during the call; only kvest's own and NumPy's may
# appear.  Each function either answers as without pure (so the answer is the
# oracle's, checked above) or raises kvest.ImpureRequest, and both
# implementations decide alike, to the message.

def _callers_code(fn, args, kwargs):
    """(outcome, the caller's Python functions that ran during the call)."""
    ran: list[str] = []

    def hook(frame, event_, arg):
        # The caller's code: the requests' classes, defined in the tests (and
        # kvest's own stand-ins); not a library's (an import, a GC callback).
        if event_ == "call":
            path = frame.f_code.co_filename.replace("\\", "/")
            if path.startswith(_TESTS) or "/kvest/_bench/" in path:
                ran.append(f"{frame.f_code.co_name} ({path})")

    import sys

    error = value = None
    sys.setprofile(hook)
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        error = exc
    finally:
        sys.setprofile(None)
    if error is not None:
        return ("raise", type(error), str(error)), ran
    if isinstance(value, kvest.AllocPlan):
        value = (value.cur.tolist(), value.nxt.tolist(), value.num_tokens, value.num_pages)
    return ("ok", value), ran


_TESTS = __file__.replace("\\", "/").rsplit("/", 1)[0] + "/"

PURE_CALLS = {
    "spec_v2": lambda impl, reqs, p, r, idx, layout: (
        impl.spec_v2_new_tokens_from_reqs, (reqs, p, r, idx), {"layout": layout}),
    "decode": lambda impl, reqs, p, r, idx, layout: (
        impl.decode_new_tokens_from_reqs, (reqs, p, idx), {"layout": layout}),
    "plan": lambda impl, reqs, p, r, idx, layout: (
        impl.decode_alloc_plan_from_reqs, (reqs, p, r, idx),
        {"layout": layout, "dtype": np.int32 if r % 2 else None}),
}


@pytest.mark.parametrize("fn", list(PURE_CALLS))
@given(st.data(), requests(), page_sizes, reserves, layouts)
def test_pure_reads_answer_or_refuse_without_the_callers_code(fn, data, reqs, p, r, layout):
    indices = data.draw(selections(reqs))
    outcomes = []
    for impl in IMPLS:
        call, args, kwargs = PURE_CALLS[fn](impl, reqs, p, r, indices, layout)
        got, ran = _callers_code(call, args, {**kwargs, "pure": True})
        assert ran == [], f"{impl.__name__} ran the caller's code: {ran}"
        if got[0] == "ok" or got[1] is not kvest.ImpureRequest:
            assert got == outcome(call, args, kwargs), impl.__name__
        outcomes.append(got)
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_reads_refuse_what_needs_the_callers_code(impl):
    """Properties, __getattr__, a value read by __index__ or not an exact int64
    int, a dict key of its own kind, a container or argument that is not the
    interpreter's own: ImpureRequest naming it; plain requests are read."""
    plain = [FlatReq(5, 8), NestedReq(16, 16)]
    assert impl.spec_v2_new_tokens_from_reqs(plain, 16, 4, pure=True) == \
        impl.spec_v2_new_tokens_from_reqs(plain, 16, 4)
    odd = FlatReq(1, 1)
    del odd.kv_committed_len
    odd.__dict__[Index(0)] = 0  # could stand for the name: only its own __eq__ knows
    for late in [WithProperties(1, 2), GetattrHook(1, 2), FlatReq(Index(3), 4),
                 FlatReq(2**63, 0), odd]:
        with pytest.raises(kvest.ImpureRequest, match=r"^reqs\[1\] cannot be read"):
            impl.decode_new_tokens_from_reqs([FlatReq(1, 1), late], 16, pure=True)
    # req.kv is None: None has no such attribute, and nothing of the caller's runs to say so.
    with pytest.raises(AttributeError, match=r"reqs\[0\] has neither"):
        impl.decode_new_tokens_from_reqs([_kv_none(1, 1)], 16, pure=True)
    for kwargs, name in [({"reqs": iter(plain)}, "reqs"), ({"page_size": Index(16)}, "page_size"),
                         ({"indices": [Index(0)]}, r"indices\[0\]"),
                         ({"indices": range(2)}, "indices"), ({"layout": _Str("flat")}, "layout")]:
        args = {"reqs": plain, "page_size": 16, "indices": None, "layout": None, **kwargs}
        with pytest.raises(kvest.ImpureRequest, match=f"^{name} cannot be read"):
            impl.decode_new_tokens_from_reqs(args["reqs"], args["page_size"], args["indices"],
                                             layout=args["layout"], pure=True)


class _Str(str):
    def __eq__(self, other):
        raise AssertionError("the caller's code ran")

    __hash__ = str.__hash__


@dataclasses.dataclass(slots=True)
class _Group:
    num_member_rows: int


class _PropGroup:
    @property
    def num_member_rows(self):
        raise AssertionError("the caller's code ran")


class _Beamed:
    def __init__(self, group):
        self.beam_group = group


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_pure_beam_readers(impl):
    reqs = [_Beamed(None), _Beamed(_Group(3)), _Beamed(_Group(4))]
    assert impl.beam_member_rows_from_reqs(reqs, pure=True) == 7
    assert impl.beam_groups_from_reqs(reqs, [0, 2, -1], pure=True) == 2
    odd = [_Beamed(None), _Beamed(_PropGroup())]
    assert impl.beam_groups_from_reqs(odd, pure=True) == 1
    for late in [_PropGroup(), _Group(1.5), _Group(2**63)]:
        with pytest.raises(kvest.ImpureRequest, match=r"^reqs\[1\] cannot be read"):
            impl.beam_member_rows_from_reqs([_Beamed(None), _Beamed(late)], pure=True)
    with pytest.raises(AttributeError, match=r"reqs\[0\] has no \.beam_group$"):
        impl.beam_groups_from_reqs([object()], pure=True)


# ------------------------------------------------------------------- runs
# A batch of one class is read a run at a time (reqattr.h, 64 rows a chunk):
# the per-type work once, then only the loads and a type compare per link.
# A request that reads any other way ends the run, is read the usual way, and
# a new run starts after it.

RUN_BASES = {
    "nested-0.5.23": ("nested", _release(NestedReq)),
    "mixed-0.5.17": ("mixed", _release(MixedReq)),
    "flat-0.5.11": ("flat", _release(FlatReq)),
    "slots": ("flat", _slotted),
    "nested-slots": ("nested", _nested_slotted),
}


def _moved(req):
    """req with the name read from its dict moved to the dict's end: another
    position than the run learned (the dict read then searches)."""
    for name in ("kv", "kv_committed_len"):
        if name in getattr(req, "__dict__", {}):
            value = vars(req).pop(name)
            setattr(req, name, value)
    return req


_SUBCLASSES: dict[object, type] = {}


def _retyped(req):
    """req as an instance of a subclass that changes nothing (one per class: a
    new class per batch would crowd out the dict positions kvest keeps)."""
    cls = type(req)
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"{cls.__name__}Sub", (cls,), {"__slots__": ()} if hasattr(
            cls, "__slots__") and not hasattr(req, "__dict__") else {})
    req.__class__ = _SUBCLASSES[cls]
    return req


def _shadowed(req):
    """req as an instance of a subclass whose property stands for the first
    name a run reads, and answers one more: a run that kept to the routes of
    the requests before would read the instance's own value instead."""
    import types

    cls = type(req)
    if (cls, "property") not in _SUBCLASSES:
        if hasattr(req, "kv_committed_len"):  # flat: the length itself
            own = getattr(cls, "kv_committed_len", None)  # a slot's member, or none

            def committed_plus_one(self):
                raw = own.__get__(self, cls) if own is not None else vars(self)[
                    "kv_committed_len"]
                return raw + 1

            ns = {"kv_committed_len": property(committed_plus_one)}
        else:  # nested: req.kv, with committed one more

            def kv_plus_one(self):
                kv = vars(self)["kv"]
                return types.SimpleNamespace(kv_committed_len=kv.kv_committed_len + 1,
                                             kv_allocated_len=kv.kv_allocated_len)

            ns = {"kv": property(kv_plus_one)}
        if not hasattr(req, "__dict__"):
            ns["__slots__"] = ()
        _SUBCLASSES[cls, "property"] = type(f"{cls.__name__}Property", (cls,), ns)
    req.__class__ = _SUBCLASSES[cls, "property"]
    return req


def _kv_retyped(req):
    kv = getattr(req, "kv", None)
    if isinstance(kv, ReqKvInfo):
        sub = ReqKvInfoSub()
        for name in ("kv_committed_len", "kv_allocated_len"):
            setattr(sub, name, getattr(kv, name))
        req.kv = sub
    return req


# What turns a request of the run into one that ends it (True), or that the
# run reads as it is (False: a length of more than one digit is read in the
# run, and only its chunk is added row by row).
RUN_BREAKERS = {
    "subclass": (_retyped, True),
    "subclass with a property": (_shadowed, True),
    "dict order": (_moved, True),
    "req.kv subclass": (_kv_retyped, True),
    "big": (lambda req: _set_lengths(req, 2**40, 2**40 + 3), False),
    "past int64": (lambda req: _set_lengths(req, 2**63, 2**63), True),
    "negative": (lambda req: _set_lengths(req, -1, 5), True),
    "float": (lambda req: _set_lengths(req, 3.0, 5), True),
    "np.int64": (lambda req: _set_lengths(req, np.int64(7), 9), True),
}


def _set_lengths(req, c, a):
    for name, value in (("kv_committed_len", c), ("kv_allocated_len", a)):
        own = name in getattr(req, "__dict__", {}) or any(
            name in getattr(k, "__slots__", ()) for k in type(req).__mro__)
        setattr(req if own else req.kv, name, value)
    return req


def _run_batch(base, n, spoil, at, seed=0):
    rng = random.Random(seed)
    layout, make = RUN_BASES[base]
    reqs = [make(rng.randrange(0, 5000), rng.randrange(0, 5000)) for _ in range(n)]
    for i in at:
        spoil(reqs[i])
    return layout, reqs


@compiled_only
@pytest.mark.parametrize("base", list(RUN_BASES))
@pytest.mark.parametrize("breaker", [None, *RUN_BREAKERS])
def test_runs_end_at_a_request_that_reads_otherwise(base, breaker):
    """The oracle's answer, whatever the request and wherever it sits (the
    first row, either side of a chunk's end, the last).  Where the answer is a
    number, runs read every row of an unspoiled batch, and after a request
    that ends one a run starts again (at the latest 32 rows on, the retry);
    behind the public-API fence, where runs need shortcuts it keeps out, none
    (and on 3.10, which reads no dict entry directly, none through a dict)."""
    from kvest import _reqs

    n = 130
    _reqs._address_order(n + 1)  # walked first to last: each row read once
    _reqs._backward_walks(n + 1)
    spoil = RUN_BREAKERS[breaker][0] if breaker else (lambda req: req)
    for at in ([0], [63, 64], [n - 1]):
        layout, reqs = _run_batch(base, n, spoil, at)
        for fn in ("decode", "spec_v2", "plan"):
            check(fn, reqs, 16, 7, None, layout)  # learns where the names sit
            before = _reqs._runs()
            check(fn, reqs, 16, 7, None, layout)
            taken = _reqs._runs() - before
            if expect(fn, reqs, 16, 7, None, layout)[0] != "ok":
                continue
            if _reqs._PUBLIC_API_ONLY:  # runs take the private shortcuts only
                assert taken == 0, (fn, at)
            elif not _reqs._DICT_ENTRIES:  # 3.10: a dict-held name ends a run
                assert taken <= n, (fn, at)
            elif breaker is None or not RUN_BREAKERS[breaker][1]:
                assert taken == n, (fn, at)
            else:
                assert n - len(at) - 32 * (len(at) + 1) <= taken <= n, (fn, at)
        # Selected rows: a run goes on through them as they come.
        check("spec_v2", reqs, 16, 7, [*range(n - 1, -1, -2), 5, 5, -1], layout)


@st.composite
def run_batches(draw):
    """Up to three chunks of one release's requests, a few spoiled."""
    base = draw(st.sampled_from(list(RUN_BASES)))
    n = draw(st.integers(0, 150))
    layout, reqs = _run_batch(base, n, lambda req: req, [], draw(st.integers(0, 99)))
    at = draw(st.sets(st.integers(0, n - 1), max_size=3)) if n else ()
    for i in at:
        RUN_BREAKERS[draw(st.sampled_from(list(RUN_BREAKERS)))][0](reqs[i])
    return layout, reqs


@given(run_batches(), page_sizes, reserves, st.booleans(), st.data())
def test_runs_agree_with_the_oracle(batch, p, r, aligned, data):
    layout, reqs = batch
    indices = data.draw(selections(reqs))
    for fn in ("decode", "spec_v2", "plan"):
        check(fn, reqs, p, r, None, layout, aligned)
        check(fn, reqs, p, r, indices, layout, aligned)


# ----------------------------------------------------------- backward walks
# A whole batch of thousands is read from its last request to its first where
# the answer cannot tell (addrorder.h): the estimates' sums and the plan's
# rows, each request read by the quick reads.  Anything else gives up, and the
# walk from the first request answers.

def _backward_count():
    from kvest import _reqs

    _reqs._address_order(10**6)  # however the batch lies in memory
    return _reqs._backward_walks()[0]


@orders_only
@pytest.mark.parametrize("base", list(RUN_BASES))
def test_backward_walks_give_the_oracles_rows(base):
    layout, reqs = _run_batch(base, 300, lambda req: req, [])
    for fn in ("decode", "spec_v2", "plan"):
        check(fn, reqs, 16, 7, None, layout)  # learns where the names sit
        before = _backward_count()
        check(fn, reqs, 16, 7, None, layout)
        check(fn, reqs, 16, 7, None, layout, False)
        assert _backward_count() - before == 2, fn
    # A tuple too; selected rows are walked as selected.
    check("plan", tuple(reqs), 16, 7, None, layout)
    before = _backward_count()
    check("plan", reqs, 16, 7, list(range(300)), layout)
    assert _backward_count() == before


@orders_only
@pytest.mark.parametrize("spoiler", ["negative", "property", "huge", "missing"])
def test_a_backward_walk_gives_up_for_the_first_bad_request(spoiler):
    """Two requests the quick reads cannot take: the walk from the first
    request answers, naming the first of them as the twin does."""
    layout, reqs = _run_batch("nested-0.5.23", 300, lambda req: req, [])
    for fn in ("decode", "spec_v2", "plan"):
        check(fn, reqs, 16, 7, None, layout)  # learns where the names sit
    for i in (40, 250):
        if spoiler == "negative":
            reqs[i].kv.kv_committed_len = -1
        elif spoiler == "property":
            _shadowed(reqs[i])
        elif spoiler == "huge":
            reqs[i].kv.kv_committed_len = INT64_MAX
        else:
            del reqs[i].kv.kv_allocated_len
    before = _backward_count()
    for fn in ("decode", "spec_v2", "plan"):
        check(fn, reqs, 16, 7, None, layout)
    if spoiler in ("huge", "missing"):  # the decode count reads neither
        assert _backward_count() - before == 1
    else:
        assert _backward_count() == before
