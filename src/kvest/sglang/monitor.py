"""What kvest does in this SGLang process: :func:`status`, counters, shadow mode, the log line.

Switch (``KVEST_SGLANG``, read once when the plugin loads; :func:`switch`):

- unset (or empty), ``1``/``on``: kvest's kernels answer;
- ``shadow``: kvest and upstream both run on every call, upstream's answer is
  returned, and kvest counts comparisons, mismatches and time per hot spot;
  the first mismatch of each hot spot is logged with what reproduces it;
- ``0``/``off``: SGLang's own code runs;
- ``audit``: SGLang's own code runs, and kvest's KV audit
  (:mod:`kvest.sglang.audit`, which also runs in the two modes above) is added;
- anything else (``true``, ``no``, a typo; any case): off, with a warning that
  quotes the value (the safe side is upstream's code).

``KVEST_AUDIT`` (:func:`audit_switch`) runs the audit or not whatever the mode;
``KVEST_SGLANG_SKIP`` (:func:`skipped_by_operator`) leaves named hot spots to
upstream.  docs/operations.md lists every variable.

Every hot spot of :mod:`kvest.sglang.registry` has one :class:`Spot` for the
life of the process: a second ``patch()`` plans again into the same spots, so
the glue already running keeps counting where :func:`status` reads.  Counters
are per call of the hot-spot function, counted once when the call ends (so
that a counter never shows an outcome later taken back), and each call is one
of three:
``fallbacks`` (a kernel declined and upstream's statement answered),
``kernel`` (a kernel answered and none declined), ``upstream`` (neither: the
batch was smaller than the kind's crossover, ``upstream_below`` in the
registry, and went to upstream's statement on purpose, or the call went no way
through a compiled statement).  ``calls`` is their sum.

``KVEST_SGLANG_HANDOFF`` (read when the plugin plans): unset or on, small
batches go to upstream's statement as above; ``0``/``off``/``false``/``no``,
kvest's kernels answer at every batch size (what the doctor checks).
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import kvest
from kvest.sglang.readout import Status
from kvest.sglang.registry import ALLOC_SETTINGS_MODULES, HOTSPOTS, Note, NoteKind, State

__all__ = ["Mode", "Spot", "Switch", "status", "switch"]

logger = logging.getLogger("kvest.sglang")

_OFF = frozenset({"0", "off", "false", "no", "n", "f"})
SUMMARY_EVERY = 600.0  # seconds between shadow-mode summaries
SAMPLES = 1024  # timings kept per side and hot spot (the most recent)


class Mode(enum.Enum):
    ON = "on"
    SHADOW = "shadow"
    OFF = "off"
    AUDIT = "audit"  # SGLang's own code runs; only the KV audit is added

    def __str__(self) -> str:
        return self.value

    @property
    def compiles(self) -> bool:
        """Whether kvest's kernels answer (or are compared) in this mode."""
        return self in (Mode.ON, Mode.SHADOW)

    @property
    def audits(self) -> bool:
        """Whether the KV audit (:mod:`kvest.sglang.audit`) runs in this mode."""
        return self is not Mode.OFF


class Switch(NamedTuple):
    """What ``KVEST_SGLANG`` says: the mode, why (in words), and a warning where
    the value could not be read."""

    mode: Mode
    reason: str
    warning: str | None = None


HANDOFF_ENV = "KVEST_SGLANG_HANDOFF"


def handoff(environ: dict[str, str] | None = None) -> bool:
    """Whether batches too small for a kernel to gain go to upstream's statement."""
    raw = (os.environ if environ is None else environ).get(HANDOFF_ENV, "")
    return raw.strip().lower() not in _OFF


# KVEST_SGLANG's values, exactly the documented ones (any case, surrounding
# whitespace ignored): a boolean spelling such as "true" or "no" is a typo here
# and warns, since docs/operations.md and the warning name these alone.
SWITCH_VALUES = {"1": Mode.ON, "on": Mode.ON, "shadow": Mode.SHADOW, "audit": Mode.AUDIT,
                 "0": Mode.OFF, "off": Mode.OFF}


def switch(environ: dict[str, str] | None = None) -> Switch:
    """The mode ``KVEST_SGLANG`` asks for, and why: unset (or empty), ``1`` or
    ``on``: on; ``shadow``; ``audit``; ``0`` or ``off``: off (any case,
    surrounding whitespace ignored).  Any other value is off, with a warning
    that quotes it: upstream's code is the safe side."""
    raw = (os.environ if environ is None else environ).get("KVEST_SGLANG")
    if raw is None:
        return Switch(Mode.ON, "KVEST_SGLANG is not set: on by default")
    if not raw.strip():  # `KVEST_SGLANG= cmd` in a shell: set, but to nothing
        return Switch(Mode.ON, f"KVEST_SGLANG={raw!r} is empty: on, as when it is not set")
    mode = SWITCH_VALUES.get(raw.strip().lower())
    if mode is Mode.AUDIT:
        return Switch(mode, f"KVEST_SGLANG={raw!r}: SGLang runs its own code, with "
                            "kvest's KV audit")
    if mode is Mode.OFF:
        return Switch(mode, f"KVEST_SGLANG={raw!r} turns kvest off")
    if mode is not None:
        return Switch(mode, f"KVEST_SGLANG={raw!r}")
    why = (f"KVEST_SGLANG={raw!r} is not one of 1/on, shadow, audit, 0/off: kvest is off and "
           "SGLang runs its own code")
    return Switch(Mode.OFF, why, why)


AUDIT_ENV = "KVEST_AUDIT"
SKIP_ENV = "KVEST_SGLANG_SKIP"
_AUDIT_ON, _AUDIT_OFF = frozenset({"1", "on"}), frozenset({"0", "off"})


class AuditSwitch(NamedTuple):
    """What ``KVEST_AUDIT`` says: whether the KV audit runs, why, and a warning
    where the value could not be read."""

    runs: bool
    reason: str
    warning: str | None = None


def audit_switch(mode: Mode, environ: dict[str, str] | None = None) -> AuditSwitch:
    """Whether the KV audit runs, beside kernels in ``mode``: ``KVEST_AUDIT``
    ``1``/``on`` or ``0``/``off`` (any case, spaces around ignored) whatever
    the mode; unset, as the mode says (every mode but off); anything else as
    unset, with a warning that quotes it.  How often it samples the lengths is
    ``KVEST_AUDIT_EVERY`` (:mod:`kvest.sglang.audit`)."""
    raw = (os.environ if environ is None else environ).get(AUDIT_ENV)
    says = "the audit runs" if mode.audits else "no audit"
    default = AuditSwitch(mode.audits, f"{AUDIT_ENV} is not set: {says} in mode {mode}")
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _AUDIT_ON:
        return AuditSwitch(True, f"{AUDIT_ENV}={raw!r}")
    if value in _AUDIT_OFF:
        return AuditSwitch(False, f"{AUDIT_ENV}={raw!r} turns the audit off")
    why = f"{AUDIT_ENV}={raw!r} is not one of 1/on, 0/off: read as unset"
    return AuditSwitch(default.runs, f"{why}; {default.reason}", why)


def skipped_by_operator(environ: dict[str, str] | None = None
                        ) -> tuple[frozenset[str], tuple[str, ...]]:
    """The hot spots ``KVEST_SGLANG_SKIP`` (names, comma-separated) leaves to
    upstream, and the names in it that are no hot spot of the registry."""
    raw = (os.environ if environ is None else environ).get(SKIP_ENV, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return (frozenset(n for n in names if n in HOTSPOTS),
            tuple(n for n in names if n not in HOTSPOTS))


class Samples:
    """The most recent :data:`SAMPLES` timings of one side, in nanoseconds."""

    __slots__ = ("count", "values")

    def __init__(self) -> None:
        self.values: list[int] = []
        self.count = 0

    def add(self, ns: int) -> None:
        if len(self.values) < SAMPLES:
            self.values.append(ns)
        else:
            self.values[self.count % SAMPLES] = ns
        self.count += 1

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile in microseconds (nearest rank), ``None`` with no sample."""
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3


UPSTREAM, KERNEL, FALLBACK = 0, 1, 2  # a call's outcome, as its tally counts it

# What a kernel raises by its input rules (docs/contract.md): a decline, after
# which upstream's statement answers.  Anything else it raises is a failure of
# kvest's own (:func:`kernel_failed`): upstream answers too, and it is counted
# and logged.
DECLINES = (kvest.ImpureRequest, AttributeError, TypeError, ValueError, OverflowError,
            IndexError)


class _PyTally:
    """kvest.sglang._glue._Tally in Python (the pure build): a hot spot's
    counters, each call counted once when its outcome is final
    (:meth:`count`), under a lock: ``+=`` on an attribute is no single step
    of Python's, and two threads must not lose a count."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0, 0, 0]  # upstream, kernel, fallbacks (by outcome)

    def count(self, seen: int) -> None:
        """One call ended: ``seen`` is :data:`KERNEL` (a kernel answered, none
        declined), :data:`FALLBACK` (a kernel declined) or :data:`UPSTREAM`."""
        with self._lock:
            self._counts[seen if seen in (UPSTREAM, KERNEL) else FALLBACK] += 1

    @property
    def kernel(self) -> int:
        return self._counts[KERNEL]

    @property
    def fallbacks(self) -> int:
        return self._counts[FALLBACK]

    @property
    def upstream(self) -> int:
        return self._counts[UPSTREAM]

    @property
    def calls(self) -> int:
        return sum(self._counts)


Tally: Any = _PyTally  # the pure-Python build's
if kvest.IMPLEMENTATION == "cython":
    from kvest.sglang._glue import _Tally as Tally


def _counter(name: str, doc: str) -> Any:
    """A Spot's view of one of its tally's counters (read only: they only grow)."""
    return property(lambda spot: getattr(spot.tally, name), doc=doc)


@dataclasses.dataclass(eq=False)
class Spot:
    """One hot spot: what kvest did with it and what happened since."""

    name: str
    state: State = State.NOT_LOADED
    patterns: list[str] = dataclasses.field(default_factory=list)
    notes: list[Note] = dataclasses.field(default_factory=list)
    # kernel, fallbacks, upstream: each call counted once, when it ends (where
    # the compiled glue counts them without a Python attribute write)
    tally: Any = dataclasses.field(default_factory=Tally)
    failures: int = 0  # a kernel raised none of its declines (kernel_failed)
    first_failure: str | None = None
    compared: int = 0  # shadow mode
    mismatches: int = 0
    first_mismatch: str | None = None
    kvest_ns: Samples = dataclasses.field(default_factory=Samples)
    upstream_ns: Samples = dataclasses.field(default_factory=Samples)

    calls = _counter("calls", "calls of the hot spot that ended (kernel + fallbacks + upstream)")
    kernel = _counter("kernel", "calls in which a kernel answered and none declined")
    fallbacks = _counter("fallbacks", "calls in which a kernel declined")
    upstream = _counter("upstream", "calls in which no kernel answered and none declined: "
                        "the batch was smaller than the kind's crossover, or the call went "
                        "no way through a compiled statement")

    @property
    def declines(self) -> list[Note]:
        """The notes that say compiled code of this hot spot was left to upstream."""
        return [n for n in self.notes if n.kind.declines]

    @property
    def reason(self) -> str | None:
        """Why the hot spot, or a statement of it, is not compiled, in words
        (``None`` where all of it is)."""
        if self.state in (State.REPLACED, State.SHADOW):
            return "; ".join(dict.fromkeys(n.text for n in self.declines)) or None
        if self.notes:
            wanted = self.declines or self.notes
            return "; ".join(dict.fromkeys(n.text for n in wanted))
        return _STATE_REASONS.get(self.state)


_STATE_REASONS = {
    State.NOT_LOADED: "its module is not imported in this process",
    State.ABSENT: "not in this release",
    State.OFF: "kvest is off",
}


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = Mode.OFF
        self.reason = "kvest's SGLang plugin has not run in this process"
        self.loaded = False  # the plugin or patch() ran
        self.sglang = "unknown"
        self.scheduler = False
        self.spots: dict[str, Spot] = {name: Spot(name) for name in HOTSPOTS}
        self.announced = False
        self.audit: AuditSwitch | None = None  # the plugin's decision (KVEST_AUDIT)
        self.by_patch = False  # planned by kvest.sglang.patch(), not SGLang's plugin loader
        self.handoff = True  # small batches to upstream's statement (HANDOFF_ENV)
        self.last_summary = time.monotonic()
        self.atexit = False
        # (owner, attribute, upstream's function, kvest's) registered with SGLang's
        # HookRegistry, whose wrapper takes upstream's name: renamed on first call.
        self.hooked: list[tuple[Any, str, Any, Any]] = []


STATE = _State()
_SHADOW_LOCK = threading.Lock()  # shadow mode's counters and samples
_side = threading.local()  # which side (Side) a shadow call is running on this thread


class Side(enum.Enum):
    """The side of a shadow call that is running."""

    UPSTREAM = "upstream"
    KVEST = "kvest"


def reset(mode: Mode, reason: str, sglang: str, scheduler: bool,
          small_to_upstream: bool | None = None) -> None:
    """A new plan: every hot spot's state and notes start again; counters go on.
    ``small_to_upstream``: whether small batches go to upstream's statement
    (``None``: as ``KVEST_SGLANG_HANDOFF`` says; never in shadow mode)."""
    with STATE.lock:
        STATE.mode, STATE.reason = mode, reason
        STATE.sglang, STATE.scheduler, STATE.loaded = sglang, scheduler, True
        STATE.announced = False
        STATE.audit, STATE.by_patch = None, False
        wanted = handoff() if small_to_upstream is None else small_to_upstream
        STATE.handoff = wanted and mode is not Mode.SHADOW  # shadow compares kernels
        STATE.hooked = []
        first = State.NOT_LOADED if mode.compiles else State.OFF
        for entry in STATE.spots.values():
            entry.state, entry.patterns, entry.notes = first, [], []


def failed(why: str) -> None:
    """Planning failed (kvest's own error): SGLang runs its own code, and says why."""
    reset(Mode.OFF, f"kvest failed while planning, SGLang runs its own code: {why}",
          STATE.sglang, STATE.scheduler)


def undone(names: set[str]) -> None:
    """``patch()``'s undo put upstream's functions back."""
    with STATE.lock:
        for name in names:
            entry = STATE.spots[name]
            entry.state, entry.patterns = State.OFF, []
            entry.notes = [Note(NoteKind.INFO, "kvest.sglang.patch() was undone")]


def spot(name: str) -> Spot:
    found = STATE.spots.get(name)
    if found is None:
        with STATE.lock:
            found = STATE.spots.setdefault(name, Spot(name))
    return found


def plugins_reason() -> str | None:
    allowed = os.environ.get("SGLANG_PLUGINS", "").strip()
    if allowed and "kvest" not in [p.strip() for p in allowed.split(",")]:
        return f"SGLANG_PLUGINS={allowed!r} does not list kvest"
    return None


def not_run_reason() -> str:
    """Why kvest does nothing in this process, where its plugin has not run,
    and what the switches would make of it in a scheduler process."""
    plugins = plugins_reason()
    if plugins is not None:
        there = f"it would not load ({plugins})"
    else:
        choice = switch()
        there = f"it would run in mode {choice.mode} ({choice.reason})"
    return ("kvest's SGLang plugin has not run in this process: it runs in SGLang's "
            f"scheduler processes, and in one started here {there}")


def _scheduler_mode() -> Mode:
    """The mode a scheduler process started with this environment runs in."""
    return Mode.OFF if plugins_reason() is not None else switch().mode


def status() -> dict[str, Any]:
    """A snapshot of what kvest does in this process (the keys are documented
    in docs/sglang.md and never change), a :class:`~kvest.sglang.readout.Status`:
    a dict whose ``repr`` is a short summary that names the instruments
    (``dict(status())`` prints the dict itself):

    ``kvest`` (its version), ``implementation``, ``sglang`` (its version),
    ``mode`` (on, shadow, off), ``reason`` (why that mode, in words),
    ``scheduler`` (whether this process runs SGLang's scheduler: not a
    script that called ``patch()``), ``scheduler_mode`` (the mode a scheduler
    process runs in: this one's, or, elsewhere, what the switches would make
    of one started with this environment), and per hot
    spot of the registry, in every mode: ``state``, ``reason`` (why it, or a
    statement of it, is not compiled; ``None`` where all of it is),
    ``patterns`` (compiled), ``notes``, ``calls``, ``kernel``, ``fallbacks``,
    ``upstream`` (each call is one of these three: see the module docstring),
    ``failures`` (calls in which a kernel raised an exception that is none of
    its declines, :data:`DECLINES`; each also a fallback) with
    ``first_failure`` (what reproduces the first, or ``None``),
    and ``shadow``: ``compared``,
    ``mismatches``, ``kvest_us`` and ``upstream_us`` (``median`` and ``p99`` of
    the recent calls), ``ratio`` (upstream's median over kvest's) and
    ``first_mismatch``.
    """
    import kvest

    with STATE.lock:
        reason = STATE.reason if STATE.loaded else not_run_reason()
        return Status({
            "kvest": kvest.__version__, "implementation": kvest.IMPLEMENTATION,
            "sglang": STATE.sglang, "mode": STATE.mode.value, "reason": reason,
            # (a process that patch() planned in is not one SGLang started)
            "scheduler": STATE.scheduler and not STATE.by_patch,
            "scheduler_mode": STATE.mode.value if STATE.loaded and not STATE.by_patch
            else _scheduler_mode().value,
            "hotspots": {name: _entry(STATE.spots.get(name) or Spot(name))
                         for name in list(HOTSPOTS)},
            "audit": _audit_report(),
        })


def _audit_report() -> dict[str, Any]:
    """The KV audit's counters (:func:`kvest.sglang.audit.report`)."""
    from kvest.sglang import audit

    return audit.report()


def _entry(s: Spot) -> dict[str, Any]:
    # (each read once: calls is their sum in this snapshot, whatever counts meanwhile)
    kernel, fallbacks, upstream = s.kernel, s.fallbacks, s.upstream
    kvest_us = {"median": s.kvest_ns.quantile(0.5), "p99": s.kvest_ns.quantile(0.99)}
    upstream_us = {"median": s.upstream_ns.quantile(0.5), "p99": s.upstream_ns.quantile(0.99)}
    ratio = (upstream_us["median"] / kvest_us["median"]
             if kvest_us["median"] and upstream_us["median"] is not None else None)
    return {
        "state": s.state.value, "reason": s.reason, "patterns": list(s.patterns),
        "notes": [n.text for n in s.notes],
        "calls": kernel + fallbacks + upstream, "kernel": kernel, "fallbacks": fallbacks,
        "upstream": upstream, "failures": s.failures, "first_failure": s.first_failure,
        "shadow": {"compared": s.compared, "mismatches": s.mismatches, "kvest_us": kvest_us,
                   "upstream_us": upstream_us, "ratio": ratio,
                   "first_mismatch": s.first_mismatch},
    }


def describe() -> list[tuple[int, str]]:
    """The status as log records: (level, message)."""
    import kvest

    spots = [s for name in list(HOTSPOTS) if (s := STATE.spots.get(name)) is not None]
    done = [s for s in spots if s.state in (State.REPLACED, State.SHADOW)]
    head = (f"kvest {kvest.__version__} ({kvest.IMPLEMENTATION}), sglang {STATE.sglang}, "
            f"mode {STATE.mode} ({STATE.reason}): ")
    if not STATE.mode.compiles or not STATE.scheduler:
        head += "nothing replaced"
    else:
        head += ("; ".join(f"{s.name} {s.state} ({', '.join(s.patterns)})" for s in done)
                 or "nothing replaced")
    older = [s.name for s in spots if s.state is State.NOT_RECOGNISED]
    if older and STATE.mode.compiles:
        head += f"; not recognised in this release (its own older code): {', '.join(older)}"
    left = [s.name for s in spots if s.state in (State.SKIPPED, State.LEFT_ALONE)]
    if left and STATE.mode.compiles and STATE.scheduler:
        head += (f"; left to upstream: {', '.join(left)} (why: status() or "
                 "`python -m kvest sglang`)")
    if STATE.audit is not None and STATE.scheduler:
        from kvest.sglang import audit

        head += ("; the KV audit runs" if audit.installed()
                 else "; the KV audit is not installed" if STATE.audit.runs
                 else f"; no KV audit ({STATE.audit.reason})")
    records = [(logging.INFO, head)]
    _, unknown = skipped_by_operator()
    if unknown and STATE.mode.compiles:
        records.append((logging.WARNING, f"kvest: {SKIP_ENV} names no hot spot "
                        f"{', '.join(map(repr, unknown))} (the names: status()'s hotspots)"))
    for s in spots:
        for note_ in s.declines:
            records.append((logging.WARNING, f"kvest: {s.name} left alone: {note_.text}"))
    return records


def announce() -> None:
    """Log the status line (once per process)."""
    with STATE.lock:
        if STATE.announced:
            return
        STATE.announced = True
    _unwrap_hook_wrappers()
    for level, message in describe():
        logger.log(level, "%s", message)
    if STATE.mode is Mode.SHADOW and not STATE.atexit:
        STATE.atexit = True
        atexit.register(summary)


def _pass_through(hook: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(*args, **kwargs)

    return wrapper


_PASS_THROUGH = _pass_through(print).__code__


def _is_pass_through(bound: Any, new: Any) -> bool:
    """Whether ``bound`` is a plain function that only calls ``new`` with its
    own arguments and returns its answer (as HookRegistry's REPLACE wraps)."""
    code = getattr(bound, "__code__", None)
    cells = getattr(bound, "__closure__", None) or ()
    return (type(bound) is types.FunctionType and code is not None
            and code.co_code == _PASS_THROUGH.co_code
            and code.co_flags & 0xFFFF == _PASS_THROUGH.co_flags & 0xFFFF  # (not __future__)
            and code.co_varnames == _PASS_THROUGH.co_varnames
            and code.co_freevars == _PASS_THROUGH.co_freevars
            and code.co_names == _PASS_THROUGH.co_names
            and code.co_consts == _PASS_THROUGH.co_consts
            and len(cells) == 1 and cells[0].cell_contents is new)


def _unwrap_hook_wrappers() -> None:
    """SGLang's HookRegistry installs kvest's function inside one of its own,
    ``wrapper(*args, **kwargs): return hook(*args, **kwargs)`` with upstream's
    name (``functools.wraps``), bound wherever upstream's function was: one
    Python call more on every call (about 0.1 µs: at a batch of one, more
    than kvest's kernel saves).  Where the binding is exactly that
    pass-through of kvest's function (nothing else wrapped around it), every
    binding of it becomes kvest's function itself -- what HookRegistry meant,
    without the extra call.  Any other wrapper of kvest's function is left
    where it is, named as kvest's so that ``repr()`` shows what runs."""
    for owner, attr, original, new in STATE.hooked:
        bound = vars(owner).get(attr)
        if bound is new or getattr(bound, "__wrapped__", None) is not original:
            continue
        if _is_pass_through(bound, new):
            setattr(owner, attr, new)
            for module in list(sys.modules.values()):
                if isinstance(module, types.ModuleType) and module is not owner:
                    for name, value in list(vars(module).items()):
                        if value is bound:
                            setattr(module, name, new)
            continue
        cells = [c.cell_contents for c in getattr(bound, "__closure__", None) or ()]
        if any(c is new for c in cells):
            bound.__qualname__ = new.__qualname__
            bound.__kvest_original__ = original


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summary() -> None:
    """Log the shadow-mode counters (periodically, and at exit): medians and
    99th percentiles of the recent calls, so that one slow call decides nothing."""
    STATE.last_summary = time.monotonic()
    for s in list(STATE.spots.values()):
        if s.compared:
            k, u = s.kvest_ns, s.upstream_ns
            logger.info("kvest shadow: %s: %d compared, %d mismatches; kvest median %s us "
                        "(p99 %s), upstream median %s us (p99 %s)", s.name, s.compared,
                        s.mismatches, _us(k.quantile(0.5)), _us(k.quantile(0.99)),
                        _us(u.quantile(0.5)), _us(u.quantile(0.99)))


def _comparable(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_comparable(v) for v in value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, (int, list)):
        return tolist()
    return value


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[Any, BaseException | None, int]:
    start = time.perf_counter_ns()
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return None, exc, time.perf_counter_ns() - start
    return value, None, time.perf_counter_ns() - start


def record(name: str, same: bool, kvest_ns: int, upstream_ns: int,
           report: Callable[[], str]) -> None:
    """One shadow comparison of hot spot ``name``: counted, timed, and the
    first mismatch logged with ``report()`` (which must not change anything;
    if it raises, the mismatch is still counted)."""
    entry = spot(name)
    with _SHADOW_LOCK:  # (+= is no single step: two threads must not lose a count)
        entry.compared += 1
        entry.mismatches += int(not same)
        entry.upstream_ns.add(upstream_ns)
        entry.kvest_ns.add(kvest_ns)
        first = not same and entry.first_mismatch is None
        if first:
            entry.first_mismatch = ""  # (taken: one thread writes the report)
    if first:
        try:  # the report reads the arguments again: it must never raise
            text = report()
        except Exception as exc:
            text = f"(no reproduction: reading the arguments raised {exc!r})"
        entry.first_mismatch = text
        logger.warning("kvest shadow: first mismatch in %s: %s", name, text)
    if time.monotonic() - STATE.last_summary > SUMMARY_EVERY:
        summary()


def shadow(original: Callable[..., Any], replaced: Callable[..., Any], name: str
           ) -> Callable[..., Any]:
    """``original`` and ``replaced`` both run, ``original``'s answer is returned
    (both only read their inputs: the writers are compared statement by
    statement instead, :func:`kvest.sglang.rewrite.rebuild`).

    A shadowed hot spot called from inside another one's shadow call is
    compared too, once: on the caller's kvest side, where its own kvest side
    is the one that runs anyway (so each call of kvest's code is counted once)
    and answers the caller, and its upstream side is run beside it (a reader:
    run twice, once a side), its time taken out of the caller's kvest time.
    On the caller's upstream side it runs upstream's code alone."""

    def shadowed(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_side, "name", None)
        if outer is Side.UPSTREAM:
            return original(*args, **kwargs)
        if not STATE.announced:
            announce()
        try:
            _side.name = Side.UPSTREAM
            value, error, upstream_ns = _outcome(original, args, kwargs)
            _side.name, nested = Side.KVEST, getattr(_side, "nested_ns", 0)
            _side.nested_ns = 0
            mine, mine_error, kvest_ns = _outcome(replaced, args, kwargs)
            # (the upstream sides of the hot spots it reached, compared inside it)
            kvest_ns -= _side.nested_ns
            _side.nested_ns = nested + (upstream_ns if outer is Side.KVEST else 0)
        finally:
            _side.name = outer
        try:
            same = (type(error) is type(mine_error) and str(error) == str(mine_error)
                    if error is not None or mine_error is not None
                    else _comparable(value) == _comparable(mine))
        except Exception:
            same = False
        record(name, same, kvest_ns, upstream_ns,
               lambda: _reproduction(args, kwargs, value, error, mine, mine_error))
        if outer is Side.KVEST:  # (the caller's kvest side goes on with kvest's answer)
            value, error = mine, mine_error
        if error is not None:
            raise error
        return value

    return shadowed


def kernel_failed(name: str, kernel: Any, error: BaseException, args: tuple[Any, ...]
                  ) -> None:
    """``kernel``, called by hot spot ``name``'s glue with ``args``, raised
    ``error``: a decline (:data:`DECLINES`) is nothing more; anything else is
    counted as the hot spot's failure and logged, the first of each hot spot,
    with what reproduces it.  Upstream's statement answers either way (the
    call counts as a fallback).  Never raises: it runs inside SGLang's step."""
    if isinstance(error, DECLINES):
        return
    entry = spot(name)
    with _SHADOW_LOCK:
        entry.failures += 1
        first = entry.first_failure is None
        if first:
            entry.first_failure = ""  # (taken: one thread writes the report)
    if not first:
        return
    try:
        inputs = str([_lengths(a) for a in args])[:2000]
    except Exception as exc:
        inputs = f"(not shown: reading them raised {exc!r})"
    where = f"{getattr(kernel, '__module__', '?')}.{getattr(kernel, '__qualname__', kernel)}"
    entry.first_failure = (f"{where} raised {type(error).__name__}: {error}; inputs "
                           f"(requests as (committed, allocated)) {inputs}{_config()}")
    logger.warning("kvest: %s: a kernel failed and SGLang's own statement answered "
                   "(counted in status()'s failures; only the first is logged): %s",
                   name, entry.first_failure,
                   exc_info=(type(error), error, error.__traceback__))


def _lengths(value: Any) -> Any:
    """A compact picture of an argument: requests as their lengths."""
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        return [_lengths(v) for v in value[:64]] + (["..."] if len(value) > 64 else [])
    kv = getattr(value, "kv", None)
    source = kv if kv is not None and hasattr(kv, "kv_allocated_len") else value
    if hasattr(source, "kv_allocated_len") or hasattr(value, "kv_committed_len"):
        committed = getattr(source, "kv_committed_len", getattr(value, "kv_committed_len", None))
        return (committed, getattr(source, "kv_allocated_len", None))
    reqs = getattr(value, "reqs", None)
    if isinstance(reqs, list):
        page = getattr(getattr(value, "token_to_kv_pool_allocator", None), "page_size", None)
        return {"page_size": page, "reqs": _lengths(reqs)}
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return value


def _reproduction(args: tuple[Any, ...], kwargs: dict[str, Any], value: Any,
                  error: BaseException | None, mine: Any, mine_error: BaseException | None
                  ) -> str:
    upstream = repr(error) if error is not None else repr(_comparable(value))
    kvest_side = repr(mine_error) if mine_error is not None else repr(_comparable(mine))
    inputs = {"args": [_lengths(a) for a in args],
              "kwargs": {k: _lengths(v) for k, v in kwargs.items()}}
    return (f"upstream {upstream[:200]}, kvest {kvest_side[:200]}; inputs (committed, "
            f"allocated) {str(inputs)[:2000]}{_config()}")


def _config() -> str:
    """The speculative settings upstream read, where the release can say them
    (nothing where it cannot: a server without speculation publishes none)."""
    import sys

    for name in ALLOC_SETTINGS_MODULES:
        fn = getattr(sys.modules.get(name), "get_alloc_len_per_decode", None)
        if callable(fn):
            try:
                return f"; config get_alloc_len_per_decode() = {fn()}"
            except Exception:
                return ""
    return ""


def note(entry: Spot, kind: NoteKind, text: str) -> None:
    entry.notes.append(Note(kind, text))
