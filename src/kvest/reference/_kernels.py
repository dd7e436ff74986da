"""The pure-Python twin of ``kvest._kernels``: the array estimators as plain loops.

Each function here has the same name, signature and exceptions as its compiled
counterpart and is written as the plain per-request loop a scheduler would
write, over Python ints (arbitrary precision), so that it is obviously correct.
``KVEST_PURE_PYTHON=1`` serves these functions as ``kvest.*``.

Integers are exact, but results follow int64 semantics: where a value named in
a formula (an input, an intermediate such as ``C[i] + R`` or
``ceil_align(x, p)``, or the result) falls outside int64, the function raises
``OverflowError`` instead of returning a number no int64 scheduler could hold.
Rows are checked in order, and within a row in the order the formula names its
values, so the first value out of range is the one reported; sums whose terms
are never negative are checked as they run (the first row where the running
total leaves int64), the signed sum of ``num_new_pages`` only at the end.  The
compiled kernels report the same row with the same message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvest._errors import int64_overflow, plan_overflow, spec_v2_overflow
from kvest._inputs import (
    INT64_MAX,
    as_count,
    as_flag,
    as_indices,
    as_lengths,
    as_out,
    check_same_length,
    first_negative,
    out_pair,
    result_int64,
)
from kvest._names import ARRAY_FUNCTIONS
from kvest._types import AllocPlan

__all__ = list(ARRAY_FUNCTIONS)  # kvest._names: the one list


def ceil_div(x: int, p: int) -> int:
    """``ceil(x / p)`` for ``x >= 0``, ``p >= 1``."""
    return -(-x // p)


def ceil_align(x: int, p: int) -> int:
    """``ceil(x / p) * p``: ``x`` rounded up to a whole number of pages."""
    return ceil_div(x, p) * p


def _fits(value: int, what: str) -> int:
    if value > INT64_MAX:
        raise int64_overflow(what, value)
    return value


def _rows(n: int, indices: Any) -> list[int]:
    """The selected rows, in order, with Python list semantics."""
    if indices is None:
        return list(range(n))
    return [i % n for i in as_indices(indices, n).tolist()]


def _lengths(obj: Any, name: str) -> list[int]:
    return as_lengths(obj, name).tolist()


def _nonnegative(*named: tuple[Any, str], rows: list[int] | None = None) -> None:
    for values, name in named:
        first_negative(values, name, rows)


def spec_v2_new_tokens(
    committed: Any, allocated: Any, page_size: int, reserve: int, indices: Any = None
) -> int:
    """KV slots the next spec-v2 (overlap) decode step allocates.

    ``sum(ceil_align(max(A[i], C[i] + R), p) - ceil_align(A[i], p))`` over the
    selected rows ``i``, with ``C = committed``, ``A = allocated``,
    ``p = page_size`` and ``R = reserve``.
    """
    p = as_count(page_size, "page_size", 1)
    r = as_count(reserve, "reserve", 0)
    c = _lengths(committed, "committed")
    a = _lengths(allocated, "allocated")
    check_same_length(c, "committed", a, "allocated")
    rows = _rows(len(c), indices)
    _nonnegative((c, "committed"), (a, "allocated"), rows=rows)
    total = 0
    for i in rows:
        top = ceil_align(max(a[i], c[i] + r), p)
        if c[i] + r > INT64_MAX or top > INT64_MAX or total + top - ceil_align(a[i], p) > INT64_MAX:
            raise spec_v2_overflow(i, c[i], a[i], p, r, total)
        total += top - ceil_align(a[i], p)
    return total


def decode_new_tokens(committed: Any, page_size: int, indices: Any = None) -> int:
    """KV slots the next plain decode step allocates.

    ``p * count(C[i] mod p == 0)`` over the selected rows: a request needs a
    fresh page exactly when its committed length sits on a page boundary.
    """
    p = as_count(page_size, "page_size", 1)
    c = _lengths(committed, "committed")
    rows = _rows(len(c), indices)
    _nonnegative((c, "committed"), rows=rows)
    pages = 0
    for i in rows:
        if c[i] % p == 0:
            pages += 1
    return result_int64(pages * p, "decode_new_tokens")


def spec_v1_new_tokens(
    num_requests: int, page_size: int, num_steps: int | None, topk: int | None,
    num_draft_tokens: int | None,
) -> int:
    """Upper bound on KV slots a spec-v1 (EAGLE) decode step allocates.

    With ``s = num_steps or 1``, ``k = topk or 1``, ``T = num_draft_tokens``:
    ``L = ceil_align(s + p, p)`` and ``T' = ceil_align(T, p)`` when ``p > 1`` and
    ``k > 1``; ``L = ceil_align(s, p)``, ``T' = ceil_align(T, p)`` when ``p > 1``
    and ``k == 1``; ``L = s``, ``T' = T`` when ``p == 1``.  Returns
    ``num_requests * max(L * k, T')``.  ``None`` counts as unset (0).
    """
    n = as_count(num_requests, "num_requests")
    p = as_count(page_size, "page_size", 1)
    s = as_count(num_steps, "num_steps", optional=True) or 1
    k = as_count(topk, "topk", optional=True) or 1
    t = as_count(num_draft_tokens, "num_draft_tokens", optional=True)
    if p > 1 and k > 1:
        length = _fits(ceil_align(_fits(s + p, "num_steps + page_size"), p), "L")
        t = _fits(ceil_align(t, p), "ceil_align(num_draft_tokens)")
    elif p > 1:
        length = _fits(ceil_align(s, p), "L")
        t = _fits(ceil_align(t, p), "ceil_align(num_draft_tokens)")
    else:
        length = s
    per_request = max(_fits(length * k, "L * topk"), t)
    return result_int64(n * per_request, "spec_v1_new_tokens")


def num_new_pages(
    seq_lens: Any, page_size: int, prefix_lens: Any = None, decode: bool = False
) -> int:
    """Pages (not tokens) an extend or decode allocation takes.

    Extend: ``sum(ceil_div(S[i], p) - ceil_div(P[i], p))``.  ``decode=True``:
    ``count(S[i] mod p == 1)``, where ``S`` already includes the new token;
    like SGLang's decode special case this is 0 when ``p == 1``.
    """
    p = as_count(page_size, "page_size", 1)
    if as_flag(decode, "decode"):
        # As SGLang's get_num_new_pages: prefix_lens is not read at all.
        s = _lengths(seq_lens, "seq_lens")
        _nonnegative((s, "seq_lens"))
        pages = 0
        for length in s:
            if length % p == 1:
                pages += 1
        return pages
    if prefix_lens is None:
        raise ValueError("num_new_pages needs prefix_lens unless decode=True")
    s = _lengths(seq_lens, "seq_lens")
    pre = _lengths(prefix_lens, "prefix_lens")
    check_same_length(s, "seq_lens", pre, "prefix_lens")
    _nonnegative((s, "seq_lens"), (pre, "prefix_lens"))
    pages = 0
    for i in range(len(s)):
        pages += ceil_div(s[i], p) - ceil_div(pre[i], p)
    return result_int64(pages, "num_new_pages")


def alloc_len_per_decode(
    num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
    page_size: int, *, speculative: bool = True, has_draft_kv: bool = True,
) -> int:
    """KV length one request may allocate in one decode step.

    ``1`` without speculation; ``max(s * k, T)`` when ``p == 1``, ``k == 1`` or
    the draft model keeps no KV (``has_draft_kv=False``); otherwise (tree
    drafts on pages) ``max(ceil_div(p - 1 + s, p) * p * k, T)``, with ``s``,
    ``k``, ``T`` as in :func:`spec_v1_new_tokens`.
    """
    s = as_count(num_steps, "num_steps", optional=True) or 1
    k = as_count(topk, "topk", optional=True) or 1
    t = as_count(num_draft_tokens, "num_draft_tokens", optional=True)
    p = as_count(page_size, "page_size", 1)
    speculative = as_flag(speculative, "speculative")
    has_draft_kv = as_flag(has_draft_kv, "has_draft_kv")
    if not speculative:
        return 1
    if p == 1 or k == 1 or not has_draft_kv:
        return max(_fits(s * k, "num_steps * topk"), t)
    pages = ceil_div(_fits(p - 1 + s, "page_size - 1 + num_steps"), p)
    span = _fits(_fits(pages * p, "pages * page_size") * k, "pages * page_size * topk")
    return max(span, t)


def alloc_reserve_per_decode(
    num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
    page_size: int, *, speculative: bool = True, has_draft_kv: bool = True,
) -> int:
    """The reserve ``R``: ``2 * alloc_len_per_decode(...)``."""
    one = alloc_len_per_decode(
        num_steps, topk, num_draft_tokens, page_size,
        speculative=speculative, has_draft_kv=has_draft_kv,
    )
    return result_int64(2 * one, "alloc_reserve_per_decode")


def decode_alloc_plan(
    committed: Any, allocated: Any, page_size: int, reserve: int, *,
    page_aligned: bool = True, out: tuple[Any, Any] | None = None,
) -> AllocPlan:
    """The spec-v2 decode allocation itself, in one pass.

    Per request ``cur = A[i]`` and ``nxt = max(A[i], ceil_align(C[i] + R, p))``
    (``page_aligned``) or ``nxt = max(A[i], C[i] + R)``; returns both arrays,
    ``num_tokens = sum(nxt - cur)`` and
    ``num_pages = sum(ceil_div(nxt, p) - ceil_div(cur, p))``.  ``out=(cur, nxt)``
    fills preallocated buffers instead: NumPy arrays or CPU tensors, both int32
    or both int64, separate from each other and from the inputs (their contents
    are unspecified if the call raises); the plan then holds those objects.
    ``num_pages * p`` always equals :func:`spec_v2_new_tokens` on the same inputs.
    """
    p = as_count(page_size, "page_size", 1)
    r = as_count(reserve, "reserve", 0)
    aligned = as_flag(page_aligned, "page_aligned")
    c_arr = as_lengths(committed, "committed")
    a_arr = as_lengths(allocated, "allocated")
    check_same_length(c_arr, "committed", a_arr, "allocated")
    out = out_pair(out)  # read once: the plan returns the objects it wrote
    if out is None:
        cur_out, nxt_out = np.empty(len(c_arr), np.int64), np.empty(len(c_arr), np.int64)
    else:
        cur_out, nxt_out = as_out(
            out, len(c_arr), ("committed", committed), ("allocated", allocated),
            ("committed", c_arr), ("allocated", a_arr))
    c, a = c_arr.tolist(), a_arr.tolist()
    _nonnegative((c, "committed"), (a, "allocated"))
    limit = int(np.iinfo(cur_out.dtype).max)
    tokens = pages = 0
    for i in range(len(c)):
        need = ceil_align(c[i] + r, p) if aligned else c[i] + r
        cur, nxt = a[i], max(a[i], need)
        if need > INT64_MAX or nxt > limit or tokens + nxt - cur > INT64_MAX:
            raise plan_overflow(i, c[i], a[i], p, r, aligned, cur_out.dtype, tokens)
        cur_out[i], nxt_out[i] = cur, nxt
        tokens += nxt - cur
        pages += ceil_div(nxt, p) - ceil_div(cur, p)  # <= tokens: fits too
    if out is None:
        return AllocPlan(cur_out, nxt_out, tokens, pages)
    return AllocPlan(out[0], out[1], tokens, pages)
