"""``python -m kvest bench``: kvest timed against the alternatives, one job per module.

- :mod:`~kvest._bench.timing`: the timer (calibrated, interleaved medians) and
  the machine's description;
- :mod:`~kvest._bench.arrays`: the array workloads and the implementations
  compared on them (per-request loop, NumPy, Numba, kvest, the read floor);
- :mod:`~kvest._bench.requests` and :mod:`~kvest._bench.objects`: request
  objects shaped like each SGLang release's, and the object kernels on them;
- :mod:`~kvest._bench.sglang_step`: one decode step's bookkeeping in real SGLang;
- :mod:`~kvest._bench.tables`, :mod:`~kvest._bench.targets`,
  :mod:`~kvest._bench.plots`: what a run prints, judges and draws;
- :mod:`~kvest._bench.run`: the command, which ties them together.

The pytest-benchmark suite in ``bench/`` uses the same workloads, so both
measure the same code on the same data.
"""
