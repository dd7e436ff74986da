"""kvest: exact, compiled KV-cache allocation estimates for LLM-serving schedulers.

``import kvest`` serves the compiled kernels (``kvest._kernels``) or, when they
cannot be imported or ``KVEST_PURE_PYTHON=1`` is set, their pure-Python twins
(``kvest.reference``).  ``kvest.IMPLEMENTATION`` says which: ``"cython"`` or
``"python"``.  Both give the same results and raise the same exceptions.
"""

from __future__ import annotations

import os

from kvest._types import AllocPlan

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "AllocPlan",
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "decode_alloc_plan",
    "decode_new_tokens",
    "decode_new_tokens_from_reqs",
    "num_new_pages",
    "show_config",
    "spec_v1_new_tokens",
    "spec_v2_new_tokens",
    "spec_v2_new_tokens_from_reqs",
]

IMPLEMENTATION: str
if os.environ.get("KVEST_PURE_PYTHON", "") not in ("", "0"):
    from kvest.reference import *  # noqa: F403

    IMPLEMENTATION = "python"
else:
    try:
        from kvest._kernels import *  # noqa: F403
    except ImportError:
        from kvest.reference import *  # noqa: F403

        IMPLEMENTATION = "python"
    else:
        IMPLEMENTATION = "cython"


def show_config() -> dict[str, object]:
    """Which implementation and CPU loop variant serve calls; printed and returned."""
    config: dict[str, object] = {"version": __version__, "implementation": IMPLEMENTATION}
    if IMPLEMENTATION == "cython":
        from kvest import _kernels

        config["cpu_variant"] = _kernels.cpu_variant()
        config["cpu_variants_available"] = _kernels.cpu_variants()
    for key, value in config.items():
        print(f"{key}: {value}")
    return config
