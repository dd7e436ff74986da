"""``kvest.sglang.status()`` as a person reads it: a dict whose ``repr`` is a summary.

:func:`kvest.sglang.status` returns a :class:`Status`: a plain ``dict`` (its
keys documented in docs/sglang.md and pinned by the tests) whose ``repr`` and
``str`` are a few lines a newcomer can read -- the mode and why, each hot
spot's state and counters, and where an operator looks next (the scheduler's
log, the doctor, the metrics, the audit).  ``dict(status())`` is the dict
printed as a dict.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

__all__ = ["INSTRUMENTS", "Status", "render"]

# Where an operator looks: what each instrument says, in one line each.
INSTRUMENTS = (
    ("the log", 'one INFO line per scheduler process (logger "kvest.sglang"): what runs on '
                "kvest and why"),
    ("the doctor", "python -m kvest sglang: the mode a scheduler here would run in, each hot "
                   "spot's state, parity with the installed SGLang"),
    ("the metrics", "SGLang's /metrics with --enable-metrics: kvest_calls_total, kvest_mode "
                    "and the other kvest_* series"),
    ("the audit", "python -m kvest audit: SGLang's own decode-step estimate against what its "
                  "pools hand out"),
)

WIDTH = 96  # the summary's lines, at most

# Hot-spot states listed by name on one line, not one line each.
_GROUPED = ("absent", "not loaded", "off")


class Status(dict):  # type: ignore[type-arg]
    """The snapshot :func:`kvest.sglang.status` returns: a ``dict`` (every key
    as documented) whose ``repr`` is :func:`render`'s summary."""

    __slots__ = ()

    def __repr__(self) -> str:
        return render(self)

    __str__ = __repr__


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def render(report: Mapping[str, Any]) -> str:
    """A status dict in a few lines: the mode and why, the hot spots, the instruments."""
    scheduler = report.get("scheduler")
    head = f"kvest {report.get('kvest')} ({report.get('implementation')})"
    if report.get("sglang") not in (None, "unknown"):
        head += f", sglang {report.get('sglang')}"
    if scheduler:
        head += f", in an SGLang scheduler process: mode {report.get('mode')}"
    else:
        head += (f", not an SGLang scheduler process (mode {report.get('mode')} here; a "
                 f"scheduler started with this environment runs in mode "
                 f"{report.get('scheduler_mode')})")
    lines = textwrap.wrap(head, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    lines += textwrap.wrap(str(report.get("reason")), WIDTH, initial_indent="  ",
                           subsequent_indent="  ", break_on_hyphens=False)
    spots = report.get("hotspots")
    spots = spots if isinstance(spots, Mapping) else {}
    listed = {n: s for n, s in spots.items()
              if isinstance(s, Mapping) and s.get("state") not in _GROUPED}
    if listed:
        width = max(len(n) for n in listed)
        states = max(len(str(s.get("state"))) for s in listed.values())
        lines.append(f"  {'hot spot':{width}}  {'state':{states}} {'calls':>9} {'kernel':>9} "
                     f"{'fallback':>9} {'upstream':>9}")
        for name, spot in listed.items():
            row = (f"  {name:{width}}  {spot.get('state')!s:{states}} "
                   f"{_int(spot.get('calls')):>9,} {_int(spot.get('kernel')):>9,} "
                   f"{_int(spot.get('fallbacks')):>9,} {_int(spot.get('upstream')):>9,}")
            lines.append(row.rstrip())
            if _int(spot.get("failures")):
                lines.append(f"    kernel failures: {_int(spot.get('failures')):,} "
                             f"(upstream answered; the first: {spot.get('first_failure')})")
            shadow = spot.get("shadow")
            if isinstance(shadow, Mapping) and _int(shadow.get("compared")):
                lines.append(f"    shadow: {_int(shadow.get('compared')):,} compared, "
                             f"{_int(shadow.get('mismatches')):,} mismatches")
    for state in _GROUPED:
        names = [n for n, s in spots.items()
                 if isinstance(s, Mapping) and s.get("state") == state]
        if names and len(names) == len(spots):
            lines.append(f"  every hot spot: {state}")
        elif names:
            lines += textwrap.wrap(f"{state}: {', '.join(names)}", WIDTH, initial_indent="  ",
                                   subsequent_indent="    ", break_on_hyphens=False)
    audit = report.get("audit")
    if isinstance(audit, Mapping) and audit.get("installed"):  # (only where it runs)
        lines.append("  audit: " + ", ".join(
            f"{key.replace('_', ' ')} {audit[key]:,}" for key in
            ("steps", "undercounts", "bookkeeping_gaps") if isinstance(audit.get(key), int)))
    lines.append("Where to look:")
    width = max(len(name) for name, _ in INSTRUMENTS)
    for name, what in INSTRUMENTS:
        lines += textwrap.wrap(what, WIDTH, initial_indent=f"  {name:{width}}  ",
                               subsequent_indent=" " * (width + 4), break_on_hyphens=False)
    lines += textwrap.wrap("This is a dict: status()['hotspots'][name] for one hot spot, "
                           "dict(status()) for every key (docs/sglang.md lists them).", WIDTH)
    return "\n".join(lines)
