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


# The request layer's C: CPython's private API, version tests and the
# free-threading switch live in the fence (src/kvest/_src/fence.h) alone.
FENCED = re.compile(r"PY_VERSION_HEX|Py_GIL_DISABLED|_PyType_Lookup|_PyObject_GetDictPtr"
                    r"|\bma_keys\b|\bma_values\b|tp_version_tag|VALID_VERSION_TAG|ob_digit"
                    r"|PyUnstable_|\bT_OBJECT|PyMemberDef|structmember|\[-3\]")


def _layer_sources() -> list[Path]:
    """The compiled request layer: every C header and Cython source but the array
    kernels (the .c files Cython writes beside them are not sources)."""
    return sorted(p for p in SRC.rglob("*") if p.suffix in (".h", ".pyx", ".pxd")
                  and p.name != "_kernels.pyx" and not p.name.startswith("loops"))


def _code(path: Path) -> str:
    """A source's text without its comments (C's, and Cython's ``#`` lines)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(encoding="utf-8"), flags=re.S)
    if path.suffix != ".h":
        text = re.sub(r"(?m)^\s*#(?!\s*(?:if|include|define|endif|else|elif)).*$", "", text)
    return re.sub(r"//.*", "", text)


def test_private_api_is_used_in_the_fence_alone():
    files = _layer_sources()
    assert SRC / "_src" / "fence.h" in files and SRC / "_reqs.pyx" in files
    wrong = [f"{path.relative_to(SRC)}:{n}: {line.strip()}" for path in files
             if path.name != "fence.h"
             for n, line in enumerate(_code(path).splitlines(), 1) if FENCED.search(line)]
    assert not wrong, wrong


def test_the_fence_check_sees_a_private_use(tmp_path):
    assert FENCED.search("    return t->tp_version_tag;")
    assert FENCED.search("#if PY_VERSION_HEX >= 0x030C0000")
    assert FENCED.search("uintptr_t d = ((uintptr_t *)obj)[-3];")
    assert not FENCED.search("#if KV_PY312")
    header = tmp_path / "bad.h"
    header.write_text("/* tp_version_tag in a comment */\n#ifdef Py_GIL_DISABLED\n")
    assert [line for line in _code(header).splitlines() if FENCED.search(line)] == \
        ["#ifdef Py_GIL_DISABLED"]
