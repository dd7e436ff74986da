"""The no-speculation decode step's hot spots under callgrind's cache simulator:
instructions and simulated D1/LL data misses per request, upstream against kvest.

    python tools/cachegrind_hotspots.py                 # the table, both sides, and the crossovers
    python tools/cachegrind_hotspots.py --markdown      # docs/benchmarks.md's table of it
    python tools/cachegrind_hotspots.py --check         # kvest only: check against the ceilings
    python tools/cachegrind_hotspots.py --update        # kvest only: rewrite the ceilings (+10%)
    python tools/cachegrind_hotspots.py --wheel W.whl   # upstream's files from a wheel
    python tools/cachegrind_hotspots.py --no-handoff    # kvest's kernels at every size too

Upstream's code is SGLang 0.5.23's own, taken from its files (an installed
``sglang`` distribution, or ``--wheel``; never imported) into
:func:`kvest.sglang.upstream.standin_tree`.  Each hot spot is called as its
caller calls it, on release-shaped requests (:class:`kvest.sglang.standins.NestedReq`,
157 attributes, lengths in a slots ``req.kv``; ``decode_batch_idx`` set after
``__init__``), in a stand-in ``ScheduleBatch``:

- whole functions: upstream's as compiled from the file, kvest's as
  ``kvest.sglang.patch()`` installs it (the estimate, with and without a
  shuffled ``selected_indices`` as the retract loop passes it;
  ``page_aligned_decode_alloc_lens``; ``num_beam_member_rows``);
- statements inside larger functions (the selection ``check_decode_mem``
  builds, ``alloc_for_decode_default``'s adding loop, ``prepare_for_decode``'s
  batch-index loop, ``append_beam_tail``'s loop): the statement alone in a
  function of its own, as written and as swapped
  (:func:`kvest.sglang.parity.statement_pair`), so torch's work around them is
  not counted.

Each side runs in its own processes under ``valgrind --tool=callgrind
--cache-sim=yes`` with a fixed cache (D1 32 KiB 8-way, LL 8 MiB 16-way, 64-byte
lines: the same counts on any host).  Instrumentation starts once every batch
is built; events are collected only between two toggles around one call, and
each such segment is dumped on its own.  Per (hot spot, n):

- **warm**: the call made once uncounted, then once counted (a scheduler's
  steady state: the same requests read every step);
- **cold** (n >= 256): the caches flushed (a 16 MiB sweep) before the counted
  call: every line the call touches is a miss, so LL misses per request are
  the cache lines it reads and writes per request.

From each count the same segment around an empty call (the same arguments)
is subtracted, and the rest is divided by n.  Instructions are the
deterministic proxy for time (``PYTHONHASHSEED=0``; a build's counts are the
same on every run).  ``--check`` runs kvest's side only, at 256, 1,024 and
4,096 requests, and fails if a count is above its ceiling in
``tools/cachegrind_ceilings.json`` (``--update`` writes them 10% above the
measurement).

Counts are the same on every run of the same build in the same place; where
the heap lies still moves them a little between places (another wheel path,
another environment): the D1/LL counts by a few percent, and the shuffled
selection's instructions by up to 12% at 256 requests, as the passes and
buckets of its address-order sort follow the span of the requests' addresses
(the ceilings come from the higher count seen).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CEILINGS = Path(__file__).with_name("cachegrind_ceilings.json")
# The public-API build's (KVEST_PUBLIC_API_ONLY=1, every Python newer than 3.13):
# its own gate, as its request kernels take several times the default's instructions.
PUBLIC_API_CEILINGS = Path(__file__).with_name("cachegrind_ceilings_public_api.json")


def ceilings_file() -> Path:
    """The installed build's ceilings."""
    from kvest.sglang import registry

    public = registry.installed_build() is registry.Build.PUBLIC_API
    return PUBLIC_API_CEILINGS if public else CEILINGS
SLACK = 1.10
SORT_SLACK = 1.25  # the shuffled selection's instructions (see _ceiling)
MISS_SLACK = 0.75  # misses a request: the least room a miss ceiling leaves (see gate_check)
VERSION = "0.5.23"
TABLE_SIZES = (256, 1024, 4096)
CROSS_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
PAGE_SIZE = 16
RESERVE = 8  # alloc lens: EAGLE (3, 1, 4)'s alloc_len_per_decode doubled
CACHE = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64"]
FLUSH_BYTES = 16 << 20  # twice LL
WARM_ITERATIONS = 16384  # requests' worth of calls before any count (see worker())



def _rows() -> dict[str, tuple[str, Any]]:
    """label -> (the hot spot's name, its Bench): every row the registry's hot
    spots give (:class:`kvest.sglang.registry.Bench`), in the registry's order."""
    from kvest.sglang.registry import HOTSPOTS

    return {b.label: (spot.name, b) for spot in HOTSPOTS.values() for b in spot.bench}


# label -> (what it is, "function" or "statement", the hot spot, the statement's kind)
SPOTS: dict[str, tuple[str, str, str, str]] = {
    label: (b.what, "statement" if b.kind else "function", spot, b.kind)
    for label, (spot, b) in _rows().items()}
# label -> the passes over the batch (kvest, upstream): the registry's Bench.passes
PASSES: dict[str, tuple[str, str]] = {label: b.passes for label, (_, b) in _rows().items()}
EVENTS = ("Ir", "D1", "LL")
NO_HANDOFF = False  # --no-handoff: small batches on kvest's kernels too
# Where the batch's requests lie decides how many passes kvest's address-order
# sort makes (addrorder.h): without address-space randomisation they lie at the
# same addresses on every run.
NO_ASLR = (["setarch", os.uname().machine, "-R"]
           if subprocess.run(["setarch", os.uname().machine, "-R", "true"],
                             capture_output=True).returncode == 0 else [])


# ------------------------------------------------------------------ the worker

HELPER_C = r"""
#include <stdlib.h>
#include <valgrind/callgrind.h>
void kvcg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void kvcg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void kvcg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
static volatile char *sweep;
void kvcg_flush(size_t bytes)
{
    if (sweep == NULL) sweep = calloc(bytes, 1);
    for (size_t i = 0; i < bytes; i += 64) sweep[i]++;
}
"""


def _empty(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def hot_spots(side: str, names: list[str], sizes: list[int], root: str, version: str
              ) -> Iterator[tuple[dict[str, Any], Callable[[str, int], tuple[Any, Any]]]]:
    """In stand-in modules of the release at ``root``: each hot spot's function of
    ``side`` (upstream's, or kvest's as ``patch()`` installs it), and
    ``arguments(name, n)``, the batch of n requests as its caller passes it."""
    import random

    import kvest.sglang
    from kvest.sglang import parity, registry, upstream
    from kvest.sglang.standins import NestedReq

    # kvest's code as the default build installs it, on every build: the builds'
    # counts are of the same code (each build's own choice is the registry's Cost)
    registry.DECIDING = registry.Build.DEFAULT
    rows = _rows()
    source = upstream.SourceTree(root, version)
    with upstream.standin_tree(source) as tree:
        handle = kvest.sglang.patch()
        try:
            targets = {t.spot: t for t in handle.plan.targets if t.registry is not None}
            calls: dict[str, tuple[Any, tuple[str, ...]]] = {}
            for name in names:
                _, how, spot, kind = SPOTS[name]
                if how == "function":
                    target = targets[spot]
                    fn = target.new if side == "kvest" else target.original
                    calls[name] = (fn, ())
                    continue
                # (found as the plan finds it: also where upstream's loop is
                # faster and kvest leaves it so, to show by how much)
                analysis, found = parity.found_statement(tree, spot, kind)
                alone, swapped, params = parity.statement_pair(analysis, found, spot)
                calls[name] = (swapped if side == "kvest" else alone, params)
            if side != "kvest":
                handle.undo()  # upstream's functions call upstream's helpers
            rng = random.Random(0)
            worlds = {}
            for n in sizes:
                reqs = []
                for _ in range(n):
                    committed = rng.randint(300, 2**15)
                    req = NestedReq(committed, committed + rng.randint(0, 2 * PAGE_SIZE))
                    req.decode_batch_idx = rng.randint(300, 2**15)
                    reqs.append(req)
                picked = list(range(n))
                random.Random(n).shuffle(picked)
                worlds[n] = (tree.batch(reqs, PAGE_SIZE, None), reqs, picked,
                             tree.batch(reqs, PAGE_SIZE, "EAGLE"))

            def arguments(name: str, n: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
                batch, reqs, picked, eagle = worlds[n]
                # (each made only where a call takes it: what else the worker
                # allocates moves where the requests' new ints land, and so the
                # misses counted)
                values = {"self": lambda: batch, "batch": lambda: batch,
                          "eagle": lambda: eagle, "picked": lambda: picked,
                          "selected_indices": lambda: picked, "reqs": lambda: reqs,
                          "token_per_req": lambda: 1, "t": lambda: 0,
                          "reserve": lambda: RESERVE, "page_size": lambda: PAGE_SIZE,
                          # (each request's own length: max() keeps the same int,
                          # so the batch is the same for every row after it)
                          "nxt_kv_lens_list": lambda: [r.kv.kv_allocated_len for r in reqs]}
                bench = rows[name][1]
                if not bench.kind:  # a whole function, as its caller calls it
                    return (tuple(values[a]() for a in bench.args),
                            {k: values[k]() for k in bench.kwargs})
                lists = ("entries", "tails", "tails_cpu", "leader_idx", "widths")
                return tuple(values[p]() if p in values else [] if p in lists else None
                             for p in calls[name][1]), {}

            yield {name: fn for name, (fn, _) in calls.items()}, arguments
        finally:
            handle.undo()


def worker(side: str, names: list[str], sizes: list[int], cold: list[int], helper: str,
           root: str, version: str) -> None:
    """Inside valgrind: build the batches, then count every (hot spot, n)."""
    import ctypes

    lib = ctypes.CDLL(helper)
    lib.kvcg_dump.argtypes = [ctypes.c_char_p]
    lib.kvcg_flush.argtypes = [ctypes.c_size_t]
    toggle, dump, flush = lib.kvcg_toggle, lib.kvcg_dump, lib.kvcg_flush
    with hot_spots(side, names, sizes, root, version) as (calls, arguments):
        def segment(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    label: str) -> None:
            toggle()
            fn(*args, **kwargs)
            toggle()
            dump(label.encode())

        # CPython 3.11+ specialises a code object's instructions only after it
        # ran a while, and backs off exponentially where that fails: how many
        # instructions a call takes depends on how often the code ran before.
        # Every call runs WARM_ITERATIONS requests' worth first, uninstrumented,
        # so that every count sees the steady state, whatever ran before it.
        for name in names:
            fn = calls[name]
            for n in sizes:
                args, kwargs = arguments(name, n)
                for _ in range(max(8, WARM_ITERATIONS // n)):
                    fn(*args, **kwargs)
                    _empty(*args, **kwargs)
        lib.kvcg_start()
        segment(_empty, (), {}, "prime")
        for name in names:
            fn = calls[name]
            for n in sizes:
                args, kwargs = arguments(name, n)
                fn(*args, **kwargs)  # warm: the same call made once, uncounted
                _empty(*args, **kwargs)
                segment(fn, args, kwargs, f"{name}|{n}|warm|call")
                segment(_empty, args, kwargs, f"{name}|{n}|warm|empty")
                if n in cold:
                    flush(FLUSH_BYTES)
                    segment(fn, args, kwargs, f"{name}|{n}|cold|call")
                    flush(FLUSH_BYTES)
                    segment(_empty, args, kwargs, f"{name}|{n}|cold|empty")


# ------------------------------------------------------------------ the parent

def build_helper(directory: str) -> str:
    source = Path(directory) / "kvcg.c"
    library = Path(directory) / "kvcg.so"
    source.write_text(HELPER_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True)
    return str(library)


def _read_dumps(directory: Path, stem: str) -> dict[str, dict[str, int]]:
    """label -> {Ir, D1, LL} (data misses, reads and writes) of every dump."""
    out: dict[str, dict[str, int]] = {}
    for path in directory.glob(f"{stem}.*"):
        text = path.read_text()
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.MULTILINE)
        events = re.search(r"^events:\s+(.*)$", text, re.MULTILINE)
        totals = re.search(r"^(?:summary|totals):\s+(.*)$", text, re.MULTILINE)
        if not (label and events and totals):
            continue
        values = dict(zip(events.group(1).split(), map(int, totals.group(1).split()),
                          strict=False))
        out[label.group(1).strip()] = {
            "Ir": values.get("Ir", 0),
            "D1": values.get("D1mr", 0) + values.get("D1mw", 0),
            "LL": values.get("DLmr", 0) + values.get("DLmw", 0),
        }
    return out


def run(side: str, names: list[str], sizes: list[int], cold: list[int], helper: str,
        source: Any) -> dict[str, dict[str, int]]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    if NO_HANDOFF:  # kvest's kernels at every size: where they cross upstream's code
        env["KVEST_SGLANG_HANDOFF"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        stem = "cg.out"
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                "import cachegrind_hotspots as t; "
                f"t.worker({side!r}, {names!r}, {sizes!r}, {cold!r}, {helper!r}, "
                f"{str(source.root)!r}, {source.version!r})")
        proc = subprocess.run(
            [*NO_ASLR, "valgrind", "--tool=callgrind", "--cache-sim=yes", *CACHE,
             "--instr-atstart=no", "--collect-atstart=no",
             f"--callgrind-out-file={tmp}/{stem}", sys.executable, "-c", code],
            env=env, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the {side} worker failed:\n{proc.stderr[-4000:]}")
        return _read_dumps(Path(tmp), stem)


def per_request(dumps: dict[str, dict[str, int]], name: str, n: int, state: str
                ) -> dict[str, float] | None:
    call = dumps.get(f"{name}|{n}|{state}|call")
    empty = dumps.get(f"{name}|{n}|{state}|empty")
    if call is None or empty is None:
        return None
    return {e: (call[e] - empty[e]) / n for e in EVENTS}


def source_tree(wheel: str | None, cache: str) -> Any:
    """Upstream's files: from ``wheel`` (unpacked under ``cache``), else the installed sglang."""
    from kvest.sglang import upstream

    if wheel is not None:
        tree = upstream.wheel(wheel, cache)
    else:
        tree = upstream.installed()
        if tree is None:
            raise SystemExit("no sglang installed: pip install --no-deps sglang==0.5.23, "
                             "or pass --wheel")
    if tree.version != VERSION:
        raise SystemExit(f"sglang {tree.version}: the counts are for {VERSION}")
    return tree


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 1 else f"{x:.2f}"


def markdown(results: dict[str, dict[str, dict[str, int]]]) -> str:
    """The table for docs/benchmarks.md, a row a hot spot, upstream → kvest:
    instructions per request at 1,024 and 4,096 requests, the misses per
    request at 4,096, the crossover and the instructions of a call at n = 1
    (``report`` prints every count).  With --no-handoff, only the crossover and
    n = 1: the larger sizes are the same on either run."""
    big = TABLE_SIZES[-1]

    def pair(name: str, n: int, state: str, event: str) -> str:
        up = per_request(results["upstream"], name, n, state)
        kv = per_request(results["kvest"], name, n, state)
        return f"{_fmt(up[event])} → {_fmt(kv[event])}" if up and kv else "–"

    def at_one(name: str) -> str:
        row = crossover(results, name)[1]
        return f"{_fmt(row[1][0])} → {_fmt(row[1][1])}" if 1 in row else "–"

    if NO_HANDOFF:
        lines = ["| hot spot, --no-handoff | kvest below upstream from n = | "
                 "instructions / call, n = 1 |", "| --- | ---: | ---: |"]
        for name in SPOTS:
            lines.append(f"| {name} | {crossover(results, name)[0]} | {at_one(name)} |")
        return "\n".join(lines)
    lines = [f"| hot spot | instructions / request, n = {TABLE_SIZES[-2]:,} | n = {big:,} | "
             f"D1 misses / request, warm, n = {big:,} | LL misses / request, cold, "
             f"n = {big:,} | kvest below upstream from n = | instructions / call, n = 1 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in SPOTS:
        lines.append(f"| {name} | {pair(name, TABLE_SIZES[-2], 'warm', 'Ir')} | "
                     f"{pair(name, big, 'warm', 'Ir')} | {pair(name, big, 'warm', 'D1')} | "
                     f"{pair(name, big, 'cold', 'LL')} | {crossover(results, name)[0]} | "
                     f"{at_one(name)} |")
    return "\n".join(lines)


def crossover(results: dict[str, dict[str, dict[str, int]]], name: str
              ) -> tuple[str, dict[int, tuple[float, float]]]:
    """The smallest n of CROSS_SIZES (then TABLE_SIZES) where kvest's instructions per
    call are below upstream's, and every (upstream, kvest) pair per call."""
    row: dict[int, tuple[float, float]] = {}
    for n in (*CROSS_SIZES, *TABLE_SIZES):
        up = per_request(results["upstream"], name, n, "warm")
        kv = per_request(results["kvest"], name, n, "warm")
        if up and kv:
            row[n] = (up["Ir"] * n, kv["Ir"] * n)
    below = [n for n, (u, k) in row.items() if k < u]
    if not below:
        return "none measured", row
    first = min(below)
    above_later = [n for n in row if n > first and row[n][1] >= row[n][0]]
    label = f"{first:,}"
    if above_later:
        label += f" (not at {', '.join(f'{n:,}' for n in above_later)})"
    return label, row


def main() -> int:
    global NO_HANDOFF
    args = sys.argv[1:]
    check, update, md = "--check" in args, "--update" in args, "--markdown" in args
    wheel = None
    only: list[int] | None = None
    jobs = 2
    out: str | None = None
    saved: dict[str, Any] | None = None
    for i, arg in enumerate(args):
        if arg == "--wheel":
            wheel = args[i + 1]
        elif arg.startswith("--wheel="):
            wheel = arg.split("=", 1)[1]
        elif arg.startswith("--jobs="):
            jobs = int(arg.split("=", 1)[1])
        elif arg.startswith("--json="):
            out = arg.split("=", 1)[1]
        elif arg.startswith("--from-json="):  # render a --json file, run nothing
            saved = json.loads(Path(arg.split("=", 1)[1]).read_text())
        elif arg == "--no-handoff":
            NO_HANDOFF = True
        elif arg.startswith("--sizes="):  # a look at other sizes (not for the gate)
            only = [int(x) for x in arg.split("=", 1)[1].split(",")]
    if saved is not None:  # (after every flag: --no-handoff decides the table)
        print(markdown(saved) if md else report(saved, [*CROSS_SIZES, *TABLE_SIZES]))
        return 0
    scratch = tempfile.TemporaryDirectory()
    try:
        return _main(source_tree(wheel, scratch.name), scratch.name, check, update, md, jobs,
                     out, only)
    finally:
        scratch.cleanup()


def _main(source: Any, tmp: str, check: bool, update: bool, md: bool, jobs: int,
          out: str | None, only: list[int] | None) -> int:
    gate = check or update
    sides = ["kvest"] if gate else ["upstream", "kvest"]
    sizes = list(TABLE_SIZES) if gate else [*CROSS_SIZES, *TABLE_SIZES]
    if only is not None and not gate:
        sizes = only
    names = list(SPOTS)
    halves = [names[0::2], names[1::2]]
    helper = build_helper(tmp)
    work = [(side, half) for side in sides for half in halves]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        parts = list(pool.map(
            lambda w: (w[0], run(w[0], w[1], sizes, list(TABLE_SIZES), helper, source)),
            work))
    results: dict[str, dict[str, dict[str, int]]] = {side: {} for side in sides}
    for side, dumps in parts:
        results[side].update(dumps)
    if out:
        Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if gate:
        return gate_check(results["kvest"], update)
    print(markdown(results) if md else report(results, sizes))
    return 0


def report(results: dict[str, dict[str, dict[str, int]]], sizes: list[int]) -> str:
    """Every count per request, both sides, and the crossovers, as plain text."""
    lines = [f"{'hot spot':32} {'n':>6} {'state':5} "
             + " ".join(f"{e + ' up':>10} {e + ' kvest':>10}" for e in EVENTS)]
    for name in SPOTS:
        for n in sizes:
            for state in ("warm", "cold"):
                up = per_request(results["upstream"], name, n, state)
                kv = per_request(results["kvest"], name, n, state)
                if up and kv:
                    lines.append(f"{name:32} {n:>6} {state:5} "
                                 + " ".join(f"{up[e]:10.2f} {kv[e]:10.2f}" for e in EVENTS))
    lines.append("\ncrossover (smallest n where kvest's instructions per call are below "
                 "upstream's):")
    lines += [f"  {name:32} {crossover(results, name)[0]}" for name in SPOTS]
    lines.append("\npasses over the batch (kvest; upstream):")
    lines += [f"  {name:32} {PASSES[name][0]}; {PASSES[name][1]}" for name in SPOTS]
    return "\n".join(lines)


def _key(name: str, n: int, state: str, event: str) -> str:
    return f"{name} | n={n} | {state} | {event}"


def _ceiling(key: str, value: float) -> float:
    """The ceiling --update writes for a measurement."""
    if not key.endswith("| Ir"):
        return max(value * SLACK, value + MISS_SLACK)
    if key.startswith("estimate, selection") and "| warm |" in key:
        # The sort's passes and buckets follow the span of the requests' addresses:
        # 751 or 839 instructions a request at 256, 677 to 727 at 1,024, from one
        # place to another (another path, another environment) on the same build.
        return value * SORT_SLACK
    return value * SLACK


def gate_check(dumps: dict[str, dict[str, int]], update: bool) -> int:
    """kvest's counts per request against the ceilings: instructions (warm), D1 misses
    (warm) and LL misses (cold), per hot spot, at TABLE_SIZES.

    The public-API build's warm D1 misses are left out: its readers search each
    request's dict whole, about 190 lines a request against D1's 512, so their
    conflict misses follow where the heap lies, and a change anywhere in the
    process moves them (the beam tail's 47 to 77 a request between two runs of
    one build in one place, its tool edited between them).  Its cold LL count,
    every line a call touches, holds to 1% there."""
    public = ceilings_file() == PUBLIC_API_CEILINGS
    measured: dict[str, float] = {}
    for name in SPOTS:
        for n in TABLE_SIZES:
            warm = per_request(dumps, name, n, "warm")
            cold = per_request(dumps, name, n, "cold")
            if warm is None or cold is None:
                raise RuntimeError(f"no counts for {name} at n={n}")
            measured[_key(name, n, "warm", "Ir")] = warm["Ir"]
            if not public:
                measured[_key(name, n, "warm", "D1")] = warm["D1"]
            measured[_key(name, n, "cold", "LL")] = cold["LL"]
    if update:
        # Misses get at least MISS_SLACK a request above the measurement: where the
        # heap lies moves a few-miss count by a few tenths from place to place
        # (another path, another environment), and a new pass over the requests
        # themselves costs about one miss a request more.
        ceilings_file().write_text(json.dumps(
            {k: round(_ceiling(k, v), 2) for k, v in measured.items()}, indent=2) + "\n")
        print(f"ceilings written to {ceilings_file()}")
    ceilings = json.loads(ceilings_file().read_text())
    failed = False
    print(f"{'case':58} {'per request':>12} {'ceiling':>9}")
    for key, value in measured.items():
        ceiling = ceilings.get(key)
        verdict = ""
        if ceiling is None:
            verdict = "  NO CEILING"
            failed = True
        elif value > ceiling:
            verdict = "  ABOVE CEILING"
            failed = True
        print(f"{key:58} {value:12.2f} {ceiling if ceiling is not None else '-':>9}{verdict}")
    if failed:
        print("cachegrind gate: a count is above its ceiling (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
