"""kvest: exact, compiled KV-cache allocation estimates for LLM-serving schedulers.

``import kvest`` serves the compiled kernels (``kvest._kernels`` for arrays,
``kvest._reqs`` for request objects).  Their pure-Python twins
(``kvest.reference``) are served only when ``KVEST_PURE_PYTHON=1`` asks for them;
a missing compiled module is an ``ImportError``, never a silent fallback.
``kvest.IMPLEMENTATION`` says which is live: ``"cython"`` or ``"python"``.

The contract -- every formula, the argument and error rules, the SGLang facts --
is ``docs/contract.md`` in the source distribution and repository.
"""

from __future__ import annotations

from kvest._env import flag
from kvest._names import FUNCTIONS
from kvest._types import AllocPlan

__version__ = "0.1.0"

__all__ = ["IMPLEMENTATION", "AllocPlan", "show_config", *FUNCTIONS]

IMPLEMENTATION: str
if flag("KVEST_PURE_PYTHON"):
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
