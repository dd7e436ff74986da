"""Regenerate the README's benchmark section from a real run.

    python tools/update_readme.py [--quick]

runs ``python -m kvest bench --plot docs/bench.png --markdown <tmp>`` with the
installed kvest, then replaces the text between the ``bench:start`` and
``bench:end`` markers in README.md with the table it wrote.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "bench.md"
        cmd = [sys.executable, "-m", "kvest", "bench", "--plot", str(ROOT / "docs" / "bench.png"),
               "--markdown", str(md)] + (["--quick"] if quick else [])
        (ROOT / "docs").mkdir(exist_ok=True)
        subprocess.run(cmd, check=True, cwd=tmp)  # cwd: import the installed kvest
        table = md.read_text(encoding="utf-8").strip()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table}\n\n![time per request](docs/bench.png)\n{END}{tail}",
                      encoding="utf-8")
    print(f"README.md updated from: {' '.join(cmd[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
