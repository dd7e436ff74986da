"""Deterministic performance gate: instructions per request, counted by callgrind.

    python tools/instructions.py            # measure and check against the ceilings
    python tools/instructions.py --update   # measure and rewrite the ceilings file

Wall-clock times on a shared machine drift; instruction counts do not. For each
case (CPU variant x page size x dtype) this runs the spec-v2 estimate on 65,536
requests under ``valgrind --tool=callgrind``, collecting only inside the C entry
point ``kv_spec_v2_pages`` (the loop and its dispatch), and divides the count by
the requests processed. A count above its ceiling in
``tools/instruction_ceilings.json`` fails loudly: the loop lost its
vectorization, gained a branch, or fell back to division.

Valgrind emulates AVX2 but not AVX-512, so the gate covers the baseline and
AVX2 variants; the differential tests cover AVX-512 on machines that have it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CEILINGS = Path(__file__).with_name("instruction_ceilings.json")
ROWS = 65536
CALLS = 4
CASES = [(variant, p, dtype) for variant in ("baseline", "avx2") for p in (16, 100)
         for dtype in ("int64", "int32")]
SLACK = 1.10  # ceilings written by --update sit 10% above the measurement

PROGRAM = """
import numpy as np, kvest
from kvest import _kernels
assert _kernels.cpu_variant() == {variant!r}, _kernels.cpu_variant()
rng = np.random.default_rng(0)
c = rng.integers(0, 2**17, {rows}).astype({dtype!r})
a = (c + rng.integers(0, 129, {rows})).astype({dtype!r})
for _ in range({calls}):
    kvest.spec_v2_new_tokens(c, a, {p}, 128)
"""


def count(variant: str, p: int, dtype: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, KVEST_CPU=variant)
        code = PROGRAM.format(variant=variant, rows=ROWS, dtype=dtype, calls=CALLS, p=p)
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--toggle-collect=kv_spec_v2_pages", sys.executable, "-c", code],
            check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        text = out.read_text()
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if not match:
        raise RuntimeError("callgrind wrote no instruction total")
    return int(match.group(1)) / (ROWS * CALLS)


def main() -> int:
    update = "--update" in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILINGS.read_text())
    measured = {}
    failed = False
    print(f"{'case':28} {'instructions/request':>22} {'ceiling':>9}")
    for variant, p, dtype in CASES:
        key = f"{variant} p={p} {dtype}"
        measured[key] = per_row = count(variant, p, dtype)
        ceiling = ceilings.get(key)
        verdict = ""
        if ceiling is not None and per_row > ceiling:
            verdict = "  ABOVE CEILING"
            failed = True
        print(f"{key:28} {per_row:22.3f} {ceiling if ceiling is not None else '-':>9}{verdict}")
    if update:
        CEILINGS.write_text(json.dumps(
            {k: round(v * SLACK, 2) for k, v in measured.items()}, indent=2) + "\n")
        print(f"ceilings written to {CEILINGS}")
    if failed:
        print("instruction count regression: see the cases above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
