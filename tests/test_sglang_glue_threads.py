"""Two threads (or a call made inside a call) on one glue: each call counted
once, as what it was; the collector left as it was found; a metrics sync
that lands inside a call never shows more than ``status()`` shows after it.

On stand-in modules built from the newest release at hand, patched as the
plugin patches them.  In both builds (the pure one's glue is the Python twin,
its tally counts under a lock).
"""

from __future__ import annotations

import gc
import sys
import threading

import pytest
from metrics_readback import read_back
from sglang_releases import check_required, releases
from sglang_standins import request_class

import kvest.sglang
from kvest.sglang import metrics, monitor
from kvest.sglang.upstream import Config, standin_tree

check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = releases()[-1]
ESTIMATE = "new_tokens_required_next_decode"
COUNTERS = ("calls", "kernel", "fallbacks", "upstream")


class Big(int):
    """A length that is not exactly an int: the kernel declines it, upstream's
    loop reads it as it always did."""


class Allocator:
    """``token_to_kv_pool_allocator``, whose ``page_size`` runs ``hook`` first:
    code of the caller's, in the middle of the estimate, before its glue."""

    def __init__(self, page_size, hook=None):
        self._page_size, self.hook = page_size, hook

    @property
    def page_size(self):
        hook, self.hook = self.hook, None  # (once)
        if hook is not None:
            hook()
        return self._page_size


def _batches(tree, n=6):
    """(a batch the kernel answers, a batch it declines): the no-spec estimate."""
    tree.config = Config(None, 3, 1, 4, 16)
    make = request_class(tree.layout())
    good = [make(16 * (i % 3) + i % 2, 16 * (i % 3) + 5) for i in range(n)]
    bad = [*good[:-1], make(Big(32), 40)]
    return tree.batch(good, 16), tree.batch(bad, 16)


def _counts():
    entry = kvest.sglang.status()["hotspots"][ESTIMATE]
    return {k: entry[k] for k in COUNTERS}


def _delta(before, after):
    return {k: after[k] - before[k] for k in COUNTERS}


def _race(threads):
    """threads started and joined (each given 600 s), the interpreter switching
    between them as often as it can meanwhile."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        sys.setswitchinterval(old)


def _never_more(earlier, later):
    """Every counter of ``later`` at least ``earlier``'s: nothing taken back."""
    assert all(later[k] >= earlier[k] for k in COUNTERS), (earlier, later)


def test_a_call_inside_a_call_counts_each_once():
    """The estimate called again from code its own call runs (a property read
    before its glue): the inner call's kernel answer and the outer call's
    decline are one count each, in their own calls."""
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        good, bad = _batches(tree)
        expected = good.new_tokens_required_next_decode(), bad.new_tokens_required_next_decode()
        seen = {}

        def inner():
            seen["inner"] = good.new_tokens_required_next_decode()
            seen["during"] = _counts()

        bad.token_to_kv_pool_allocator = Allocator(16, inner)
        before = _counts()
        outer = bad.new_tokens_required_next_decode()
        after = _counts()
    assert (seen["inner"], outer) == expected
    assert _delta(before, after) == {"calls": 2, "kernel": 1, "fallbacks": 1, "upstream": 0}
    # Inside the outer call only the inner one has ended, and is counted.
    assert _delta(before, seen["during"]) == {"calls": 1, "kernel": 1, "fallbacks": 0,
                                              "upstream": 0}
    _never_more(seen["during"], after)


@pytest.mark.parametrize("declining", ["first", "second"])
def test_two_threads_interleaved_inside_a_call_count_each_once(declining):
    """Thread A is held inside its call (before its glue) until thread B has
    made a whole call of the same hot spot; then A goes on.  One of them
    declines.  Each call is one count, as what it was, whatever the order."""
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        good, bad = _batches(tree)
        first, second = (bad, good) if declining == "first" else (good, bad)
        expected = (first.new_tokens_required_next_decode(),
                    second.new_tokens_required_next_decode())
        b_may_go, b_done = threading.Event(), threading.Event()
        answers = {}

        def hold():  # A, inside its call
            b_may_go.set()
            assert b_done.wait(60)

        def thread_b():
            assert b_may_go.wait(60)
            answers["b"] = second.new_tokens_required_next_decode()
            b_done.set()

        first.token_to_kv_pool_allocator = Allocator(16, hook=hold)
        before = _counts()
        b = threading.Thread(target=thread_b)
        b.start()
        answers["a"] = first.new_tokens_required_next_decode()
        b.join(60)
        after = _counts()
    assert not b.is_alive()
    assert (answers["a"], answers["b"]) == expected
    assert _delta(before, after) == {"calls": 2, "kernel": 1, "fallbacks": 1, "upstream": 0}


def test_many_interleaved_calls_on_two_threads_count_exactly():
    """Two threads on one hot spot, one declining every call, with the
    interpreter switching threads as often as it can: every call counted,
    as what it was, and the collector as it was found."""
    n = 400 if kvest.IMPLEMENTATION == "python" else 2000
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        good, bad = _batches(tree)
        expected = good.new_tokens_required_next_decode(), bad.new_tokens_required_next_decode()
        wrong = []
        start = threading.Barrier(2)

        def run(batch, want):
            start.wait(60)
            for _ in range(n):
                got = batch.new_tokens_required_next_decode()
                if got != want:
                    wrong.append(got)

        before = _counts()
        threads = [threading.Thread(target=run, args=pair)
                   for pair in zip((good, bad), expected, strict=True)]
        _race(threads)
        after = _counts()
    assert not any(t.is_alive() for t in threads)
    assert not wrong
    assert _delta(before, after) == {"calls": 2 * n, "kernel": n, "fallbacks": n,
                                     "upstream": 0}
    assert gc.isenabled()


def test_status_read_inside_a_call_never_shows_more_than_after_it():
    """A read of the counters (what a metrics sync reads) made in the middle of
    a call -- after a nested call's kernel answered, before the outer call
    declines -- shows nothing that a later read takes back."""
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        good, bad = _batches(tree)
        during = {}

        def inner():
            good.new_tokens_required_next_decode()
            during.update(_counts())

        bad.token_to_kv_pool_allocator = Allocator(16, inner)
        bad.new_tokens_required_next_decode()
        _never_more(during, _counts())


def _exported(directory):
    """kvest_calls_total for the estimate, as SGLang's /metrics serves it."""
    return {dict(labels)["answer"]: value for (name, labels), value in read_back(directory).items()
            if name == "kvest_calls_total" and dict(labels).get("hotspot") == ESTIMATE}


def test_a_metrics_sync_inside_a_call_never_shows_more_than_status(multiproc):
    """A sync landing inside a call (after a nested call's kernel answered,
    before the outer call declined), then one after it: the exported series
    equal status()'s counters after the call -- nothing counted twice, nothing
    taken back."""
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        assert metrics.start(scheduler=True)
        good, bad = _batches(tree)
        synced = {}

        def inner():
            good.new_tokens_required_next_decode()
            assert metrics.sync()
            synced.update(_exported(multiproc))

        bad.token_to_kv_pool_allocator = Allocator(16, inner)
        bad.new_tokens_required_next_decode()
        after = kvest.sglang.status()["hotspots"][ESTIMATE]
        assert metrics.sync()
        final = _exported(multiproc)
    status = {"kernel": after["kernel"], "fallback": after["fallbacks"],
              "upstream": after["upstream"]}
    assert all(synced[k] <= status[k] for k in status), (synced, status)
    assert final == status


def test_the_tally_counts_each_outcome_once():
    """The tally itself (compiled or the pure build's): calls is the sum of
    the three, each only grows."""
    tally = monitor.Tally()
    for seen in (monitor.KERNEL, monitor.FALLBACK, monitor.UPSTREAM, monitor.KERNEL):
        tally.count(seen)
    assert (tally.calls, tally.kernel, tally.fallbacks, tally.upstream) == (4, 2, 1, 1)
    with pytest.raises(AttributeError):
        tally.kernel = 0  # read only: a counter is never set back


class _Collides(str):
    """An instance-dict key that hashes as ``"kv"`` does and whose ``__eq__``
    runs Python code: CPython's lookup of ``kv`` calls it."""

    def __hash__(self):
        return hash("kv")

    def __eq__(self, other):
        return str.__eq__(self, other)


class _Nested:
    __slots__ = ("kv_allocated_len", "kv_committed_len")

    def __init__(self, committed):
        self.kv_committed_len, self.kv_allocated_len = committed, committed + 3


class _Plain:
    def __init__(self, committed):
        self.kv = _Nested(committed)
        self.beam_group = None


class _Colliding(_Plain):
    def __init__(self, committed):
        self.__dict__[_Collides("kx")] = 0  # (first: a lookup of kv meets it first)
        super().__init__(committed)


class _Property(_Plain):
    @property
    def kv(self):
        return self.__dict__["_kv"]

    @kv.setter
    def kv(self, value):
        self.__dict__["_kv"] = value


def test_two_threads_on_one_glue_leave_the_collector_as_found():
    """One glue object (compiled in the compiled build), two threads switching
    as often as the interpreter can, one of them on batches the glue declines
    (a request whose ``kv`` is a property, one whose dict holds a key that
    runs code when compared): the collector is enabled afterwards, as it was,
    and every answer is the loop's."""
    from kvest.sglang import glue
    from kvest.sglang.patterns import by_kind

    pattern = next(p for p in by_kind("decode_count") if p.layout == "nested")
    run = glue.make_decode_count(pattern, "threads: collector", {})
    monitor.STATE.announced = True
    good = [_Plain(c) for c in (0, 1, 16, 31, 32, 48)]
    odd = [[*good, _Property(5)], [*good, _Colliding(16)], [_Colliding(0), *good]]
    n = 300 if kvest.IMPLEMENTATION == "python" else 3000
    wrong = []
    start = threading.Barrier(2)

    want = sum(1 for r in good if r.kv.kv_committed_len % 16 == 0)

    def answering():
        start.wait(60)
        for _ in range(n):
            if run(good, 16, sum) != want:
                wrong.append("good")

    loop = [sum(1 for r in batch if r.kv.kv_committed_len % 16 == 0) for batch in odd]

    def declining():
        start.wait(60)
        for i in range(n):
            got = run(odd[i % 3], 16, sum)
            # (the property is always declined; the colliding key may be read)
            if got is not glue.DECLINED and (i % 3 == 0 or got != loop[i % 3]):
                wrong.append((i % 3, got))

    assert gc.isenabled()
    threads = [threading.Thread(target=answering), threading.Thread(target=declining)]
    _race(threads)
    enabled = gc.isenabled()
    gc.enable()  # (whatever happened, the rest of the suite runs as usual)
    assert not any(t.is_alive() for t in threads)
    assert enabled
    assert not wrong
