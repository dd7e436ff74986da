"""Result types shared by the kernels and the reference."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt


class AllocPlan(NamedTuple):
    """What :func:`kvest.decode_alloc_plan` returns.

    ``cur[i]`` and ``nxt[i]`` are request ``i``'s allocated KV length before and
    after the step; ``num_tokens`` is ``sum(nxt - cur)`` and ``num_pages`` the
    pages the paged allocator hands out for that growth.  Given ``out=``, ``cur``
    and ``nxt`` are the caller's own buffers (NumPy arrays or CPU tensors).
    """

    # Any: a CPU tensor passed as an out= buffer comes back as itself.
    cur: npt.NDArray[np.int32] | npt.NDArray[np.int64] | Any
    nxt: npt.NDArray[np.int32] | npt.NDArray[np.int64] | Any
    num_tokens: int
    num_pages: int
