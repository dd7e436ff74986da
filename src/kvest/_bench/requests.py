"""Request objects for the benchmarks: the release-shaped ones
(:mod:`kvest.sglang.standins`, where the doctor finds them too) and two tiny
shapes, :class:`TinyFlat` / :class:`TinyNested`: the lengths and nothing else."""

from __future__ import annotations

from typing import Any

from kvest.sglang.standins import RELEASE_SHAPED, FlatReq, MixedReq, NestedReq

__all__ = ["ALL", "LAYOUT_OF", "RELEASE_SHAPED", "FlatReq", "MixedReq", "NestedReq",
           "TinyFlat", "TinyKV", "TinyNested"]


class TinyFlat:
    """The two lengths, flat, and nothing else."""

    def __init__(self, committed: Any, allocated: Any) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


class TinyKV:
    def __init__(self, committed: Any, allocated: Any) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


class TinyNested:
    """The two lengths under ``req.kv`` (a plain object), and nothing else."""

    def __init__(self, committed: Any, allocated: Any) -> None:
        self.kv = TinyKV(committed, allocated)


# class -> the `layout=` value that release's code implies
LAYOUT_OF: dict[type, str] = {FlatReq: "flat", MixedReq: "mixed", NestedReq: "nested",
                              TinyFlat: "flat", TinyNested: "nested"}
ALL = (*RELEASE_SHAPED, TinyFlat, TinyNested)
