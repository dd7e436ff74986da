"""The verdicts: each target of the benchmark, what was measured, met or missed."""

from __future__ import annotations

# (target, measured, met); met is None when the run did not measure that cell.
Verdict = tuple[str, str, bool | None]


def verdicts(items: list[Verdict], markdown: bool) -> str:
    """The verdicts as a table: ``met``, ``MISSED`` (Markdown: bold), or ``–``."""

    def word(met: bool | None) -> str:
        if met is None:
            return "–"
        return "met" if met else ("**missed**" if markdown else "MISSED")

    if markdown:
        return "\n".join(["| target | measured | |", "| --- | ---: | --- |"]
                         + [f"| {a} | {b} | {word(c)} |" for a, b, c in items])
    width = max((len(a) for a, _, _ in items), default=0)
    measured = max((len(b) for _, b, _ in items), default=0)
    return "\n".join(f"{a:<{width}}  {b:<{measured}}  {word(c)}".rstrip()
                     for a, b, c in items)
