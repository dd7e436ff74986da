"""kvest's modules import downward only: the command line (``kvest.cli``,
``kvest.__main__``) over the benchmarks (``kvest._bench``) over the SGLang
integration (``kvest.sglang``) over the kernels.  The doctor's stand-in
requests live in ``kvest.sglang.standins`` for that reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kvest"
# package -> the packages above it, which it must not import
ABOVE = {"kvest.sglang": ("kvest._bench", "kvest.cli", "kvest.__main__"),
         "kvest.reference": ("kvest.sglang", "kvest._bench", "kvest.cli")}
_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import|c?import\s+([\w.]+))", re.M)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, as written (a .pyx file read line by line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return {a or b for a, b in _CIMPORT.findall(text)}
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _files(package: str) -> list[Path]:
    folder = SRC.joinpath(*package.split(".")[1:])
    return sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".pyx"))


@pytest.mark.parametrize("package", list(ABOVE))
def test_nothing_imports_upward(package):
    files = _files(package)
    assert files, package
    wrong = [f"{path.relative_to(SRC)}: {name}" for path in files for name in _imports(path)
             if any(name == up or name.startswith(up + ".") for up in ABOVE[package])]
    assert not wrong, wrong


def test_the_check_sees_an_upward_import(tmp_path):
    """The scan finds the import this test guards against (parity.py once had it)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from kvest._bench.requests import NestedReq\n")
    assert "kvest._bench.requests" in _imports(bad)
    pyx = tmp_path / "bad.pyx"
    pyx.write_text("cimport cython\nfrom kvest._bench import run\n")
    assert "kvest._bench" in _imports(pyx)
