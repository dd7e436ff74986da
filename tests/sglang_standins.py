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


# Batches holding ``reqs`` each way a class can: its own attribute, a slot, an
# unset slot, a class-level default, a property, ``__getattr__``, its own
# ``__getattribute__``, no instance dict at all. Only the first two are the
# instance's own plain ``reqs`` (kv_plain_attr, glue.plain_reqs); the rest
# must be read the generic way, or not at all.
class Own:
    def __init__(self, reqs: Any) -> None:
        self.reqs = reqs


class Slotted:
    __slots__ = ("reqs",)

    def __init__(self, reqs: Any) -> None:
        self.reqs = reqs


class Unset:
    __slots__ = ("reqs",)

    def __init__(self, reqs: Any) -> None:
        pass


class Default(Own):
    reqs = None  # a class-level default, as a dataclass field with one has


class Property:
    def __init__(self, reqs: Any) -> None:
        self._reqs = reqs

    @property
    def reqs(self) -> Any:
        return self._reqs


class Fallback(Own):
    def __getattr__(self, name: str) -> Any:
        return []


class Custom(Own):
    def __getattribute__(self, name: str) -> Any:
        return object.__getattribute__(self, name)


class NoDict:
    __slots__ = ()

    def __init__(self, reqs: Any) -> None:
        pass


OWNERS = (Own, Slotted, Unset, Default, Property, Fallback, Custom, NoDict)
