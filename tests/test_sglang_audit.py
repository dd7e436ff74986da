"""The KV audit's counting (kvest.sglang.audit) on stand-ins shaped like SGLang's classes.

The stand-ins live in modules named as the registry says SGLang's do (a
``ScheduleBatch`` whose ``check_decode_mem`` asks its allocator's
``check_decode_capacity``, allocators whose pools hand out pages), so the
audit attaches to them exactly as it does in a scheduler process.  The real
classes are ``tests/test_sglang_audit_real.py``'s.
"""

from __future__ import annotations

import logging
import sys
import types
from types import SimpleNamespace

import pytest

from kvest.sglang import audit, monitor, registry


def ceil_div(x: int, p: int) -> int:
    return -(-x // p)


class BaseTokenToKVPoolAllocator:
    page_size = 1

    def check_decode_capacity(self, *, num_tokens, tree_cache, requests=None,
                              spec_algorithm=None):
        return self.available_size() >= num_tokens


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(self, size: int) -> None:
        self.free = size

    def available_size(self) -> int:
        return self.free

    def alloc(self, need: int):
        if need > self.free:
            return None
        self.free -= need
        return list(range(need))


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    def __init__(self, size: int, page: int) -> None:
        super().__init__(size)
        self.page_size = page

    def alloc_decode(self, seq_lens):
        pages = sum(1 for s in seq_lens if s % self.page_size == 1 % self.page_size)
        if pages * self.page_size > self.free:
            return None
        self.free -= pages * self.page_size
        return list(seq_lens)

    def alloc_extend(self, prefix_lens, seq_lens):
        pages = sum(ceil_div(s, self.page_size) - ceil_div(p, self.page_size)
                    for p, s in zip(prefix_lens, seq_lens, strict=True))
        if pages * self.page_size > self.free:
            return None
        self.free -= pages * self.page_size
        return list(seq_lens)


class HiSparseTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Two pools; the device pool may be asked for an extra page (0.5.23's bug)."""

    def __init__(self, size: int, page: int) -> None:
        self.page_size = page
        self.logical_attn_allocator = PagedTokenToKVPoolAllocator(size, page)
        self.hisparse_attn_allocator = PagedTokenToKVPoolAllocator(size, page)

    def available_size(self) -> int:
        return min(self.logical_attn_allocator.available_size(),
                   self.hisparse_attn_allocator.available_size())

    def alloc_decode(self, seq_lens):
        return self.logical_attn_allocator.alloc_decode(seq_lens)


class MysteryAllocator(BaseTokenToKVPoolAllocator):
    """An allocator kvest does not know (its own allocation method)."""

    page_size = 4

    def __init__(self, size: int) -> None:
        self.free = size

    def available_size(self) -> int:
        return self.free

    def alloc_decode(self, seq_lens):
        return list(seq_lens)


class Spec:
    def __init__(self, on: bool) -> None:
        self.on = on

    def is_none(self) -> bool:
        return not self.on

    def __str__(self) -> str:
        return "EAGLE" if self.on else "NONE"


class Req:
    def __init__(self, committed: int, allocated: int | None = None) -> None:
        self.kv = SimpleNamespace(kv_committed_len=committed,
                                  kv_allocated_len=committed if allocated is None else allocated)
        self.beam_group = None


class ScheduleBatch:
    """check_decode_mem / prepare_for_decode as SGLang shapes them (0.5.19+)."""

    def __init__(self, reqs, allocator, *, spec=False, reserve=0, aligned=True,
                 extra_device_pages=0, raise_in_step=False):
        self.reqs = reqs
        self.token_to_kv_pool_allocator = allocator
        self.tree_cache = None
        self.spec_algorithm = Spec(spec)
        self.reserve, self.aligned = reserve, aligned
        self.extra_device_pages = extra_device_pages
        self.raise_in_step = raise_in_step
        self.seq_lens_cpu = [r.kv.kv_committed_len for r in reqs]

    def estimate(self, reqs):
        p = self.token_to_kv_pool_allocator.page_size
        if not self.spec_algorithm.on:
            return p * sum(1 for r in reqs if r.kv.kv_committed_len % p == 0)
        return sum(ceil_div(max(r.kv.kv_allocated_len, r.kv.kv_committed_len + self.reserve), p)
                   * p - ceil_div(r.kv.kv_allocated_len, p) * p for r in reqs)

    def check_decode_mem(self, selected_indices=None):
        reqs = self.reqs if selected_indices is None else [self.reqs[i] for i in selected_indices]
        return self.token_to_kv_pool_allocator.check_decode_capacity(
            num_tokens=self.estimate(reqs), tree_cache=None, requests=reqs,
            spec_algorithm=self.spec_algorithm)

    def prepare_for_decode(self):
        if getattr(self, "body", None) is not None:  # a test's own step
            return self.body()
        alloc = self.token_to_kv_pool_allocator
        p = alloc.page_size
        if not self.spec_algorithm.on:
            if p == 1:
                alloc.alloc(len(self.reqs))
            else:
                alloc.alloc_decode([r.kv.kv_committed_len + 1 for r in self.reqs])
            for r in self.reqs:
                r.kv.kv_allocated_len += 1
                r.kv.kv_committed_len += 1
        else:
            cur = [r.kv.kv_allocated_len for r in self.reqs]
            nxt = [max(a, ceil_div(r.kv.kv_committed_len + self.reserve, p) * p
                       if self.aligned else r.kv.kv_committed_len + self.reserve)
                   for a, r in zip(cur, self.reqs, strict=True)]
            alloc.alloc_extend(cur, nxt)
            for r, n in zip(self.reqs, nxt, strict=True):
                r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, n)
        if self.extra_device_pages:  # HiSparse's _grow_device_buffers padding
            alloc.hisparse_attn_allocator.alloc(self.extra_device_pages * p)
        if self.raise_in_step:
            raise RuntimeError("HiSparse _grow_device_buffers failed")
        self.seq_lens_cpu = [r.kv.kv_committed_len for r in self.reqs]


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        value.__module__ = name
        setattr(module, key, value)
    return module


@pytest.fixture()
def audited(monkeypatch):
    """The stand-ins, under SGLang's module names, with the audit installed
    (lengths read every step); everything put back after."""
    classes = {registry.ALLOCATOR_BASE: {"BaseTokenToKVPoolAllocator":
                                         BaseTokenToKVPoolAllocator},
               registry.BATCH: {"ScheduleBatch": ScheduleBatch},
               registry.POOLS[0].modules[0]: {"TokenToKVPoolAllocator": TokenToKVPoolAllocator},
               registry.POOLS[1].modules[0]: {"PagedTokenToKVPoolAllocator":
                                              PagedTokenToKVPoolAllocator}}
    for name, attrs in classes.items():
        monkeypatch.setitem(sys.modules, name, _module(name, **attrs))
    audit.reset()
    assert audit.install(every=1) == []
    assert audit.installed()
    yield audit
    audit.uninstall()
    audit.reset()
    assert "__kvest_audit__" not in dir(ScheduleBatch.__dict__["prepare_for_decode"])


def step(batch) -> bool:
    fits = batch.check_decode_mem()
    batch.prepare_for_decode()
    return fits


def test_exact_estimates_count_steps_and_nothing_else(audited):
    batch = ScheduleBatch([Req(c) for c in (15, 16, 17, 31, 32, 1)],
                          PagedTokenToKVPoolAllocator(4096, 16))
    for _ in range(40):
        assert step(batch)
    report = audit.report()
    assert report["steps"] == 40
    assert report["undercounts"] == report["bookkeeping_gaps"] == 0
    pool = report["pools"]["PagedTokenToKVPoolAllocator"]
    assert pool["steps"] == pool["bookkeeping_steps"] == 40
    # 6 requests over 40 tokens each: 16 new pages handed out, every one counted
    assert pool["handed_out"] == 4096 - batch.token_to_kv_pool_allocator.free > 0
    assert pool["overcounts"] == pool["overcount_slack"] == 0
    assert report["not_audited"] == {} and report["errors"] == 0


def test_token_pool_and_spec_steps_are_exact(audited):
    batch = ScheduleBatch([Req(5), Req(9)], TokenToKVPoolAllocator(1000))
    for _ in range(5):
        step(batch)
    spec = ScheduleBatch([Req(33), Req(64), Req(7, 16)], PagedTokenToKVPoolAllocator(4096, 16),
                         spec=True, reserve=8)
    for _ in range(12):
        step(spec)
        held = sum(r.kv.kv_allocated_len - r.kv.kv_committed_len for r in spec.reqs)
        assert audit.report()["reserved_uncommitted"] == held > 0
        for r in spec.reqs:
            r.kv.kv_committed_len += 3  # accepted tokens
    report = audit.report()
    assert report["steps"] == 17 and report["bookkeeping_steps"] == 17
    assert report["undercounts"] == report["bookkeeping_gaps"] == 0


def test_hisparse_extra_device_page_is_an_undercount_in_that_pool(audited, caplog):
    alloc = HiSparseTokenToKVPoolAllocator(4096, 16)
    # 32 is on a page boundary: one page counted, three taken from the device pool;
    # then none counted, two taken
    batch = ScheduleBatch([Req(32), Req(40)], alloc, extra_device_pages=2)
    with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
        assert step(batch)
        step(batch)
    report = audit.report()
    device = report["pools"]["HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator"]
    logical = report["pools"]["HiSparseTokenToKVPoolAllocator.logical_attn_allocator"]
    assert device["undercounts"] == 2 and device["short_tokens"] == 16 + 32
    assert logical["undercounts"] == 0 and logical["handed_out"] == 16
    assert report["undercounts"] == 2 and report["short_tokens"] == 48
    # the first one is logged once, with what reproduces it
    warnings = [r.getMessage() for r in caplog.records if "first undercount" in r.getMessage()]
    assert len(warnings) == 1
    assert "hisparse_attn_allocator" in warnings[0] and "page_size': 16" in warnings[0]
    assert "seq_lens before the step [32, 40]" in warnings[0]
    # (and, where sglang is installed, whether kvest knows it)
    said = warnings[0].split("first undercount: ", 1)[1].split("; known: ", 1)[0]
    assert report["first"]["undercount"] == said


def test_a_refused_request_counts_as_asked_and_a_raising_step_still_audits(audited):
    alloc = HiSparseTokenToKVPoolAllocator(4096, 16)
    alloc.hisparse_attn_allocator.free = 16  # one page left on the device
    batch = ScheduleBatch([Req(32)], alloc, extra_device_pages=2, raise_in_step=True)
    assert batch.check_decode_mem()  # the estimate's 16 tokens fit
    with pytest.raises(RuntimeError, match="_grow_device_buffers"):  # SGLang's, untouched
        batch.prepare_for_decode()
    report = audit.report()
    device = report["pools"]["HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator"]
    # asked for 32 (refused) where 16 were counted
    assert device["undercounts"] == 1 and device["short_tokens"] == 16
    assert report["failed_after_fits"] == 1


def test_bookkeeping_gap_of_the_0515_shape(audited):
    """nxt not rounded up to a page: the pool hands out pages, the record is short."""
    batch = ScheduleBatch([Req(33), Req(64)], PagedTokenToKVPoolAllocator(4096, 16),
                          spec=True, reserve=8, aligned=False)
    step(batch)
    report = audit.report()
    assert report["undercounts"] == 0
    assert report["bookkeeping_gaps"] == 1
    pool = report["pools"]["PagedTokenToKVPoolAllocator"]
    # 33 -> 41 recorded inside the page it held (48): 7 short; 64 -> 72 of 80: 8 short
    assert pool["gap_tokens"] == 15 and pool["bookkeeping_gaps"] == 1
    assert "kv_allocated_len grew by" in report["first"]["bookkeeping gap"]
    # the record the step left off a page boundary is named, in those words
    assert ("a record that is not page-aligned: request 0's kv_allocated_len went from 33 "
            "to 41 at page size 16") in report["first"]["bookkeeping gap"]


def test_recorded_growth():
    # spec: pages held before are not new; a short tail shows
    assert audit.recorded_growth([33, 64], [48, 80], 16, True) == 0 + 16
    assert audit.recorded_growth([33], [41], 16, True) == -7
    assert audit.recorded_growth([48], [48], 16, True) == 0
    # no spec: page-rounded
    assert audit.recorded_growth([15, 16, 17], [16, 17, 18], 16, False) == 16
    assert audit.recorded_growth([4, 5], [5, 6], 1, False) == 2


def test_unknown_allocator_is_named_not_guessed(audited):
    batch = ScheduleBatch([Req(3)], MysteryAllocator(100))
    step(batch)
    report = audit.report()
    assert report["steps"] == 0 and report["pools"] == {}
    assert report["not_audited"] == {"MysteryAllocator":
                                     "MysteryAllocator: an allocator kvest does not know"}


def test_a_step_without_its_check_is_unpaired(audited):
    batch = ScheduleBatch([Req(3), Req(4)], PagedTokenToKVPoolAllocator(1000, 4))
    batch.prepare_for_decode()  # no check before it
    batch.check_decode_mem(selected_indices=[0])  # a check of other requests
    batch.prepare_for_decode()
    report = audit.report()
    assert report["unpaired"] == 2 and report["steps"] == 0
    batch.check_decode_mem(selected_indices=[0, 1])  # the retract loop's last check: all
    batch.prepare_for_decode()
    assert audit.report()["steps"] == 1


def test_the_audits_own_errors_never_reach_the_scheduler(audited, monkeypatch):
    def broken(*args):
        raise ZeroDivisionError("audit bug")

    monkeypatch.setattr(audit, "_pools_of", broken)
    batch = ScheduleBatch([Req(3)], PagedTokenToKVPoolAllocator(1000, 4))
    assert step(batch) is True
    assert batch.reqs[0].kv.kv_allocated_len == 4  # SGLang's step ran
    assert audit.report()["errors"] == 1


def test_sampling_reads_lengths_every_n_steps(audited):
    audit.install(every=5)
    batch = ScheduleBatch([Req(3)], PagedTokenToKVPoolAllocator(1000, 4))
    for _ in range(20):
        step(batch)
    report = audit.report()
    assert report["steps"] == 20 and report["lengths_read"] == 4
    assert report["lengths_every"] == 5


def test_adaptive_sampling_bounds_the_reads(audited, monkeypatch):
    monkeypatch.setattr(audit, "_FIXED_EVERY", None)
    clock = iter(range(0, 10**12, 50_000))  # every read "costs" 50 us
    monkeypatch.setattr(audit.time, "perf_counter_ns", lambda: next(clock))
    batch = ScheduleBatch([Req(3)], PagedTokenToKVPoolAllocator(100000, 4))
    for _ in range(400):
        step(batch)
    report = audit.report()
    # 100 us a sample against a 1 us budget: one read in 100 steps
    assert report["lengths_read"] == 4 and report["lengths_every"] == "adaptive"


def test_status_has_the_documented_audit_keys(audited):
    step(ScheduleBatch([Req(3)], PagedTokenToKVPoolAllocator(1000, 4)))
    report = monitor.status()["audit"]
    assert set(report) == {
        "installed", "missing", "steps", "unpaired", "undercounts", "short_tokens",
        "failed_after_fits", "overcount_slack", "bookkeeping_steps", "bookkeeping_gaps",
        "gap_tokens", "reserved_uncommitted", "lengths_every", "lengths_read", "pools",
        "not_audited", "first", "errors", "raised_other", "last_raised", "last_error"}
    assert set(report["pools"]["PagedTokenToKVPoolAllocator"]) == {
        "steps", "undercounts", "short_tokens", "overcounts", "overcount_slack", "handed_out",
        "bookkeeping_steps", "bookkeeping_gaps", "gap_tokens"}
    assert report["steps"] == 1 and report["installed"] is True


def test_the_hot_spot_planner_sees_through_the_audit(audited):
    from kvest.sglang import hotspots

    owner, fn = hotspots._locate(registry.HOTSPOTS["prepare_for_decode"], sys.modules.get,
                                 absent=False)
    assert owner is ScheduleBatch
    assert fn is audit._WRAPPED[(ScheduleBatch, "prepare_for_decode")]


def test_switch_audit_mode():
    choice = monitor.switch({"KVEST_SGLANG": "audit"})
    assert choice.mode is monitor.Mode.AUDIT and choice.warning is None
    assert not choice.mode.compiles and choice.mode.audits
    assert monitor.Mode.ON.audits and monitor.Mode.SHADOW.audits
    assert not monitor.Mode.OFF.audits
    assert "audit" in monitor.switch({"KVEST_SGLANG": "bogus"}).reason


def test_metrics_take_the_audit_counters(monkeypatch):
    prometheus_client = pytest.importorskip("prometheus_client")
    from kvest.sglang import metrics

    registry_ = prometheus_client.CollectorRegistry()
    real_counter, real_gauge = prometheus_client.Counter, prometheus_client.Gauge

    def counter(*args, registry=None, **kwargs):
        return real_counter(*args, registry=registry_, **kwargs)

    def gauge(*args, registry=None, multiprocess_mode=None, **kwargs):
        return real_gauge(*args, registry=registry_, **kwargs)

    monkeypatch.setattr(prometheus_client, "Counter", counter)
    monkeypatch.setattr(prometheus_client, "Gauge", gauge)
    report = {"mode": "audit", "hotspots": {}, "audit": {
        "steps": 7, "reserved_uncommitted": 96,
        "pools": {"H.hisparse_attn_allocator": {"undercounts": 2, "short_tokens": 32,
                                                "bookkeeping_gaps": 0}}}}
    exporter = metrics._Exporter(lambda: report)
    exporter.sync()
    report["audit"]["steps"] = 9
    exporter.sync()
    get = registry_.get_sample_value
    assert get("kvest_estimate_steps_total") == 9
    assert get("kvest_estimate_undercount_total", {"pool": "H.hisparse_attn_allocator"}) == 2
    assert get("kvest_estimate_short_tokens_total", {"pool": "H.hisparse_attn_allocator"}) == 32
    assert get("kvest_kv_bookkeeping_gap_total", {"pool": "H.hisparse_attn_allocator"}) == 0
    assert get("kvest_kv_reserved_uncommitted_tokens") == 96
    assert get("kvest_mode", {"mode": "audit"}) == 1


def test_audit_command_without_sglang_exits_2(monkeypatch, capsys):
    from kvest.sglang import audit_run

    def missing():
        raise ImportError("No module named 'sglang'")

    monkeypatch.setattr(audit_run, "sg", missing)
    assert audit_run.main(["--quick"]) == 2
    assert "does not import here" in capsys.readouterr().err


def test_audit_command_usage_errors_exit_2(capsys):
    from kvest.cli import main

    for argv in (["audit", "--steps", "0"], ["audit", "--allocator", "nope"], ["audit", "-x"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    assert "usage: python -m kvest audit" in capsys.readouterr().err


# ------------------------------------------------------------------ invisible wrappers
# Every function the audit wraps must receive exactly what it would unwrapped
# (its own defaults, by position or by keyword) and raise only what it raises.


def _received(fn):
    """``fn`` that records what it received, as its own signature binds it."""
    import inspect

    calls = []
    sig = inspect.signature(fn)

    def recording(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append({k: v for k, v in bound.arguments.items() if k != "self"})
        return fn(*args, **kwargs)

    recording.__signature__ = sig
    recording.__name__ = fn.__name__
    recording.__qualname__ = fn.__qualname__
    return recording, calls


def _kw_other_defaults(self, *, num_tokens, tree_cache=None, requests=None,
                       spec_algorithm="own default"):
    return ("fits", num_tokens, tree_cache, spec_algorithm)


def _positional(self, num_tokens, tree_cache=None, requests=None, spec_algorithm=None):
    return ("fits", num_tokens, tree_cache)


def _var_kwargs(self, num_tokens, **rest):
    return ("fits", num_tokens, tuple(sorted(rest)))


def _positional_only(self, num_tokens, tree_cache="mine", /, requests=None):
    return ("fits", num_tokens, tree_cache)


CHECKS = [  # (upstream's signature, calls (args, kwargs) it accepts)
    (_kw_other_defaults, [((), {"num_tokens": 4}), ((), {"num_tokens": 4, "requests": [1]}),
                          ((), {"num_tokens": 4, "tree_cache": "t", "requests": [1],
                                "spec_algorithm": None})]),
    (_positional, [((4,), {}), ((4, "t", [1]), {}), ((), {"num_tokens": 4, "requests": [1]}),
                   ((4,), {"spec_algorithm": "s"})]),
    (_var_kwargs, [((4,), {}), ((), {"num_tokens": 4, "requests": [1], "x": 1})]),
    (_positional_only, [((4,), {}), ((4, "t"), {"requests": [1]})]),
]


@pytest.mark.parametrize("fn,calls", CHECKS, ids=[fn.__name__ for fn, _ in CHECKS])
def test_the_capacity_check_gets_its_own_arguments_and_defaults(fn, calls):
    bare, got_bare = _received(fn)
    wrapped_fn, got_wrapped = _received(fn)
    wrapped = audit._capacity(wrapped_fn)
    me = object()
    for args, kwargs in calls:
        expected = bare(me, *args, **kwargs)
        assert wrapped(me, *args, **kwargs) == expected
        # the estimate and the requests, read as the function binds them
        check = audit._this_step().check
        assert check[0] is me and check[1] == 4 and check[3] == expected
        assert check[2] == ([1] if "requests" in kwargs or len(args) > 2 else None)
    assert got_wrapped == got_bare  # argument for argument, defaults included
    # a call upstream refuses raises upstream's own error, unchanged
    bad = [((), {})] + ([((4,), {"bogus": 1})] if fn is not _var_kwargs else [])
    for args, kwargs in bad:
        with pytest.raises(TypeError) as bare_error:
            fn(me, *args, **kwargs)
        with pytest.raises(TypeError) as wrapped_error:
            audit._capacity(fn)(me, *args, **kwargs)
        assert str(wrapped_error.value) == str(bare_error.value)
    import inspect

    assert inspect.signature(wrapped) == inspect.signature(wrapped_fn)


def test_an_installed_check_with_other_defaults_still_returns(monkeypatch, audited):
    """0.5.23's parameter names, other defaults: called as upstream allows."""
    base = sys.modules[registry.ALLOCATOR_BASE].BaseTokenToKVPoolAllocator
    audit.uninstall()
    monkeypatch.setattr(base, "check_decode_capacity", _kw_other_defaults)
    assert audit.install(every=1) == []
    alloc = PagedTokenToKVPoolAllocator(100, 4)
    assert alloc.check_decode_capacity(num_tokens=4) == ("fits", 4, None, "own default")
    assert alloc.check_decode_capacity(num_tokens=4, requests=None) == \
        _kw_other_defaults(alloc, num_tokens=4)


class KeywordPool(TokenToKVPoolAllocator):
    """A pool whose alloc the step calls by keyword (and once with its default)."""

    def alloc(self, need_size=8):
        return super().alloc(need_size)


@pytest.mark.parametrize("call", ["keyword", "default", "positional"])
def test_a_refusal_counts_however_its_size_is_passed(audited, call):
    audit._wrap(KeywordPool, "alloc", audit._pool_alloc)
    asked = {"keyword": 200, "default": 8, "positional": 200}[call]

    pool = KeywordPool(2)

    def body():
        out = (pool.alloc(need_size=200) if call == "keyword" else
               pool.alloc() if call == "default" else pool.alloc(200))
        assert out is None  # refused: 2 tokens left

    batch = ScheduleBatch([Req(3), Req(4)], pool)
    batch.body = body
    assert step(batch)  # the estimate: 2 tokens, which fit
    report = audit.report()
    counts = report["pools"]["KeywordPool"]
    assert counts["undercounts"] == 1 and counts["short_tokens"] == asked - 2
    assert report["short_tokens"] == asked - 2


def test_what_one_thread_does_never_changes_another_threads_step(audited):
    """One thread sits inside another pool's alloc while this thread's step
    allocates 10 tokens against an estimate of 2."""
    import threading

    inside, release = threading.Event(), threading.Event()

    class SlowPool(TokenToKVPoolAllocator):
        def alloc(self, need):
            inside.set()
            release.wait(30)
            return super().alloc(need)

    audit._wrap(SlowPool, "alloc", audit._pool_alloc)
    other = ScheduleBatch([Req(1)], SlowPool(100))
    errors = []

    def other_thread():
        try:
            step(other)
        except Exception as exc:  # pragma: no cover (shown by the assertion below)
            errors.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert inside.wait(30)

        mine = ScheduleBatch([Req(1), Req(2)], TokenToKVPoolAllocator(100))
        mine.body = lambda: mine.token_to_kv_pool_allocator.alloc(10)
        assert step(mine)
        report = audit.report()
        assert report["undercounts"] == 1 and report["short_tokens"] == 8
    finally:
        release.set()
        thread.join(30)
    assert not errors
    # and the other thread's step was counted in its own thread, once
    assert audit.report()["steps"] == 2
    assert audit.report()["pools"]["SlowPool"]["handed_out"] == 1


def test_a_pool_raises_only_its_own_errors(audited):
    class Broken(TokenToKVPoolAllocator):
        def available_size(self):
            raise OSError("the audit's read fails")

        def alloc(self, need):
            raise ValueError(need)

    pool = Broken(10)
    wrapped = audit._pool_alloc(Broken.alloc)
    audit._this_step().window = True
    try:
        with pytest.raises(ValueError) as error:
            wrapped(pool, need=3)
        assert error.value.args == (3,)
    finally:
        audit._this_step().window = False


def test_failed_after_fits_counts_only_an_allocation_failure(audited):
    alloc = HiSparseTokenToKVPoolAllocator(4096, 16)

    batch = ScheduleBatch([Req(32)], alloc)

    def body():
        alloc.alloc_decode([33])
        raise KeyError("not an allocation failure")

    batch.body = body
    assert batch.check_decode_mem()
    with pytest.raises(KeyError):
        batch.prepare_for_decode()
    report = audit.report()
    assert report["failed_after_fits"] == 0
    assert report["raised_other"] == 1 and "KeyError" in report["last_raised"]
    # a pool refusing in the step, then the step raising: an allocation failure
    alloc.hisparse_attn_allocator.free = 16
    batch = ScheduleBatch([Req(32)], alloc, extra_device_pages=2, raise_in_step=True)
    assert batch.check_decode_mem()
    with pytest.raises(RuntimeError):
        batch.prepare_for_decode()
    assert audit.report()["failed_after_fits"] == 1
    assert "a pool refused an allocation" in audit.report()["first"]["failed after fits"]


def test_a_check_that_is_not_a_plain_function_is_left_alone(audited, monkeypatch):
    """A static method wrapped as a plain function would be passed ``self``."""
    base = sys.modules[registry.ALLOCATOR_BASE].BaseTokenToKVPoolAllocator
    audit.uninstall()

    def check(*, num_tokens, tree_cache=None, requests=None, spec_algorithm=None):
        return num_tokens < 10

    monkeypatch.setattr(base, "check_decode_capacity", staticmethod(check))
    missing = audit.install(every=1)
    assert any("check_decode_capacity" in m for m in missing) and not audit.installed()
    assert PagedTokenToKVPoolAllocator(100, 4).check_decode_capacity(num_tokens=3) is True


def test_the_step_raises_upstreams_exception_even_one_that_cannot_be_printed(audited):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no words")

    batch = ScheduleBatch([Req(3)], PagedTokenToKVPoolAllocator(100, 4))
    error = Unprintable()

    def body():
        raise error

    batch.body = body
    assert batch.check_decode_mem()
    with pytest.raises(Unprintable) as raised:
        batch.prepare_for_decode()
    assert raised.value is error
    assert audit.report()["raised_other"] == 1


def test_a_pool_that_cannot_be_a_dict_key_is_passed_through(audited):
    class Unhashable(TokenToKVPoolAllocator):
        __hash__ = None

        def __eq__(self, other):
            return self is other

    audit._wrap(Unhashable, "alloc", audit._pool_alloc)
    pool = Unhashable(2)
    batch = ScheduleBatch([Req(3)], pool)
    batch.body = lambda: pool.alloc(5)  # refused
    assert step(batch)
    assert pool.free == 2 and audit.report()["errors"] >= 1  # counted, never raised


class OldScheduleBatch(ScheduleBatch):
    """check_decode_mem as 0.5.11-0.5.18 shape it: the estimate from
    new_tokens_required_next_decode, compared with available_size() itself."""

    prepare_for_decode = ScheduleBatch.prepare_for_decode  # its own, as the audit wraps it

    def new_tokens_required_next_decode(self, selected_indices=None):
        return self.estimate(self.reqs if selected_indices is None
                             else [self.reqs[i] for i in selected_indices])

    def check_decode_mem(self, selected_indices=None):
        num_tokens = self.new_tokens_required_next_decode(selected_indices)
        # (a global of the batch's module, as SGLang's check reads it)
        sys.modules[registry.BATCH].evict_from_tree_cache(self.tree_cache, num_tokens)
        return self.token_to_kv_pool_allocator.available_size() >= num_tokens


def evict_from_tree_cache(tree_cache, num_tokens):
    pass


@pytest.fixture()
def audited_old(audited, monkeypatch):
    """The stand-ins as a release before check_decode_capacity has them."""
    audit.uninstall()
    monkeypatch.delattr(BaseTokenToKVPoolAllocator, "check_decode_capacity")
    monkeypatch.setattr(sys.modules[registry.BATCH], "ScheduleBatch", OldScheduleBatch)
    monkeypatch.setattr(sys.modules[registry.BATCH], "evict_from_tree_cache",
                        evict_from_tree_cache, raising=False)
    assert audit.install(every=1) == []
    assert audit.installed()
    yield audit
    audit.uninstall()
    assert "__kvest_audit__" not in dir(OldScheduleBatch.__dict__["check_decode_mem"])


def test_before_the_capacity_check_the_step_pairs_with_check_decode_mems_estimate(
        audited_old):
    batch = OldScheduleBatch([Req(32), Req(40)], HiSparseTokenToKVPoolAllocator(4096, 16),
                             extra_device_pages=2)
    batch.new_tokens_required_next_decode()  # outside the check: no estimate recorded
    sys.modules[registry.BATCH].evict_from_tree_cache(None, 1)
    batch.prepare_for_decode()
    assert audit.report()["unpaired"] == 1 and audit.report()["steps"] == 0
    assert step(batch)
    report = audit.report()
    assert report["steps"] == 1 and report["undercounts"] == 1
    # 33 and 41 committed: no page counted, two taken from the device pool
    assert report["short_tokens"] == 32
    assert report["bookkeeping_gaps"] == 0


def test_before_the_capacity_check_the_retract_loops_last_check_pairs(audited_old):
    batch = OldScheduleBatch([Req(c) for c in (15, 16, 31, 32)],
                             PagedTokenToKVPoolAllocator(4096, 16))
    keep = [3, 0, 1]
    assert batch.check_decode_mem(keep)  # by position, then as a retract filters the batch
    batch.reqs = [batch.reqs[i] for i in keep]
    batch.prepare_for_decode()
    assert batch.check_decode_mem(selected_indices=[0, 1])  # by keyword: 2 of 3, unpaired
    batch.prepare_for_decode()
    report = audit.report()
    assert report["steps"] == 1 and report["unpaired"] == 1
    assert report["undercounts"] == report["bookkeeping_gaps"] == 0
    assert report["errors"] == 0


def test_before_the_capacity_check_the_wrappers_pass_calls_through(audited_old):
    batch = OldScheduleBatch([Req(16)], PagedTokenToKVPoolAllocator(4, 16))
    assert batch.check_decode_mem() is False  # its own answer, unchanged
    assert batch.new_tokens_required_next_decode() == 16
    with pytest.raises(TypeError):
        batch.check_decode_mem([0], "extra")
    assert OldScheduleBatch.check_decode_mem.__wrapped__.__qualname__ == \
        "OldScheduleBatch.check_decode_mem"


@pytest.mark.parametrize("version, known", [("0.5.23", True), ("0.5.12", False)])
def test_the_first_warning_says_when_kvest_knows_the_finding(audited, caplog, monkeypatch,
                                                            version, known):
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__=version))
    batch = ScheduleBatch([Req(32)], HiSparseTokenToKVPoolAllocator(4096, 16),
                          extra_device_pages=2)
    with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
        step(batch)
    (warning,) = [r.getMessage() for r in caplog.records if "first undercount" in r.getMessage()]
    assert ("known: hisparse-device-buffer-padding (" in warning) is known
    names = [k.name for k in audit.known_for(version)]
    assert ("hisparse-device-buffer-padding" in names) is known
    assert ("spec-tail-stranded" in names) is not known  # 0.5.11-0.5.15
