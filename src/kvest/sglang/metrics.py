"""kvest's counters on SGLang's own Prometheus ``/metrics``.

With ``--enable-metrics`` SGLang runs ``prometheus_client`` in multiprocess
mode: the launcher sets ``PROMETHEUS_MULTIPROC_DIR`` before it spawns the
schedulers (``set_prometheus_multiproc_dir()``), each scheduler process writes
its values into its own files there, and the HTTP server's ``/metrics``
collects every file of the directory (``MultiProcessCollector``).  Values
kvest writes in a scheduler process join them, with no change to SGLang.

The series (summed over the scheduler processes, as prometheus_client sums
counters in multiprocess mode):

- ``kvest_calls_total{hotspot, answer}``: calls of a hot spot, by who
  answered: ``kernel`` (kvest's kernel), ``fallback`` (the kernel declined and
  upstream's statement answered), ``upstream`` (handed to upstream's code on
  purpose, e.g. a batch too small to gain);
- ``kvest_kernel_failures_total{hotspot}``: calls in which a kernel raised an
  exception that is none of its declines (each also a ``fallback``: upstream
  answered; the first of each hot spot is logged with what reproduces it);
- ``kvest_shadow_comparisons_total{hotspot}`` and
  ``kvest_shadow_mismatches_total{hotspot}`` (shadow mode);
- ``kvest_hotspot_state{hotspot, state}``: 1 for the state each hot spot is
  in (the registry's ``State``: ``replaced``, ``shadow``, ``left alone``,
  ``skipped``, ``absent``, ...), 0 for the others (``multiprocess_mode="max"``):
  a hot spot left alone after an upgrade shows here, not only in the log;
- ``kvest_mode{mode}``: 1 for the mode kvest runs in (``on``, ``shadow``,
  ``audit``, ``off``), 0 for the others (``multiprocess_mode="max"``: 1 if any
  scheduler process runs in that mode).

The KV audit's (:mod:`kvest.sglang.audit`, ``status()["audit"]``):

- ``kvest_estimate_steps_total``: decode steps whose estimate was compared
  with what the pools handed out;
- ``kvest_estimate_undercount_total{pool}`` and
  ``kvest_estimate_short_tokens_total{pool}``: steps where a pool was asked for
  more than the estimate, and by how many tokens (the check said "fits" for a
  step that can fail);
- ``kvest_kv_bookkeeping_gap_total{pool}``: sampled steps where the requests'
  recorded ``kv_allocated_len`` grew by other than what the pool handed out;
- ``kvest_kv_reserved_uncommitted_tokens``: allocated minus committed over the
  running batch at the last sampled step (``multiprocess_mode="livesum"``:
  summed over the live scheduler processes).

Nothing is added to the hot path: kvest keeps plain int counters in the
process, read only through :func:`kvest.sglang.status`; a daemon thread copies
them into prometheus_client every ``KVEST_METRICS_INTERVAL`` seconds (default
5) and once at exit, pushing each counter's increase since the last copy.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvest.sglang import registry

__all__ = ["INTERVAL", "MODES", "active", "start", "sync"]

logger = logging.getLogger("kvest.sglang")

INTERVAL = 5.0  # seconds between copies, unless KVEST_METRICS_INTERVAL says otherwise
MODES = ("on", "shadow", "audit", "off")
ANSWERS = ("kernel", "fallback", "upstream")
STATES = tuple(state.value for state in registry.State)  # kvest_hotspot_state's values

StatusFn = Callable[[], Mapping[str, Any]]


def _int(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _counters(entry: Mapping[str, Any]) -> dict[str, int]:
    """One hot spot's counters from its ``status()`` entry: ``kernel``,
    ``fallbacks``, ``upstream``, ``failures`` and ``shadow: {compared, mismatches}``."""
    shadow = entry.get("shadow")
    if not isinstance(shadow, Mapping):
        shadow = {}
    return {
        "kernel": _int(entry.get("kernel", 0)),
        "fallback": _int(entry.get("fallbacks", 0)),
        "upstream": _int(entry.get("upstream", 0)),
        "failures": _int(entry.get("failures", 0)),
        "compared": _int(shadow.get("compared", 0)),
        "mismatches": _int(shadow.get("mismatches", 0)),
    }


def interval(environ: Mapping[str, str] | None = None) -> float:
    """``KVEST_METRICS_INTERVAL`` in seconds (a positive number; else 5, with a warning)."""
    raw = (os.environ if environ is None else environ).get("KVEST_METRICS_INTERVAL")
    if raw is None or not raw.strip():
        return INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        logger.warning("kvest: KVEST_METRICS_INTERVAL=%r is not a positive number of "
                       "seconds; using %g", raw, INTERVAL)
        return INTERVAL
    return value


def active() -> str | None:
    """Why metrics cannot be exported here, or None when they can: SGLang's
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set, and prometheus_client
    importable and writing to files)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return "PROMETHEUS_MULTIPROC_DIR is not set (SGLang runs without --enable-metrics)"
    try:
        from prometheus_client import values
    except ImportError:
        return "prometheus_client is not installed"
    if getattr(values, "ValueClass", None) is getattr(values, "MutexValue", object()):
        return ("prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set: "
                "it keeps values in this process only")
    if not os.path.isdir(directory):
        return f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a directory"
    return None


class _Exporter:
    """The prometheus_client metrics, and what has been pushed into them."""

    def __init__(self, status_fn: StatusFn) -> None:
        from prometheus_client import Counter, Gauge

        self.status_fn = status_fn
        self.lock = threading.Lock()
        self.pid = os.getpid()
        # registry=None: the values go to the multiprocess files, which is what
        # SGLang's /metrics reads; nothing is added to the default registry.
        self.calls = Counter("kvest_calls", "Calls of an SGLang hot spot kvest replaced, by "
                             "who answered: kernel, fallback (the kernel declined), upstream "
                             "(handed to upstream's code on purpose)",
                             ["hotspot", "answer"], registry=None)
        self.failures = Counter("kvest_kernel_failures", "Calls in which a kernel raised an "
                                "exception that is none of its declines (each also a "
                                "fallback: upstream answered); the first is logged",
                                ["hotspot"], registry=None)
        self.compared = Counter("kvest_shadow_comparisons", "Shadow mode: calls where kvest's "
                                "answer was compared with upstream's", ["hotspot"],
                                registry=None)
        self.mismatches = Counter("kvest_shadow_mismatches", "Shadow mode: comparisons where "
                                  "kvest's answer differed from upstream's", ["hotspot"],
                                  registry=None)
        self.state = Gauge("kvest_hotspot_state", "1 for the state a hot spot is in "
                           "(replaced, shadow, left alone, skipped, absent, ...), 0 for the "
                           "others", ["hotspot", "state"], registry=None,
                           multiprocess_mode="max")
        self.mode = Gauge("kvest_mode", "1 for the mode kvest runs in (on, shadow, off)",
                          ["mode"], registry=None, multiprocess_mode="max")
        self.audit_steps = Counter("kvest_estimate_steps", "KV audit: decode steps whose "
                                   "estimate was compared with what the pools handed out",
                                   registry=None)
        self.undercounts = Counter("kvest_estimate_undercount", "KV audit: decode steps where "
                                   "a pool was asked for more than the estimate", ["pool"],
                                   registry=None)
        self.short = Counter("kvest_estimate_short_tokens", "KV audit: tokens a pool was asked "
                             "for beyond the estimate", ["pool"], registry=None)
        self.gaps = Counter("kvest_kv_bookkeeping_gap", "KV audit: sampled decode steps where "
                            "the recorded kv_allocated_len grew by other than the pool handed "
                            "out", ["pool"], registry=None)
        self.reserved = Gauge("kvest_kv_reserved_uncommitted_tokens", "KV audit: allocated "
                              "minus committed tokens over the running batch (last sample)",
                              registry=None, multiprocess_mode="livesum")
        self.pushed: dict[tuple[str, str, str], int] = {}

    def _push(self, counter: Any, key: tuple[str, str, str], labels: tuple[str, ...],
              now: int) -> None:
        before = self.pushed.get(key)
        # made at the first sync: the series reads 0
        child = counter.labels(*labels) if labels else counter
        # First sight, or the in-process counters started again (a new patch):
        # everything they counted is new.
        delta = now if before is None or now < before else now - before
        if delta:
            child.inc(delta)
        self.pushed[key] = now

    def sync(self) -> None:
        report = self.status_fn()
        with self.lock:
            mode = report.get("mode")
            for name in MODES:
                self.mode.labels(name).set(1 if name == mode else 0)
            spots = report.get("hotspots") or {}
            for hotspot, entry in spots.items():
                if not isinstance(entry, Mapping):
                    continue
                for state in STATES:
                    self.state.labels(hotspot, state).set(1 if entry.get("state") == state
                                                          else 0)
                counts = _counters(entry)
                for answer in ANSWERS:
                    self._push(self.calls, ("calls", hotspot, answer), (hotspot, answer),
                               counts[answer])
                self._push(self.failures, ("failures", hotspot, ""), (hotspot,),
                           counts["failures"])
                self._push(self.compared, ("compared", hotspot, ""), (hotspot,),
                           counts["compared"])
                self._push(self.mismatches, ("mismatches", hotspot, ""), (hotspot,),
                           counts["mismatches"])
            audit = report.get("audit")
            if isinstance(audit, Mapping):
                self._sync_audit(audit)

    def _sync_audit(self, audit: Mapping[str, Any]) -> None:
        self._push(self.audit_steps, ("audit_steps", "", ""), (), _int(audit.get("steps")))
        pools = audit.get("pools") or {}
        for pool, entry in pools.items():
            if not isinstance(entry, Mapping):
                continue
            self._push(self.undercounts, ("undercounts", pool, ""), (pool,),
                       _int(entry.get("undercounts")))
            self._push(self.short, ("short", pool, ""), (pool,),
                       _int(entry.get("short_tokens")))
            self._push(self.gaps, ("gaps", pool, ""), (pool,),
                       _int(entry.get("bookkeeping_gaps")))
        reserved = audit.get("reserved_uncommitted")
        if reserved is not None:
            self.reserved.set(_int(reserved))


_LOCK = threading.Lock()
_EXPORTER: _Exporter | None = None
_ATEXIT = False


def _default_status() -> Mapping[str, Any]:
    import kvest.sglang

    return kvest.sglang.status()


def _loop(exporter: _Exporter, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        if _EXPORTER is not exporter:
            return
        try:
            exporter.sync()
        except Exception as exc:  # never let the thread die noisily in SGLang's process
            logger.warning("kvest: metrics not updated: %s: %s", type(exc).__name__, exc)


def _at_exit() -> None:
    try:
        sync()
    except Exception as exc:
        logger.debug("kvest: metrics not updated at exit: %s: %s", type(exc).__name__, exc)


def start(status_fn: StatusFn | None = None, *, scheduler: bool | None = None) -> bool:
    """Export kvest's counters through SGLang's Prometheus multiprocess files.

    Starts once per process (a forked child starts its own), only where metrics
    are active (:func:`active`) and a scheduler is present (``scheduler``, by
    default ``status_fn()["scheduler"]`` or SGLang's scheduler module loaded).
    Returns True if exporting runs.  Never raises: a failure is one warning.
    """
    global _EXPORTER, _ATEXIT
    status_fn = status_fn or _default_status
    try:
        with _LOCK:
            if _EXPORTER is not None and _EXPORTER.pid == os.getpid():
                return True
            why = active()
            if why is not None:
                logger.debug("kvest: no metrics: %s", why)
                return False
            if scheduler is None:
                import sys

                scheduler = bool(status_fn().get("scheduler")) or \
                    registry.SCHEDULER in sys.modules
            if not scheduler:
                logger.debug("kvest: no metrics: no SGLang scheduler in this process")
                return False
            exporter = _Exporter(status_fn)
            exporter.sync()
            _EXPORTER = exporter
            every = interval()
            thread = threading.Thread(target=_loop, args=(exporter, every, threading.Event()),
                                      name="kvest-metrics", daemon=True)
            thread.start()
            if not _ATEXIT:
                _ATEXIT = True
                atexit.register(_at_exit)
        logger.debug("kvest: metrics exported every %g s to %s", every,
                     os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        return True
    except Exception as exc:  # never break SGLang's start-up
        logger.warning("kvest: metrics not exported: %s: %s", type(exc).__name__, exc)
        return False


def sync() -> bool:
    """Copy the counters into prometheus_client now (the thread does it every
    interval). False when exporting was not started in this process."""
    exporter = _EXPORTER
    if exporter is None or exporter.pid != os.getpid():
        return False
    exporter.sync()
    return True


def _forget() -> None:
    """Tests: stop exporting in this process (the thread ends at its next wake)."""
    global _EXPORTER
    with _LOCK:
        _EXPORTER = None
