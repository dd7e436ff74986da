# Type stubs for the compiled request-object kernels; kvest.reference._reqs has the same
# signatures.
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvest._types import AllocPlan

__all__: list[str]

# `indices` is any 1-D integer sequence (list, tuple, NumPy array, ...); with it, `reqs`
# must be a Sequence.
def spec_v2_new_tokens_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    reserve: int,
    indices: Any = None,
    *,
    layout: Literal["flat", "mixed", "nested"] | None = None,
) -> int: ...
def decode_new_tokens_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    indices: Any = None,
    *,
    layout: Literal["flat", "mixed", "nested"] | None = None,
) -> int: ...
def decode_alloc_plan_from_reqs(
    reqs: Iterable[Any] | Sequence[Any],
    page_size: int,
    reserve: int,
    *,
    page_aligned: bool = True,
    indices: Any = None,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    dtype: npt.DTypeLike = None,
    layout: Literal["flat", "mixed", "nested"] | None = None,
) -> AllocPlan: ...
def beam_member_rows_from_reqs(
    reqs: Iterable[Any] | Sequence[Any], indices: Any = None
) -> Any: ...
