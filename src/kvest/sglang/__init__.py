"""kvest inside SGLang: route the scheduler's per-step bookkeeping through kvest.

The integration's rooms: :mod:`kvest.sglang.patch` (the reversible patch).
"""

from kvest.sglang.patch import Patch, patch

__all__ = ["Patch", "patch"]
