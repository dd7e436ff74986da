"""Kernels against the reference: Hypothesis-driven, on every CPU variant."""

from __future__ import annotations

import numpy as np
from helpers import (
    check_same,
    indices_for,
    length_arrays,
    page_sizes,
    reserves,
)
from hypothesis import given, settings
from hypothesis import strategies as st

sizes = st.integers(0, 40)


def more_examples(factor: int) -> settings:
    """The loaded profile's example count times factor: a few thousand per
    function in CI, for functions with fewer tests (or no CPU variants)."""
    return settings(max_examples=settings.default.max_examples * factor)


@given(st.data(), sizes, page_sizes, reserves, st.booleans())
def test_spec_v2_new_tokens(cpu_variant, data, n, p, r, negative):
    c = data.draw(length_arrays(n, p, negative))
    a = data.draw(length_arrays(n, p))
    check_same("spec_v2_new_tokens", c, a, p, r, indices=data.draw(indices_for(n)))


@given(st.data(), sizes, page_sizes, st.booleans())
def test_decode_new_tokens(cpu_variant, data, n, p, negative):
    c = data.draw(length_arrays(n, p, negative))
    check_same("decode_new_tokens", c, p, indices=data.draw(indices_for(n)))


@more_examples(3)
@given(st.data(), sizes, page_sizes, st.booleans(), st.booleans())
def test_num_new_pages(cpu_variant, data, n, p, decode, negative):
    s = data.draw(length_arrays(n, p, negative))
    pre = data.draw(st.none() | length_arrays(n, p)) if decode else data.draw(length_arrays(n, p))
    check_same("num_new_pages", s, p, pre, decode=decode)


@given(st.data(), sizes, page_sizes, reserves, st.booleans(), st.booleans(),
       st.sampled_from([None, "int32", "int64"]))
def test_decode_alloc_plan(cpu_variant, data, n, p, r, aligned, negative, out_dtype):
    c = data.draw(length_arrays(n, p, negative))
    a = data.draw(length_arrays(n, p))
    if out_dtype is None:
        check_same("decode_alloc_plan", c, a, p, r, page_aligned=aligned)
        return
    # Each implementation fills its own buffers: outcomes must still agree.
    import kvest
    from kvest import reference

    fast_out = (np.zeros(n, out_dtype), np.zeros(n, out_dtype))
    slow_out = (np.zeros(n, out_dtype), np.zeros(n, out_dtype))
    try:
        fast = kvest.decode_alloc_plan(c, a, p, r, page_aligned=aligned, out=fast_out)
    except Exception as exc:
        fast = type(exc)
    try:
        slow = reference.decode_alloc_plan(c, a, p, r, page_aligned=aligned, out=slow_out)
    except Exception as exc:
        slow = type(exc)
    if isinstance(slow, type):
        assert fast is slow
    else:
        assert fast.cur is fast_out[0] and fast.nxt is fast_out[1]
        assert fast_out[0].tolist() == slow_out[0].tolist()
        assert fast_out[1].tolist() == slow_out[1].tolist()
        assert (fast.num_tokens, fast.num_pages) == (slow.num_tokens, slow.num_pages)


@given(st.data(), sizes, page_sizes, reserves, st.booleans())
def test_alloc_plan_pages_match_spec_v2(cpu_variant, data, n, p, r, aligned):
    """SPEC invariant: num_pages * p == spec_v2_new_tokens, for both nxt variants."""
    import kvest

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
    check_same("spec_v1_new_tokens", n, p, steps, topk, draft)


@more_examples(8)
@given(counts, counts, counts, page_sizes, st.booleans(), st.booleans())
def test_alloc_len_per_decode(steps, topk, draft, p, speculative, has_draft_kv):
    kw = {"speculative": speculative, "has_draft_kv": has_draft_kv}
    check_same("alloc_len_per_decode", steps, topk, draft, p, **kw)
    check_same("alloc_reserve_per_decode", steps, topk, draft, p, **kw)


@given(st.data(), st.integers(0, 40), page_sizes, reserves)
def test_indices_equal_fancy_indexing(cpu_variant, data, n, p, r):
    """f(C, A, indices=idx) == f(C[idx], A[idx]) whenever idx is in range."""
    import kvest

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
        check_same("spec_v2_new_tokens", arr_c, arr_a, p, r)
        check_same("decode_new_tokens", arr_c, p)
        check_same("num_new_pages", arr_c + 1, p, arr_c // 2)
        check_same("num_new_pages", arr_c, p, decode=True)
