"""Redraw the recorded benchmark results with the current code, measuring nothing.

``python tools/update_readme.py --from-recorded --redraw`` calls :func:`redraw`:
the tables of docs/benchmarks.md are read back into the benchmark's own rows
(times as recorded, three significant digits) and the figures are drawn again
by ``kvest._bench.plots``.  Each recorded table is cut as the generators now
cut theirs (``sglang_step.dense``, ``arrays.dense``; the line events and the
request-object table, whose figures the verdicts give, go), every kept cell
as recorded (ratios recomputed from rounded times would differ in the last
digit); a target the current code no longer judges is dropped from the
recorded verdicts.  A figure is drawn only from a table that holds every
point it draws (a run's full one): from the page's cut tables, the figures
stay as the run drew them.
For when the presentation changes and a new run is not wanted.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvest._bench import arrays, objects, plots, sglang_step

# The title before each verdict table -> the part whose targets it judges.
TARGET_TITLES = {"Targets on real requests:": "sglang", "Targets:": "arrays",
                 "Targets on the release-shaped": "objects"}

UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def seconds(cell: str) -> float | None:
    """``"5.73 µs"`` -> 5.73e-6; ``"–"`` -> None."""
    cell = cell.strip()
    if cell in ("–", ""):
        return None
    value, unit = cell.split()
    return float(value) * UNITS[unit]


def _blocks(text: str) -> list[str]:
    """The text cut into runs of table lines and runs of other lines."""
    blocks: list[str] = []
    for line in text.split("\n"):
        is_table = line.startswith("|")
        if blocks and blocks[-1].startswith("|") == is_table:
            blocks[-1] += "\n" + line
        else:
            blocks.append(line)
    return blocks


def _cells(table: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.split("\n")]
    return [r for r in rows if not all(set(c) <= set("-: ") for c in r)]


def redraw(results: Path, figures: Path) -> None:
    text = results.read_text(encoding="utf-8")
    blocks = _blocks(text)
    tables = {i: _cells(b) for i, b in enumerate(blocks) if b.startswith("|")}
    machine = re.findall(r"^Measured with `[^`]*` on (.*?); median time", text, re.M)
    step_rows: list[sglang_step.StepRow] = []
    speedups: dict[tuple[str, int], float] = {}
    array_rows: list[arrays.Row] = []
    kinds: dict[int, str] = {}
    for i, table in tables.items():
        head, body = table[0], table[1:]
        if head[0] == "hot spot" and all(h.startswith("n=") for h in head[1:]):
            sizes = [int(h.removeprefix("n=").replace(",", "")) for h in head[1:]]
            for r in body:
                for n, cell in zip(sizes, r[1:], strict=True):
                    if cell != "–":
                        times, ratio = cell.split(" (")
                        up, kv = times.split(" → ")
                        step_rows.append(sglang_step.StepRow(r[0], n, seconds(up), seconds(kv)))
                        speedups[r[0], n] = float(ratio.rstrip("×)"))
            kinds[i] = "sglang"
        elif head[0] == "function":
            columns = head[3:head.index("kvest vs loop")]
            for r in body:
                times = {c: seconds(v) for c, v in zip(columns, r[3:], strict=False)}
                array_rows.append(arrays.Row(r[0], int(r[1].replace(",", "")), int(r[2]),
                                             {c: t for c, t in times.items() if t is not None}))
            kinds[i] = "arrays"
        elif head[0] == "requests":  # a run recorded before the cut
            kinds[i] = "gone"  # the verdicts give its ratios
        elif head[0] == "line events":
            kinds[i] = "gone"  # the verdicts give its slopes
        elif head[0] == "target":
            title = blocks[i - 1].strip().rsplit("\n", 1)[-1] if i else ""
            kinds[i] = next((f"{part} targets" for start, part in TARGET_TITLES.items()
                             if title.startswith(start)), "")
    # A figure is drawn only from a run's full table (see the docstring); the
    # array targets name the page sizes measured, so they too are judged again
    # only from a full table.
    step_plotted = {r.n for r in step_rows} >= set(sglang_step.SIZES)
    array_plotted = {r.page_size for r in array_rows} >= set(plots.PLOT_PAGE_SIZES)
    judged = {
        "sglang": [t[0] for t in sglang_step.targets(step_rows)] if step_rows else None,
        "arrays": [t[0] for t in arrays.targets(array_rows)] if array_plotted else None,
        "objects": objects.target_labels(),
    }
    for i, kind in kinds.items():
        if kind == "arrays":
            blocks[i] = arrays.dense(blocks[i])
        elif kind == "sglang":
            blocks[i] = sglang_step.dense(blocks[i])
        elif kind == "gone":
            blocks[i] = None
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            if after is not None and after.startswith("\n"):
                blocks[i + 1] = after[1:]  # and the blank line after it
        elif kind.endswith(" targets") and judged[kind.removesuffix(" targets")] is not None:
            keep = set(judged[kind.removesuffix(" targets")])
            lines = blocks[i].split("\n")
            blocks[i] = "\n".join(lines[:2] + [line for line in lines[2:]
                                              if _cells(line)[0][0] in keep])
    results.write_text("\n".join(b for b in blocks if b is not None), encoding="utf-8")
    version = re.search(r"real sglang (\d[\w.]*)", text)
    if step_rows and version and step_plotted:
        plots.plot_sglang(step_rows, str(figures / "bench-sglang.png"), version.group(1),
                          where=machine[0] if machine else None, speedups=speedups)
    if array_rows and array_plotted:
        plots.plot_arrays(array_rows, str(figures / "bench.png"),
                          where=machine[-1] if machine else None)
    drawn = [name for name, done in (("bench-sglang.png", step_rows and version and step_plotted),
                                      ("bench.png", array_rows and array_plotted)) if done]
    print(f"{results.name}: tables cut as the generators cut them; figures redrawn: "
          f"{', '.join(drawn) or 'none (the page holds the cut tables)'}")
