"""kvest's public function names: the one list.  The compiled modules and their
pure-Python twins take their ``__all__`` from it; the stubs and the package's
``__init__`` write it out for type checkers (which run no code), and
tests/test_packaging.py holds each of those equal to it."""

from __future__ import annotations

# Array estimators: kvest._kernels (compiled) and kvest.reference._kernels (pure).
ARRAY_FUNCTIONS = (
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "decode_alloc_plan",
    "decode_new_tokens",
    "num_new_pages",
    "spec_v1_new_tokens",
    "spec_v2_new_tokens",
)

# Request-object estimators: kvest._reqs (compiled) and kvest.reference._reqs (pure).
REQ_FUNCTIONS = (
    "beam_groups_from_reqs",
    "beam_member_rows_from_reqs",
    "decode_alloc_plan_from_reqs",
    "decode_new_tokens_from_reqs",
    "spec_v2_new_tokens_from_reqs",
)

# Request-object writers: kvest._writes (compiled) and kvest.reference._writes (pure).
WRITE_FUNCTIONS = (
    "add_to_attrs",
    "max_into_attr",
)

FUNCTIONS = ARRAY_FUNCTIONS + REQ_FUNCTIONS + WRITE_FUNCTIONS

# Public exceptions: kvest._errors, the same class for both implementations.
EXCEPTIONS = ("ImpureRequest",)
