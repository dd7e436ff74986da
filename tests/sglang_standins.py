"""SGLang test rigs: request classes per release layout (over the one set in
``request_standins``), and the doctor's beam groups and unpatched batch view."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from request_standins import FlatReq, MixedReq, NestedReq

# The doctor's parity run ships these two; the tests use the same ones.
from kvest.sglang.parity import BeamGroup as BeamGroup
from kvest.sglang.parity import Unpatched as Unpatched


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
