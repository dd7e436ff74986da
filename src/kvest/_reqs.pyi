# Type stubs for the compiled request-object kernels; kvest.reference._reqs has the same
# signatures.
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvest._types import AllocPlan

__all__ = [
    "beam_groups_from_reqs",
    "beam_member_rows_from_reqs",
    "decode_alloc_plan_from_reqs",
    "decode_new_tokens_from_reqs",
    "spec_v2_new_tokens_from_reqs",
]

# `indices` is any 1-D integer sequence (list, tuple, NumPy array, ...); with it, `reqs`
# must be a Sequence.  It is the parameter after the scalars in every function.
# `exact_ints=True`: a length (or beam row count) whose type is not exactly `int` is a
# TypeError, where the default reads it through `operator.index`.
# `pure=True`: no Python code of the caller's runs (no property, __index__, iterator, dict
# key's __eq__, finalizer); an argument or request that would need some raises
# kvest.ImpureRequest (kvest._errors) instead.
def spec_v2_new_tokens_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    reserve: int,
    indices: Any = None,
    *,
    layout: Literal["flat", "mixed", "nested"] | None = None,
    exact_ints: bool = False,
    pure: bool = False,
) -> int: ...
def decode_new_tokens_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    indices: Any = None,
    *,
    layout: Literal["flat", "mixed", "nested"] | None = None,
    exact_ints: bool = False,
    pure: bool = False,
) -> int: ...
def decode_alloc_plan_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    reserve: int,
    indices: Any = None,
    *,
    page_aligned: bool = True,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    dtype: npt.DTypeLike = None,
    layout: Literal["flat", "mixed", "nested"] | None = None,
    exact_ints: bool = False,
    pure: bool = False,
) -> AllocPlan: ...
def beam_groups_from_reqs(
    reqs: Iterable[Any] | Sequence[Any], indices: Any = None, *, pure: bool = False
) -> int: ...
def beam_member_rows_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    indices: Any = None,
    *,
    exact_ints: bool = False,
    pure: bool = False,
) -> Any: ...

# Private: whether this build keeps to CPython's public API (KVEST_PUBLIC_API_ONLY=1).
_PUBLIC_API_ONLY: bool

# Private, for the tests: (walks in address order, walks that gave up, the least
# batch that tries); `min_requests` sets that least batch.
def _address_order(min_requests: int | None = None) -> tuple[int, int, int]: ...
def _runs() -> int: ...
def _backward_walks(min_requests: int | None = None) -> tuple[int, int]: ...

# Private: whether instance-dict entries are read where CPython keeps them.
_DICT_ENTRIES: bool

# Private, for the SGLang glue: a class's version tag (0: none, or the public-API build).
def _type_version(cls: type) -> int: ...

# Private, for the SGLang rewrite's size checks (one call, no Python code run).
def _small_list(obj: object, below: int) -> bool: ...
def _small_reqs(owner: object, below: int) -> bool: ...

# Private, the SGLang glue's compiled half (kvest.sglang.glue): a hot spot's
# counters, and the glues whose bound ``run`` a rewritten statement calls.
class _Tally:
    calls: int
    kernel: int
    fallbacks: int
    last_kernel: int
    last_fallback: int
    def tick(self) -> None: ...
    def answered(self, answer: object) -> object: ...
    def declined(self, declined: object) -> object: ...

class _Glue:
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object) -> None: ...

class _DecodeCountGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object,
                 layout: str | None) -> None: ...
    def run(self, requests: object, page_size: object, sum_: object) -> object: ...

class _BeamTailGlue(_Glue):
    def run(self, owner: object, enumerate_: object) -> object: ...

class _SpecV2TotalGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], builtin: object, layout: str | None,
                 factor: int, ceil_align: Callable[..., object],
                 ceil_div: Callable[..., object]) -> None: ...
    def run(self, total: object, requests: object, page_size: object, reserve: object,
            max_: object, ceil_align_: object) -> object: ...

# Private, for the SGLang glue: whether a function's global names still resolve
# to the objects kvest proved its pattern with.
def _globals_resolve(namespace: dict[str, object], names: tuple[str, ...],
                     expected: tuple[object, ...], missing: object) -> bool: ...

class _AllocLensGlue(_Glue):
    def __init__(self, tally: _Tally, declined: object, state: object,
                 first_call: Callable[[], object], namespace: dict[str, object],
                 names: tuple[str, ...], expected: tuple[object, ...], missing: object,
                 layout: str | None, lists_below: int) -> None: ...
    def run(self, reqs: object, reserve: object, page_size: object) -> object: ...
