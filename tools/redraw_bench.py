"""Redraw the recorded benchmark results with the current code, measuring nothing.

``python tools/update_readme.py --from-recorded --redraw`` calls :func:`redraw`:
the tables of docs/benchmarks.md are read back into the benchmark's own rows
(times as recorded, three significant digits) and both figures are drawn again
by ``kvest._bench.plots``.  The tables stay as recorded, number for number
(ratios recomputed from rounded times would differ in the last digit); a
target the current code no longer judges is dropped from the recorded verdicts.
For when the presentation changes and a new run is not wanted.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvest._bench import arrays, objects, plots, sglang_step

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
    object_rows: list[objects.ObjectRow] = []
    kinds: dict[int, str] = {}
    last = None
    for i, table in tables.items():
        head, body = table[0], table[1:]
        if head[0] == "hot spot":
            sizes = [int(h.removeprefix("n=").replace(",", "")) for h in head[1:]]
            for r in body:
                for n, cell in zip(sizes, r[1:], strict=True):
                    if cell != "–":
                        times, ratio = cell.split(" (")
                        up, kv = times.split(" → ")
                        step_rows.append(sglang_step.StepRow(r[0], n, seconds(up), seconds(kv)))
                        speedups[r[0], n] = float(ratio.rstrip("×)"))
            kinds[i] = last = "sglang"
        elif head[0] == "function":
            columns = head[3:head.index("kvest vs loop")]
            for r in body:
                times = {c: seconds(v) for c, v in zip(columns, r[3:], strict=False)}
                array_rows.append(arrays.Row(r[0], int(r[1].replace(",", "")), int(r[2]),
                                             {c: t for c, t in times.items() if t is not None}))
            kinds[i] = last = "arrays"
        elif head[0] == "requests":
            for r in body:
                layout = r[5].rsplit("(", 1)[1].rstrip(")")
                object_rows.append(objects.ObjectRow(
                    r[0], layout, r[1], int(r[2].replace(",", "")),
                    {"loop": seconds(r[3]), "kvest": seconds(r[4]),
                     "kvest layout=": seconds(r[5].rsplit(" (", 1)[0])}))
            kinds[i] = last = "objects"
        elif head[0] == "target":
            kinds[i] = f"{last} targets"
    judged = {
        "sglang": [t[0] for t in sglang_step.targets(step_rows)],
        "arrays": [t[0] for t in arrays.targets(array_rows)],
        "objects": [t[0] for t in objects.targets(object_rows)],
    }
    for i, kind in kinds.items():
        if kind.endswith(" targets"):
            keep = set(judged[kind.removesuffix(" targets")])
            lines = blocks[i].split("\n")
            blocks[i] = "\n".join(lines[:2] + [line for line in lines[2:]
                                              if _cells(line)[0][0] in keep])
    results.write_text("\n".join(blocks), encoding="utf-8")
    version = re.search(r"real sglang (\d[\w.]*)", text)
    if step_rows and version:
        plots.plot_sglang(step_rows, str(figures / "bench-sglang.png"), version.group(1),
                          where=machine[0] if machine else None, speedups=speedups)
    if array_rows:
        plots.plot_arrays(array_rows, str(figures / "bench.png"),
                          where=machine[-1] if machine else None)
    print(f"figures redrawn from the numbers recorded in {results.name}")
