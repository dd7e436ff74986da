# Type stubs for the compiled array kernels; kvest.reference._kernels has the same signatures.
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvest._types import AllocPlan

Lengths = npt.ArrayLike | Sequence[int] | range | Any  # Any: __array__ / __dlpack__ objects
# out= buffers: int32 or int64 (both the same), NumPy arrays or CPU tensors (Any).
OutBuffers = (
    tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]
    | tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | tuple[Any, Any]
)

__all__ = [
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "decode_alloc_plan",
    "decode_new_tokens",
    "num_new_pages",
    "spec_v1_new_tokens",
    "spec_v2_new_tokens",
]

def cpu_variants() -> list[str]: ...
def cpu_variant() -> str: ...
def set_cpu_variant(name: str) -> None: ...
def spec_v2_new_tokens(
    committed: Lengths, allocated: Lengths, page_size: int, reserve: int,
    indices: Lengths | None = None,
) -> int: ...
def decode_new_tokens(
    committed: Lengths, page_size: int, indices: Lengths | None = None
) -> int: ...
def num_new_pages(
    seq_lens: Lengths, page_size: int, prefix_lens: Lengths | None = None, decode: bool = False
) -> int: ...
def spec_v1_new_tokens(
    num_requests: int, page_size: int, num_steps: int | None, topk: int | None,
    num_draft_tokens: int | None,
) -> int: ...
def alloc_len_per_decode(
    num_steps: int | None, topk: int | None, num_draft_tokens: int | None, page_size: int, *,
    speculative: bool = True, has_draft_kv: bool = True,
) -> int: ...
def alloc_reserve_per_decode(
    num_steps: int | None, topk: int | None, num_draft_tokens: int | None, page_size: int, *,
    speculative: bool = True, has_draft_kv: bool = True,
) -> int: ...
def decode_alloc_plan(
    committed: Lengths, allocated: Lengths, page_size: int, reserve: int, *,
    page_aligned: bool = True, out: OutBuffers | None = None,
) -> AllocPlan: ...
