"""Deterministic performance gate: instructions per request, counted by callgrind.

    python tools/instructions.py            # measure and check against the ceilings
    python tools/instructions.py --update   # measure and rewrite the ceilings file
    python tools/instructions.py --jobs=1   # one case at a time (default: two)

Wall-clock times on a shared machine drift; instruction counts do not. For each
case (CPU variant x page size x dtype) this runs the spec-v2 estimate on 65,536
requests under ``valgrind --tool=callgrind``, collecting only inside the C entry
point ``kv_spec_v2_pages`` (the loop and its dispatch), and divides the count by
the requests processed. A count above its ceiling in
``tools/instruction_ceilings.json`` fails loudly: the loop lost its
vectorization, gained a branch, or fell back to division.

Valgrind emulates AVX2 but not AVX-512, so the gate covers the baseline and
AVX2 variants; the differential tests cover AVX-512 on machines that have it.

Each case runs with callgrind's instrumentation off (``--instr-atstart=no``)
until the program, its arrays or requests built, switches it on through a
one-line C helper (``CALLGRIND_START_INSTRUMENTATION``, compiled here from
valgrind's own header): the interpreter's start and NumPy's import then run
at near-native speed instead of under instrumentation, which took most of the
gate's time.  What is counted does not change: only instructions inside the
collected functions, every call of which comes after the switch.  Without gcc
or the header, every case runs instrumented from the start, as before.  Cases
run two at a time (``--jobs``): a count does not depend on what else runs.

Every case runs with ``PYTHONHASHSEED=0``: the object kernels' default search
(``layout=None``) reads attributes through dicts whose probe sequences follow
the string hashes, and with a random seed per process the same build counted
anywhere from 424 to 518 instructions a request for one case (its ceiling
503), a gate that failed by chance.  With the seed fixed a build's count is
the same on every run.

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
from concurrent.futures import ThreadPoolExecutor
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
START()
for _ in range({calls}):
    kvest.spec_v2_new_tokens(c, a, {p}, 128)
"""


OBJECT_ROWS = 4096
OBJECT_CASES = [(fn, shape, layout) for fn in ("spec_v2", "decode")
                for shape, layout in (("FlatReq", "flat"), ("NestedReq", "nested"),
                                      ("NestedReq", None))]

OBJECT_PROGRAM = """
import kvest
from kvest.sglang.standins import {shape} as Req
reqs = [Req(c, c + 7) for c in range(1000, 1000 + {rows})]
START()
for _ in range({calls}):
    kvest.{fn}_new_tokens_from_reqs(reqs, 16, *{extra}, layout={layout!r})
"""


# START(): switch callgrind's instrumentation on (a no-op outside valgrind).
HELPER_C = """
#include <valgrind/callgrind.h>
void kvest_callgrind_start(void) { CALLGRIND_START_INSTRUMENTATION; }
"""
START_WITH_HELPER = "import ctypes\nSTART = ctypes.CDLL({path!r}).kvest_callgrind_start\n"
START_WITHOUT = "def START():\n    pass\n"
_helper: str | None = None  # the compiled helper's path, once built


def build_helper(directory: str) -> str | None:
    """Compile the START() helper into ``directory``; None when it cannot be built."""
    source = Path(directory) / "cgstart.c"
    library = Path(directory) / "cgstart.so"
    source.write_text(HELPER_C)
    try:
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no START() helper: {exc}; every case runs instrumented from its start)",
              file=sys.stderr)
        return None
    return str(library)


def _callgrind(code: str, collect: str, env: dict[str, str]) -> int:
    if _helper is not None:
        prelude, instr = START_WITH_HELPER.format(path=_helper), ["--instr-atstart=no"]
    else:
        prelude, instr = START_WITHOUT, []
    env = dict(env, PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", *instr, f"--callgrind-out-file={out}",
             f"--toggle-collect={collect}", sys.executable, "-c", prelude + code],
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
    # The Python entry point (Cython's ``__pyx_pw_`` wrapper) and all it calls:
    # a pattern that also matched the implementation it calls (``__pyx_pf_``)
    # would toggle collection off again there.
    total = _callgrind(code, f"__pyx_pw_*{fn}_new_tokens_from_reqs", dict(os.environ))
    return total / (OBJECT_ROWS * CALLS)


def main() -> int:
    global _helper
    update = "--update" in sys.argv[1:]
    jobs = 2
    for arg in sys.argv[1:]:
        if arg.startswith("--jobs="):
            jobs = int(arg.split("=", 1)[1])
    helper_dir = tempfile.TemporaryDirectory()
    _helper = build_helper(helper_dir.name)
    ceilings = {} if update else json.loads(CEILINGS.read_text())
    measured = {}
    failed = False
    print(f"{'case':40} {'instructions/request':>22} {'ceiling':>9}")
    cases = [(f"{variant} p={p} {dtype}", lambda v=variant, p=p, d=dtype: count(v, p, d))
             for variant, p, dtype in CASES]
    cases += [(f"objects {fn} {shape} layout={layout}",
               lambda f=fn, s=shape, la=layout: count_objects(f, s, la))
              for fn, shape, layout in OBJECT_CASES]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda case: case[1](), cases))
    helper_dir.cleanup()
    for (key, _), per_row in zip(cases, results, strict=True):
        measured[key] = per_row
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
