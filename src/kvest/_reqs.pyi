# Type stubs for the compiled request-object kernels; kvest.reference._reqs has the same
# signatures.
from collections.abc import Iterable, Sequence
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
