"""Times, ratios and tables, as text for the terminal or as Markdown for the docs."""

from __future__ import annotations


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
