"""The pure-Python twin of ``kvest._reqs``: request-object estimators as plain loops.

Same names, signatures and exceptions as the compiled module; each request is
read through the shared input rule (:func:`kvest._inputs.req_length`) and the
arithmetic is done on Python ints, with int64 limits checked as values appear.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvest._inputs import INT64_MAX, as_count, as_reqs, req_length, result_int64
from kvest._names import REQ_FUNCTIONS

__all__ = list(REQ_FUNCTIONS)


def _ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


def _fits(value: int, what: str) -> int:
    if value > INT64_MAX:
        raise OverflowError(f"{what} = {value} does not fit in int64")
    return value


def spec_v2_new_tokens_from_reqs(reqs: Sequence[Any], page_size: int, reserve: int) -> int:
    """:func:`spec_v2_new_tokens` read straight from request objects.

    Each request gives ``kv_committed_len`` and ``kv_allocated_len``, either
    flat on the request or nested under ``req.kv``.
    """
    reqs = as_reqs(reqs)
    p = as_count(page_size, "page_size", 1)
    r = as_count(reserve, "reserve", 0)
    total = 0
    for pos, req in enumerate(reqs):
        c = req_length(req, pos, "kv_committed_len")
        a = req_length(req, pos, "kv_allocated_len")
        nxt = max(a, _fits(c + r, f"reqs[{pos}]: committed + reserve"))
        total += _fits(_ceil_align(nxt, p), f"reqs[{pos}]: ceil_align") - _ceil_align(a, p)
        _fits(total, "spec_v2_new_tokens_from_reqs")
    return total


def decode_new_tokens_from_reqs(reqs: Sequence[Any], page_size: int) -> int:
    """:func:`decode_new_tokens` read straight from request objects."""
    reqs = as_reqs(reqs)
    p = as_count(page_size, "page_size", 1)
    pages = 0
    for pos, req in enumerate(reqs):
        if req_length(req, pos, "kv_committed_len") % p == 0:
            pages += 1
    return result_int64(pages * p, "decode_new_tokens_from_reqs")
