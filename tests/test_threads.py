"""Concurrency: shared read-only inputs, many threads, the same answers; the GIL is released."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from request_standins import FlatReq, MixedReq, NestedReq, TinyFlat

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
    pairs = list(zip(c[:2000].tolist(), a[:2000].tolist(), strict=True))
    reqs = [FlatReq(x, y) for x, y in pairs]
    mixed = [MixedReq(x, y) for x, y in pairs]
    nested = [NestedReq(x, y) for x, y in pairs]
    rows = rng.integers(-2000, 2000, 700).tolist()
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
        lambda: kvest.spec_v2_new_tokens_from_reqs(mixed, 16, 128, rows, layout="mixed"),
        lambda: kvest.decode_new_tokens_from_reqs(nested, 100, rows, layout="nested"),
        lambda: kvest.decode_alloc_plan_from_reqs(nested, 16, 128, dtype="int32").nxt.sum(),
        lambda: kvest.decode_alloc_plan_from_reqs(reqs, 100, 64, indices=rows).num_pages,
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


def _seen_inside(call, tries: int = 10) -> bool:
    """Whether this thread got the GIL while another thread was inside ``call``.

    The forced GIL hand-over is pushed out of reach (a 10 s switch interval), so
    a thread running Python code lets go of the GIL only where it blocks. A
    worker sets a flag, makes the call and clears the flag; meanwhile this
    thread sleeps (GIL released), then needs the GIL back to read the flag. If
    the call keeps the GIL, this thread gets it only once the worker has
    cleared the flag and ended, and reads False; if the call releases it, this
    thread gets it mid-call and reads True. No timing threshold decides: a
    late-starting worker only makes a try inconclusive (False).
    """
    import sys

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        for _ in range(tries):
            state = {"in_call": False}
            go = threading.Event()

            def worker(state=state, go=go) -> None:
                go.wait()
                state["in_call"] = True
                call()
                state["in_call"] = False

            th = threading.Thread(target=worker)
            th.start()
            go.set()
            time.sleep(0.01)  # releases the GIL; the worker enters the call
            seen = state["in_call"]  # reading it needs the GIL back
            th.join()
            if seen:
                return True
        return False
    finally:
        sys.setswitchinterval(old_interval)


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="the pure twin never drops the GIL")
def test_gil_is_released_during_large_calls():
    from kvest import _kernels

    n = 1 << 25
    c = (np.arange(n, dtype=np.int32) % 100_000).astype(np.int32)
    a = c + np.int32(7)
    big = list(range(1 << 22, 0, -1))
    reqs = [TinyFlat(5, 8)] * (1 << 21)
    # Controls that hold the GIL throughout, and are never seen inside: sorting
    # a list in C, and kvest's own object kernel (it reads Python objects).
    assert not _seen_inside(lambda: sorted(big), tries=3)
    assert not _seen_inside(lambda: kvest.spec_v2_new_tokens_from_reqs(reqs, 16, 128), tries=3)
    before = _kernels.cpu_variant()
    _kernels.set_cpu_variant("baseline")  # the slowest loops: one call of tens of ms
    try:
        assert _seen_inside(lambda: kvest.spec_v2_new_tokens(c, a, 16, 128))
    finally:
        _kernels.set_cpu_variant(before)
