"""kvest: exact, compiled KV-cache allocation estimates for LLM-serving schedulers.

``import kvest`` serves the compiled kernels (``kvest._kernels`` for arrays,
``kvest._reqs`` for request objects, ``kvest._writes`` for the loops that write
to them).  Their pure-Python twins
(``kvest.reference``) are served only when ``KVEST_PURE_PYTHON=1`` asks for them;
a missing compiled module is an ``ImportError``, never a silent fallback.
``kvest.IMPLEMENTATION`` says which is live: ``"cython"`` or ``"python"``.

The contract -- every formula, the argument and error rules, the SGLang facts --
is ``docs/contract.md`` in the source distribution and repository.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvest._env import flag
from kvest._errors import ImpureRequest
from kvest._types import AllocPlan

__version__ = "0.1.0"

# Written out, not computed: type checkers read __all__ without running the
# module.  kvest._names.FUNCTIONS is the same list (tests/test_packaging.py
# checks that the two agree).
__all__ = [  # noqa: RUF022 -- grouped as the docs present them
    "IMPLEMENTATION",
    "AllocPlan",
    "ImpureRequest",
    "show_config",
    # array estimators (kvest._kernels)
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "decode_alloc_plan",
    "decode_new_tokens",
    "num_new_pages",
    "spec_v1_new_tokens",
    "spec_v2_new_tokens",
    # request-object estimators (kvest._reqs)
    "beam_groups_from_reqs",
    "beam_member_rows_from_reqs",
    "decode_alloc_plan_from_reqs",
    "decode_new_tokens_from_reqs",
    "spec_v2_new_tokens_from_reqs",
    # request-object writers (kvest._writes)
    "add_to_attrs",
    "max_into_attr",
]

IMPLEMENTATION: str
if TYPE_CHECKING:
    # What a type checker sees: the stubs of the compiled modules, name by name
    # (the run-time star import below serves the same names from either twin).
    from kvest._kernels import (
        alloc_len_per_decode,
        alloc_reserve_per_decode,
        decode_alloc_plan,
        decode_new_tokens,
        num_new_pages,
        spec_v1_new_tokens,
        spec_v2_new_tokens,
    )
    from kvest._reqs import (
        beam_groups_from_reqs,
        beam_member_rows_from_reqs,
        decode_alloc_plan_from_reqs,
        decode_new_tokens_from_reqs,
        spec_v2_new_tokens_from_reqs,
    )
    from kvest._writes import add_to_attrs, max_into_attr
elif flag("KVEST_PURE_PYTHON"):
    from kvest.reference import *  # noqa: F403

    IMPLEMENTATION = "python"
else:
    try:
        from kvest._kernels import *  # noqa: F403
        from kvest._reqs import *  # noqa: F403
        from kvest._writes import *  # noqa: F403
    except ImportError as exc:
        raise ImportError(
            f"kvest's compiled kernels could not be imported ({exc}). Build and install "
            "them with `pip install .` from the source tree (a C compiler is needed), or "
            "set KVEST_PURE_PYTHON=1 to use the pure-Python implementation."
        ) from exc
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
