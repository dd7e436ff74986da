"""Request objects shaped like each SGLang release's ``Req``: the one definition.

The doctor's parity run (:mod:`kvest.sglang.parity`) draws its requests from
these; the object benchmarks (``kvest._bench``) time kvest on them, and the
test suite (``tests/request_standins.py``) checks the object kernels on the
same classes.

SGLang's ``Req`` is a plain class whose ``__init__`` sets well over a hundred
attributes; where its KV lengths live changed across releases (see the
contract's table of shapes), and what an object kernel costs depends on both:

- :class:`FlatReq`: 0.5.11-0.5.15, both lengths flat among 128 attributes;
- :class:`MixedReq`: 0.5.16-0.5.18, ``kv_committed_len`` flat and
  ``kv_allocated_len`` under ``req.kv``, a ``slots=True, kw_only=True`` dataclass;
- :class:`NestedReq`: 0.5.19+, both under ``req.kv``, a ``slots=True``
  dataclass (:class:`ReqKvInfo`), among 157 attributes.

The attribute names around the lengths are made up; their number and the
lengths' place among them (set midway through ``__init__``) follow the releases.
None of them has ``beam_group``: they are not beam-search requests.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _fill(obj: Any, first: int, count: int) -> None:
    for i in range(first, first + count):
        setattr(obj, f"field_{i:03d}", i)


class FlatReq:
    """sglang 0.5.11: a plain class, 128 attributes, lengths flat."""

    def __init__(self, committed: Any, allocated: Any) -> None:
        _fill(self, 0, 60)
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated
        _fill(self, 60, 66)


@dataclasses.dataclass(slots=True, kw_only=True)
class ReqKvInfo0517:
    """0.5.16-0.5.18's ``req.kv``: the allocated length and SWA bookkeeping."""

    kv_allocated_len: Any
    swa_evicted_seqlen: int = 0


class MixedReq:
    """sglang 0.5.17: committed flat, allocated under a slots dataclass, 140 attributes."""

    def __init__(self, committed: Any, allocated: Any) -> None:
        _fill(self, 0, 60)
        self.kv_committed_len = committed
        self.kv = ReqKvInfo0517(kv_allocated_len=allocated)
        _fill(self, 60, 78)


@dataclasses.dataclass(slots=True)
class ReqKvInfo:
    """0.5.19+'s ``req.kv``: a slots dataclass with the lengths among other state."""

    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_committed_len: Any = 0
    kv_allocated_len: Any = 0
    swa_evict_floor: int = 0
    component_evicted_seqlens: dict[str, int] = dataclasses.field(default_factory=dict)
    retraction_backup: Any = None
    mamba_pool_idx: Any = None


class NestedReq:
    """sglang 0.5.23: both lengths under ``req.kv``, 157 attributes."""

    def __init__(self, committed: Any, allocated: Any) -> None:
        _fill(self, 0, 70)
        self.kv = ReqKvInfo(kv_committed_len=committed, kv_allocated_len=allocated)
        self.beam_group = None  # on every request since 0.5.19 (beam search's rows)
        _fill(self, 70, 85)


RELEASE_SHAPED = (FlatReq, MixedReq, NestedReq)


def assign_torch(req_pool_indices: Any, req_to_token: Any, start_offset: Any, end_offset: Any,
                 out_cache_loc: Any, batch_size: int) -> None:
    """``assign_req_to_token_pool_func`` in torch: row i, [start, end) <- the next slots."""
    at = 0
    for i in range(batch_size):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), start:end] = out_cache_loc[at:at + end - start]
        at += end - start
