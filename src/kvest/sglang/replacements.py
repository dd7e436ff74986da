"""kvest's versions of SGLang's per-step hot spots.

Each replacement answers the common case with a kvest kernel and hands
everything else to the original function it replaces: whenever kvest declines
an input (a type it does not read, a negative or oversized length, an index
out of range, an attribute missing) the original runs on the same arguments
and its answer -- or its exception -- is the answer.  The original functions
are pure, so running them after kvest declined changes nothing but time, and
the result is always upstream's: never a different number, never a different
exception.  :data:`FALLBACKS` counts how often each hot spot did that.
"""

from __future__ import annotations

import collections
import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import kvest

__all__ = [
    "FALLBACKS",
    "global_reserve",
    "imported_reserve",
    "make_alloc_lens",
    "make_estimate",
    "make_num_new_pages",
    "make_spec_v2",
]

# Hot spot -> times the original answered because kvest declined the input.
FALLBACKS: collections.Counter[str] = collections.Counter()

_INT_LIMITS = {np.dtype(np.int64): 2**63 - 1, np.dtype(np.int32): 2**31 - 1}


def _mark(new: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    new.__kvest_original__ = original  # type: ignore[attr-defined]
    new.__wrapped__ = original  # type: ignore[attr-defined]
    new.__doc__ = original.__doc__
    new.__module__ = original.__module__
    new.__qualname__ = original.__qualname__
    return new


# ------------------------------------------------------------------ the reserve R

def global_reserve(namespace: dict[str, Any], name: str, factor: int) -> Callable[[], int]:
    """R from the function upstream's method finds under ``name`` in its module,
    looked up on every call as upstream does (so a later rebinding is seen)."""
    if factor == 1:
        return lambda: namespace[name]()  # type: ignore[no-any-return]
    return lambda: factor * namespace[name]()  # type: ignore[no-any-return]


def imported_reserve(module_name: str, name: str, factor: int) -> Callable[[], int]:
    """R from ``from module_name import name`` inside upstream's method (0.5.11)."""
    def reserve() -> int:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        return factor * getattr(module, name)()  # type: ignore[no-any-return]

    return reserve


# ------------------------------------------------------------------ the estimate

def make_estimate(original: Callable[..., Any], cls: type, reserve: Callable[[], int],
                  layout: str, *, has_v1: bool, beam: bool,
                  beam_rows: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``ScheduleBatch.new_tokens_required_next_decode`` on kvest's request kernels.

    ``selected_indices`` goes to the kernel as ``indices`` (no list of requests
    is built); the beam rows come from ``num_beam_member_rows`` found where the
    original finds it -- through kvest's kernel when it is still ``beam_rows``,
    the function whose code the detection matched, else by calling it; the
    spec-v1 branch (0.5.11-0.5.13) and
    subclasses with their own spec-v2 method are left to the original.
    """
    decode = kvest.decode_new_tokens_from_reqs
    spec_v2 = kvest.spec_v2_new_tokens_from_reqs
    beam_kernel = kvest.beam_member_rows_from_reqs
    home = original.__globals__  # type: ignore[attr-defined]
    method = "_new_tokens_required_next_decode_spec_v2"

    def new_tokens_required_next_decode(self: Any, selected_indices: Any = None) -> Any:
        try:
            page_size = self.token_to_kv_pool_allocator.page_size
            reqs = self.reqs
            if self.spec_algorithm.is_none():
                tokens = decode(reqs, page_size, selected_indices, layout=layout)
                if beam:
                    rows_fn = home["num_beam_member_rows"]
                    if rows_fn is beam_rows:
                        tokens += beam_kernel(reqs, selected_indices)
                    else:
                        tokens += rows_fn(reqs if selected_indices is None else map(
                            reqs.__getitem__, selected_indices))
                return tokens
            kind = type(self)
            if not (has_v1 and not self.is_spec_v2) and (
                    kind is cls or getattr(kind, method) is getattr(cls, method)):
                return spec_v2(reqs, page_size, reserve(), selected_indices, layout=layout)
        except Exception:
            FALLBACKS["new_tokens_required_next_decode"] += 1
        return original(self, selected_indices)

    return _mark(new_tokens_required_next_decode, original)


def make_spec_v2(original: Callable[..., Any], reserve: Callable[[], int],
                 layout: str) -> Callable[..., Any]:
    """``ScheduleBatch._new_tokens_required_next_decode_spec_v2`` on kvest's kernel."""
    spec_v2 = kvest.spec_v2_new_tokens_from_reqs

    def _new_tokens_required_next_decode_spec_v2(self: Any, requests: Any, page_size: Any) -> Any:
        try:
            return spec_v2(requests, page_size, reserve(), layout=layout)
        except Exception:
            FALLBACKS["_new_tokens_required_next_decode_spec_v2"] += 1
        return original(self, requests, page_size)

    return _mark(_new_tokens_required_next_decode_spec_v2, original)


# ------------------------------------------------------------------ get_num_new_pages

def make_num_new_pages(original: Callable[..., Any], tensor: type) -> Callable[..., Any]:
    """``get_num_new_pages`` on kvest for int32/int64 CPU tensors.

    The tensors are read through ``Tensor.numpy()`` (no copy; torch is never
    imported by kvest).  Upstream computes in the tensors' own dtype, so where
    its ``seq_lens + page_size - 1`` would wrap around -- or anything else is
    unusual: other dtypes, shapes, devices, page sizes -- the original answers.
    """
    pages = kvest.num_new_pages
    limits = _INT_LIMITS

    def get_num_new_pages(seq_lens: Any, page_size: Any, prefix_lens: Any = None,
                          decode: Any = False) -> Any:
        try:
            if type(seq_lens) is tensor and type(page_size) is int and page_size >= 1:
                seq = seq_lens.numpy()
                limit = limits.get(seq.dtype)
                if limit is not None and page_size <= limit:
                    if decode:
                        return pages(seq, page_size, decode=True)
                    if type(prefix_lens) is tensor:
                        prefix = prefix_lens.numpy()
                        prefix_limit = limits.get(prefix.dtype)
                        if prefix_limit is not None and page_size <= prefix_limit and (
                                page_size == 1 or (
                                    _at_most(seq, limit - page_size + 1)
                                    and _at_most(prefix, prefix_limit - page_size + 1))):
                            return pages(seq, page_size, prefix)
        except Exception:
            FALLBACKS["get_num_new_pages"] += 1
        return original(seq_lens, page_size, prefix_lens, decode)

    return _mark(get_num_new_pages, original)


def _at_most(values: np.ndarray, bound: int) -> bool:
    return values.size == 0 or int(values.max()) <= bound


# ------------------------------------------------------------------ page_aligned_decode_alloc_lens

def make_alloc_lens(original: Callable[..., Any], layout: str) -> Callable[..., Any]:
    """``page_aligned_decode_alloc_lens`` as int32 arrays, one pass over the requests.

    Only for callers that turn the two lists straight into int32 tensors (the
    shape detection reads them): ``torch.tensor(array, dtype=torch.int32)``
    makes the same tensor without a Python loop.  A length that does not fit
    int32 makes kvest decline, and the original's lists go to the caller,
    whose ``torch.tensor`` then fails as it always did.
    """
    plan = kvest.decode_alloc_plan_from_reqs
    int32 = np.int32

    def page_aligned_decode_alloc_lens(reqs: Any, *, reserve: Any, page_size: Any) -> Any:
        try:
            result = plan(reqs, page_size, reserve, page_aligned=True, dtype=int32,
                          layout=layout)
            return result.cur, result.nxt, result.num_tokens
        except Exception:
            FALLBACKS["page_aligned_decode_alloc_lens"] += 1
        return original(reqs, reserve=reserve, page_size=page_size)

    return _mark(page_aligned_decode_alloc_lens, original)
