"""The figures of ``python -m kvest bench --plot`` (matplotlib, the ``plot`` extra).

Each implementation has one colour in every figure (:data:`COLOURS`); int32
data is the same implementation drawn dotted.  The array figure shows page
sizes 16 and 100 only: every power-of-two page size draws the same curves as
16 (the kernels divide by a shift), and 100 stands for the others.  The
real-SGLang figure marks each size with kvest's speedup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvest._bench.timing import machine

if TYPE_CHECKING:
    from kvest._bench.arrays import Row
    from kvest._bench.sglang_step import StepRow

# One colour per implementation, the same in every figure.
COLOURS = {
    "loop": "tab:orange",      # the per-request Python loop, as SGLang writes it
    "sglang": "tab:red",       # SGLang's own code (the real-SGLang figure)
    "numpy": "tab:blue",
    "numba": "tab:purple",
    "kvest": "tab:green",
    "floor": "black",          # reading the inputs once
}
MARKERS = {"loop": "o", "sglang": "o", "numpy": "s", "numba": "v", "kvest": "D", "floor": ""}
# What a legend entry says beyond its column's name (the terminal's legend
# lines, kvest._bench.targets.FLOOR and LEGEND, say the same).
LABELS = {"floor": "floor: reading the inputs once", "floor:int32": "floor:int32"}
# The real-SGLang figure: a speedup below this is the every-size target missed.
MISSED_BELOW = 1.0
SPEEDUP_NOTE = "n× under a point: kvest's speedup"
MISSED_NOTE = f"red n×: below {MISSED_BELOW:g}×, a MISSED target"
# The page sizes the array figure draws (see the module's docstring).
PLOT_PAGE_SIZES = (16, 100)


def style(name: str) -> dict[str, Any]:
    """Line style of a column: ``kvest:int32`` is kvest's colour, dotted."""
    base, _, dtype = name.partition(":")
    return {"color": COLOURS[base], "marker": MARKERS[base] or None, "markersize": 4,
            "linestyle": ":" if dtype else ("--" if base == "floor" else "-")}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_arrays(rows: list[Row], path: str, where: str | None = None) -> None:
    """ns per request against batch size: one panel per function and drawn page size.

    ``where`` names the machine in the title (default: this one)."""
    from kvest._bench.arrays import COLUMNS

    plt = _pyplot()
    fns = sorted({r.fn for r in rows}, reverse=True)
    measured = sorted({r.page_size for r in rows})
    pages = [p for p in PLOT_PAGE_SIZES if p in measured] or measured[:2]
    fig, axes = plt.subplots(len(fns), len(pages), figsize=(5 * len(pages), 3.8 * len(fns)),
                             squeeze=False, sharex=True, sharey=True)
    for i, fn in enumerate(fns):
        for j, p in enumerate(pages):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r.fn == fn and r.page_size == p), key=lambda r: r.n)
            for name in COLUMNS:
                pts = [(r.n, r.times[name] / r.n * 1e9) for r in sel if name in r.times]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, label=LABELS.get(name, name), **style(name))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{fn}, page size {p}", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
            if i == len(fns) - 1:
                ax.set_xlabel("requests in the batch")
            if j == 0:
                ax.set_ylabel("ns per request (median)")
    # One legend below the panels, where it can cover no point.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(where or machine(), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sglang(rows: list[StepRow], path: str, version: str, where: str | None = None,
                speedups: dict[tuple[str, int], float] | None = None) -> None:
    """µs per call against batch size, one panel per hot spot, kvest's speedups marked.

    ``speedups`` (hot spot, n) -> speedup replaces the ratio of the times: a
    redrawn figure marks the ratios its recorded table printed."""
    from kvest._bench.sglang_step import HOT_SPOTS

    plt = _pyplot()
    names = [h for h in HOT_SPOTS if any(r.hot_spot == h for r in rows)]
    cols = 4
    nrows = -(-len(names) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        sel = sorted((r for r in rows if r.hot_spot == name), key=lambda r: r.n)
        xs = [r.n for r in sel]
        ax.plot(xs, [r.upstream * 1e6 for r in sel], label=f"sglang {version}",
                **style("sglang"))
        ax.plot(xs, [r.kvest * 1e6 for r in sel], label="kvest", **style("kvest"))
        for r in sel:
            # The speedup under kvest's point: the figure's point, readable without the table.
            speedup = (speedups or {}).get((r.hot_spot, r.n), r.speedup)
            colour = "tab:red" if speedup < MISSED_BELOW else COLOURS["kvest"]
            ax.annotate(f"{speedup:.1f}×", (r.n, r.kvest * 1e6), textcoords="offset points",
                        xytext=(0, -11), ha="center", fontsize=7, color=colour)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.margins(x=0.08, y=0.15)
        ax.set_title(name, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("requests in the batch")
        ax.set_ylabel("µs per call (median)")
    for k in range(len(names), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    from matplotlib.lines import Line2D

    handles, labels = axes[0][0].get_legend_handles_labels()
    for note, colour in ((SPEEDUP_NOTE, COLOURS["kvest"]), (MISSED_NOTE, "tab:red")):
        handles.append(Line2D([], [], linestyle="none", marker="$×$", color=colour))
        labels.append(note)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(f"decode-step bookkeeping, real sglang {version} against kvest "
                 f"(kvest's speedup under each point); {where or machine()}", fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
