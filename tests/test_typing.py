"""The user script that CI type-checks (tests/typing/user_script.py) also runs:
the types it asserts statically are those of values it really gets."""

from __future__ import annotations

import runpy
from pathlib import Path

SCRIPT = Path(__file__).parent / "typing" / "user_script.py"


def test_user_script_runs(capsys):
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    assert "typing script ran: 47 47" in out
