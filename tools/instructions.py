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

The object kernels get the same gate: instructions per request of
``spec_v2_new_tokens_from_reqs`` and ``decode_new_tokens_from_reqs`` (everything
they call included) on the benchmark's release-shaped stand-ins, with the
release's ``layout=`` and with the default search.  A rise means a read lost
its shortcut (the slot offset, the remembered dict position) or the per-type
work started running per request.
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


OBJECT_ROWS = 4096
OBJECT_CASES = [(fn, shape, layout) for fn in ("spec_v2", "decode")
                for shape, layout in (("FlatReq", "flat"), ("NestedReq", "nested"),
                                      ("NestedReq", None))]

OBJECT_PROGRAM = """
import kvest
from kvest._bench.requests import {shape} as Req
reqs = [Req(c, c + 7) for c in range(1000, 1000 + {rows})]
for _ in range({calls}):
    kvest.{fn}_new_tokens_from_reqs(reqs, 16, *{extra}, layout={layout!r})
"""


def _callgrind(code: str, collect: str, env: dict[str, str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             f"--toggle-collect={collect}", sys.executable, "-c", code],
            check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        text = out.read_text()
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if not match:
        raise RuntimeError("callgrind wrote no instruction total")
    return int(match.group(1))


def count(variant: str, p: int, dtype: str) -> float:
    code = PROGRAM.format(variant=variant, rows=ROWS, dtype=dtype, calls=CALLS, p=p)
    total = _callgrind(code, "kv_spec_v2_pages", dict(os.environ, KVEST_CPU=variant))
    return total / (ROWS * CALLS)


def count_objects(fn: str, shape: str, layout: str | None) -> float:
    extra = "(128,)" if fn == "spec_v2" else "()"
    code = OBJECT_PROGRAM.format(shape=shape, rows=OBJECT_ROWS, calls=CALLS, fn=fn,
                                 extra=extra, layout=layout)
    total = _callgrind(code, f"*{fn}_new_tokens_from_reqs*", dict(os.environ))
    return total / (OBJECT_ROWS * CALLS)


def main() -> int:
    update = "--update" in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILINGS.read_text())
    measured = {}
    failed = False
    print(f"{'case':40} {'instructions/request':>22} {'ceiling':>9}")
    cases = [(f"{variant} p={p} {dtype}", lambda v=variant, p=p, d=dtype: count(v, p, d))
             for variant, p, dtype in CASES]
    cases += [(f"objects {fn} {shape} layout={layout}",
               lambda f=fn, s=shape, la=layout: count_objects(f, s, la))
              for fn, shape, layout in OBJECT_CASES]
    for key, measure in cases:
        measured[key] = per_row = measure()
        ceiling = ceilings.get(key)
        verdict = ""
        if ceiling is not None and per_row > ceiling:
            verdict = "  ABOVE CEILING"
            failed = True
        print(f"{key:40} {per_row:22.3f} {ceiling if ceiling is not None else '-':>9}{verdict}")
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
