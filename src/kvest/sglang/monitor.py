"""What kvest does in this SGLang process: :func:`status`, counters, shadow mode, the log line.

Switch (``KVEST_SGLANG``, read once when the plugin loads):

- unset, ``1``/``on``/``true``/``yes``: kvest's kernels answer;
- ``shadow``: kvest and upstream both run on every call, upstream's answer is
  returned, and kvest counts calls, mismatches and time per hot spot; the
  first mismatch of each hot spot is logged with what reproduces it;
- ``0``/``off``/``false``/``no``: SGLang's own code runs;
- anything else: off, with a warning that quotes the value (the safe side is
  upstream's code).

The status line is logged once per scheduler process on the first call of a
replaced function -- by then SGLang has configured logging, which it does only
after loading plugins -- as INFO, plus a WARNING for each hot spot left alone.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Spot", "mode", "status"]

logger = logging.getLogger("kvest.sglang")

_ON = frozenset({"", "1", "on", "true", "yes", "y", "t"})
_OFF = frozenset({"0", "off", "false", "no", "n", "f"})
SUMMARY_EVERY = 600.0  # seconds between shadow-mode summaries


def mode(environ: dict[str, str] | None = None) -> tuple[str, str | None]:
    """``("on" | "shadow" | "off", warning or None)`` from ``KVEST_SGLANG``."""
    raw = (os.environ if environ is None else environ).get("KVEST_SGLANG")
    if raw is None:
        return "on", None
    value = raw.strip().lower()
    if value in _ON:
        return "on", None
    if value == "shadow":
        return "shadow", None
    if value in _OFF:
        return "off", None
    return "off", (f"KVEST_SGLANG={raw!r} is not one of 1/on, shadow, 0/off: kvest is off "
                   "and SGLang runs its own code")


@dataclasses.dataclass
class Spot:
    """One hot spot: what kvest did with it and what happened since."""

    name: str
    # "replaced", "shadow", "left alone" (code kvest did not match), "skipped"
    # (someone else's hook there already, torch not loaded) or "absent"
    state: str = "absent"
    patterns: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    kernel: int = 0  # calls a kernel answered
    fallbacks: int = 0  # calls where the kernel declined and upstream's code answered
    shadow_calls: int = 0
    mismatches: int = 0
    kvest_ns: int = 0
    upstream_ns: int = 0
    first_mismatch: str | None = None


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = "off"
        self.sglang = "unknown"
        self.scheduler = False
        self.spots: dict[str, Spot] = {}
        self.announced = False
        self.last_summary = time.monotonic()
        self.atexit = False
        # (owner, attribute, upstream's function, kvest's) registered with SGLang's
        # HookRegistry, whose wrapper takes upstream's name: renamed on first call.
        self.hooked: list[tuple[Any, str, Any, Any]] = []


STATE = _State()


def reset(mode_: str, sglang: str, scheduler: bool) -> None:
    STATE.mode, STATE.sglang, STATE.scheduler = mode_, sglang, scheduler
    STATE.spots = {}
    STATE.announced = False
    STATE.hooked = []


def spot(name: str) -> Spot:
    found = STATE.spots.get(name)
    if found is None:
        found = STATE.spots[name] = Spot(name)
    return found


def status() -> dict[str, Any]:
    """A snapshot: ``mode``, ``sglang`` (its version), ``scheduler`` (whether
    this process runs SGLang's scheduler), and per hot spot its ``state``
    (replaced, shadow, left alone, skipped, absent), the ``patterns`` compiled, the
    ``notes`` (why anything was left alone), and the counters: ``kernel``
    answers, ``fallbacks`` to upstream's code, ``shadow_calls``,
    ``mismatches``, ``kvest_ns`` and ``upstream_ns`` (shadow mode), and the
    ``first_mismatch``."""
    with STATE.lock:
        return {
            "mode": STATE.mode, "sglang": STATE.sglang, "scheduler": STATE.scheduler,
            "hotspots": {name: dataclasses.asdict(copy.deepcopy(s))
                         for name, s in STATE.spots.items()},
        }


def left_alone(spot: Spot) -> list[str]:
    """The notes of ``spot`` that say some of its code was left alone."""
    if spot.state == "left alone":
        return spot.notes or ["no pattern kvest ships"]
    return [n for n in spot.notes if n.endswith("left alone")]


def describe() -> list[tuple[int, str]]:
    """The status as log records: (level, message)."""
    import kvest

    spots = list(STATE.spots.values())
    done = [s for s in spots if s.state in ("replaced", "shadow")]
    left = [s for s in spots if left_alone(s)]
    head = (f"kvest {kvest.__version__} ({kvest.IMPLEMENTATION}), sglang {STATE.sglang}, "
            f"mode {STATE.mode}: ")
    head += ("; ".join(f"{s.name} {s.state} ({', '.join(s.patterns)})" for s in done)
             or "nothing replaced")
    records = [(logging.INFO, head)]
    for s in left:
        records += [(logging.WARNING, f"kvest: {s.name} left alone: {note}")
                    for note in left_alone(s)]
    return records


def announce() -> None:
    """Log the status line (once per process; called on a replaced function's first call)."""
    with STATE.lock:
        if STATE.announced:
            return
        STATE.announced = True
    _name_hook_wrappers()
    for level, message in describe():
        logger.log(level, "%s", message)
    if STATE.mode == "shadow" and not STATE.atexit:
        STATE.atexit = True
        atexit.register(summary)


def _name_hook_wrappers() -> None:
    """SGLang's HookRegistry wraps kvest's function in one of its own that
    copies upstream's name (``functools.wraps``): give that wrapper kvest's
    name, so ``repr()`` shows what runs (``__wrapped__`` stays upstream's)."""
    for owner, attr, original, new in STATE.hooked:
        bound = vars(owner).get(attr)
        if bound is new or getattr(bound, "__wrapped__", None) is not original:
            continue
        cells = [c.cell_contents for c in getattr(bound, "__closure__", None) or ()]
        if any(c is new for c in cells):
            bound.__qualname__ = new.__qualname__
            bound.__kvest_original__ = original


def summary() -> None:
    """Log the shadow-mode counters (periodically, and at exit)."""
    STATE.last_summary = time.monotonic()
    for s in STATE.spots.values():
        if s.shadow_calls:
            logger.info("kvest shadow: %s: %d calls, %d mismatches, kvest %.1f us/call, "
                        "upstream %.1f us/call", s.name, s.shadow_calls, s.mismatches,
                        s.kvest_ns / s.shadow_calls / 1e3, s.upstream_ns / s.shadow_calls / 1e3)


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


def shadow(original: Callable[..., Any], replaced: Callable[..., Any], name: str
           ) -> Callable[..., Any]:
    """``original`` and ``replaced`` both run, ``original``'s answer is returned
    (both are pure: they only read their inputs)."""
    entry = spot(name)

    def shadowed(*args: Any, **kwargs: Any) -> Any:
        if not STATE.announced:
            announce()
        value, error, upstream_ns = _outcome(original, args, kwargs)
        mine, mine_error, kvest_ns = _outcome(replaced, args, kwargs)
        entry.shadow_calls += 1
        entry.upstream_ns += upstream_ns
        entry.kvest_ns += kvest_ns
        same = (type(error) is type(mine_error) and str(error) == str(mine_error)
                if error is not None or mine_error is not None
                else _comparable(value) == _comparable(mine))
        if not same:
            entry.mismatches += 1
            if entry.first_mismatch is None:
                entry.first_mismatch = _reproduction(args, kwargs, value, error, mine,
                                                     mine_error)
                logger.warning("kvest shadow: first mismatch in %s: %s", name,
                               entry.first_mismatch)
        if time.monotonic() - STATE.last_summary > SUMMARY_EVERY:
            summary()
        if error is not None:
            raise error
        return value

    return shadowed


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
    config = _config()
    return (f"upstream {upstream[:200]}, kvest {kvest_side[:200]}; inputs (committed, "
            f"allocated) {str(inputs)[:2000]}; config {config}")


def _config() -> str:
    """The speculative settings upstream read, where a release exposes them."""
    import sys

    for name in ("sglang.srt.mem_cache.allocation_sizing", "sglang.srt.mem_cache.common",
                 "sglang.srt.managers.utils"):
        module = sys.modules.get(name)
        fn = getattr(module, "get_alloc_len_per_decode", None)
        if callable(fn):
            try:
                return f"get_alloc_len_per_decode() = {fn()}"
            except Exception as exc:
                return f"get_alloc_len_per_decode() raised {exc!r}"
    return "unknown"
