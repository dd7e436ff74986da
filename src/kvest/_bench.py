"""The implementations kvest is compared with, and ``python -m kvest bench``.

One registry (:data:`IMPLEMENTATIONS`) serves both the command-line comparison
and the pytest-benchmark suite in ``bench/``, so the two always measure the same
code on the same data:

- ``loop``: the per-request Python loop over request objects that SGLang runs
  (the same arithmetic, written here) -- the baseline;
- ``numpy``: the vectorized NumPy expression a user would write;
- ``kvest``: kvest's array kernel on the same arrays;
- ``kvest-objects``: kvest's object kernel on the same request objects;
- ``floor``: ``np.add.reduce`` over each input array: the cost of merely reading
  the data once, a lower bound for any implementation that reads it;
- ``numba``: an ``@njit`` loop, when Numba is installed.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kvest

SIZES = [1, 8, 64, 256, 1024, 4096, 65536, 2**20]
QUICK_SIZES = [1, 64, 256, 4096, 65536, 2**20]
PAGE_SIZES = [1, 16, 64, 100]
# Beyond this many rows the Python loop takes ~0.3 s a call, and building the
# request objects alone takes seconds: loop and object kernel stop here.
LOOP_MAX_ROWS = 65536
RESERVE = 2 * 64  # alloc_reserve_per_decode for (5, 8, 64): a common tree config


class Req:
    """A request object in SGLang 0.5.11's flat layout (a plain class, as there)."""

    def __init__(self, committed: int, allocated: int) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


class KVState:
    """The nested layout of later SGLang releases: lengths under ``req.kv``."""

    def __init__(self, committed: int, allocated: int) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


class NestedReq:
    def __init__(self, committed: int, allocated: int) -> None:
        self.kv = KVState(committed, allocated)


def loop_spec_v2_nested(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        cur = r.kv.kv_allocated_len
        nxt = max(cur, r.kv.kv_committed_len + reserve)
        total += (nxt + p - 1) // p * p - (cur + p - 1) // p * p
    return total


@dataclass
class Batch:
    """One decode batch in every form the implementations take."""

    committed: np.ndarray
    allocated: np.ndarray
    page_size: int
    reserve: int = RESERVE
    _reqs: list[Req] | None = field(default=None, repr=False)

    @property
    def reqs(self) -> list[Req]:
        if self._reqs is None:
            self._reqs = [Req(c, a) for c, a in zip(self.committed.tolist(),
                                                    self.allocated.tolist(), strict=True)]
        return self._reqs

    @property
    def n(self) -> int:
        return len(self.committed)


@functools.lru_cache(maxsize=64)
def make_batch(n: int, page_size: int, dtype: str = "int64", seed: int = 0) -> Batch:
    """A realistic decode batch: committed lengths up to 2^17, allocation ahead by up to R."""
    rng = np.random.default_rng(seed)
    committed = rng.integers(1, 2**17, n)
    allocated = committed + rng.integers(0, RESERVE + 1, n)
    return Batch(committed.astype(dtype), allocated.astype(dtype), page_size)


# ----------------------------------------------------------- implementations

def loop_spec_v2(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        cur = r.kv_allocated_len
        nxt = max(cur, r.kv_committed_len + reserve)
        total += (nxt + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def numpy_spec_v2(c: np.ndarray, a: np.ndarray, p: int, reserve: int) -> int:
    nxt = np.maximum(a, c + reserve)
    return int(((nxt + p - 1) // p * p - (a + p - 1) // p * p).sum())


def loop_decode(reqs: list[Any], p: int) -> int:
    return sum(1 for r in reqs if r.kv_committed_len % p == 0) * p


def numpy_decode(c: np.ndarray, p: int) -> int:
    return int(np.count_nonzero(c % p == 0)) * p


def _floor(*arrays: np.ndarray) -> None:
    for arr in arrays:
        np.add.reduce(arr)


@functools.lru_cache(maxsize=1)
def _numba_kernels() -> tuple[Callable[..., int], Callable[..., int]] | None:
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(cache=False, nogil=True)
    def spec_v2(c, a, p, reserve):  # pragma: no cover - compiled
        total = 0
        for i in range(c.shape[0]):
            nxt = max(a[i], c[i] + reserve)
            total += (nxt + p - 1) // p * p - (a[i] + p - 1) // p * p
        return total

    @numba.njit(cache=False, nogil=True)
    def decode(c, p):  # pragma: no cover - compiled
        count = 0
        for i in range(c.shape[0]):
            count += c[i] % p == 0
        return count * p

    return spec_v2, decode


def _numba(fn: str, b: Batch) -> Callable[[], Any] | None:
    kernels = _numba_kernels()
    if kernels is None:
        return None
    spec_v2, decode = kernels
    if fn == "spec_v2":
        call = functools.partial(spec_v2, b.committed, b.allocated, b.page_size, b.reserve)
    else:
        call = functools.partial(decode, b.committed, b.page_size)
    call()  # compile outside the timing
    return call


# name -> (fn -> batch -> zero-argument callable, or None when not applicable)
IMPLEMENTATIONS: dict[str, Callable[[str, Batch], Callable[[], Any] | None]] = {
    "loop": lambda fn, b: None if b.n > LOOP_MAX_ROWS else (
        functools.partial(loop_spec_v2, b.reqs, b.page_size, b.reserve) if fn == "spec_v2"
        else functools.partial(loop_decode, b.reqs, b.page_size)),
    "numpy": lambda fn, b: (
        functools.partial(numpy_spec_v2, b.committed, b.allocated, b.page_size, b.reserve)
        if fn == "spec_v2" else functools.partial(numpy_decode, b.committed, b.page_size)),
    "kvest": lambda fn, b: (
        functools.partial(kvest.spec_v2_new_tokens, b.committed, b.allocated, b.page_size,
                          b.reserve)
        if fn == "spec_v2" else functools.partial(kvest.decode_new_tokens, b.committed,
                                                  b.page_size)),
    "kvest-objects": lambda fn, b: None if b.n > LOOP_MAX_ROWS else (
        functools.partial(kvest.spec_v2_new_tokens_from_reqs, b.reqs, b.page_size, b.reserve)
        if fn == "spec_v2" else functools.partial(kvest.decode_new_tokens_from_reqs, b.reqs,
                                                  b.page_size)),
    "floor": lambda fn, b: (
        functools.partial(_floor, b.committed, b.allocated) if fn == "spec_v2"
        else functools.partial(_floor, b.committed)),
    "numba": _numba,
}
FUNCTIONS = ("spec_v2", "decode")


# ------------------------------------------------------------------ timing

def _calibrate(call: Callable[[], Any], target: float) -> int:
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            call()
        elapsed = time.perf_counter() - start
        if elapsed >= target or number >= 1 << 22:
            return max(1, int(number * target / max(elapsed, 1e-9)))
        number *= 4


def measure(calls: dict[str, Callable[[], Any]], samples: int, target: float) -> dict[str, float]:
    """Median seconds per call of each callable, sampled round-robin (side by side)."""
    numbers = {name: _calibrate(call, target) for name, call in calls.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(samples):
        for name, call in calls.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                call()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


@dataclass
class Row:
    fn: str
    n: int
    page_size: int
    times: dict[str, float]  # implementation (with ":int32" for int32 data) -> seconds


def run_matrix(sizes: list[int], page_sizes: list[int], fns: tuple[str, ...], samples: int,
               target: float, progress: Callable[[str], None] | None = None) -> list[Row]:
    rows = []
    total = len(sizes) * len(page_sizes) * len(fns)
    for fn in fns:
        for p in page_sizes:
            for n in sizes:
                b64, b32 = make_batch(n, p), make_batch(n, p, "int32")
                calls = {}
                for name, factory in IMPLEMENTATIONS.items():
                    call = factory(fn, b64)
                    if call is not None:
                        calls[name] = call
                for name in ("kvest", "floor"):
                    calls[f"{name}:int32"] = IMPLEMENTATIONS[name](fn, b32)
                rows.append(Row(fn, n, p, measure(calls, samples, target)))
                if progress:
                    progress(f"[{len(rows):3d}/{total}] {fn} n={n} p={p}")
    return rows


# ----------------------------------------------------------------- reports

def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None:
        return "–"
    r = num / den
    return f"{r:,.0f}×" if r >= 100 else f"{r:.3g}×"


def machine() -> str:
    config = {"implementation": kvest.IMPLEMENTATION}
    if kvest.IMPLEMENTATION == "cython":
        from kvest import _kernels

        config["cpu_variant"] = _kernels.cpu_variant()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, kvest {kvest.__version__} "
            f"({config['implementation']}"
            + (f", {config['cpu_variant']} loops" if "cpu_variant" in config else "") + ")")


def table(rows: list[Row], markdown: bool = False) -> str:
    impls = [name for name in ("loop", "numpy", "numba", "kvest", "kvest-objects", "floor",
                               "kvest:int32", "floor:int32")
             if any(name in r.times for r in rows)]
    head = ["function", "n", "p", *impls,
            "kvest vs loop", "kvest vs numpy", "kvest / floor", "objects vs loop"]
    body = []
    for r in rows:
        t = r.times
        body.append([r.fn, f"{r.n:,}", str(r.page_size)]
                    + [_fmt_time(t.get(name)) for name in impls]
                    + [_ratio(t.get("loop"), t["kvest"]), _ratio(t["numpy"], t["kvest"]),
                       _ratio(t["kvest"], t["floor"]),
                       _ratio(t.get("loop"), t.get("kvest-objects"))])
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join(" --- " if i < 3 else " ---: " for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*cells) for cells in body])


def _find(rows: list[Row], fn: str, n: int, p: int) -> Row | None:
    return next((r for r in rows if (r.fn, r.n, r.page_size) == (fn, n, p)), None)


def targets(rows: list[Row]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for the targets of the benchmark and kernel issues."""
    out: list[tuple[str, str, bool | None]] = []

    def ratio_check(label: str, row: Row | None, num: str, den: str, at_least: float) -> None:
        if row is None or num not in row.times or den not in row.times:
            out.append((label, "not measured", None))
            return
        r = row.times[num] / row.times[den]
        out.append((label, f"{r:,.1f}×", r >= at_least))

    pow2 = [p for p in sorted({r.page_size for r in rows}) if p & (p - 1) == 0 and p > 1] or [1]
    p0 = 16 if 16 in pow2 else pow2[0]
    for n, want in ((1, 5), (256, 300), (65536, 1000)):
        ratio_check(f"kvest ≥ {want}× loop at n={n:,} (p={p0})", _find(rows, "spec_v2", n, p0),
                    "loop", "kvest", want)
    for n, want in ((256, 20), (2**20, 10)):
        ratio_check(f"kvest ≥ {want}× numpy at n={n:,} (p={p0})",
                    _find(rows, "spec_v2", n, p0), "numpy", "kvest", want)
    for p in sorted({r.page_size for r in rows}):
        ratio_check(f"kvest no slower than the floor at n=2^20, p={p} (int64)",
                    _find(rows, "spec_v2", 2**20, p), "floor", "kvest", 1.0)
    for n in (65536, 2**20):
        a, b = _find(rows, "spec_v2", n, 100), _find(rows, "spec_v2", n, 64)
        if a and b:
            r = a.times["kvest"] / b.times["kvest"]
            out.append((f"p=100 within 1.5× of p=64 at n={n:,}", f"{r:.2f}×", r <= 1.5))
    row = _find(rows, "spec_v2", 2**20, p0)
    if row:
        r = row.times["kvest"] / row.times["kvest:int32"]
        out.append((f"int32 at least as fast as int64 at n=2^20 (p={p0})",
                     f"int64/int32 = {r:.2f}×", r >= 1.0))
    ratio_check(f"kvest ≥ 8× loop at n=1 (p={p0})", _find(rows, "spec_v2", 1, p0),
                "loop", "kvest", 8)
    ratio_check(f"kvest-objects ≥ 5× loop at n=1 (p={p0})", _find(rows, "spec_v2", 1, p0),
                "loop", "kvest-objects", 5)
    ratio_check(f"kvest-objects ≥ 10× loop at n=256 (p={p0})", _find(rows, "spec_v2", 256, p0),
                "loop", "kvest-objects", 10)
    return out


def targets_table(rows: list[Row], markdown: bool = False) -> str:
    lines = []
    for label, measured, met in targets(rows):
        verdict = "–" if met is None else ("met" if met else "**missed**" if markdown else "MISSED")
        lines.append((label, measured, verdict))
    if markdown:
        return "\n".join(["| target | measured | |", "| --- | ---: | --- |"]
                         + [f"| {a} | {b} | {c} |" for a, b, c in lines])
    width = max(len(a) for a, _, _ in lines)
    return "\n".join(f"{a:<{width}}  {b:>16}  {c}" for a, b, c in lines)


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fns = sorted({r.fn for r in rows}, reverse=True)
    pages = sorted({r.page_size for r in rows})
    fig, axes = plt.subplots(len(fns), len(pages), figsize=(4 * len(pages), 3.6 * len(fns)),
                             squeeze=False, sharex=True, sharey=True)
    styles = {"loop": "o-", "numpy": "s-", "numba": "v-", "kvest": "D-", "kvest-objects": "^-",
              "floor": "k--", "kvest:int32": "D:", "floor:int32": "k:"}
    for i, fn in enumerate(fns):
        for j, p in enumerate(pages):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r.fn == fn and r.page_size == p), key=lambda r: r.n)
            for name, style in styles.items():
                pts = [(r.n, r.times[name] / r.n * 1e9) for r in sel if name in r.times]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, label=name, markersize=4)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{fn}, page size {p}")
            ax.grid(True, which="major", alpha=0.3)
            if i == len(fns) - 1:
                ax.set_xlabel("requests in the batch")
            if j == 0:
                ax.set_ylabel("ns per request (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def objects_comparison(n: int, p: int, samples: int, target: float) -> dict[str, dict[str, float]]:
    """Object kernel against the loops, flat and nested layouts, side by side."""
    from kvest import reference

    b = make_batch(n, p)
    nested = [NestedReq(r.kv_committed_len, r.kv_allocated_len) for r in b.reqs]
    out = {}
    for layout, reqs, loop in (("flat", b.reqs, loop_spec_v2),
                               ("nested", nested, loop_spec_v2_nested)):
        out[layout] = measure({
            "loop": functools.partial(loop, reqs, p, b.reserve),
            "reference": functools.partial(reference.spec_v2_new_tokens_from_reqs, reqs, p,
                                           b.reserve),
            "kvest-objects": functools.partial(kvest.spec_v2_new_tokens_from_reqs, reqs, p,
                                               b.reserve),
        }, samples, target)
    return out


def objects_table(result: dict[str, dict[str, float]], n: int, p: int,
                  markdown: bool = False) -> str:
    head = ["layout", "loop", "kvest.reference", "kvest-objects", "vs loop", "vs reference"]
    body = [[layout, _fmt_time(t["loop"]), _fmt_time(t["reference"]),
             _fmt_time(t["kvest-objects"]), _ratio(t["loop"], t["kvest-objects"]),
             _ratio(t["reference"], t["kvest-objects"])] for layout, t in result.items()]
    title = f"spec_v2 over {n} request objects, p={p}"
    if markdown:
        return "\n".join([f"{title}:", "", "| " + " | ".join(head) + " |",
                          "| --- |" + " ---: |" * (len(head) - 1)]
                         + ["| " + " | ".join(row) + " |" for row in body])
    return "\n".join([title] + ["  ".join(f"{c:>16}" for c in row) for row in [head, *body]])


def run(quick: bool = False, plot_path: str | None = None, markdown: str | None = None) -> int:
    sizes = QUICK_SIZES if quick else SIZES
    pages = [16, 100] if quick else PAGE_SIZES
    fns: tuple[str, ...] = ("spec_v2",) if quick else FUNCTIONS
    samples, target = (5, 0.002) if quick else (9, 0.01)
    print(f"kvest bench{' --quick' if quick else ''}: {machine()}", file=sys.stderr)
    start = time.perf_counter()
    rows = run_matrix(sizes, pages, fns, samples, target,
                      progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    objects = objects_comparison(256, 16, samples, target)
    elapsed = time.perf_counter() - start
    print(f"\nmedian time per call, {samples} samples each, implementations interleaved; "
          f"{elapsed:.0f} s\n")
    print(table(rows))
    print()
    print(objects_table(objects, 256, 16))
    print()
    print(targets_table(rows))
    if plot_path:
        plot(rows, plot_path)
        print(f"\nplot written to {plot_path}")
    if markdown:
        cmd = "python -m kvest bench" + (" --quick" if quick else "")
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(f"Measured with `{cmd}` on {machine()}; median time per call, "
                     f"{samples} samples per cell, implementations interleaved.\n\n")
            fh.write(table(rows, markdown=True) + "\n\n"
                     + objects_table(objects, 256, 16, markdown=True) + "\n\n"
                     + targets_table(rows, markdown=True) + "\n")
        print(f"markdown written to {markdown}")
    return 0
