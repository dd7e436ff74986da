"""Hand-worked examples: every branch of every formula, worked out on paper.

These run against the live implementation (compiled or pure), against the
reference, and against the tests' own oracle, so each example checks all three
(the oracle is what the differential tests trust: it is held to paper too).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import oracle
import pytest

import kvest
from kvest import reference


class _OracleAsModule:
    """tests/oracle.py with kvest's call shapes (a plan with arrays, filling out=)."""

    def __getattr__(self, name):
        return oracle.FUNCTIONS[name]

    @staticmethod
    def decode_alloc_plan(*args, out=None, **kwargs):
        cur, nxt, tokens, pages = oracle.decode_alloc_plan(*args, out=out, **kwargs)
        if out is None:
            out = (np.array(cur, np.int64), np.array(nxt, np.int64))
        else:
            out[0][:], out[1][:] = cur, nxt
        return SimpleNamespace(cur=out[0], nxt=out[1], num_tokens=tokens, num_pages=pages)


IMPLS = [pytest.param(kvest, id="kvest"), pytest.param(reference, id="reference"),
         pytest.param(_OracleAsModule(), id="oracle")]

C = np.array([5, 16, 31, 0, 100])
A = np.array([8, 16, 32, 0, 96])


@pytest.mark.parametrize("impl", IMPLS)
class TestFormulas:
    def test_spec_v2_worked_example(self, impl):
        # p=16, R=6, row by row: max(A, C+R) -> ceil_align - ceil_align(A)
        # 11 -> 16-16=0 | 22 -> 32-16=16 | 37 -> 48-32=16 | 6 -> 16-0=16 | 106 -> 112-96=16
        assert impl.spec_v2_new_tokens(C, A, 16, 6) == 64

    def test_spec_v2_allocated_ahead_needs_nothing(self, impl):
        # A already covers C + R: max() keeps A, nothing new.
        assert impl.spec_v2_new_tokens([10], [64], 16, 6) == 0

    def test_spec_v2_page_size_one_is_plain_growth(self, impl):
        # p=1: sum(max(A, C+R) - A) = 3 + 6 + 5 + 6 + 10
        assert impl.spec_v2_new_tokens(C, A, 1, 6) == 30

    def test_spec_v2_non_power_of_two_page(self, impl):
        # p=100, R=6: ceil_align(106)=200 vs ceil_align(96)=100 -> 100; the
        # others stay within their first page except row 3 (0 -> 100) -> 200.
        assert impl.spec_v2_new_tokens(C, A, 100, 6) == 200

    def test_spec_v2_indices(self, impl):
        # rows 4, 0, 0 (negative index and a duplicate): 16 + 0 + 0
        assert impl.spec_v2_new_tokens(C, A, 16, 6, indices=[-1, 0, 0]) == 16
        assert impl.spec_v2_new_tokens(C, A, 16, 6, indices=[1, 1]) == 32
        assert impl.spec_v2_new_tokens(C, A, 16, 6, indices=[]) == 0

    def test_decode_new_tokens(self, impl):
        # rows on a page boundary: 16 and 0 -> 2 pages of 16
        assert impl.decode_new_tokens(C, 16) == 32
        # p=1: every row needs a slot
        assert impl.decode_new_tokens(C, 1) == 5
        # p=5: 5, 0 and 100 are multiples of 5
        assert impl.decode_new_tokens(C, 5) == 15
        assert impl.decode_new_tokens(C, 16, indices=[1, -2, 0]) == 32

    def test_num_new_pages_extend(self, impl):
        # ceil_div(S,16): 1,1,2,0,7; ceil_div(P,16): 1,1,1,0,3 -> 0+0+1+0+4
        assert impl.num_new_pages(C, 16, [4, 8, 16, 0, 48]) == 5
        # A longer prefix than sequence gives a negative term: 1 - 2
        assert impl.num_new_pages([16], 16, [17]) == -1

    def test_num_new_pages_decode(self, impl):
        s = [1, 17, 33, 16, 2]
        # S mod 16 == 1 for 1, 17, 33
        assert impl.num_new_pages(s, 16, decode=True) == 3
        # SGLang's special case: with p == 1, S mod 1 is never 1
        assert impl.num_new_pages(s, 1, decode=True) == 0

    def test_num_new_pages_needs_prefix(self, impl):
        with pytest.raises(ValueError, match="prefix_lens"):
            impl.num_new_pages(C, 16)

    @pytest.mark.parametrize(
        ("args", "expected"),
        [
            # p > 1, k > 1: L = ceil_align(5 + 16, 16) = 32, T' = 16; 10 * max(128, 16)
            ((10, 16, 5, 4, 8), 1280),
            # p > 1, k == 1: L = ceil_align(5, 16) = 16, T' = ceil_align(8, 16) = 16
            ((10, 16, 5, 1, 8), 160),
            # p > 1, k == 1, T' dominates: ceil_align(40, 16) = 48
            ((2, 16, 3, 1, 40), 96),
            # p == 1: max(5 * 4, 64) = 64
            ((10, 1, 5, 4, 64), 640),
            # unset steps and topk count as 1: max(1, 4)
            ((3, 1, None, None, 4), 12),
            ((3, 1, 0, 0, 0), 3),
            ((0, 16, 5, 4, 8), 0),
        ],
    )
    def test_spec_v1_new_tokens(self, impl, args, expected):
        assert impl.spec_v1_new_tokens(*args) == expected

    @pytest.mark.parametrize(
        ("args", "kwargs", "expected"),
        [
            ((3, 1, 4, 16), {"speculative": False}, 1),
            ((3, 1, 4, 1), {}, 4),  # p == 1: max(3 * 1, 4)
            ((5, 8, 64, 1), {}, 64),  # p == 1: max(40, 64)
            ((5, 1, 8, 16), {}, 8),  # k == 1: max(5, 8)
            ((5, 4, 8, 16), {"has_draft_kv": False}, 20),  # max(20, 8)
            # tree drafts on pages: ceil_div(15 + 5, 16) * 16 * 4 = 128
            ((5, 4, 8, 16), {}, 128),
            # ceil_div(99 + 3, 100) * 100 * 2 = 400 > 6
            ((3, 2, 6, 100), {}, 400),
        ],
    )
    def test_alloc_len_per_decode(self, impl, args, kwargs, expected):
        assert impl.alloc_len_per_decode(*args, **kwargs) == expected
        assert impl.alloc_reserve_per_decode(*args, **kwargs) == 2 * expected

    def test_decode_alloc_plan_page_aligned(self, impl):
        plan = impl.decode_alloc_plan(C, A, 16, 6)
        # nxt = max(A, ceil_align(C + 6, 16)): 16, 32, 48, 16, 112
        assert plan.cur.tolist() == A.tolist()
        assert plan.nxt.tolist() == [16, 32, 48, 16, 112]
        assert plan.num_tokens == 8 + 16 + 16 + 16 + 16
        assert plan.num_pages == 4
        assert plan.num_pages * 16 == impl.spec_v2_new_tokens(C, A, 16, 6)

    def test_decode_alloc_plan_unaligned(self, impl):
        plan = impl.decode_alloc_plan(C, A, 16, 6, page_aligned=False)
        # nxt = max(A, C + 6): 11, 22, 37, 6, 106
        assert plan.nxt.tolist() == [11, 22, 37, 6, 106]
        assert plan.num_tokens == 3 + 6 + 5 + 6 + 10
        # pages: 1-1, 2-1, 3-2, 1-0, 7-6
        assert plan.num_pages == 4

    def test_decode_alloc_plan_fills_int32_buffers(self, impl):
        cur = np.full(5, -1, dtype=np.int32)
        nxt = np.full(5, -1, dtype=np.int32)
        plan = impl.decode_alloc_plan(C, A, 16, 6, out=(cur, nxt))
        assert plan.cur is cur and plan.nxt is nxt
        assert nxt.tolist() == [16, 32, 48, 16, 112]

    def test_empty_batches(self, impl):
        empty = np.zeros(0, dtype=np.int64)
        assert impl.spec_v2_new_tokens(empty, [], 16, 6) == 0
        assert impl.decode_new_tokens([], 16) == 0
        assert impl.num_new_pages([], 16, []) == 0
        assert impl.decode_alloc_plan([], [], 16, 6).num_pages == 0

    def test_int64_boundaries(self, impl):
        big = 2**63 - 1
        # p == 1, R == 0: max(A, C) - A stays in range.
        assert impl.spec_v2_new_tokens([big], [0], 1, 0) == big
        # ceil_align(2^63 - 1, 16) = 2^63 does not fit.
        with pytest.raises(OverflowError):
            impl.spec_v2_new_tokens([big], [0], 16, 0)
        # C + R overflows.
        with pytest.raises(OverflowError):
            impl.spec_v2_new_tokens([big], [big], 1, 1)
        # Three rows of 2^62 sum past int64.
        with pytest.raises(OverflowError):
            impl.spec_v2_new_tokens([2**62] * 3, [0] * 3, 1, 0)
        # p * count past int64.
        with pytest.raises(OverflowError):
            impl.decode_new_tokens([0, 0], 2**62 + 1)
        assert impl.decode_new_tokens([2**31, 2**31 + 1], 2**31) == 2**31


def test_implementation_is_reported():
    assert kvest.IMPLEMENTATION in ("cython", "python")
    config = kvest.show_config()
    assert config["implementation"] == kvest.IMPLEMENTATION


def test_every_public_function_has_a_twin():
    import kvest._types

    for name in reference.__all__:
        fast, slow = getattr(kvest, name), getattr(reference, name)
        assert fast.__doc__ and slow.__doc__
        assert fast.__doc__.split("\n")[0] == slow.__doc__.split("\n")[0], name
