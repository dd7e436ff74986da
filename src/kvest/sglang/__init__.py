"""kvest inside SGLang: route the scheduler's per-step bookkeeping through kvest.

The rooms: :mod:`~kvest.sglang.registry` (every fact about SGLang's hot spots,
written once: where each lives, the kinds of statement, the accepted
fingerprints, the states), :mod:`~kvest.sglang.fingerprint` (exact fingerprints
of code), :mod:`~kvest.sglang.patterns` (the fingerprints kvest ships, as data),
:mod:`~kvest.sglang.rewrite` (finding them in SGLang's own functions and
compiling those again with glue swapped in), :mod:`~kvest.sglang.glue` (the
glue to kvest's kernels), :mod:`~kvest.sglang.hotspots` (the plan: what is done
with each hot spot in this process), :mod:`~kvest.sglang.plugin` (the entry
point SGLang loads in every process), :mod:`~kvest.sglang.patch` (the same, by
hand and reversible), :mod:`~kvest.sglang.monitor` (``status()``, counters,
shadow mode, the log line), :mod:`~kvest.sglang.announce_hook` (the log line
once SGLang configured logging), :mod:`~kvest.sglang.metrics` (the counters on
SGLang's Prometheus ``/metrics``), :mod:`~kvest.sglang.upstream` (SGLang's code
loaded from its files, and the stand-ins around it),
:mod:`~kvest.sglang.parity` (the doctor's parity run) and
:mod:`~kvest.sglang.doctor` (``python -m kvest sglang``).
"""

from kvest.sglang.monitor import status
from kvest.sglang.patch import Patch, patch

__all__ = ["Patch", "patch", "status"]
