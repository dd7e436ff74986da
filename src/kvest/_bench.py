"""The implementations kvest is compared with, and ``python -m kvest bench``.

One registry (:data:`IMPLEMENTATIONS`) serves both the command-line comparison
and the pytest-benchmark suite in ``bench/``, so the two always measure the same
code on the same data:

- ``loop``: the per-request Python loop over request objects that SGLang runs
  (the same arithmetic, written here) -- the baseline;
- ``numpy``: the vectorized NumPy expression a user would write;
- ``kvest``: kvest's array kernel on the same arrays;
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
    """The tiny nested stand-in (tests/upstream.py still imports it from here)."""

    def __init__(self, committed: int, allocated: int) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated


class NestedReq:
    def __init__(self, committed: int, allocated: int) -> None:
        self.kv = KVState(committed, allocated)


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
    impls = [name for name in ("loop", "numpy", "numba", "kvest", "floor",
                               "kvest:int32", "floor:int32")
             if any(name in r.times for r in rows)]
    head = ["function", "n", "p", *impls, "kvest vs loop", "kvest vs numpy", "kvest / floor"]
    body = []
    for r in rows:
        t = r.times
        body.append([r.fn, f"{r.n:,}", str(r.page_size)]
                    + [_fmt_time(t.get(name)) for name in impls]
                    + [_ratio(t.get("loop"), t["kvest"]), _ratio(t["numpy"], t["kvest"]),
                       _ratio(t["kvest"], t["floor"])])
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
        # Written as the table's "kvest / floor" column: at most 1 is no slower.
        row = _find(rows, "spec_v2", 2**20, p)
        label = f"kvest / floor ≤ 1 at n=2^20, p={p} (int64)"
        if row is None:
            out.append((label, "not measured", None))
        else:
            r = row.times["kvest"] / row.times["floor"]
            out.append((label, _ratio(row.times["kvest"], row.times["floor"]), r <= 1.0))
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
    styles = {"loop": "o-", "numpy": "s-", "numba": "v-", "kvest": "D-",
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
    # One legend below the panels, where it can cover no point.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


# ------------------------------------------- request objects, release-shaped
# SGLang's Req is a plain class whose __init__ sets well over a hundred
# attributes; what the object kernels cost depends on that and on where the
# lengths live.  These stand-ins copy each release's shape (attribute count,
# the lengths' place, a slots dataclass under req.kv); the attribute names
# around the lengths are made up.  The loops beside them are the per-request
# loops those releases run, written here.

def _fill(obj: Any, first: int, count: int) -> None:
    for i in range(first, first + count):
        setattr(obj, f"field_{i:03d}", i)


class Req0511:
    """sglang 0.5.11-0.5.15: both lengths flat among 128 attributes."""

    def __init__(self, committed: int, allocated: int) -> None:
        _fill(self, 0, 60)
        self.kv_committed_len = committed
        self.kv_allocated_len = allocated
        _fill(self, 60, 66)


@dataclass(slots=True, kw_only=True)
class ReqKvInfo0517:
    kv_allocated_len: int
    swa_evicted_seqlen: int = 0


class Req0517:
    """sglang 0.5.16-0.5.18: committed flat, allocated under a slots dataclass."""

    def __init__(self, committed: int, allocated: int) -> None:
        _fill(self, 0, 60)
        self.kv_committed_len = committed
        self.kv = ReqKvInfo0517(kv_allocated_len=allocated)
        _fill(self, 60, 78)


@dataclass(slots=True, kw_only=True)
class ReqKvInfo0523:
    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    swa_evict_floor: int = 0
    retraction_backup: Any = None
    mamba_pool_idx: Any = None


class Req0523:
    """sglang 0.5.19+: both lengths under req.kv (a slots dataclass), 157 attributes."""

    def __init__(self, committed: int, allocated: int) -> None:
        _fill(self, 0, 70)
        self.kv = ReqKvInfo0523(kv_committed_len=committed, kv_allocated_len=allocated)
        _fill(self, 70, 86)


def _spec_v2_flat(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv_committed_len + reserve - r.kv_allocated_len)
        cur = r.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _spec_v2_mixed(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv_committed_len + reserve - r.kv.kv_allocated_len)
        cur = r.kv.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _spec_v2_nested(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv.kv_committed_len + reserve - r.kv.kv_allocated_len)
        cur = r.kv.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _decode_flat(reqs: list[Any], p: int) -> int:
    return sum(1 for r in reqs if r.kv_committed_len % p == 0) * p


def _decode_nested(reqs: list[Any], p: int) -> int:
    return sum(1 for r in reqs if r.kv.kv_committed_len % p == 0) * p


def _plan_flat(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv_allocated_len
        nxt = max(cur, (r.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


def _plan_mixed(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv.kv_allocated_len
        nxt = max(cur, (r.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


def _plan_nested(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv.kv_allocated_len
        nxt = max(cur, (r.kv.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


@dataclass(frozen=True)
class Shape:
    label: str
    make: Callable[[int, int], Any]
    layout: str
    loops: dict[str, Callable[..., Any]]


SHAPES = [
    Shape("tiny stand-in (2 attributes)", Req, "flat",
          {"spec_v2": _spec_v2_flat, "decode": _decode_flat, "plan": _plan_flat}),
    Shape("0.5.11 flat, 128 attributes", Req0511, "flat",
          {"spec_v2": _spec_v2_flat, "decode": _decode_flat, "plan": _plan_flat}),
    Shape("0.5.17 mixed, 140 attributes", Req0517, "mixed",
          {"spec_v2": _spec_v2_mixed, "decode": _decode_flat, "plan": _plan_mixed}),
    Shape("0.5.23 nested, 157 attributes", Req0523, "nested",
          {"spec_v2": _spec_v2_nested, "decode": _decode_nested, "plan": _plan_nested}),
]
OBJECT_SIZES = [1, 256, 1024, 4096]
OBJECT_FUNCTIONS = ("spec_v2", "decode", "plan")
OBJECT_PAGE_SIZE = 16


@functools.lru_cache(maxsize=32)
def shape_batch(label: str, n: int) -> list[Any]:
    shape = next(s for s in SHAPES if s.label == label)
    b = make_batch(n, OBJECT_PAGE_SIZE)
    return [shape.make(c, a) for c, a in zip(b.committed.tolist(), b.allocated.tolist(),
                                             strict=True)]


def object_calls(shape: Shape, fn: str, n: int) -> dict[str, Callable[[], Any]]:
    """implementation -> zero-argument call, on n requests of one release's shape."""
    reqs, p, r = shape_batch(shape.label, n), OBJECT_PAGE_SIZE, RESERVE
    loop = shape.loops[fn]
    if fn == "spec_v2":
        kernel: Callable[..., Any] = functools.partial(kvest.spec_v2_new_tokens_from_reqs,
                                                       reqs, p, r)
        base = functools.partial(loop, reqs, p, r)
    elif fn == "decode":
        kernel = functools.partial(kvest.decode_new_tokens_from_reqs, reqs, p)
        base = functools.partial(loop, reqs, p)
    else:
        kernel = functools.partial(kvest.decode_alloc_plan_from_reqs, reqs, p, r,
                                   dtype=np.int32)
        base = functools.partial(loop, reqs, p, r)
    return {"loop": base, "kvest": kernel,
            "kvest layout=": functools.partial(kernel, layout=shape.layout)}


def _plain(result: Any) -> Any:
    if isinstance(result, kvest.AllocPlan):
        return result.cur.tolist(), result.nxt.tolist(), result.num_tokens
    return result


@dataclass
class ObjectRow:
    shape: str
    layout: str
    fn: str
    n: int
    times: dict[str, float]


def run_objects(sizes: list[int], samples: int, target: float,
                progress: Callable[[str], None] | None = None) -> list[ObjectRow]:
    rows = []
    for shape in SHAPES:
        for fn in OBJECT_FUNCTIONS:
            for n in sizes:
                calls = object_calls(shape, fn, n)
                answers = {name: _plain(call()) for name, call in calls.items()}
                if len({repr(a) for a in answers.values()}) != 1:
                    raise AssertionError(f"{shape.label} {fn} n={n}: {answers}")
                rows.append(ObjectRow(shape.label, shape.layout, fn, n,
                                      measure(calls, samples, target)))
                if progress:
                    progress(f"objects {shape.label} {fn} n={n}")
    return rows


def objects_table(rows: list[ObjectRow], markdown: bool = False) -> str:
    head = ["requests", "function", "n", "loop", "kvest", "kvest layout=",
            "kvest vs loop", "layout= vs loop"]
    body = [[r.shape, r.fn, f"{r.n:,}", _fmt_time(r.times["loop"]), _fmt_time(r.times["kvest"]),
             f"{_fmt_time(r.times['kvest layout='])} ({r.layout})",
             _ratio(r.times["loop"], r.times["kvest"]),
             _ratio(r.times["loop"], r.times["kvest layout="])] for r in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |",
                          "| --- | --- | ---: |" + " ---: |" * (len(head) - 3)]
                         + ["| " + " | ".join(c) + " |" for c in body])
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
                     for cells in [head, *body])


# Issue 11's targets for the drop-in (kvest with the release's layout) against
# the release's own loop: function -> (at least, at n=256).
OBJECT_TARGETS = {"spec_v2": (8.0, 10.0), "decode": (1.5, 1.5), "plan": (10.0, 10.0)}


def object_targets(rows: list[ObjectRow]) -> list[tuple[str, str, bool]]:
    out = []
    for shape in SHAPES[1:]:
        for fn, (want, want256) in OBJECT_TARGETS.items():
            picked = [r for r in rows if r.shape == shape.label and r.fn == fn
                      and r.n in (256, 1024, 4096)]
            if not picked:
                continue
            ratios = [(r.n, r.times["loop"] / r.times["kvest layout="]) for r in picked]
            met = all(x >= (want256 if n == 256 else want) for n, x in ratios)
            label = f"{shape.label}, {fn}: ≥ {want:g}×" + (
                f" ({want256:g}× at 256)" if want256 != want else "")
            out.append((label, ", ".join(f"{x:.1f}× at {n:,}" for n, x in ratios), met))
    return out


def _verdicts(items: list[tuple[str, str, bool]], markdown: bool) -> str:
    if markdown:
        return "\n".join(["| target | measured | |", "| --- | --- | --- |"]
                         + [f"| {a} | {b} | {'met' if c else '**missed**'} |"
                            for a, b, c in items])
    width = max((len(a) for a, _, _ in items), default=0)
    return "\n".join(f"{a:<{width}}  {b}  {'met' if c else 'MISSED'}" for a, b, c in items)


def _md_sections(parts: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"{title}\n\n{text}" if title else text for title, text in parts)


def run(quick: bool = False, plot_path: str | None = None, markdown: str | None = None,
        sglang_only: bool = False) -> int:
    """``python -m kvest bench``: arrays, request objects, and real SGLang where it imports."""
    from kvest import _bench_sglang

    sizes = QUICK_SIZES if quick else SIZES
    pages = [16, 100] if quick else PAGE_SIZES
    fns: tuple[str, ...] = ("spec_v2",) if quick else FUNCTIONS
    samples, target = (5, 0.002) if quick else (9, 0.01)
    object_sizes = [1, 1024] if quick else OBJECT_SIZES
    step_sizes = _bench_sglang.QUICK_SIZES if quick else _bench_sglang.SIZES
    say = functools.partial(print, file=sys.stderr, flush=True)
    say(f"kvest bench{' --quick' if quick else ''}: {machine()}")
    start = time.perf_counter()
    rows = [] if sglang_only else run_matrix(sizes, pages, fns, samples, target, progress=say)
    objects = [] if sglang_only else run_objects(object_sizes, samples, target, progress=say)
    why_not = _bench_sglang.available()
    steps = [] if why_not else _bench_sglang.run_section(step_sizes, samples, target,
                                                         progress=say)
    elapsed = time.perf_counter() - start
    print(f"\nmedian time per call, {samples} samples each, implementations interleaved; "
          f"{elapsed:.0f} s\n")
    parts: list[tuple[str, str]] = []
    if rows:
        print(table(rows), targets_table(rows), sep="\n\n", end="\n\n")
        parts += [("", table(rows, markdown=True)),
                  ("Targets:", targets_table(rows, markdown=True))]
    if objects:
        title = (f"Request objects (page size {OBJECT_PAGE_SIZE}, R = {RESERVE}), "
                 "on stand-ins shaped like each release's own:")
        print(title, objects_table(objects), "", _verdicts(object_targets(objects), False),
              sep="\n", end="\n\n")
        parts += [(title, objects_table(objects, markdown=True)),
                  ("Targets on the release-shaped stand-ins (kvest with the release's layout "
                   "against the release's loop):",
                   _verdicts(object_targets(objects), True))]
    if steps:
        version = _bench_sglang.upstream().version
        title = (f"One decode step's bookkeeping in real sglang {version} (real `Req` and "
                 f"`ScheduleBatch`, page size {_bench_sglang.PAGE_SIZE}, EAGLE (3, 1, 4)): "
                 "upstream → kvest (speedup):")
        head = _bench_sglang.headline(steps) or ""
        print(title, _bench_sglang.table(steps), "", head, sep="\n", end="\n\n")
        verdicts = _bench_sglang.targets(steps)
        print(_verdicts(verdicts, False))
        parts += [(title, _bench_sglang.table(steps, markdown=True)),
                  ("", f"**Headline: {head}.**"),
                  ("Targets on real requests:", _verdicts(verdicts, True))]
    else:
        print(f"sglang section skipped: {why_not}")
    if plot_path:
        if rows:
            plot(rows, plot_path)
            print(f"\nplot written to {plot_path}")
        if steps:
            step_path = _suffixed(plot_path, "-sglang")
            _bench_sglang.plot(steps, step_path)
            print(f"plot written to {step_path}")
    if markdown:
        cmd = "python -m kvest bench" + (" --quick" if quick else "") + (
            " --sglang" if sglang_only else "")
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(f"Measured with `{cmd}` on {machine()}; median time per call, "
                     f"{samples} samples per cell, implementations interleaved.\n\n"
                     + _md_sections(parts) + "\n")
        print(f"markdown written to {markdown}")
    return 0


def _suffixed(path: str, suffix: str) -> str:
    stem, dot, ext = path.rpartition(".")
    return f"{stem}{suffix}.{ext}" if dot else path + suffix
