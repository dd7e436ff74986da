"""kvest's counters in prometheus_client's multiprocess files, as SGLang's /metrics reads them.

The real prometheus_client in multiprocess mode (a temporary
``PROMETHEUS_MULTIPROC_DIR``, as SGLang's ``--enable-metrics`` sets one), a
status function with known counters, :func:`kvest.sglang.metrics.sync`, and the
values read back the way SGLang's HTTP server does: ``MultiProcessCollector``
on a fresh ``CollectorRegistry``.  Skipped where prometheus_client is not
installed, except under ``KVEST_REQUIRE_REAL_SGLANG=1`` (CI's real-SGLang lane
has it), where that fails.
"""

from __future__ import annotations

import copy
import logging

from metrics_readback import calls, read_back

from kvest.sglang import metrics

NEW_SHAPE = {
    "kvest": "0.1.0", "implementation": "cython", "sglang": "0.5.23", "mode": "on",
    "reason": "KVEST_SGLANG unset", "scheduler": True,
    "hotspots": {
        "new_tokens_required_next_decode": {
            "state": "replaced", "patterns": ["decode_count/nested"], "notes": [],
            "calls": 17, "kernel": 12, "fallbacks": 2, "upstream": 3, "failures": 1,
            "shadow": {"compared": 0, "mismatches": 0},
        },
        "get_num_new_pages": {
            "state": "shadow", "patterns": [], "notes": [], "calls": 9, "kernel": 0,
            "fallbacks": 0, "upstream": 0,
            "shadow": {"compared": 9, "mismatches": 2, "kvest_ns": 5},
        },
    },
}
def test_counters_read_the_status_shape():
    spot = NEW_SHAPE["hotspots"]
    assert metrics._counters(spot["new_tokens_required_next_decode"]) == {
        "kernel": 12, "fallback": 2, "upstream": 3, "failures": 1, "compared": 0,
        "mismatches": 0}
    assert metrics._counters(spot["get_num_new_pages"])["compared"] == 9
    assert metrics._counters({}) == dict.fromkeys(
        ("kernel", "fallback", "upstream", "failures", "compared", "mismatches"), 0)
    assert metrics._counters({"kernel": None, "fallbacks": "x", "shadow": {}})["kernel"] == 0


def test_interval():
    assert metrics.interval({}) == 5.0
    assert metrics.interval({"KVEST_METRICS_INTERVAL": "0.25"}) == 0.25
    for bad in ("0", "-1", "soon", "inf", "nan"):
        assert metrics.interval({"KVEST_METRICS_INTERVAL": bad}) == 5.0


# ------------------------------------------------------------------ real prometheus_client

def shadow(kind, hotspot):
    return (f"kvest_shadow_{kind}_total", (("hotspot", hotspot),))


def mode(name):
    return ("kvest_mode", (("mode", name),))


def state_of(hotspot, state):
    return ("kvest_hotspot_state", (("hotspot", hotspot), ("state", state)))


class Status:
    def __init__(self, report):
        self.report = copy.deepcopy(report)

    def __call__(self):
        return copy.deepcopy(self.report)

    def bump(self, hotspot, **counts):
        entry = self.report["hotspots"][hotspot]
        for key, value in counts.items():
            if key in ("compared", "mismatches"):
                entry["shadow"][key] += value
            else:
                entry[key] += value


def test_exported_with_exact_values_and_labels(multiproc):
    status = Status(NEW_SHAPE)
    assert metrics.start(status, scheduler=True)
    got = read_back(multiproc)
    estimate, pages = "new_tokens_required_next_decode", "get_num_new_pages"
    assert got == {
        calls(estimate, "kernel"): 12.0, calls(estimate, "fallback"): 2.0,
        calls(estimate, "upstream"): 3.0,
        calls(pages, "kernel"): 0.0, calls(pages, "fallback"): 0.0,
        calls(pages, "upstream"): 0.0,
        ("kvest_kernel_failures_total", (("hotspot", estimate),)): 1.0,
        ("kvest_kernel_failures_total", (("hotspot", pages),)): 0.0,
        shadow("comparisons", estimate): 0.0, shadow("mismatches", estimate): 0.0,
        shadow("comparisons", pages): 9.0, shadow("mismatches", pages): 2.0,
        mode("on"): 1.0, mode("shadow"): 0.0, mode("off"): 0.0, mode("audit"): 0.0,
        # one series per hot spot and state, 1 for the state it is in
        **{state_of(hotspot, value): float(value == current)
           for hotspot, current in ((estimate, "replaced"), (pages, "shadow"))
           for value in metrics.STATES},
        # the KV audit's series with no label (no "audit" entry in this status)
        ("kvest_estimate_steps_total", ()): 0.0,
        ("kvest_kv_reserved_uncommitted_tokens", ()): 0.0,
    }


def test_each_increase_counted_once(multiproc):
    status = Status(NEW_SHAPE)
    estimate, pages = "new_tokens_required_next_decode", "get_num_new_pages"
    assert metrics.start(status, scheduler=True)  # first sync
    assert metrics.sync()  # nothing new: nothing added
    assert read_back(multiproc)[calls(estimate, "kernel")] == 12.0
    status.bump(estimate, kernel=5, fallbacks=1, failures=2)
    status.bump(pages, compared=4, mismatches=1)
    assert metrics.sync()
    assert metrics.sync()
    got = read_back(multiproc)
    assert got[calls(estimate, "kernel")] == 17.0
    assert got[calls(estimate, "fallback")] == 3.0
    assert got[calls(estimate, "upstream")] == 3.0
    assert got[("kvest_kernel_failures_total", (("hotspot", estimate),))] == 3.0
    assert got[shadow("comparisons", pages)] == 13.0
    assert got[shadow("mismatches", pages)] == 3.0
    # The in-process counters start again (a new patch): what they count since is added.
    status.report["hotspots"][estimate]["kernel"] = 2
    assert metrics.sync()
    assert read_back(multiproc)[calls(estimate, "kernel")] == 19.0
    # The mode changes: the gauge follows.
    status.report["mode"] = "shadow"
    assert metrics.sync()
    got = read_back(multiproc)
    assert (got[mode("on")], got[mode("shadow")], got[mode("off")]) == (0.0, 1.0, 0.0)


def test_start_once_per_process(multiproc):
    status = Status(NEW_SHAPE)
    assert metrics.start(status, scheduler=True)
    exporter = metrics._EXPORTER
    assert metrics.start(status, scheduler=True)  # idempotent: no second exporter
    assert metrics._EXPORTER is exporter
    assert read_back(multiproc)[calls("new_tokens_required_next_decode", "kernel")] == 12.0
    threads = [t for t in __import__("threading").enumerate() if t.name == "kvest-metrics"]
    assert threads and all(t.daemon for t in threads)


def test_not_started_where_sglang_exports_nothing(multiproc, monkeypatch):
    status = Status(NEW_SHAPE)
    assert not metrics.start(status, scheduler=False)  # no scheduler in this process
    status.report["scheduler"] = False
    assert not metrics.start(status)
    assert not metrics.sync()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert "PROMETHEUS_MULTIPROC_DIR" in metrics.active()
    assert not metrics.start(Status(NEW_SHAPE), scheduler=True)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc / "missing"))
    assert "not a directory" in metrics.active()
    # prometheus_client imported before the directory was set: in-process values only.
    from prometheus_client import values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc))
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    assert "imported before" in metrics.active()
    assert not metrics.start(Status(NEW_SHAPE), scheduler=True)
    assert read_back(multiproc) == {}


def test_never_raises_into_sglang(multiproc, caplog):
    def broken():
        raise KeyError("status")

    with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
        assert not metrics.start(broken, scheduler=True)
    assert "metrics not exported" in caplog.text and metrics._EXPORTER is None
