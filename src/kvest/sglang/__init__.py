"""kvest inside SGLang: route the scheduler's per-step bookkeeping through kvest.

The rooms: :mod:`~kvest.sglang.plugin` (the entry point SGLang loads in every
process), :mod:`~kvest.sglang.patch` (the same, by hand and reversible),
:mod:`~kvest.sglang.shapes` (which release shape is loaded, by feature),
:mod:`~kvest.sglang.replacements` (kvest's versions of the hot spots),
:mod:`~kvest.sglang.upstream` (SGLang's own code loaded from its files, for
the doctor and the tests) and :mod:`~kvest.sglang.doctor` (``python -m kvest sglang``).
"""

from kvest.sglang.patch import Patch, patch

__all__ = ["Patch", "patch"]
