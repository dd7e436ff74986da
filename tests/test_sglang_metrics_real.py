"""In the real SGLang: the status line once SGLang configured logging, and kvest's
counters in SGLang's Prometheus multiprocess files after a decode loop.

Each case is a fresh process started as SGLang starts a scheduler, in the
order its ``run_scheduler_process`` goes: the scheduler's module imported,
SGLang's own ``load_plugins()``, ``publish()`` of the server args, then the
function kvest hooks, ``configure_scheduler_process()``, which configures
logging (``logging.basicConfig(force=True)``).  ``PROMETHEUS_MULTIPROC_DIR`` is
set as ``--enable-metrics`` sets it.  Then a decode loop of real ``Req``
objects in real ``ScheduleBatch`` es through the replaced
``new_tokens_required_next_decode`` (a fallback among them), with the
metrics thread running every 0.2 s.

- The process's log (stderr, formatted by SGLang's configured logger) holds
  kvest's status line exactly once, for ``KVEST_SGLANG`` unset, ``shadow``,
  ``0`` and an unreadable value.
- The counters read back with ``MultiProcessCollector`` (what SGLang's
  ``/metrics`` serves) equal ``kvest.sglang.status()``'s: after an explicit
  ``sync()``, after the thread alone, and after exit (the last copy at exit).

Runs where sglang's scheduler and prometheus_client import (an environment
built by ``tools/make_sglang_env.sh --scheduler``); skipped elsewhere, except
under ``KVEST_REQUIRE_REAL_SGLANG=1`` (CI), where a missing environment fails.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sglang_releases import real_sglang_missing

try:
    import prometheus_client  # noqa: F401
    import sglang.srt.managers.schedule_batch  # noqa: F401
except Exception as exc:  # not a real SGLang environment
    pytest.skip(real_sglang_missing(exc), allow_module_level=True)

import kvest
from kvest.sglang import metrics

HERE = Path(__file__).resolve().parent
MODES = {"unset": "on", "shadow": "shadow", "0": "off", "bogus": "off"}


# ------------------------------------------------------------------ the child

def _child(result_path: str) -> None:  # runs in a fresh interpreter
    import random
    import time
    from array import array

    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.managers.scheduler as scheduler  # loaded in a scheduler process
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import kvest.sglang
    from kvest.sglang import metrics as child_metrics

    load_plugins()  # run_scheduler_process's first statement
    server_args = ServerArgs(model_path="dummy", enable_metrics=True)
    publish(server_args, role="scheduler", ranks=SpawnRanks(
        world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), dp_rank=None,
        gpu_id=0))
    scheduler.configure_scheduler_process(server_args, 0)  # logging configured here
    started = child_metrics._EXPORTER is not None
    states = {name: spot["state"] for name, spot in kvest.sglang.status()["hotspots"].items()}

    rng = random.Random(0)
    counter = iter(range(10**9))

    def make_req(committed: int, allocated: int):
        req = sb.Req(f"r{next(counter)}", "", array("q", range(4)),
                     SamplingParams(max_new_tokens=16))
        req.kv.kv_committed_len = committed
        req.kv.kv_allocated_len = allocated
        return req

    def make_batch(reqs, page_size: int):
        return sb.ScheduleBatch(
            reqs=reqs, token_to_kv_pool_allocator=type("A", (), {"page_size": page_size})(),
            spec_algorithm=SpeculativeAlgorithm.from_string(None), enable_overlap=True)

    reqs = [make_req(c, c + rng.randint(0, 20)) for c in
            (rng.randint(0, 4096) for _ in range(64))]

    def decode(steps: int) -> None:
        for step in range(steps):
            batch = make_batch(reqs, 16)
            batch.new_tokens_required_next_decode()
            if step % 3 == 0:
                batch.new_tokens_required_next_decode([rng.randrange(len(reqs))
                                                       for _ in range(8)])
            if step % 5 == 0:  # a batch of one
                make_batch(reqs[:1], 16).new_tokens_required_next_decode()
            for r in reqs:
                r.kv.kv_committed_len += 1
                r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, r.kv.kv_committed_len)

    def read_back():
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return [[s.name, s.labels, s.value] for f in registry.collect() for s in f.samples
                if s.name.startswith("kvest_")]

    result = {"started": started, "states": states}
    decode(40)
    saved = reqs[0].kv.kv_committed_len
    reqs[0].kv.kv_committed_len = True  # not an exact int: the kernel declines
    make_batch(reqs, 16).new_tokens_required_next_decode()
    reqs[0].kv.kv_committed_len = saved
    result["synced"] = child_metrics.sync()
    result["after_sync"] = [kvest.sglang.status(), read_back()]
    decode(30)
    status = kvest.sglang.status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # no sync() here: the thread copies them
        time.sleep(0.05)
        if _compare(status, read_back()) == []:
            break
    result["after_thread"] = [status, read_back()]
    decode(20)
    result["at_exit"] = kvest.sglang.status()  # copied once more at exit
    Path(result_path).write_text(json.dumps(result))


def _expected(status: dict) -> dict:
    """The series ``status()`` implies: {(name, labels...): value}."""
    out = {}
    for mode in metrics.MODES:
        out[("kvest_mode", ("mode", mode))] = 1.0 if status["mode"] == mode else 0.0
    for hotspot, entry in status["hotspots"].items():
        counts = metrics._counters(entry)
        for answer in metrics.ANSWERS:
            out[("kvest_calls_total", ("answer", answer), ("hotspot", hotspot))] = \
                float(counts[answer])
        out[("kvest_kernel_failures_total", ("hotspot", hotspot))] = \
            float(counts["failures"])
        for state in metrics.STATES:
            out[("kvest_hotspot_state", ("hotspot", hotspot), ("state", state))] = \
                1.0 if entry["state"] == state else 0.0
        out[("kvest_shadow_comparisons_total", ("hotspot", hotspot))] = \
            float(counts["compared"])
        out[("kvest_shadow_mismatches_total", ("hotspot", hotspot))] = \
            float(counts["mismatches"])
    audit = status["audit"]  # the KV audit's series (docs/audit.md)
    out[("kvest_estimate_steps_total",)] = float(audit["steps"])
    out[("kvest_kv_reserved_uncommitted_tokens",)] = float(audit["reserved_uncommitted"] or 0)
    for pool, entry in audit["pools"].items():
        out[("kvest_estimate_undercount_total", ("pool", pool))] = float(entry["undercounts"])
        out[("kvest_estimate_short_tokens_total", ("pool", pool))] = float(entry["short_tokens"])
        out[("kvest_kv_bookkeeping_gap_total", ("pool", pool))] = float(entry["bookkeeping_gaps"])
    return out


def _series(samples: list) -> dict:
    return {(name, *sorted(labels.items())): value for name, labels, value in samples}


def _compare(status: dict, samples: list) -> list:
    """The differences between what status() says and what /metrics would serve."""
    want, got = _expected(status), _series(samples)
    return sorted((str(k), want.get(k), got.get(k)) for k in set(want) | set(got)
                  if want.get(k) != got.get(k))


@functools.cache
def _run(switch: str) -> tuple[dict, str, list, str]:
    """One scheduler-like process: its results, its log, the multiprocess
    registry after it exited, and SGLang's /metrics text then."""
    directory = tempfile.mkdtemp(prefix="kvest-prom-")
    result_path = os.path.join(directory, "..", os.path.basename(directory) + ".json")
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=directory, KVEST_METRICS_INTERVAL="0.2",
               PYTHONWARNINGS="ignore::UserWarning")
    env.pop("KVEST_SGLANG", None)
    env.pop("SGLANG_PLUGINS", None)
    env.pop("SGLANG_LOGGING_CONFIG_PATH", None)
    if switch != "unset":
        env["KVEST_SGLANG"] = switch
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); "
            f"import test_sglang_metrics_real as t; t._child({result_path!r})")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(Path(result_path).read_text())
    os.unlink(result_path)

    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    final = [[s.name, s.labels, s.value] for f in registry.collect() for s in f.samples
             if s.name.startswith("kvest_")]
    served = _served(directory)
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)
    return result, done.stdout + done.stderr, final, served


def _served(directory: str) -> str:
    """The text SGLang's HTTP server serves on /metrics over that directory
    (its own ``add_prometheus_middleware``, on a bare Starlette app)."""
    from sglang.srt.utils.common import add_prometheus_middleware
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    saved = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        app = Starlette()
        add_prometheus_middleware(app)
        response = TestClient(app).get("/metrics")
    finally:
        if saved is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    assert response.status_code == 200
    return response.text


@pytest.mark.parametrize("switch", list(MODES))
def test_status_line_once_after_logging_is_configured(switch):
    _, log, _, _ = _run(switch)
    line = re.compile(rf"kvest {re.escape(kvest.__version__)}\b.*\bmode {MODES[switch]}\b")
    found = [entry for entry in log.splitlines() if line.search(entry)]
    assert len(found) == 1, log[-4000:]
    # Through SGLang's configured logger (its format: "[date time] message").
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] kvest ", found[0]), found[0]
    if switch == "bogus":
        assert "KVEST_SGLANG='bogus'" in log


def _doctor_states(switch: str) -> dict[str, str]:
    """The hot spots' states the doctor reports for a scheduler process here."""
    env = dict(os.environ)
    env.pop("KVEST_SGLANG", None)
    env.pop("SGLANG_PLUGINS", None)
    if switch != "unset":
        env["KVEST_SGLANG"] = switch
    done = subprocess.run([sys.executable, "-m", "kvest", "sglang", "--batches", "5"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    start = lines.index("the hot spots, as status() and the log give them in that process:")
    states = {}
    for line in lines[start + 1:]:
        match = re.match(r"  (\w+): ([a-z][a-z ]*?)(?: \(|$)", line)
        if not line.startswith("  "):
            break
        if match:
            states[match.group(1)] = match.group(2)
    return states


@pytest.mark.parametrize("switch", list(MODES))
def test_the_doctor_status_and_the_log_agree(switch):
    """One truth: in a scheduler process started as SGLang starts one, the
    states status() gives, the doctor's report for this installation and the
    status line name the same hot spots with the same states, in every mode."""
    result, log, _, _ = _run(switch)
    assert _doctor_states(switch) == result["states"]
    line = next(entry for entry in log.splitlines() if f"kvest {kvest.__version__}" in entry)
    for name, state in result["states"].items():
        if state in ("replaced", "shadow"):
            assert f"{name} {state} (" in line, (name, line)
        else:
            assert f"{name} replaced" not in line and f"{name} shadow" not in line


@pytest.mark.parametrize("switch", ["unset", "shadow", "0"])
def test_counters_on_sglangs_metrics(switch):
    result, _, final, served = _run(switch)
    assert result["started"] and result["synced"]
    status, samples = result["after_sync"]
    assert _compare(status, samples) == []
    # (today's status() lists no hot spot when off; the registry's lists them all)
    estimate = status["hotspots"].get("new_tokens_required_next_decode", {})
    counts = metrics._counters(estimate)
    if switch == "unset":
        assert status["mode"] == "on" and counts["kernel"] > 0 and counts["fallback"] > 0
    elif switch == "shadow":
        assert counts["compared"] > 0 and counts["mismatches"] == 0
    else:  # off: SGLang's code, and the gauge says so
        assert status["mode"] == "off" and counts["kernel"] == counts["fallback"] == 0
        assert _series(samples)[("kvest_mode", ("mode", "off"))] == 1.0
    # The thread alone, then the last copy at exit (read after the process ended,
    # as SGLang's HTTP server reads a scheduler's files).
    assert _compare(*result["after_thread"]) == []
    assert _compare(result["at_exit"], final) == []
    # ... and on SGLang's own /metrics, every series with its value.
    for (name, *labels), value in _expected(result["at_exit"]).items():
        text = ",".join(f'{k}="{v}"' for k, v in labels)
        text = f"{{{text}}}" if labels else ""  # a series with no label is served bare
        assert f"{name}{text} {value}" in served.splitlines(), (name, labels, value)
    if switch != "0":
        later = metrics._counters(result["at_exit"]["hotspots"].get(
            "new_tokens_required_next_decode", {}))
        assert later != counts  # the loop went on after the explicit sync
