"""Times, ratios and tables, as text for the terminal or as Markdown for the docs."""

from __future__ import annotations

from collections.abc import Callable


def fmt_time(seconds: float | None) -> str:
    """``1.23 µs``: three significant digits in the largest unit below the value."""
    if seconds is None:
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        # Rounded first: 999.6 µs is 1 ms, not "1e+03 µs".
        value = float(f"{seconds / scale:.3g}")
        if value >= 1:
            return f"{value:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(num: float | None, den: float | None) -> str:
    """``num / den`` as ``12.3×`` (``1,234×`` from 100 up), ``–`` if either is missing."""
    if num is None or den is None:
        return "–"
    r = num / den
    return f"{r:,.0f}×" if r >= 100 else f"{r:.3g}×"


def render(head: list[str], body: list[list[str]], markdown: bool, left: int = 1) -> str:
    """A table; its first ``left`` columns align left, the others (numbers) right."""
    if markdown:
        rule = "|" + "|".join(" --- " if i < left else " ---: " for i in range(len(head))) + "|"
        return "\n".join(["| " + " | ".join(head) + " |", rule]
                         + ["| " + " | ".join(cells) + " |" for cells in body])
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(head)]
    return "\n".join(
        "  ".join(c.ljust(w) if i < left else c.rjust(w)
                  for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
        for cells in [head, ["-" * w for w in widths], *body])


def select(table: str, column: Callable[[str], bool],
           row: Callable[[dict[str, str]], bool] = lambda cells: True) -> str:
    """A Markdown table cut down: the columns whose header ``column`` keeps, the
    rows ``row`` keeps (given header -> cell), every kept cell as it was.

    What docs/benchmarks.md shows of a run: the generators render the whole
    table and cut it with this, and ``tools/redraw_bench.py`` cuts a recorded
    table the same way, so a cut never changes a recorded figure."""
    lines = table.strip("\n").split("\n")
    split = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    head = split[0]
    keep = [i for i, h in enumerate(head) if column(h)]
    out = []
    for k, (line, cells) in enumerate(zip(lines, split, strict=True)):
        if k > 1 and not row(dict(zip(head, cells, strict=True))):
            continue
        if k == 1:  # the rule row: each column's alignment as it was
            cells = [c for c in line.strip().strip("|").split("|")]
            out.append("|" + "|".join(cells[i] for i in keep) + "|")
        else:
            out.append("| " + " | ".join(cells[i] for i in keep) + " |")
    return "\n".join(out)
