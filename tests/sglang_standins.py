"""SGLang test rigs: request classes per release layout, beam groups, and the
unpatched view of a batch (test side; the request classes themselves are the
one set in ``request_standins``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from request_standins import FlatReq, MixedReq, NestedReq


def request_class(layout: dict[str, str]) -> Callable[..., Any]:
    """``make(committed, allocated, beam_group=None)``: a request shaped like
    those of a release whose estimator reads the lengths as ``layout``
    (``StandinTree.layout()``) says (a beam group only where the release has
    them: nested requests)."""
    kinds = (layout.get("kv_committed_len"), layout.get("kv_allocated_len"))
    cls = {("flat", "flat"): FlatReq, ("flat", "nested"): MixedReq,
           ("nested", "nested"): NestedReq}[kinds]

    def make(committed: Any, allocated: Any, beam_group: Any = None) -> Any:
        req = cls(committed, allocated)
        if beam_group is not None:
            req.beam_group = beam_group
        return req

    return make


@dataclasses.dataclass
class BeamGroup:
    """Stands in for a request's ``beam_group`` (0.5.19+)."""

    num_member_rows: int


class Unpatched:
    """``batch`` as SGLang's original estimate must see it once kvest replaced
    the spec-v2 method on the class: the original method on the instance, every
    other attribute the batch's own.  ``original_estimate(Unpatched(batch,
    original_spec_v2), ...)`` is then SGLang's answer end to end."""

    def __init__(self, batch: Any, spec_v2: Any) -> None:
        self.__dict__["_batch"] = batch
        self.__dict__["_new_tokens_required_next_decode_spec_v2"] = (
            lambda requests, page_size: spec_v2(batch, requests, page_size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)
