"""kvest inside SGLang: route the scheduler's per-step bookkeeping through kvest.

The rooms: :mod:`~kvest.sglang.fingerprint` (exact fingerprints of code),
:mod:`~kvest.sglang.patterns` (the code kvest replaces, as data),
:mod:`~kvest.sglang.rewrite` (finding the patterns in SGLang's own functions
and compiling them again with kernels swapped in), :mod:`~kvest.sglang.kernels`
(the glue to kvest's kernels), :mod:`~kvest.sglang.hotspots` (where the hot
spots live and what is done with each), :mod:`~kvest.sglang.plugin` (the entry
point SGLang loads in every process), :mod:`~kvest.sglang.patch` (the same, by
hand and reversible), :mod:`~kvest.sglang.monitor` (``status()``, counters,
shadow mode, the log line), :mod:`~kvest.sglang.announce_hook` (the log line
once SGLang configured logging), :mod:`~kvest.sglang.metrics` (the counters on
SGLang's Prometheus ``/metrics``), :mod:`~kvest.sglang.upstream` (SGLang's code loaded
from its files, for the doctor) and :mod:`~kvest.sglang.doctor`
(``python -m kvest sglang``).
"""

from kvest.sglang.monitor import status
from kvest.sglang.patch import Patch, patch

__all__ = ["Patch", "patch", "status"]
