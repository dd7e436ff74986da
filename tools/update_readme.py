"""Regenerate the benchmark results: docs/benchmarks.md in full, the README's headline.

    python tools/update_readme.py [--quick] [--sglang-python PYTHON [--sglang-pythonpath DIRS]]
    python tools/update_readme.py --sglang-python PYTHON --sglang-only
    python tools/update_readme.py --from-recorded [--redraw]

The first form runs ``python -m kvest bench --plot docs/bench.png --markdown
<tmp>`` with the installed kvest (arrays and request objects), and, given
``--sglang-python``, ``PYTHON -m kvest bench --sglang`` with an interpreter
whose environment has SGLang's scheduler modules (the real-SGLang section, plot
``docs/bench-sglang.png``); kvest and matplotlib must import there too,
installed in it or found through ``--sglang-pythonpath`` (set as ``PYTHONPATH``
for that run only).  It replaces the text between the ``bench:start`` and
``bench:end`` markers of docs/benchmarks.md with what they wrote.  Without
``--sglang-python`` the real-SGLang part is kept as it was; with
``--sglang-only`` only the real-SGLang part is rerun, and the array and object
tables (each headed by the run it came from) and ``bench.png`` are kept.  The
tables are cut to what a reader needs (the generators' ``dense``; the
terminal shows every cell), and docs/benchmarks.md must stay within 3,000
words (tests/test_bench.py).

Either way, the README's headline (the sentence between the
``bench-headline`` markers and the short table between the ``bench-table``
markers) is then derived from the real-SGLang part of docs/benchmarks.md, so
the two files always show the same run.  ``--from-recorded`` runs nothing and
only rewrites the README's headline from docs/benchmarks.md; ``--redraw`` also
cuts the recorded tables and verdicts as the current code does, every kept cell
as recorded, and redraws a figure where the page still holds all its points
(tools/redraw_bench.py; no new measurement).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SGLANG_START, SGLANG_END = "<!-- bench-sglang:start -->", "<!-- bench-sglang:end -->"
HEADLINE_START, HEADLINE_END = "<!-- bench-headline:start -->", "<!-- bench-headline:end -->"
TABLE_START, TABLE_END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
# The README's short table: these hot spots at these batch sizes.
HEADLINE_ROWS = ("step, no spec", "step, EAGLE", "retract k=8")
HEADLINE_SIZES = ("n=1", "n=256", "n=1,024", "n=4,096")


def _bench(python: str, extra: list[str], plot: Path, quick: bool,
           pythonpath: str | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "bench.md"
        cmd = [python, "-m", "kvest", "bench", *extra, "--plot", str(plot),
               "--markdown", str(md)] + (["--quick"] if quick else [])
        print("running:", " ".join(cmd), file=sys.stderr)
        env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
        subprocess.run(cmd, check=True, cwd=tmp, env=env)  # cwd: import the installed kvest
        return md.read_text(encoding="utf-8").strip()


def _between(text: str, start: str, end: str) -> tuple[str, str, str]:
    """(before start marker, between the markers, from the end marker on)."""
    head, rest = text.split(start, 1)
    middle, tail = rest.split(end, 1)
    return head, middle, tail


def _tables(markdown: str) -> list[list[list[str]]]:
    """Every Markdown table in the text: rows of cells, the rule row left out."""
    tables, current = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def headline_table(sglang: str) -> str:
    """The README's short table, cut from the real-SGLang hot-spot table."""
    table = next(t for t in _tables(sglang) if t[0][0] == "hot spot")
    head = table[0]
    cols = [head.index(size) for size in HEADLINE_SIZES if size in head]
    rows = [r for r in table[1:] if r[0] in HEADLINE_ROWS]
    lines = ["| decode-step bookkeeping | " + " | ".join(head[c] for c in cols) + " |",
             "| --- |" + " ---: |" * len(cols)]
    lines += ["| " + r[0] + " | " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def headline_sentence(sglang: str) -> str | None:
    line = next((line for line in sglang.splitlines() if line.startswith("**Headline:")), None)
    if line is None:
        return None
    text = line.strip("* ").removeprefix("Headline: ").rstrip(".*")
    return text[0].upper() + text[1:]


def update_readme(sglang: str) -> None:
    text = README.read_text(encoding="utf-8")
    sentence = headline_sentence(sglang)
    if sentence:
        head, _, tail = _between(text, HEADLINE_START, HEADLINE_END)
        text = f"{head}{HEADLINE_START}{sentence}{HEADLINE_END}{tail}"
    head, _, tail = _between(text, TABLE_START, TABLE_END)
    text = f"{head}{TABLE_START}\n{headline_table(sglang)}\n{TABLE_END}{tail}"
    README.write_text(text, encoding="utf-8")
    print("README.md headline updated", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bench --quick: a shorter run")
    parser.add_argument("--sglang-python", metavar="PYTHON",
                        help="interpreter of an environment where sglang imports")
    parser.add_argument("--sglang-pythonpath", metavar="DIRS",
                        help="PYTHONPATH for the --sglang-python run (kvest, matplotlib)")
    parser.add_argument("--sglang-only", action="store_true",
                        help="with --sglang-python: rerun only the real-SGLang part, and keep "
                             "the recorded array and object tables (and bench.png)")
    parser.add_argument("--from-recorded", action="store_true",
                        help="run nothing: the README's headline from docs/benchmarks.md")
    parser.add_argument("--redraw", action="store_true",
                        help="with --from-recorded: re-render the recorded tables and figures")
    args = parser.parse_args()
    if args.redraw and not args.from_recorded:
        parser.error("--redraw goes with --from-recorded")
    if args.sglang_only and not args.sglang_python:
        parser.error("--sglang-only goes with --sglang-python")
    docs = ROOT / "docs"
    if args.from_recorded:
        if args.redraw:
            sys.path.insert(0, str(Path(__file__).parent))
            from redraw_bench import redraw

            redraw(RESULTS, docs)
        text = RESULTS.read_text(encoding="utf-8")
        update_readme(_between(_between(text, START, END)[1], SGLANG_START, SGLANG_END)[1])
        return 0
    sglang = None
    if args.sglang_python:
        sglang = _bench(args.sglang_python, ["--sglang"], docs / "bench.png",
                        args.quick, args.sglang_pythonpath)
        sglang += ("\n\n![decode-step bookkeeping, real sglang against kvest]"
                   "(bench-sglang.png)")
    arrays = None if args.sglang_only else _bench(sys.executable, [], docs / "bench.png",
                                                   args.quick)
    # Read only now: the runs take minutes, and the prose may change meanwhile.
    text = RESULTS.read_text(encoding="utf-8")
    head, old, tail = _between(text, START, END)
    if arrays is None:  # the recorded tables, from the run their header names
        arrays = _between(old, SGLANG_END, "\n\n![time per request]")[1].strip()
    if sglang is None:
        if SGLANG_START in old:
            sglang = _between(old, SGLANG_START, SGLANG_END)[1].strip()
        else:
            sglang = "(not measured: run with --sglang-python)"
    section = (f"{SGLANG_START}\n{sglang}\n{SGLANG_END}\n\n"
               f"{arrays}\n\n![time per request](bench.png)")
    RESULTS.write_text(f"{head}{START}\n{section}\n{END}{tail}", encoding="utf-8")
    print("docs/benchmarks.md updated", file=sys.stderr)
    update_readme(sglang)
    return 0


if __name__ == "__main__":
    sys.exit(main())
