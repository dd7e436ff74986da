"""The pure-Python twin of ``kvest._reqs``: request-object estimators as plain loops.

Same names, signatures and exceptions as the compiled module; each request is
read through the shared input rule (:func:`kvest._inputs.req_length`) and the
arithmetic is done on Python ints, with int64 limits checked as values appear.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvest._errors import plan_reqs_overflow, spec_v2_reqs_overflow
from kvest._inputs import (
    INT64_MAX,
    KV,
    as_count,
    as_flag,
    as_plan_out,
    as_req_layout,
    as_reqs,
    beam_attr,
    beam_rows_value,
    plan_grew_error,
    plan_shrank_error,
    pure_args,
    pure_reqs,
    req_length,
    req_length_value,
    req_read_error,
    req_rows,
    reqs_iter,
    reqs_list,
    reqs_read_error,
    result_int64,
)
from kvest._names import REQ_FUNCTIONS
from kvest._types import AllocPlan
from kvest.reference import _pure

__all__ = list(REQ_FUNCTIONS)  # kvest._names: the one list


def _ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


def _ceil_div(x: int, p: int) -> int:
    return -(-x // p)


def _length(req: Any, pos: int, attr: str, where: str, exact: bool, pure: bool = False) -> int:
    """reqs[pos].<attr> read where the layout says (see kvest._inputs.REQ_LAYOUTS);
    in pure mode without code of the caller's (kvest.reference._pure)."""
    if pure:
        return _pure.length(req, pos, attr, where)
    if where == "either":
        return req_length(req, pos, attr, exact)
    path = f".kv.{attr}" if where == "nested" else f".{attr}"
    try:
        value = getattr(getattr(req, KV) if where == "nested" else req, attr)
    except AttributeError:
        raise AttributeError(f"reqs[{pos}] has no {path}") from None
    except MemoryError:
        raise
    except Exception as exc:
        raise req_read_error(exc, pos, path) from exc
    return req_length_value(value, pos, attr, exact)


def _selected(reqs: Any, rows: np.ndarray | None) -> Iterator[tuple[int, Any]]:
    """(position, request) for every selected request, in order; a container
    that fails while read is a TypeError naming the position."""
    if rows is None:
        it = reqs_iter(reqs)
        pos = 0
        while True:
            try:
                req = next(it)
            except StopIteration:
                return
            except MemoryError:
                raise
            except Exception as exc:
                raise reqs_read_error(exc, pos) from exc
            yield pos, req
            pos += 1
    # The selection taken whole before any request is read, as [reqs[i] for i
    # in indices] takes it: what a request's code does to reqs later changes
    # nothing selected.
    picked = []
    for pos in rows.tolist():  # positions in [0, n) for the n they were checked against
        try:
            picked.append((pos, reqs[pos]))
        except MemoryError:
            raise
        except Exception as exc:
            raise reqs_read_error(exc, pos) from exc
    yield from picked


def spec_v2_new_tokens_from_reqs(
    reqs: Sequence[Any], page_size: int, reserve: int, indices: Any = None, *,
    layout: str | None = None, exact_ints: bool = False, pure: bool = False,
) -> int:
    """:func:`spec_v2_new_tokens` read straight from request objects.

    Each request gives ``kv_committed_len`` and ``kv_allocated_len``, either
    flat on the request or nested under ``req.kv``.  ``indices`` selects
    requests with Python list semantics (``reqs`` must then be a sequence).
    ``layout`` (``"flat"``, ``"mixed"``, ``"nested"``) reads each length
    only where that SGLang layout keeps it, skipping the search the default
    (``None``: ``req.<name>``, else ``req.kv.<name>``) makes.
    ``exact_ints=True`` refuses (``TypeError``) any length whose type is not
    exactly ``int``, where the default reads it through ``operator.index``.
    ``pure=True`` runs no Python code of the caller's: an argument or request
    that would need some raises :class:`kvest.ImpureRequest` instead.
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_args(indices, layout, ((exact_ints, "exact_ints"),),
                  ((page_size, "page_size"), (reserve, "reserve")))
    reqs = as_reqs(reqs)
    p = as_count(page_size, "page_size", 1)
    r = as_count(reserve, "reserve", 0)
    at_c, at_a = as_req_layout(layout)
    exact = as_flag(exact_ints, "exact_ints")
    reqs, rows = req_rows(reqs, indices)
    total = 0
    for pos, req in _selected(reqs, rows):
        c = _length(req, pos, "kv_committed_len", at_c, exact, pure)
        a = _length(req, pos, "kv_allocated_len", at_a, exact, pure)
        grow = _ceil_align(max(a, c + r), p) - _ceil_align(a, p)
        if c + r > INT64_MAX or grow + _ceil_align(a, p) > INT64_MAX or total + grow > INT64_MAX:
            raise spec_v2_reqs_overflow(pos, c, a, p, r, total)
        total += grow
    return total


def decode_new_tokens_from_reqs(
    reqs: Sequence[Any], page_size: int, indices: Any = None, *, layout: str | None = None,
    exact_ints: bool = False, pure: bool = False,
) -> int:
    """:func:`decode_new_tokens` read straight from request objects."""
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_args(indices, layout, ((exact_ints, "exact_ints"),), ((page_size, "page_size"),))
    reqs = as_reqs(reqs)
    p = as_count(page_size, "page_size", 1)
    at_c, _ = as_req_layout(layout)
    exact = as_flag(exact_ints, "exact_ints")
    reqs, rows = req_rows(reqs, indices)
    pages = 0
    for pos, req in _selected(reqs, rows):
        if _length(req, pos, "kv_committed_len", at_c, exact, pure) % p == 0:
            pages += 1
    return result_int64(pages * p, "decode_new_tokens_from_reqs")


def decode_alloc_plan_from_reqs(
    reqs: Sequence[Any], page_size: int, reserve: int, indices: Any = None, *,
    page_aligned: bool = True, out: tuple[np.ndarray, np.ndarray] | None = None,
    dtype: npt.DTypeLike = None, layout: str | None = None, exact_ints: bool = False,
    pure: bool = False,
) -> AllocPlan:
    """:func:`decode_alloc_plan` read straight from request objects, in one pass.

    Per selected request ``cur = A`` and ``nxt = max(A, ceil_align(C + R, p))``
    (``page_aligned``) or ``nxt = max(A, C + R)``.  ``cur`` and ``nxt`` are new
    arrays of ``dtype`` (int32 or int64; default int64), or ``out=(cur, nxt)``.
    A value its array's dtype cannot hold raises ``OverflowError`` naming
    ``out[0]`` (cur) or ``out[1]`` (nxt).
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_args(indices, layout, ((page_aligned, "page_aligned"), (exact_ints, "exact_ints")),
                  ((page_size, "page_size"), (reserve, "reserve")), out, dtype)
    reqs = as_reqs(reqs)
    p = as_count(page_size, "page_size", 1)
    r = as_count(reserve, "reserve", 0)
    aligned = as_flag(page_aligned, "page_aligned")
    at_c, at_a = as_req_layout(layout)
    exact = as_flag(exact_ints, "exact_ints")
    reqs, rows = req_rows(reqs, indices)
    if rows is None and type(reqs) is not list and type(reqs) is not tuple:
        # The plan's length must be known before the first row: anything but a
        # list or tuple -- a subclass too -- is read once by its own iterator.
        reqs = reqs_list(reqs)
    cur_out, nxt_out = as_plan_out(out, len(reqs) if rows is None else len(rows), dtype)
    limit = int(np.iinfo(cur_out.dtype).max)  # both buffers have one dtype
    tokens = pages = 0
    done = 0
    for j, (pos, req) in enumerate(_selected(reqs, rows)):
        if j == len(cur_out):
            raise plan_grew_error(j)
        c = _length(req, pos, "kv_committed_len", at_c, exact, pure)
        a = _length(req, pos, "kv_allocated_len", at_a, exact, pure)
        need = _ceil_align(c + r, p) if aligned else c + r
        cur, nxt = a, max(a, need)
        if need > INT64_MAX or nxt > limit or tokens + nxt - cur > INT64_MAX:
            raise plan_reqs_overflow(pos, j, c, a, p, r, aligned, limit, tokens)
        cur_out[j], nxt_out[j] = cur, nxt
        tokens += nxt - cur
        pages += _ceil_div(nxt, p) - _ceil_div(cur, p)
        done += 1
    if done < len(cur_out):  # a request's property shrank the list: no row is left unread
        raise plan_shrank_error(len(cur_out), done)
    return AllocPlan(cur_out, nxt_out, tokens, pages)


def beam_groups_from_reqs(reqs: Sequence[Any], indices: Any = None, *,
                          pure: bool = False) -> int:
    """How many of the selected requests are in a beam group: ``sum(1 for r in
    reqs if r.beam_group is not None)`` (``indices`` as in
    :func:`decode_new_tokens_from_reqs`).

    Zero means SGLang's ``append_beam_tail`` has no member rows to append.
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_args(indices)
    reqs = as_reqs(reqs)
    reqs, rows = req_rows(reqs, indices)
    count = 0
    for pos, req in _selected(reqs, rows):
        if pure:
            count += _pure.beam(req, pos, False)
        elif beam_attr(req, "beam_group", pos, ".beam_group") is not None:
            count += 1
    return count


def beam_member_rows_from_reqs(
    reqs: Sequence[Any], indices: Any = None, *, exact_ints: bool = False, pure: bool = False,
) -> Any:
    """SGLang's beam rows, ``sum(r.beam_group.num_member_rows for r in reqs if
    r.beam_group is not None)``, over the selected requests (``indices`` as in
    :func:`decode_new_tokens_from_reqs`).

    SGLang 0.5.19+ adds this to the no-speculation estimate.  The sum is
    Python's: whatever ``num_member_rows`` returns is added as ``sum()`` adds it
    (with ``exact_ints=True``, only a value whose type is ``int``).
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_args(indices, None, ((exact_ints, "exact_ints"),))
    reqs = as_reqs(reqs)
    exact = as_flag(exact_ints, "exact_ints")
    reqs, rows = req_rows(reqs, indices)
    total = 0
    for pos, req in _selected(reqs, rows):
        if pure:
            total = total + _pure.beam(req, pos, True)
            continue
        # beam_group read twice, as the upstream expression reads it.
        if beam_attr(req, "beam_group", pos, ".beam_group") is not None:
            group = beam_attr(req, "beam_group", pos, ".beam_group")
            rows_ = beam_attr(group, "num_member_rows", pos, ".beam_group.num_member_rows")
            total = total + beam_rows_value(rows_, pos, exact)  # the compiled sum adds so
    return total
