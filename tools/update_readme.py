"""Regenerate the README's benchmark section from a real run.

    python tools/update_readme.py [--quick] [--sglang-python PYTHON [--sglang-pythonpath DIRS]]

runs ``python -m kvest bench --plot docs/bench.png --markdown <tmp>`` with the
installed kvest (arrays and request objects), and, given ``--sglang-python``,
``PYTHON -m kvest bench --sglang`` with an interpreter whose environment has
SGLang's scheduler modules (the real-SGLang section, plot
``docs/bench-sglang.png``); kvest and matplotlib must import there too, installed
in it or found through ``--sglang-pythonpath`` (set as ``PYTHONPATH`` for that
run only).  It then replaces the text between the
``bench:start`` and ``bench:end`` markers in README.md with what they wrote.
Without ``--sglang-python`` the real-SGLang part of the section is kept as it
was.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SGLANG_START, SGLANG_END = "<!-- bench-sglang:start -->", "<!-- bench-sglang:end -->"
# The headline sentence of the real-SGLang run, also shown in the prose above.
HEADLINE_START, HEADLINE_END = "<!-- bench-headline:start -->", "<!-- bench-headline:end -->"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sglang-python", metavar="PYTHON",
                        help="interpreter of an environment where sglang imports")
    parser.add_argument("--sglang-pythonpath", metavar="DIRS",
                        help="PYTHONPATH for the --sglang-python run (kvest, matplotlib)")
    args = parser.parse_args()
    (ROOT / "docs").mkdir(exist_ok=True)
    sglang = None
    if args.sglang_python:
        sglang = _bench(args.sglang_python, ["--sglang"], ROOT / "docs" / "bench.png",
                        args.quick, args.sglang_pythonpath)
        sglang += ("\n\n![decode-step bookkeeping, real sglang against kvest]"
                   "(docs/bench-sglang.png)")
    arrays = _bench(sys.executable, [], ROOT / "docs" / "bench.png", args.quick)
    # Read only now: the runs take minutes, and the prose may change meanwhile.
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    old, tail = rest.split(END, 1)
    if sglang is None:
        if SGLANG_START in old:
            sglang = old.split(SGLANG_START, 1)[1].split(SGLANG_END, 1)[0].strip()
        else:
            sglang = "(not measured: run with --sglang-python)"
    section = (f"{SGLANG_START}\n{sglang}\n{SGLANG_END}\n\n"
               f"{arrays}\n\n![time per request](docs/bench.png)")
    headline = next((line.strip("* ").removeprefix("Headline: ").rstrip(".*")
                     for line in sglang.splitlines() if line.startswith("**Headline:")), None)
    if headline and HEADLINE_START in head:
        before, rest = head.split(HEADLINE_START, 1)
        head = f"{before}{HEADLINE_START}{headline[0].upper()}{headline[1:]}" \
               f"{HEADLINE_END}{rest.split(HEADLINE_END, 1)[1]}"
    readme.write_text(f"{head}{START}\n{section}\n{END}{tail}", encoding="utf-8")
    print("README.md updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
