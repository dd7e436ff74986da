"""Both implementations against the oracle (tests/oracle.py) and each other.

Hypothesis-driven, on every CPU variant: each call's value (or exception type)
must be the oracle's, and kvest and kvest.reference must raise the same
exception with the same message.  Under KVEST_PURE_PYTHON=1 kvest.* is
kvest.reference.*, and the oracle is what these tests check against.
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from helpers import (
    check_exact,
    check_same,
    indices_for,
    length_arrays,
    length_values,
    page_sizes,
    reserves,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from request_standins import ALL, LAYOUT_OF, FlatReq, MixedReq, NestedReq, TinyFlat

import kvest
from kvest import reference
from kvest._names import FUNCTIONS

sizes = st.integers(0, 40)


def more_examples(factor: int) -> settings:
    """The loaded profile's example count times factor: a few thousand per
    function in CI, for functions with fewer tests (or no CPU variants)."""
    return settings(max_examples=settings.default.max_examples * factor)


@given(st.data(), sizes, page_sizes, reserves, st.booleans())
def test_spec_v2_new_tokens(cpu_variant, data, n, p, r, negative):
    c = data.draw(length_arrays(n, p, negative))
    a = data.draw(length_arrays(n, p))
    check_exact("spec_v2_new_tokens", c, a, p, r, indices=data.draw(indices_for(n)))


@given(st.data(), sizes, page_sizes, st.booleans())
def test_decode_new_tokens(cpu_variant, data, n, p, negative):
    c = data.draw(length_arrays(n, p, negative))
    check_exact("decode_new_tokens", c, p, indices=data.draw(indices_for(n)))


@more_examples(3)
@given(st.data(), sizes, page_sizes, st.booleans(), st.booleans())
def test_num_new_pages(cpu_variant, data, n, p, decode, negative):
    s = data.draw(length_arrays(n, p, negative))
    if decode:
        # Never read when decoding: any length, any sign, even not lengths at all.
        pre = data.draw(st.none() | st.integers(0, 40).flatmap(
            lambda m: length_arrays(m, p, negative=True)) | st.just("not read"))
    else:
        pre = data.draw(length_arrays(n, p))
    check_exact("num_new_pages", s, p, pre, decode=decode)


@given(st.data(), sizes, page_sizes, reserves, st.booleans(), st.booleans(),
       st.sampled_from([None, "int32", "int64"]))
def test_decode_alloc_plan(cpu_variant, data, n, p, r, aligned, negative, out_dtype):
    c = data.draw(length_arrays(n, p, negative))
    a = data.draw(length_arrays(n, p))
    if out_dtype is None:
        check_exact("decode_alloc_plan", c, a, p, r, page_aligned=aligned)
        return
    # Both implementations fill the same buffers in turn; each plan holds them.
    out = (np.full(n, -7, out_dtype), np.full(n, -7, out_dtype))
    check_exact("decode_alloc_plan", c, a, p, r, page_aligned=aligned, out=out)
    for impl in (kvest, reference):
        try:
            plan = impl.decode_alloc_plan(c, a, p, r, page_aligned=aligned, out=out)
        except (ValueError, OverflowError):
            continue
        assert plan.cur is out[0] and plan.nxt is out[1]


@given(st.data(), sizes, page_sizes, reserves, st.booleans())
def test_alloc_plan_pages_match_spec_v2(cpu_variant, data, n, p, r, aligned):
    """The contract's invariant: num_pages * p == spec_v2_new_tokens, for both nxt variants."""
    c = data.draw(length_arrays(n, p))
    a = data.draw(length_arrays(n, p))
    try:
        expected = kvest.spec_v2_new_tokens(c, a, p, r)
    except OverflowError:
        return
    try:
        plan = kvest.decode_alloc_plan(c, a, p, r, page_aligned=aligned)
    except OverflowError:
        return
    assert plan.num_pages * p == expected


counts = st.one_of(st.none(), st.integers(0, 70), st.sampled_from([2**31, 2**62, 2**63 - 1]))


@more_examples(8)
@given(st.integers(0, 5000) | st.sampled_from([2**40, 2**63 - 1]), page_sizes, counts, counts,
       counts)
def test_spec_v1_new_tokens(n, p, steps, topk, draft):
    check_exact("spec_v1_new_tokens", n, p, steps, topk, draft)


@more_examples(8)
@given(counts, counts, counts, page_sizes, st.booleans(), st.booleans())
def test_alloc_len_per_decode(steps, topk, draft, p, speculative, has_draft_kv):
    kw = {"speculative": speculative, "has_draft_kv": has_draft_kv}
    check_exact("alloc_len_per_decode", steps, topk, draft, p, **kw)
    check_exact("alloc_reserve_per_decode", steps, topk, draft, p, **kw)


@given(st.data(), st.integers(0, 40), page_sizes, reserves)
def test_indices_equal_fancy_indexing(cpu_variant, data, n, p, r):
    """f(C, A, indices=idx) == f(C[idx], A[idx]) whenever idx is in range."""
    c = np.array(data.draw(st.lists(st.integers(0, 2**21), min_size=n, max_size=n)), np.int64)
    a = np.array(data.draw(st.lists(st.integers(0, 2**21), min_size=n, max_size=n)), np.int64)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=3 * n)) if n else []
    sel = np.asarray(idx, dtype=np.int64)
    assert kvest.spec_v2_new_tokens(c, a, p, r, indices=idx) == kvest.spec_v2_new_tokens(
        c[sel], a[sel], p, r)
    assert kvest.decode_new_tokens(c, p, indices=idx) == kvest.decode_new_tokens(c[sel], p)


@settings(max_examples=12)
@given(st.data(), st.sampled_from([1000, 4099, 20000]), page_sizes, reserves)
def test_large_batches(cpu_variant, data, n, p, r):
    """Long arrays exercise the vector bodies and tails of the loops."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    hi = data.draw(st.sampled_from([2**12, 2**21, 2**29, 2**31]))
    c = rng.integers(0, hi, n)
    a = c + rng.integers(-3 * p, 3 * p + r + 1, n).clip(-c)
    for arr_c, arr_a in ((c, a), (c.astype(np.int32) if hi <= 2**31 else c, a)):
        check_exact("spec_v2_new_tokens", arr_c, arr_a, p, r)
        check_exact("decode_new_tokens", arr_c, p)
        check_exact("num_new_pages", arr_c + 1, p, arr_c // 2)
        check_exact("num_new_pages", arr_c, p, decode=True)
        check_exact("decode_alloc_plan", arr_c, arr_a, p, r)


@given(st.integers(-(2**64), 2**64) | st.integers(-50, 50), st.integers(0, 60),
       st.integers(-(2**64), 2**64).filter(bool) | st.sampled_from([1, 2, -1, 7]), page_sizes)
def test_ranges(start, count, step, p):
    """A range is read without a loop, exactly, bounds included."""
    lengths = range(start, start + count * step, step)
    check_same("decode_new_tokens", lengths, p)
    check_same("num_new_pages", lengths, p, decode=True)
    check_same("spec_v2_new_tokens", lengths, lengths, p, 3, indices=range(-count, count, 3))


# --------------------------------------------- the oracle, not the twin, decides

def test_expected_values_come_from_the_oracle(monkeypatch):
    """check_same fails when the oracle disagrees, even if kvest and the twin
    agree: under KVEST_PURE_PYTHON=1 (kvest.X is reference.X) this is what
    makes every differential test a real check."""
    assert check_exact("decode_new_tokens", [16, 17, 32], 16) == ("ok", 32)
    monkeypatch.setitem(oracle.FUNCTIONS, "decode_new_tokens", lambda *a, **k: 33)
    with pytest.raises(AssertionError, match="oracle"):
        check_same("decode_new_tokens", [16, 17, 32], 16)
    monkeypatch.setitem(oracle.FUNCTIONS, "spec_v2_new_tokens",
                        lambda *a, **k: (_ for _ in ()).throw(OverflowError))
    with pytest.raises(AssertionError, match="oracle"):
        check_same("spec_v2_new_tokens", [1], [1], 16, 2)


def test_pure_python_switch_serves_the_twin():
    """KVEST_PURE_PYTHON=1 serves kvest.reference's functions as kvest.* (run in a
    fresh interpreter, so it runs in every stage, not only the pure one)."""
    import os
    import subprocess
    import sys

    code = ("import kvest; from kvest import reference; "
            "assert kvest.IMPLEMENTATION == 'python'; "
            "print(sum(getattr(kvest, n) is getattr(reference, n) for n in reference.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, KVEST_PURE_PYTHON="1"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(reference.__all__) == len(FUNCTIONS)


def test_oracle_covers_every_public_function():
    """Every public function has an oracle; a missing one fails, never skips."""
    assert set(oracle.FUNCTIONS) == set(FUNCTIONS)
    for name in FUNCTIONS:
        assert callable(getattr(kvest, name))


def test_a_function_missing_from_the_oracle_fails(monkeypatch):
    monkeypatch.delitem(oracle.FUNCTIONS, "decode_new_tokens")
    with pytest.raises(KeyError):
        check_same("decode_new_tokens", [16, 17, 32], 16)


def test_an_oracle_that_breaks_fails(monkeypatch):
    """Only oracle.Unmodelled means "not modelled"; an oracle that fails in any
    other way fails the test instead of leaving the twin to check itself."""
    def broken(*args, **kwargs):
        raise TypeError("the oracle's own bug")

    monkeypatch.setitem(oracle.FUNCTIONS, "decode_new_tokens", broken)
    with pytest.raises(TypeError, match="own bug"):
        check_same("decode_new_tokens", [16, 17, 32], 16)


def test_oracle_is_independent_of_kvest():
    """tests/oracle.py imports nothing from kvest: it is not the code under test."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(oracle.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.split(".")[0] == "kvest"}


@pytest.mark.parametrize(("name", "args", "kwargs", "want"), [
    ("spec_v2_new_tokens", ([2**63 - 1], [0], 16, 0), {}, OverflowError),  # ceil_align
    ("spec_v2_new_tokens", ([2**63 - 1], [0], 1, 1), {}, OverflowError),  # C + R
    ("spec_v2_new_tokens", ([2**62] * 2, [0, 0], 1, 0), {}, OverflowError),  # the sum
    ("spec_v2_new_tokens", ([2**63 - 1], [0], 1, 0), {}, 2**63 - 1),
    ("decode_new_tokens", ([0, 0], 2**62), {}, OverflowError),
    ("num_new_pages", ([2**63 - 1] * 2, 1, [0, 0]), {}, OverflowError),
    ("num_new_pages", ([2**63 - 1, 0], 1, [0, 2**63 - 1]), {}, 0),  # the terms cancel
    ("spec_v1_new_tokens", (2, 1, 2**62, 1, 0), {}, OverflowError),
    ("alloc_len_per_decode", (2**62, 2, 0, 1), {}, OverflowError),
    ("alloc_reserve_per_decode", (2**62, 1, 0, 1), {}, OverflowError),
    ("decode_alloc_plan", ([2**31 - 1], [0], 16, 0),
     {"out": (np.zeros(1, np.int32), np.zeros(1, np.int32))}, OverflowError),
    ("decode_alloc_plan", ([2**31 - 1], [0], 16, 0), {}, ([0], [2**31], 2**31, 2**27)),
])
def test_oracle_models_int64_overflow(name, args, kwargs, want):
    """Overflow cases are checked against the oracle too, not only between the
    implementations."""
    got = check_exact(name, *args, **kwargs)
    assert got == (("raise", want) if isinstance(want, type) else ("ok", want))


@given(st.data(), st.integers(0, 12), st.sampled_from(["int32", "int64"]), st.booleans())
def test_out_buffers_sharing_memory(data, n, dtype, strided):
    """out= buffers cut from one base at random offsets, the lengths too: a
    ValueError exactly when some out buffer shares memory with the other or
    with an input (the compiled shortcut and the general check agree)."""
    base = np.zeros(3 * n + 8, dtype)
    offsets = st.integers(0, 2 * n + 8 - (2 * n if strided else n))
    c = base[data.draw(offsets):][: 2 * n: 2 if strided else 1][:n]
    cur = base[data.draw(st.integers(0, 2 * n + 8)):][:n]
    nxt = base[data.draw(st.integers(0, 2 * n + 8)):][:n]
    if len(cur) != n or len(nxt) != n or len(c) != n:
        return
    a = np.zeros(n, dtype)
    shared = n > 0 and (np.shares_memory(cur, nxt) or np.shares_memory(cur, c)
                        or np.shares_memory(nxt, c))
    got = check_same("decode_alloc_plan", c, a, 16, 2, out=(cur, nxt))
    assert got[0] == ("raise" if shared else "ok")
    if shared:
        assert got[1] is ValueError


# ------------------------------------------------------ request objects

class Beam:
    def __init__(self, rows: int) -> None:
        self.num_member_rows = rows


def _requests(draw, n: int, p: int, cls: type) -> list:
    values = draw(st.lists(st.tuples(length_values(p), length_values(p)), min_size=n,
                           max_size=n))
    return [cls(c, a) for c, a in values]


def _layout_for(draw, cls: type) -> str | None:
    """None (the search), or the layout the request class implies."""
    return draw(st.sampled_from([None, LAYOUT_OF[cls]]))


req_counts = st.integers(0, 16)


@given(st.data(), req_counts, page_sizes, reserves, st.sampled_from(ALL))
def test_spec_v2_new_tokens_from_reqs(data, n, p, r, cls):
    reqs = _requests(data.draw, n, p, cls)
    check_exact("spec_v2_new_tokens_from_reqs", reqs, p, r, data.draw(indices_for(n)),
                layout=_layout_for(data.draw, cls))


@given(st.data(), req_counts, page_sizes, st.sampled_from(ALL))
def test_decode_new_tokens_from_reqs(data, n, p, cls):
    reqs = _requests(data.draw, n, p, cls)
    check_exact("decode_new_tokens_from_reqs", reqs, p, data.draw(indices_for(n)),
                layout=_layout_for(data.draw, cls))


@given(st.data(), req_counts, page_sizes, reserves, st.sampled_from(ALL),
       st.booleans(), st.sampled_from([None, np.int32, np.int64]))
def test_decode_alloc_plan_from_reqs(data, n, p, r, cls, aligned, dtype):
    reqs = _requests(data.draw, n, p, cls)
    got = check_exact("decode_alloc_plan_from_reqs", reqs, p, r,
                      indices=data.draw(indices_for(n)), page_aligned=aligned, dtype=dtype,
                      layout=_layout_for(data.draw, cls))
    if got[0] == "ok":
        cur, nxt, tokens, pages = got[1]
        assert tokens == sum(nxt) - sum(cur)
        assert pages * p >= tokens - sum(-a % p for a in cur)


@given(st.data(), req_counts, st.sampled_from([FlatReq, MixedReq, NestedReq, TinyFlat]))
def test_beam_member_rows_from_reqs(data, n, cls):
    reqs = [cls(0, 0) for _ in range(n)]
    groups = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 2**40)), min_size=n,
                                max_size=n))
    for req, rows in zip(reqs, groups, strict=True):
        req.beam_group = None if rows is None else Beam(rows)
    got = check_exact("beam_member_rows_from_reqs", reqs, data.draw(indices_for(n)))
    if got[0] == "ok" and all(req.beam_group is None for req in reqs):
        assert got[1] == 0
    chosen = data.draw(indices_for(n))
    got = check_exact("beam_groups_from_reqs", reqs, chosen)
    if got[0] == "ok" and chosen is None:
        assert got[1] == sum(rows is not None for rows in groups)


@pytest.mark.parametrize(("cls", "layout"), [(FlatReq, "nested"), (NestedReq, "flat"),
                                             (MixedReq, "nested")])
def test_a_layout_that_does_not_fit_is_not_modelled_but_agrees(cls, layout):
    """Lengths missing where the layout reads them: an AttributeError, the same
    from both implementations (the oracle leaves the exception type to them)."""
    got = check_same("spec_v2_new_tokens_from_reqs", [cls(5, 8)], 16, 6, layout=layout)
    assert got == ("raise", AttributeError)


def test_request_functions_worked_example():
    """The README's request-object tour, against the oracle."""
    reqs = [TinyFlat(c, a) for c, a in zip([5, 16, 31, 0, 100], [8, 16, 32, 0, 96],
                                           strict=True)]
    assert check_exact("spec_v2_new_tokens_from_reqs", reqs, 16, 128) == ("ok", 656)
    assert check_exact("spec_v2_new_tokens_from_reqs", reqs, 16, 128, [4, -1],
                       layout="flat") == ("ok", 288)
    assert check_exact("decode_new_tokens_from_reqs", reqs, 16) == ("ok", 32)
    plan = check_exact("decode_alloc_plan_from_reqs", reqs, 16, 128, dtype=np.int32)
    assert plan == ("ok", ([8, 16, 32, 0, 96], [144, 144, 160, 128, 240], 664, 41))
    for req in reqs:
        req.beam_group = None
    reqs[2].beam_group = Beam(3)
    assert check_exact("beam_member_rows_from_reqs", reqs) == ("ok", 3)
    assert check_exact("beam_member_rows_from_reqs", reqs, [0, 1]) == ("ok", 0)
    assert check_exact("beam_groups_from_reqs", reqs) == ("ok", 1)
    assert check_exact("beam_groups_from_reqs", reqs, [2, 2, 0]) == ("ok", 2)


@settings(deadline=None)
@given(committed=st.lists(st.integers(-2**70, 2**70), max_size=12),
       delta=st.integers(-2**66, 2**66), data=st.data())
def test_writers_against_the_oracle(committed, delta, data):
    """The writers leave requests as the oracle's plain loops do."""
    import copy

    from request_standins import NestedReq

    reqs = [NestedReq(c, c // 2) for c in committed]
    twin = copy.deepcopy(reqs)
    paths = data.draw(st.sampled_from([
        "kv.kv_committed_len", (("kv", "kv_allocated_len"), ("kv", "kv_committed_len"))]))
    kvest.add_to_attrs(reqs, paths, delta)
    oracle.FUNCTIONS["add_to_attrs"](twin, paths, delta)
    values = data.draw(st.lists(st.integers(-2**70, 2**70), min_size=len(reqs),
                                max_size=len(reqs)))
    kvest.max_into_attr(reqs, "kv.kv_allocated_len", values)
    oracle.FUNCTIONS["max_into_attr"](twin, "kv.kv_allocated_len", values)
    assert [(r.kv.kv_committed_len, r.kv.kv_allocated_len) for r in reqs] == \
        [(r.kv.kv_committed_len, r.kv.kv_allocated_len) for r in twin]
