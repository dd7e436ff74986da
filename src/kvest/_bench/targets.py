"""The verdicts: each target of the benchmark, what was measured, met or missed."""

from __future__ import annotations

import enum
from typing import NamedTuple

# (target, measured, met); met is None when the run did not measure that cell.
Verdict = tuple[str, str, bool | None]


class Outcome(enum.Enum):
    """A verdict's word, as the terminal prints it."""

    MET = "met"
    MISSED = "MISSED"
    NOT_MEASURED = "–"


def outcome(item: Verdict) -> Outcome:
    met = item[2]
    return Outcome.NOT_MEASURED if met is None else Outcome.MET if met else Outcome.MISSED


# What the verdicts' words and the arrays' floor mean: printed under the tables
# (and the floor in the figure's legend), so that a reader needs no docs.
LEGEND = ("met: this run's medians meet the target; MISSED: they do not (bench --check "
          "then exits 1); –: this run did not measure that cell.")
FLOOR = ("floor: np.add.reduce over each input array, the time to read the inputs once "
         "(a lower bound for any implementation); kvest / floor ≤ 1: kvest takes no longer "
         "than reading its inputs.")
QUICK_MISSED = ("A MISSED on a --quick run (fewer, shorter samples; one pair of SGLang "
                "workers) can be the short run: a run without --quick decides.")


class Tally(NamedTuple):
    """The targets of a run by outcome, each a list of labels."""

    met: list[str]
    missed: list[str]
    not_measured: list[str]


def tally(items: list[Verdict]) -> Tally:
    by = {o: [label for label, *_ in (i for i in items if outcome(i) is o)] for o in Outcome}
    return Tally(by[Outcome.MET], by[Outcome.MISSED], by[Outcome.NOT_MEASURED])


def summary(items: list[Verdict], quick: bool) -> str:
    """The run's verdicts in a few lines: counts, what the words mean, which
    targets were not measured (and that --quick is why), what a MISSED means."""
    t = tally(items)
    lines = [f"Targets: {len(t.met)} met, {len(t.missed)} MISSED, "
             f"{len(t.not_measured)} not measured.", LEGEND]
    if t.not_measured:
        why = ("--quick does not measure" if quick else "Not measured on this run")
        lines.append(f"{why}: " + "; ".join(t.not_measured)
                     + (" (a run without --quick measures them)." if quick else "."))
    if t.missed and quick:
        lines.append(QUICK_MISSED)
    return "\n".join(lines)


def verdicts(items: list[Verdict], markdown: bool) -> str:
    """The verdicts as a table: ``met``, ``MISSED`` (Markdown: bold), or ``–``."""

    def word(item: Verdict) -> str:
        o = outcome(item)
        return "**missed**" if markdown and o is Outcome.MISSED else o.value

    if markdown:
        return "\n".join(["| target | measured | |", "| --- | ---: | --- |"]
                         + [f"| {a} | {b} | {word((a, b, c))} |" for a, b, c in items])
    width = max((len(a) for a, _, _ in items), default=0)
    measured = max((len(b) for _, b, _ in items), default=0)
    return "\n".join(f"{a:<{width}}  {b:<{measured}}  {word((a, b, c))}".rstrip()
                     for a, b, c in items)
