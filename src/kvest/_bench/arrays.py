"""The array workloads, and the implementations kvest is compared with on them.

One registry (:data:`IMPLEMENTATIONS`) serves both ``python -m kvest bench``
and the pytest-benchmark suite (``bench/test_estimators.py``):

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kvest
from kvest._bench.requests import TinyFlat
from kvest._bench.tables import fmt_ratio, fmt_time, render, select
from kvest._bench.targets import Verdict
from kvest._bench.timing import measure

SIZES = [1, 8, 64, 256, 1024, 4096, 65536, 2**20]
QUICK_SIZES = [1, 64, 256, 4096, 65536, 2**20]
PAGE_SIZES = [1, 16, 64, 100]
QUICK_PAGE_SIZES = [16, 100]
# Beyond this many rows the Python loop takes ~0.3 s a call, and building the
# request objects alone takes seconds: the loop stops here.
LOOP_MAX_ROWS = 65536
RESERVE = 2 * 64  # alloc_reserve_per_decode for (5, 8, 64): a common tree config
FUNCTIONS = ("spec_v2", "decode")
# What docs/benchmarks.md shows of the matrix (the terminal and the figure show
# it all): the function and the sizes the targets read, at one page size (every
# power of two runs as 16 does; the targets name the others), and no int32
# floor or NumPy ratio.
MARKDOWN_FUNCTIONS = ("spec_v2",)
MARKDOWN_PAGE_SIZES = ("16",)
MARKDOWN_SIZES = ("1", "256", "65,536", "1,048,576")
MARKDOWN_DROPPED = ("floor:int32", "kvest vs numpy")


@dataclass
class Batch:
    """One decode batch in every form the implementations take."""

    committed: np.ndarray
    allocated: np.ndarray
    page_size: int
    reserve: int = RESERVE
    _reqs: list[TinyFlat] | None = field(default=None, repr=False)

    @property
    def reqs(self) -> list[TinyFlat]:
        """The batch as request objects with the two lengths (for the loop)."""
        if self._reqs is None:
            self._reqs = [TinyFlat(c, a) for c, a in zip(self.committed.tolist(),
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


def read_floor(*arrays: np.ndarray) -> None:
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
        functools.partial(read_floor, b.committed, b.allocated) if fn == "spec_v2"
        else functools.partial(read_floor, b.committed)),
    "numba": _numba,
}
# The columns of the table and the lines of the plot, in order; ":int32" is the
# same implementation on int32 data.
COLUMNS = ("loop", "numpy", "numba", "kvest", "floor", "kvest:int32", "floor:int32")


@dataclass
class Row:
    fn: str
    n: int
    page_size: int
    times: dict[str, float]  # a name of COLUMNS -> seconds per call


def run_matrix(sizes: list[int], page_sizes: list[int], fns: tuple[str, ...], samples: int,
               target: float, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Every implementation at every (function, page size, size), interleaved."""
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
                    call = IMPLEMENTATIONS[name](fn, b32)
                    assert call is not None
                    calls[f"{name}:int32"] = call
                rows.append(Row(fn, n, p, measure(calls, samples, target)))
                if progress:
                    progress(f"[{len(rows):3d}/{total}] {fn} n={n} p={p}")
    return rows


def table(rows: list[Row], markdown: bool = False) -> str:
    impls = [name for name in COLUMNS if any(name in r.times for r in rows)]
    head = ["function", "n", "p", *impls, "kvest vs loop", "kvest vs numpy", "kvest / floor"]
    body = []
    for r in rows:
        t = r.times
        body.append([r.fn, f"{r.n:,}", str(r.page_size)]
                    + [fmt_time(t.get(name)) for name in impls]
                    + [fmt_ratio(t.get("loop"), t["kvest"]), fmt_ratio(t["numpy"], t["kvest"]),
                       fmt_ratio(t["kvest"], t["floor"])])
    text = render(head, body, markdown)
    return dense(text) if markdown else text


def dense(table: str) -> str:
    """The Markdown table as docs/benchmarks.md shows it (see MARKDOWN_SIZES)."""
    return select(table, lambda h: h not in MARKDOWN_DROPPED,
                  lambda r: (r["function"] in MARKDOWN_FUNCTIONS and r["p"] in MARKDOWN_PAGE_SIZES
                             and r["n"] in MARKDOWN_SIZES))


def _find(rows: list[Row], fn: str, n: int, p: int) -> Row | None:
    return next((r for r in rows if (r.fn, r.n, r.page_size) == (fn, n, p)), None)


def targets(rows: list[Row]) -> list[Verdict]:
    """The array targets, each once: (target, measured, met or None if not measured)."""
    out: list[Verdict] = []

    def ratio_check(label: str, row: Row | None, num: str, den: str, at_least: float) -> None:
        if row is None or num not in row.times or den not in row.times:
            out.append((label, "not measured", None))
            return
        r = row.times[num] / row.times[den]
        out.append((label, f"{r:,.1f}×", r >= at_least))

    pow2 = [p for p in sorted({r.page_size for r in rows}) if p & (p - 1) == 0 and p > 1] or [1]
    p0 = 16 if 16 in pow2 else pow2[0]
    for n, want in ((1, 8), (256, 300), (65536, 1000)):
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
            out.append((label, fmt_ratio(row.times["kvest"], row.times["floor"]), r <= 1.0))
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
    return out
