"""Request stand-ins shaped like SGLang's own, release by release (test side).

A real ``Req`` carries 128 (0.5.11) to 157 (0.5.23) attributes in its
``__dict__``; the lengths are flat on the request (0.5.11-0.5.15), mixed
(committed flat, allocated under ``req.kv``; 0.5.16-0.5.18) or nested under
``req.kv``, a ``slots=True`` dataclass ``ReqKvInfo`` (0.5.19+), which also has
``beam_group`` on every request.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Filler attributes, so that attribute lookups go through dicts of the real size.
_PAD_FLAT = {f"attr_{i}": None for i in range(126)}
_PAD_NESTED = {f"attr_{i}": None for i in range(155)}


class FlatReq:
    """0.5.11-0.5.15: ``req.kv_committed_len``, ``req.kv_allocated_len``."""

    def __init__(self, committed: Any, allocated: Any, beam_group: Any = None) -> None:
        self.__dict__.update(_PAD_FLAT)
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


@dataclasses.dataclass(slots=True, kw_only=True)
class MixedKvInfo:
    kv_allocated_len: Any
    swa_evicted_seqlen: int = 0


class MixedReq:
    """0.5.16-0.5.18: committed flat, allocated under ``req.kv``."""

    def __init__(self, committed: Any, allocated: Any, beam_group: Any = None) -> None:
        self.__dict__.update(_PAD_FLAT)
        self.kv_committed_len = committed
        self.kv = MixedKvInfo(kv_allocated_len=allocated)


@dataclasses.dataclass(slots=True, kw_only=True)
class ReqKvInfo:
    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    kv_committed_len: Any = 0
    kv_allocated_len: Any = 0


class NestedReq:
    """0.5.19+: both lengths under ``req.kv``; ``beam_group`` on every request."""

    def __init__(self, committed: Any, allocated: Any, beam_group: Any = None) -> None:
        self.__dict__.update(_PAD_NESTED)
        self.kv = ReqKvInfo(kv_committed_len=committed, kv_allocated_len=allocated)
        self.beam_group = beam_group


def request_class(layout: dict[str, str]) -> type:
    """The stand-in for a release whose estimator reads the lengths as ``layout`` says."""
    kinds = (layout.get("kv_committed_len"), layout.get("kv_allocated_len"))
    return {("flat", "flat"): FlatReq, ("flat", "nested"): MixedReq,
            ("nested", "nested"): NestedReq}[kinds]
