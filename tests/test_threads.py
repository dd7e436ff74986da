"""Concurrency: shared read-only inputs, many threads, the same answers; the GIL is released."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from upstream import FlatReq, NestedReq

import kvest

THREADS = 8
SECONDS = 1.5


def _calls():
    rng = np.random.default_rng(7)
    # Long enough to overlap in the kernels; short enough for the pure twin.
    n = 50_000 if kvest.IMPLEMENTATION == "cython" else 2_000
    c = rng.integers(0, 2**20, n)
    a = c + rng.integers(0, 300, n)
    c32, a32 = c.astype(np.int32), a.astype(np.int32)
    for arr in (c, a, c32, a32):
        arr.flags.writeable = False
    idx = rng.integers(-n, n, 5000)
    reqs = [FlatReq(int(x), int(y)) for x, y in zip(c[:2000], a[:2000], strict=True)]
    nested = [NestedReq(int(x), int(y)) for x, y in zip(c[:2000], a[:2000], strict=True)]
    return [
        lambda: kvest.spec_v2_new_tokens(c, a, 16, 128),
        lambda: kvest.spec_v2_new_tokens(c32, a32, 100, 64),
        lambda: kvest.spec_v2_new_tokens(c, a, 64, 16, indices=idx),
        lambda: kvest.decode_new_tokens(c, 16),
        lambda: kvest.decode_new_tokens(c32, 96, indices=idx),
        lambda: kvest.num_new_pages(a, 16, c),
        lambda: kvest.num_new_pages(a32, 100, decode=True),
        lambda: kvest.decode_alloc_plan(c, a, 16, 128).num_pages,
        lambda: kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 128),
        lambda: kvest.spec_v2_new_tokens_from_reqs(nested, 100, 128),
        lambda: kvest.decode_new_tokens_from_reqs(reqs, 16),
        lambda: kvest.spec_v1_new_tokens(2000, 16, 5, 4, 8),
        lambda: kvest.alloc_reserve_per_decode(5, 4, 8, 16),
    ]


def test_concurrent_calls_agree_with_single_threaded():
    calls = _calls()
    expected = [call() for call in calls]
    mismatches: list[tuple[int, object]] = []
    counts = [0] * THREADS
    deadline = time.monotonic() + SECONDS

    def worker(t: int) -> None:
        k = t
        # Until the deadline, and through every call at least once.
        while time.monotonic() < deadline or k - t < len(calls):
            i = k % len(calls)
            got = calls[i]()
            if got != expected[i]:
                mismatches.append((i, got))
            k += 1
        counts[t] = k - t

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=SECONDS + 60)
    assert not any(th.is_alive() for th in threads)
    assert not mismatches
    assert all(count >= len(calls) for count in counts), counts  # every call ran in every thread


def _ticks_inside(call, margin: float = 0.004, tries: int = 10) -> int:
    """Ticks another thread makes strictly inside one call, a margin from its ends.

    A call that keeps the GIL lets the other thread run only before it starts
    or after it returns (for at most one switch interval, made 1 ms here), so
    it scores 0; a call that releases the GIL scores many.
    """
    import sys

    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    th = threading.Thread(target=ticker)
    th.start()
    best = judged = 0
    try:
        while not ticks:
            time.sleep(0.001)
        for _ in range(tries):
            start = time.perf_counter()
            result = call()
            end = time.perf_counter()
            del result  # freeing a large result after `end`, not inside the window
            if end - start <= 4 * margin:
                continue  # too short to judge: try again
            judged += 1
            recent = ticks[-1_000_000:]
            best = max(best, sum(1 for t in recent if start + margin < t < end - margin))
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old_interval)
    assert judged, "no call lasted long enough to judge"
    return best


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="the pure twin never drops the GIL")
def test_gil_is_released_during_large_calls():
    from kvest import _kernels

    n = 1 << 25
    c = (np.arange(n, dtype=np.int32) % 100_000).astype(np.int32)
    a = c + np.int32(7)
    big = list(range(1 << 22, 0, -1))
    # Control: sorting a list in C holds the GIL throughout, and scores 0.
    assert _ticks_inside(lambda: sorted(big), tries=3) == 0
    before = _kernels.cpu_variant()
    _kernels.set_cpu_variant("baseline")  # the slowest loops: one call of tens of ms
    try:
        assert _ticks_inside(lambda: kvest.spec_v2_new_tokens(c, a, 16, 128)) > 0
    finally:
        _kernels.set_cpu_variant(before)
