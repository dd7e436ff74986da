"""Hostile inputs (issue 18): objects that lie about themselves, change while
read, or fail in ways of their own.  Never a crash, never a wrong number, never
a foreign exception; both implementations agree.

The cases that crashed the interpreter before the fix run in a subprocess of
their own, under each implementation, and must exit cleanly with the expected
answer or exception; the rest run in-process under both.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import mmap
import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import check_same, outcome
from hypothesis import given
from hypothesis import strategies as st

import kvest
from kvest import reference

IMPLS = [kvest, reference]
IMPL_IDS = ["kvest", "reference"]
PURE = ["0", "1"]  # KVEST_PURE_PYTHON for the subprocess cases
PURE_IDS = ["compiled", "twin"]  # tools/memcheck.sh runs "not twin"

REQ_FUNCTIONS = {
    "spec_v2": ("spec_v2_new_tokens_from_reqs", (16, 20)),
    "decode": ("decode_new_tokens_from_reqs", (16,)),
    "plan": ("decode_alloc_plan_from_reqs", (16, 20)),
    "beam": ("beam_member_rows_from_reqs", ()),
}
# The request readers that take no exact_ints: the walks and containers above.
READERS = {**REQ_FUNCTIONS, "beam_groups": ("beam_groups_from_reqs", ())}


def run_isolated(code: str, pure: str) -> list[str]:
    """Run ``code`` in a fresh interpreter under one implementation; it must exit
    cleanly (a crash is a negative return code).  Returns its output lines."""
    if pure == "0" and importlib.util.find_spec("kvest._kernels") is None:
        pytest.skip("the compiled kernels are not built here")
    env = dict(os.environ, KVEST_PURE_PYTHON="1" if pure == "1" else "")
    if pure == "1":
        env.pop("KVEST_REQUIRE_COMPILED", None)
    # The kvest this process tests (an in-place sanitizer build, say), not
    # whichever one the child would find first.
    here = os.path.dirname(os.path.dirname(os.path.abspath(kvest.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"exit {done.returncode} (pure={pure})\nstdout: {done.stdout}\nstderr: {done.stderr}")
    return done.stdout.splitlines()


# A prelude for the subprocess cases: outcome() as a line of text.
PRELUDE = """
import sys, threading
import numpy as np
import kvest
assert kvest.IMPLEMENTATION == ("python" if {pure!r} == "1" else "cython"), kvest.IMPLEMENTATION

def show(fn, *args, **kwargs):
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return f"raise {{type(exc).__name__}}: {{exc}}"
    if isinstance(value, kvest.AllocPlan):
        value = (value.cur.tolist(), value.nxt.tolist(), value.num_tokens, value.num_pages)
    return f"ok {{value!r}}"
"""


def isolated(body: str, pure: str, setup: str = "") -> list[str]:
    return run_isolated(PRELUDE.format(pure=pure) + setup + textwrap.dedent(body), pure)


# ------------------------------------------- crash-prone: each in a subprocess

@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("fn", READERS, ids=list(READERS))
def test_list_shrunk_by_a_property_during_a_call_with_indices(fn, pure):
    """reqs[0]'s property empties the list; the selection was taken whole
    before it ran, as [reqs[i] for i in indices] takes it: the answer is the
    selected requests', as over that list."""
    name, args = READERS[fn]
    lines = isolated(f"""
    class Req:
        def __init__(self):
            self.kv_allocated_len = 2
        @property
        def kv_committed_len(self):
            del reqs[:]
            return 1
        @property
        def beam_group(self):
            del reqs[:]
            return None
    for indices in ([0, 4, -1], np.array([0, 4, -1])):
        reqs = [Req() for _ in range(5)]
        print(show(kvest.{name}, reqs, *{args!r}, indices))
        reqs = [Req() for _ in range(5)]
        print(show(kvest.{name}, [reqs[int(i)] for i in indices], *{args!r}))
    """, pure=pure)
    assert len(lines) == 4 and lines[0] == lines[1] == lines[2] == lines[3], lines
    assert lines[0].startswith("ok "), lines


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("fn", ["spec_v2", "decode", "beam_groups"])
def test_collection_while_a_shuffled_batch_is_read(fn, pure):
    """A shuffled batch is read in address order by reads that run no code --
    but on 3.11 the first read of a fresh request makes its instance dict real,
    and allocating that may collect garbage, whose finalizer here empties the
    batch and rebinds every req.kv.  The compiled walk holds collections off
    while it reads, so the finalizer runs after it and the answer is the whole
    batch's; the twin, Python's own loop, sees the finalizer wherever it runs."""
    name, args = READERS[fn]
    lines = isolated(f"""
    import gc, random
    class KV:
        def __init__(self, c):
            self.kv_committed_len, self.kv_allocated_len = c, c + 3
    class Req:
        def __init__(self, c):
            self.kv, self.beam_group = KV(c), (None if c % 7 else 1)
    class Bomb:
        def __init__(self):
            self.me = self  # only the collector frees it
        def __del__(self):
            for r in reqs:
                r.kv = r.beam_group = None
            del reqs[:]
    learn = [Req(i) for i in range(9)]  # where the names sit, for each type
    show(kvest.{name}, learn, *{args!r}, layout="nested") if {fn!r} != "beam_groups" \
        else show(kvest.{name}, learn)
    seen = set()
    for round in range(20):
        reqs = [Req(i) for i in range(600)]
        random.Random(round).shuffle(reqs)
        whole = show(kvest.{name}, list(reqs), *{args!r}, **({{}} if {fn!r} == "beam_groups"
                                                            else {{"layout": "nested"}}))
        reqs = [Req(i) for i in range(600)]  # fresh: no instance dict made yet
        random.Random(round).shuffle(reqs)
        Bomb()
        gc.set_threshold(1)
        try:
            got = show(kvest.{name}, reqs, *{args!r}, **({{}} if {fn!r} == "beam_groups"
                                                         else {{"layout": "nested"}}))
        finally:
            gc.set_threshold(700)
        gc.collect()
        seen.add("whole" if got == whole else got if not got.startswith("raise") else
                 got.split(":")[0])
    print(sorted(seen))
    """, pure=pure)
    seen = ast.literal_eval(lines[-1])
    if pure == "0":
        assert seen == ["whole"]
    else:
        assert all(s == "whole" or s == "raise AttributeError" or re.fullmatch(r"ok \d+", s)
                   for s in seen), seen


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("fn", READERS, ids=list(READERS))
def test_indices_that_shrink_reqs_while_read(fn, pure):
    """An index's __index__ shrinks reqs: -5 was checked against 5 rows, so it is
    row 0, never a negative position into the shorter list."""
    name, args = READERS[fn]
    lines = isolated(f"""
    from types import SimpleNamespace
    class Shrinking:
        def __index__(self):
            del reqs[1:]
            return -5
    reqs = [SimpleNamespace(kv_committed_len=16, kv_allocated_len=16, beam_group=None)
            for _ in range(5)]
    print(show(kvest.{name}, reqs, *{args!r}, [Shrinking()]))
    """, pure=pure)
    plain = outcome(getattr(reference, name),
                    ([SimpleNamespace(kv_committed_len=16, kv_allocated_len=16, beam_group=None)],
                     *args, [0]), {})
    assert lines == [f"ok {plain[1]!r}"]


LIAR = """
class Liar(np.ndarray):
    # Everything a subclass can say about itself, wrong.
    @property
    def dtype(self):
        return np.dtype(np.int64)
    @property
    def flags(self):
        return SimpleNamespace(writeable=True, c_contiguous=True, aligned=True,
                               f_contiguous=True, owndata=True)
    def astype(self, *args, **kwargs):
        return [1, 2]
    def view(self, *args, **kwargs):
        return [1, 2]
    def __array__(self, *args, **kwargs):
        return np.array([99, 99])
"""


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("dtype", ["int8", "int16", "uint64", ">i8", "int32", "int64"])
def test_ndarray_subclass_that_lies(dtype, pure):
    """Its memory is read for what it is: the answers of the plain array."""
    values = [16, 32, 1, 2, 3, 4, 5, 6]
    lines = isolated(setup="from types import SimpleNamespace\n" + LIAR, body=f"""
    plain = np.array({values!r}, {dtype!r})
    lying = plain.view(Liar)
    for fn, args in ((kvest.decode_new_tokens, (16,)), (kvest.num_new_pages, (16, None, True)),
                     (kvest.spec_v2_new_tokens, (plain, 16, 4)),
                     (kvest.decode_alloc_plan, (plain, 16, 4))):
        print(show(fn, lying, *args) == show(fn, plain, *args), show(fn, lying, *args))
    print(show(kvest.decode_new_tokens, [16, 32], 16, indices=lying[:2]))
    """, pure=pure)
    assert [line.split(" ", 1)[0] for line in lines[:4]] == ["True"] * 4
    assert lines[0].endswith("ok 32")  # 16 and 32 sit on a page boundary; 48 was the misread
    assert lines[4] in ("ok 32", "raise IndexError: indices[0] = 16 is out of range for 2 rows")


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("memory", ["bytes", "mmap"])
def test_out_subclass_claiming_writeable_over_read_only_memory(memory, pure):
    lines = isolated(setup="from types import SimpleNamespace\nimport mmap\n" + LIAR, body=f"""
    if {memory!r} == "bytes":
        raw = [bytes(8), bytes(8)]
    else:
        raw = []
        for _ in range(2):
            m = mmap.mmap(-1, 8)
            raw.append(mmap.mmap(-1, 8, access=mmap.ACCESS_READ))
    bufs = [np.frombuffer(r, np.int64).view(Liar) for r in raw]
    print(show(kvest.decode_alloc_plan, [1], [1], 16, 4, out=tuple(bufs)))
    reqs = [SimpleNamespace(kv_committed_len=1, kv_allocated_len=1)]
    print(show(kvest.decode_alloc_plan_from_reqs, reqs, 16, 4, out=tuple(bufs)))
    print([bytes(r) == bytes(8) for r in raw])
    """, pure=pure)
    assert lines == ["raise ValueError: out[0] is read-only"] * 2 + ["[True, True]"]


RACE = """
import itertools
stop = threading.Event()
def writer(arr, values):
    # Rewrites arr in place until told to stop, while the main thread reads it.
    for v in itertools.cycle(values):
        if stop.is_set():
            return
        arr[:] = v
import itertools
seen = set()
def race(arr, values, call, rounds=300):
    t = threading.Thread(target=writer, args=(arr, values))
    t.start()
    try:
        for _ in range(rounds):
            seen.add(call())
    finally:
        stop.set()
        t.join()
        stop.clear()
"""


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
def test_indices_rewritten_by_another_thread(pure):
    """Indices are checked and read from kvest's own copy: every answer is the
    one any in-range state gives (every row counted, p = 1), or an IndexError
    naming a value that is out of range.  (Another thread's writes may be torn,
    so the values seen are any mixture of the bytes written.)"""
    n = 4096
    lines = isolated(setup=RACE, body=f"""
    committed = np.arange({n}, dtype=np.int64)
    indices = np.zeros({n}, dtype=np.int64)
    race(indices, [0, {n} - 1, 10**12, -10**12],
         lambda: show(kvest.decode_new_tokens, committed, 1, indices))
    race(indices, [0, -1, 10**12],
         lambda: show(kvest.spec_v2_new_tokens, committed, committed, 1, 1, indices))
    print(sorted(seen))
    """, pure=pure)
    seen = ast.literal_eval(lines[-1])
    assert seen
    for line in seen:
        if line != f"ok {n}":
            found = re.fullmatch(rf"raise IndexError: indices\[(\d+)\] = (-?\d+) is out of "
                                 rf"range for {n} rows", line)
            assert found and not -n <= int(found[2]) < n, line


# Each differs from 1 in one byte, so even a torn write leaves a value
# 1 + x·2^40 + t, x in {0, 1}, t in {0, 2^62, -2^63}: negative exactly when t is.
RACE_VALUES = [1, 1 + 2**40, 1 + 2**62, 1 - 2**63]


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
def test_lengths_rewritten_by_another_thread(pure):
    """The checked paths read a snapshot: no AssertionError, no number that no
    state of the array gives, no OverflowError naming a value that fits.  With
    A = 0, p = 1, R = 0 each row adds its own C (decode: 1)."""
    n = 3000
    lines = isolated(setup=RACE, body=f"""
    c = np.ones({n}, dtype=np.int64)
    zeros = np.zeros({n}, dtype=np.int64)
    values = {RACE_VALUES!r}
    race(c, values, lambda: show(kvest.spec_v2_new_tokens, c, zeros, 1, 0))
    race(c, values, lambda: show(kvest.decode_new_tokens, c, 1))
    race(c, values, lambda: show(kvest.num_new_pages, c, 1, zeros))
    race(c, values, lambda: show(lambda *a: kvest.decode_alloc_plan(*a).num_tokens, c, zeros,
                                 1, 0))
    print(sorted(seen))
    """, pure=pure)
    seen = ast.literal_eval(lines[-1])
    assert seen
    for line in seen:
        kind, _, rest = line.partition(" ")
        if kind == "ok":
            # n rows of 1, plus x·2^40 and 2^62 terms, as many as there are rows.
            big, low = divmod(int(rest) - n, 2**62)
            mid, none = divmod(low, 2**40)
            assert none == 0 and 0 <= big <= n and 0 <= mid <= n, line
            continue
        if rest.startswith("ValueError"):
            found = re.search(r"= (-?\d+) is negative", rest)
            assert found and int(found[1]) < 0, line
        else:
            named = re.search(r"(?:= |running total )(-?\d+)", rest)
            assert rest.startswith("OverflowError") and named, line
            assert int(named[1]) > 2**63 - 1, line


# ------------------------------------------------- in-process, both implementations

class RaisingGetattr:
    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")


class Raising:
    """A request whose every attribute read fails with an exception of its own."""

    def __getattr__(self, name):
        raise RuntimeError("device lost")


@pytest.mark.parametrize(("name", "args", "where"), [
    ("decode_new_tokens", (RaisingGetattr(), 16), "committed"),
    ("spec_v2_new_tokens", ([1], [1], RaisingGetattr(), 0), "page_size"),
    ("spec_v2_new_tokens", ([1], [1], 16, 0, RaisingGetattr()), "indices"),
    ("num_new_pages", ([1], 16, RaisingGetattr()), "prefix_lens"),
    ("decode_new_tokens", ([RaisingGetattr()], 16), "committed[0]"),
    ("decode_new_tokens_from_reqs", (RaisingGetattr(), 16), "reqs"),
    ("decode_new_tokens_from_reqs", ([SimpleNamespace(kv_committed_len=RaisingGetattr())], 16),
     "reqs[0].kv_committed_len"),
])
def test_raising_getattr_is_a_type_error(name, args, where):
    """hasattr lets anything but AttributeError through: never the foreign one."""
    kind, exc_type = check_same(name, *args)
    assert (kind, exc_type) == ("raise", TypeError)
    for impl in IMPLS:
        with pytest.raises(TypeError, match=rf"^{re.escape(where)} "):
            getattr(impl, name)(*args)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_closed_mmap_is_a_type_error(impl):
    m = mmap.mmap(-1, 16)
    m.close()
    with pytest.raises(TypeError, match=r"^committed could not be read: ValueError"):
        impl.decode_new_tokens(m, 16)
    with pytest.raises(TypeError, match=r"^seq_lens could not be read: ValueError"):
        impl.num_new_pages(m, 16, decode=True)


big_ints = st.one_of(st.integers(-40, 40), st.integers(-(2**70), 2**70))


@given(st.integers(0, 12), big_ints, big_ints, big_ints.filter(bool))
def test_range_indices_never_materialised(n, start, stop, step):
    """A range of indices is bounds-checked by arithmetic: range(2**40) on two rows
    is the IndexError at indices[2], not an 8 TiB allocation."""
    r = range(start, stop, step)
    head = list(itertools.islice(r, 2 * n + 1))  # an in-bound range has at most 2n entries
    bad = next((k for k, i in enumerate(head) if not -n <= i < n), None)
    committed = list(range(0, 16 * n, 16))
    # Not check_same: its oracle would read the range item by item.
    got, twin = (outcome(impl.decode_new_tokens, (committed, 16, r), {}) for impl in IMPLS)
    assert got == twin
    if head and any(not -(2**63) <= v < 2**63 for v in (r[0], r[-1])):
        assert got[:2] == ("raise", OverflowError) or got[:2] == ("raise", IndexError)
    elif bad is not None:
        assert got[:2] == ("raise", IndexError)
        with pytest.raises(IndexError, match=rf"^indices\[{bad}\] = {head[bad]} is out of"):
            kvest.decode_new_tokens(committed, 16, r)
    else:
        assert got == ("ok", 16 * len(head))
        assert got == ("ok", 16 * len(list(r)))


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_huge_range_indices(impl):
    for r, pos, value in ((range(2**40), 2, 2), (range(-(2**40), 0), 0, -(2**40)),
                          (range(1, 2**62, 2**61), 1, 2**61 + 1)):
        with pytest.raises(IndexError, match=rf"^indices\[{pos}\] = {value} is out of range"):
            impl.decode_new_tokens([1, 2], 16, indices=r)
        reqs = [SimpleNamespace(kv_committed_len=1, kv_allocated_len=1)] * 2
        with pytest.raises(IndexError, match=rf"^indices\[{pos}\] = {value} is out of range"):
            impl.decode_new_tokens_from_reqs(reqs, 16, r)


not_flags = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.floats(),
                      st.sampled_from(["no", "yes", "", 0, 1, [], [True], np.array(True),
                                       np.array([False])]))


@given(not_flags)
def test_flags_are_checked_alike_everywhere(value):
    """Every flag of every function: True or False (Python or NumPy), else TypeError."""
    reqs = [SimpleNamespace(kv_committed_len=1, kv_allocated_len=1, beam_group=None)]
    calls = [
        ("decode_alloc_plan", ([1], [1], 16, 4), "page_aligned"),
        ("num_new_pages", ([1], 16, [0]), "decode"),
        ("alloc_len_per_decode", (3, 1, 4, 16), "speculative"),
        ("alloc_len_per_decode", (3, 1, 4, 16), "has_draft_kv"),
        ("decode_alloc_plan_from_reqs", (reqs, 16, 4), "page_aligned"),
        ("spec_v2_new_tokens_from_reqs", (reqs, 16, 4), "exact_ints"),
        ("decode_new_tokens_from_reqs", (reqs, 16), "exact_ints"),
        ("decode_alloc_plan_from_reqs", (reqs, 16, 4), "exact_ints"),
        ("beam_member_rows_from_reqs", (reqs,), "exact_ints"),
    ]
    for name, args, flag in calls:
        assert check_same(name, *args, **{flag: value}) == ("raise", TypeError)
        with pytest.raises(TypeError, match=f"^{flag} must be True or False"):
            getattr(kvest, name)(*args, **{flag: value})


@given(st.booleans())
def test_page_aligned_from_reqs_follows_the_flag(aligned):
    reqs = [SimpleNamespace(kv_committed_len=1, kv_allocated_len=1)]
    for flag in (aligned, np.bool_(aligned)):
        _, plan = check_same("decode_alloc_plan_from_reqs", reqs, 16, 4, page_aligned=flag)
        assert plan[1] == ([16] if aligned else [5])


class LyingIndex(int):
    """An int whose __index__ says something else: Python's arithmetic uses its value."""

    def __index__(self):
        return int(self) + 5


lengths = st.integers(0, 2**40)


@given(st.lists(st.tuples(lengths, lengths), min_size=1, max_size=8),
       st.sampled_from([1, 3, 16, 64]), st.integers(0, 100), st.data())
def test_int_subclass_lengths_count_by_value(pairs, p, r, data):
    """As SGLang's own ``c % p`` reads them (operator.index), in both implementations."""
    wrap = [data.draw(st.sampled_from([int, LyingIndex])) for _ in range(2 * len(pairs))]
    reqs = [SimpleNamespace(kv_committed_len=wrap[2 * i](c), kv_allocated_len=wrap[2 * i + 1](a))
            for i, (c, a) in enumerate(pairs)]
    plain = [SimpleNamespace(kv_committed_len=c, kv_allocated_len=a) for c, a in pairs]
    assert check_same("decode_new_tokens_from_reqs", reqs, p) == (
        "ok", p * sum(c % p == 0 for c, _ in pairs))
    assert (check_same("spec_v2_new_tokens_from_reqs", reqs, p, r)
            == check_same("spec_v2_new_tokens_from_reqs", plain, p, r))
    assert (check_same("decode_alloc_plan_from_reqs", reqs, p, r)
            == check_same("decode_alloc_plan_from_reqs", plain, p, r))


def _zero_d_arrays():
    values = [np.array(True), np.array(5), np.array([5]), np.bool_(True), True]
    try:
        import torch
    except ImportError:
        return values
    return [*values, torch.tensor(True), torch.tensor(5), torch.tensor([5])]


@pytest.mark.parametrize("value", _zero_d_arrays(), ids=repr)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_arrays_and_bools_are_not_request_lengths(impl, value):
    """A bool, or an array or tensor even with one element, is not a length."""
    reqs = [SimpleNamespace(kv_committed_len=value, kv_allocated_len=1)]
    with pytest.raises(TypeError, match=r"^reqs\[0\]\.kv_committed_len must be an integer"):
        impl.decode_new_tokens_from_reqs(reqs, 16)


not_ints = st.one_of(
    st.builds(np.int32, st.integers(0, 2**31 - 1)), st.builds(np.int64, st.integers(0, 2**40)),
    st.builds(LyingIndex, st.integers(0, 2**40)), st.booleans(), st.just(np.bool_(False)),
    st.floats(0, 100), st.none(),
)


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=6), st.data())
def test_exact_ints_refuses_all_but_int(values, data):
    """exact_ints=True: a length or beam row count whose type is not int is a
    TypeError (so the SGLang drop-in falls back to upstream); plain ints answer as
    without it."""
    where = data.draw(st.integers(0, len(values) - 1))
    bad = data.draw(not_ints)
    make = data.draw(st.sampled_from(["flat", "nested"]))

    def req(c, a):
        if make == "flat":
            return SimpleNamespace(kv_committed_len=c, kv_allocated_len=a,
                                   beam_group=SimpleNamespace(num_member_rows=c))
        return SimpleNamespace(kv=SimpleNamespace(kv_committed_len=c, kv_allocated_len=a),
                               beam_group=SimpleNamespace(num_member_rows=c))

    good = [req(v, v) for v in values]
    for name, args in REQ_FUNCTIONS.values():
        assert (check_same(name, good, *args, exact_ints=True)
                == check_same(name, good, *args))
    hostile = [req(bad if i == where else v, v) for i, v in enumerate(values)]
    for name, args in REQ_FUNCTIONS.values():
        assert check_same(name, hostile, *args, exact_ints=True) == ("raise", TypeError)
        attr = "beam_group.num_member_rows" if name.startswith("beam") else "kv_committed_len"
        with pytest.raises(TypeError, match=rf"^reqs\[{where}\]\.{attr} must be an int, not "):
            getattr(kvest, name)(hostile, *args, exact_ints=True)


def test_indices_is_the_parameter_after_the_scalars():
    reqs = [SimpleNamespace(kv_committed_len=c, kv_allocated_len=c, beam_group=None)
            for c in (16, 17, 32)]
    for impl in IMPLS:
        assert impl.decode_new_tokens_from_reqs(reqs, 16, [0, 0]) == 32
        assert impl.spec_v2_new_tokens_from_reqs(reqs, 16, 20, [1]) == 16
        assert impl.decode_alloc_plan_from_reqs(reqs, 16, 20, [1]).num_tokens == 31
        assert impl.decode_alloc_plan_from_reqs(reqs, 16, 20, indices=[1]).num_tokens == 31
        assert impl.beam_member_rows_from_reqs(reqs, [2]) == 0
        assert impl.beam_groups_from_reqs(reqs, [2]) == 0


class NoBeam:
    pass


@pytest.mark.parametrize("reqs", [
    [NoBeam()], [SimpleNamespace(beam_group=NoBeam())],
    [SimpleNamespace(beam_group=SimpleNamespace(num_member_rows="2"))],
], ids=["no beam_group", "no num_member_rows", "a str"])
def test_beam_messages_agree(reqs):
    assert check_same("beam_member_rows_from_reqs", reqs)[0] == "raise"
    # (a group without rows is still a group)
    assert check_same("beam_groups_from_reqs", reqs)[0] == ("raise" if not reqs[0].__dict__
                                                            else "ok")


class Colliding:
    """A key of req.__dict__ whose hash collides with a length's name: the dict
    search compares it by its own __eq__, which replaces req.kv."""

    def __init__(self, target, req, kv):
        self.hash, self.req, self.kv = hash(target), req, kv

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        self.req.kv = self.kv
        return False


class Plain:
    pass


@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 100), st.integers(0, 100),
       st.sampled_from(["kv_committed_len", "kv_allocated_len", "kv"]),
       st.sampled_from([None, "nested"]))
def test_kv_replaced_between_two_reads(c0, a0, c1, a1, target, layout):
    """The answer is the one reading req.kv afresh each time gives: the twin's."""
    def make():
        req = Plain()
        req.kv = SimpleNamespace(kv_committed_len=c0, kv_allocated_len=a0)
        req.__dict__[Colliding(target, req, SimpleNamespace(
            kv_committed_len=c1, kv_allocated_len=a1))] = 0
        return req

    for name, args in (("spec_v2_new_tokens_from_reqs", (16, 20)),
                       ("decode_alloc_plan_from_reqs", (16, 20))):
        got = [outcome(getattr(impl, name), ([make(), make()], *args), {"layout": layout})
               for impl in IMPLS]
        assert got[0] == got[1]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_list_growing_during_a_plan(impl):
    class Growing:
        kv_allocated_len = 1

        @property
        def kv_committed_len(self):
            reqs.append(SimpleNamespace(kv_committed_len=1, kv_allocated_len=1))
            return 1

    reqs = [Growing()]
    with pytest.raises(IndexError, match=r"^reqs grew past the 1 rows the plan was sized for"):
        impl.decode_alloc_plan_from_reqs(reqs, 16, 4)


class HidesSharing(np.ndarray):
    """Answers every NumPy function itself: np.shares_memory says False."""

    def __array_function__(self, func, types, args, kwargs):
        return False


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_overlap_is_judged_on_the_memory_not_the_subclass(impl):
    base = np.array([1, 2, 3, 40], dtype=np.int64)
    committed = base.view(HidesSharing)
    with pytest.raises(ValueError, match=r"^out\[0\] overlaps committed in memory"):
        impl.decode_alloc_plan(committed, [1, 1, 1, 1], 16, 4,
                               out=(base, np.empty(4, np.int64)))
    assert base.tolist() == [1, 2, 3, 40]


class Shifty(tuple):
    """A tuple whose items, read by index, are other arrays than the ones it holds."""

    def __getitem__(self, i):
        return np.empty(1, np.int64)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_out_tuple_subclass_read_once(impl):
    cur, nxt = np.zeros(1, np.int64), np.zeros(1, np.int64)
    plan = impl.decode_alloc_plan([1], [1], 16, 4, out=Shifty((cur, nxt)))
    assert plan.cur is cur and plan.nxt is nxt  # the buffers written, and returned
    assert (cur.tolist(), nxt.tolist(), plan.num_tokens) == ([1], [16], 15)


class FakeTensor:
    """Looks like a torch tensor (its module says so); its properties fail."""

    numpy = requires_grad = __array__ = None

    @property
    def device(self):
        raise RuntimeError("driver gone")


FakeTensor.__module__ = "torch.fake"


class BadDtype:
    @property
    def dtype(self):
        raise RuntimeError("no dtype")


@pytest.mark.parametrize(("name", "args", "kwargs", "fragment"), [
    ("decode_new_tokens", (FakeTensor(), 16), {}, "committed could not be read"),
    ("decode_alloc_plan", ([1], [1], 16, 4), {"out": (FakeTensor(), FakeTensor())},
     "out[0] could not be read"),
    ("decode_alloc_plan_from_reqs", ([SimpleNamespace(kv_committed_len=1, kv_allocated_len=1)],
                                     16, 4), {"dtype": BadDtype()}, "dtype must be int32"),
])
def test_foreign_exceptions_while_probing_become_type_errors(name, args, kwargs, fragment):
    assert check_same(name, *args, **kwargs) == ("raise", TypeError)
    with pytest.raises(TypeError, match=re.escape(fragment)):
        getattr(kvest, name)(*args, **kwargs)


def _failing_generator():
    yield SimpleNamespace(kv_committed_len=1, kv_allocated_len=1, beam_group=None)
    raise RuntimeError("stream closed")


class FailingIter:
    def __iter__(self):
        raise RuntimeError("no iterator")


@pytest.mark.parametrize("fn", READERS, ids=list(READERS))
@pytest.mark.parametrize(("make", "where"), [(_failing_generator, 1), (FailingIter, 0)],
                         ids=["generator", "__iter__"])
def test_reqs_whose_iteration_fails(fn, make, where):
    name, args = READERS[fn]
    for impl in IMPLS:
        with pytest.raises(TypeError, match=rf"^reqs could not be read at reqs\[{where}\]: "
                                            "RuntimeError"):
            getattr(impl, name)(make(), *args)


class LoudStr(str):
    def __hash__(self):
        raise RuntimeError("unhashable today")

    def __eq__(self, other):
        raise RuntimeError("incomparable today")


@pytest.mark.parametrize("layout", ["nested", "flat", "bogus"])
def test_layout_str_subclass_read_by_its_characters(layout):
    reqs = [SimpleNamespace(kv_committed_len=16, kv_allocated_len=16,
                            kv=SimpleNamespace(kv_committed_len=16, kv_allocated_len=16))]
    for name, args in (("spec_v2_new_tokens_from_reqs", (16, 20)),
                       ("decode_new_tokens_from_reqs", (16,))):
        assert (check_same(name, reqs, *args, layout=LoudStr(layout))
                == check_same(name, reqs, *args, layout=layout))


# ------------------------------------------- collections in the middle of a call

GC_CALLS = {
    "spec_v2": "kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 20, layout=LAYOUT)",
    "decode": "kvest.decode_new_tokens_from_reqs(reqs, 16, layout=LAYOUT)",
    "plan": "kvest.decode_alloc_plan_from_reqs(reqs, 16, 20, layout=LAYOUT)",
    "plan_int32": "kvest.decode_alloc_plan_from_reqs(reqs, 16, 20, layout=LAYOUT, "
                  "dtype=np.int32)",
    "beam_groups": "kvest.beam_groups_from_reqs(reqs)",
    "add": "kvest.add_to_attrs(reqs, ('kv.kv_allocated_len', 'kv.kv_committed_len'), 1)",
    "add_flat": "kvest.add_to_attrs(reqs, ('beam_group', 'beam_group'), 3)",
    "max": "kvest.max_into_attr(reqs, 'kv.kv_allocated_len', list(range(len(reqs))))",
}


@pytest.mark.parametrize("pure", PURE, ids=PURE_IDS)
@pytest.mark.parametrize("layout", [None, "nested"])
@pytest.mark.parametrize("call", GC_CALLS)
def test_finalizers_that_build_instance_dicts_mid_call(call, layout, pure):
    """Issue 26: on 3.11 the first read or write of a fresh object's attribute
    makes its instance dict real; the allocation may collect garbage, and the
    finalizer here makes the same requests' dicts real and adds to them.  The
    compiled kernels hold collections off while their C code holds borrowed
    pointers: no crash, no garbage read or written, the answer and the
    requests' state those of a call without the finalizer."""
    lines = isolated(f"""
    import gc
    LAYOUT = {layout!r}
    class KV:
        def __init__(self, c):
            self.kv_committed_len, self.kv_allocated_len = c, c + 3
    class Req:
        def __init__(self, c):
            self.kv, self.beam_group = KV(c), (7 if c % 3 else None)
    budget = [0]
    class Bomb:
        def __init__(self, victims):
            self.me, self.victims = self, victims  # only the collector frees it
        def __del__(self):
            for r in self.victims:
                vars(r)["spare"] = vars(r.kv)["spare"] = 1
            if budget[0] > 0:  # another one for the next collection
                budget[0] -= 1
                Bomb(self.victims)
    def state(reqs):
        return [(r.kv.kv_committed_len, r.kv.kv_allocated_len, r.beam_group) for r in reqs]
    for rounds in range(30):
        reqs = [Req(i) for i in range(40)]
        want = show(lambda: {GC_CALLS[call]}), state(reqs)
        reqs = [Req(i) for i in range(40)]  # fresh: no instance dict made yet
        budget[0] = 10_000
        Bomb(reqs)
        # Dicts held, so that none waits on the interpreter's free list: the
        # next dict made (an instance dict built) is an allocation that collects.
        held = [dict() for _ in range(200)]
        gc.set_threshold(1)
        try:
            got = show(lambda: {GC_CALLS[call]}), state(reqs)
        finally:
            budget[0] = 0
            gc.set_threshold(700)
        del held
        gc.collect()
        assert got == want, (got, want)
    print("same")
    """, pure=pure)
    assert lines == ["same"]


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("how", ["new", "int32", "out64", "out32"])
def test_list_shrinking_during_a_plan(impl, how):
    """Issue 26: a request's property shrinks the list mid-plan.  The rows it
    never reaches would be np.empty's garbage (or an out= buffer's old
    values): the plan raises instead, as one that grows does."""
    class Shrinking:
        kv_allocated_len = 1

        @property
        def kv_committed_len(self):
            del reqs[1:]
            return 1

    plain = SimpleNamespace(kv_committed_len=1, kv_allocated_len=1)
    kwargs = {"new": {}, "int32": {"dtype": np.int32},
              "out64": {"out": (np.full(3, -7), np.full(3, -7))},
              "out32": {"out": (np.full(3, -7, np.int32), np.full(3, -7, np.int32))}}[how]
    for first in range(2):
        reqs = [plain, Shrinking(), plain] if first else [Shrinking(), plain, plain]
        with pytest.raises(IndexError, match=r"^reqs shrank while the plan sized for its 3 "
                                             rf"rows was filled: {1 + first} rows were read$"):
            impl.decode_alloc_plan_from_reqs(reqs, 16, 4, **kwargs)


# ----------------------------------------------- lying containers, absurd sizes

class _LyingIter(list):
    """A list whose __iter__ yields only its first item."""

    def __iter__(self):
        return iter(list.__getitem__(self, slice(0, 1)))


class _LyingLen(list):
    """A list whose __len__ says 1, whatever it holds."""

    def __len__(self):
        return 1


class _LyingTuple(tuple):
    __slots__ = ()

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return tuple.__getitem__(self, 0)


@pytest.mark.parametrize("kind", [_LyingIter, _LyingLen, _LyingTuple])
@pytest.mark.parametrize("fn", READERS, ids=list(READERS))
@pytest.mark.parametrize("indices", [None, [0, -1]])
def test_list_subclasses_are_read_through_their_own_methods(kind, fn, indices):
    """The rule (docs/contract.md): an exact list or tuple is read through its
    storage, as its iterator would read it; a subclass is a sequence like any
    other, read through its own methods -- iter() once without indices, len()
    and [] with them -- as the loop it stands for reads it.  Both
    implementations, to the message; never a row left unread."""
    name, args = READERS[fn]

    @dataclasses.dataclass(slots=True)
    class Req:
        kv_committed_len: int
        kv_allocated_len: int
        beam_group: object = None

    reqs = kind([Req(5, 8), Req(16, 16), Req(1, 0)])
    got = check_same(name, reqs, *args, indices)
    if fn == "plan" and indices is None and kind is not _LyingLen:
        want = len(list(iter(reqs)))
        assert got[0] == "raise" or len(got[1][0]) == want, got


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_absurd_sizes_are_refused_by_name(impl):
    """A range of 2^62 lengths, 2^40 broadcast indices: a ValueError naming the
    argument, before anything is allocated (no MemoryError, no NumPy message)."""
    huge = range(2**62)
    bcast = np.broadcast_to(np.int64(0), 2**40)
    cases = [
        (lambda: impl.spec_v2_new_tokens(huge, huge, 16, 4), "committed"),
        (lambda: impl.decode_alloc_plan(huge, huge, 16, 4), "committed"),
        (lambda: impl.num_new_pages(huge, 16, decode=True), "seq_lens"),
        (lambda: impl.decode_new_tokens([1, 2, 3], 16, bcast), "indices"),
        (lambda: impl.spec_v2_new_tokens([1], [1], 16, 4, bcast), "indices"),
        (lambda: impl.decode_new_tokens_from_reqs([], 16, bcast), "indices"),
        (lambda: impl.decode_new_tokens(bcast, 16), None),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=r"rows; kvest copies at most 2\*\*32 rows") as info:
            call()
        if name is not None:
            assert str(info.value).startswith(f"{name} has "), info.value
    assert impl.decode_new_tokens(np.broadcast_to(np.int64(0), 5), 16) == 80


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("enabled", [True, False])
def test_collector_state_is_the_callers(impl, enabled):
    """Collections are held off only while kvest's own C code runs: the
    caller's code (a property) sees the caller's collector state, and every
    call -- answered, raising, refused in pure mode -- leaves it as it was."""
    import gc

    seen = []

    class KV:
        def __init__(self, c):
            self.kv_committed_len, self.kv_allocated_len = c, c + 1

    class Req:
        def __init__(self, c):
            self.kv, self.beam_group = KV(c), None
            self.kv_committed_len, self.kv_allocated_len = c, c + 1

    class Watching(Req):
        @property
        def kv_allocated_len(self):
            seen.append(gc.isenabled())
            return 3

        @kv_allocated_len.setter
        def kv_allocated_len(self, value):
            seen.append(gc.isenabled())

    def calls():
        plain = [Req(i) for i in range(5)]
        late = [*plain, Watching(1)]
        yield lambda: impl.spec_v2_new_tokens_from_reqs(plain, 16, 4)
        yield lambda: impl.spec_v2_new_tokens_from_reqs(late, 16, 4, layout="flat")
        yield lambda: impl.decode_alloc_plan_from_reqs(late, 16, 4, layout="nested", pure=True)
        yield lambda: impl.decode_new_tokens_from_reqs([*plain, object()], 16, pure=True)
        yield lambda: impl.add_to_attrs(late, ("kv.kv_allocated_len", "kv_allocated_len"), 1)
        yield lambda: impl.add_to_attrs(late, "kv_allocated_len", 1, pure=True)
        yield lambda: impl.add_to_attrs(plain, "kv.kv_allocated_len", 1, pure=True)
        yield lambda: impl.max_into_attr(late, "kv_allocated_len", [9] * 6)

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        for call in calls():
            outcome(call, (), {})
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and all(s is enabled for s in seen), seen
