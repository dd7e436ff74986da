"""The pure-Python twin of every kvest function.

Each module here has the same name, functions, signatures and exceptions as its
compiled counterpart in ``kvest`` (``_kernels`` for arrays, ``_reqs`` for request
objects), written as the plain per-request loop a scheduler would write, over
Python ints.  ``KVEST_PURE_PYTHON=1`` serves these functions as ``kvest.*``; the
test suite checks both implementations against an oracle of its own.
"""

from __future__ import annotations

from kvest.reference._kernels import *  # noqa: F403
from kvest.reference._reqs import *  # noqa: F403
from kvest.reference._writes import *  # noqa: F403

__all__ = [
    "add_to_attrs",
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "beam_groups_from_reqs",
    "beam_member_rows_from_reqs",
    "decode_alloc_plan",
    "decode_alloc_plan_from_reqs",
    "decode_new_tokens",
    "decode_new_tokens_from_reqs",
    "max_into_attr",
    "num_new_pages",
    "spec_v1_new_tokens",
    "spec_v2_new_tokens",
    "spec_v2_new_tokens_from_reqs",
]  # == kvest._names.FUNCTIONS (tested)
