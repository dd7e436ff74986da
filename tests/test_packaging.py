"""What the installed package carries (stubs, py.typed, the public names) and
what `import kvest` does: no silent fallback, environment switches that never
break the import, compiled modules that never load the pure twin."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from importlib import resources

import pytest

import kvest
from kvest import reference

STUBS = ("_kernels.pyi", "_reqs.pyi", "_writes.pyi")
# Built and installed, whichever implementation this run serves: the tests that
# start a fresh interpreter run the compiled kernels even in the pure-Python stage.
BUILT = all(importlib.util.find_spec(f"kvest.{name}") is not None
            for name in ("_kernels", "_reqs", "_writes"))
needs_built = pytest.mark.skipif(not BUILT, reason="the compiled kernels are not built here")


def test_typed_package_files_are_installed():
    root = resources.files("kvest")
    assert root.joinpath("py.typed").is_file()
    for stub in STUBS:
        assert root.joinpath(stub).is_file()


def test_stubs_declare_every_public_function():
    declared = set()
    for stub in STUBS:
        tree = ast.parse(resources.files("kvest").joinpath(stub).read_text())
        declared |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert set(reference.__all__) <= declared


def _stub_signatures() -> dict[str, list[tuple[str, str, str | None]]]:
    """name -> [(parameter, kind, default as written)] of each function in the stubs."""
    out = {}
    for stub in STUBS:
        tree = ast.parse(resources.files("kvest").joinpath(stub).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
                params = [(arg.arg, "POSITIONAL_ONLY" if arg in a.posonlyargs
                           else "POSITIONAL_OR_KEYWORD", d) for arg, d in zip(
                               positional, defaults, strict=True)]
                params += [(arg.arg, "KEYWORD_ONLY", d)
                           for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
                out[node.name] = [(n, k, None if d is None else ast.unparse(d))
                                  for n, k, d in params]
    return out


def _signature(fn) -> list[tuple[str, str, str | None]]:
    import inspect

    return [(p.name, p.kind.name, None if p.default is p.empty else repr(p.default))
            for p in inspect.signature(fn).parameters.values()]


def test_stubs_in_step_with_the_code():
    """Each stub's parameters -- names, kinds (positional or keyword-only) and
    defaults -- are the pure twin's and the compiled kernel's."""
    stubs = _stub_signatures()
    for name in reference.__all__:
        want = _signature(getattr(reference, name))
        assert stubs[name] == want, f"{name}: stub {stubs[name]}, reference {want}"
        if kvest.IMPLEMENTATION == "cython":
            assert _signature(getattr(kvest, name)) == want, name


def test_public_names():
    for name in reference.__all__:
        assert name in kvest.__all__
        assert callable(getattr(kvest, name))


def test_all_is_a_literal_type_checkers_can_read():
    """``kvest.__all__`` is written out (mypy and pyright do not run code) and
    names exactly the functions and exceptions of kvest._names plus the three
    other names."""
    from kvest._names import EXCEPTIONS, FUNCTIONS

    tree = ast.parse(resources.files("kvest").joinpath("__init__.py").read_text())
    (assign,) = [node for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in node.targets)]
    assert isinstance(assign.value, ast.List)
    literal = [ast.literal_eval(element) for element in assign.value.elts]
    assert literal == kvest.__all__
    assert sorted(literal) == sorted(["IMPLEMENTATION", "AllocPlan", "show_config", *FUNCTIONS,
                                   *EXCEPTIONS])
    assert len(set(literal)) == len(literal)
    for name in literal:
        assert hasattr(kvest, name), name


def _elf_sections(path: str) -> list[str]:
    """The section names of an ELF file (64-bit little-endian, as built here)."""
    import struct

    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size
    _, str_offset, str_size = header(shstrndx)
    names = data[str_offset:str_offset + str_size]
    return [names[n:names.index(b"\0", n)].decode() for n, _, _ in map(header, range(shnum))]


@needs_built
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF files")
@pytest.mark.skipif("-g" in os.environ.get("KVEST_CFLAGS", "").split(),
                    reason="a debug build asked for with KVEST_CFLAGS")
@pytest.mark.parametrize("module", ["_kernels", "_reqs"])
def test_extensions_carry_no_debug_info(module):
    """setup.py builds with -g0: no DWARF sections (they made the wheel six
    times its size), while the symbol table that profilers read stays."""
    spec = importlib.util.find_spec(f"kvest.{module}")
    assert spec is not None and spec.origin is not None
    sections = _elf_sections(spec.origin)
    assert not [s for s in sections if s.startswith(".debug_")], sections
    assert ".symtab" in sections or ".dynsym" in sections


# ------------------------------------------------------- what `import kvest` does

# Makes the compiled modules unimportable, as in a source tree nobody built.
BLOCK_COMPILED = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name in ("kvest._kernels", "kvest._reqs"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Blocker())
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("KVEST_PURE_PYTHON", "KVEST_CPU")}
    environ.update(env)
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=environ,
                          capture_output=True, text=True, timeout=120)


def test_import_without_compiled_modules_says_how_to_build():
    done = _run(BLOCK_COMPILED + "import kvest")
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install ." in done.stderr and "KVEST_PURE_PYTHON=1" in done.stderr


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " On "])
def test_pure_python_on_serves_the_twin(value):
    done = _run(BLOCK_COMPILED + "import kvest; from kvest import reference;"
                "assert kvest.IMPLEMENTATION == 'python', kvest.IMPLEMENTATION;"
                "assert kvest.spec_v2_new_tokens is reference.spec_v2_new_tokens;"
                "print(kvest.decode_new_tokens([16, 17], 16))", KVEST_PURE_PYTHON=value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "16"
    assert "Warning" not in done.stderr


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "", "OFF"])
@needs_built
def test_pure_python_off_serves_the_compiled_kernels(value):
    done = _run("import kvest; print(kvest.IMPLEMENTATION)", KVEST_PURE_PYTHON=value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cython"
    assert "Warning" not in done.stderr


@needs_built
def test_pure_python_bad_value_warns_and_keeps_the_default():
    done = _run("import kvest; print(kvest.IMPLEMENTATION)", KVEST_PURE_PYTHON="maybe")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cython"
    assert "RuntimeWarning" in done.stderr and "KVEST_PURE_PYTHON" in done.stderr


@needs_built
@pytest.mark.parametrize("value", ["AVX2", "avx2", " Baseline "])
def test_kvest_cpu_any_case(value):
    done = _run("import kvest._kernels as k; print(k.cpu_variant(), k.cpu_variants())",
                KVEST_CPU=value)
    assert done.returncode == 0, done.stderr
    chosen, available = done.stdout.split(" ", 1)
    if value.strip().lower() in available:
        assert chosen == value.strip().lower()
        assert "Warning" not in done.stderr
    else:  # this CPU cannot run it: a warning, and the best variant
        assert "RuntimeWarning" in done.stderr


@needs_built
def test_kvest_cpu_bogus_value_warns_without_failing():
    done = _run("import kvest; print(kvest.decode_new_tokens([16], 16))", KVEST_CPU="avx9000")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "16"
    assert "RuntimeWarning" in done.stderr and "KVEST_CPU" in done.stderr


@needs_built
def test_compiled_modules_import_nothing_from_the_reference():
    """The twin is an independent implementation: the compiled kernels never
    load it, not on import and not on any call, error paths included."""
    code = """
import sys, numpy as np, kvest
from kvest import _kernels, _reqs
assert kvest.IMPLEMENTATION == "cython"
calls = [
    lambda: kvest.spec_v2_new_tokens([2**63 - 1], [0], 16, 0),
    lambda: kvest.spec_v2_new_tokens([1.5], [0], 16, 0),
    lambda: kvest.decode_alloc_plan([2**62] * 3, [0] * 3, 1, 0),
    lambda: kvest.decode_alloc_plan([1], [2**31], 16, 0, out=(np.zeros(1, np.int32),) * 2),
    lambda: kvest.num_new_pages([2**63 - 1] * 2, 1, [0, 0]),
    lambda: kvest.num_new_pages([-1], 16, decode=True),
    lambda: kvest.spec_v1_new_tokens(2**62, 16, 3, 1, 4),
    lambda: kvest.alloc_len_per_decode(3, 1, 4, 16, speculative="yes"),
    lambda: kvest.spec_v2_new_tokens_from_reqs([object()], 16, 6),
    lambda: kvest.decode_new_tokens_from_reqs(None, 16),
]
for call in calls:
    try:
        call()
    except Exception:
        pass
loaded = sorted(m for m in sys.modules if m.startswith("kvest.reference"))
assert not loaded, loaded
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("where", "names"), [
    ("_kernels.pyi", "ARRAY_FUNCTIONS"), ("_reqs.pyi", "REQ_FUNCTIONS"),
    ("_writes.pyi", "WRITE_FUNCTIONS"),
])
def test_every_stub_all_is_the_names_list_written_out(where, names):
    """The stubs write ``__all__`` out, for type checkers (which run no code);
    each is exactly its list in kvest._names."""
    from kvest import _names

    path = resources.files("kvest").joinpath(where)
    tree = ast.parse(path.read_text())
    (assign,) = [node for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in node.targets)]
    assert sorted(ast.literal_eval(e) for e in assign.value.elts) == sorted(getattr(_names, names))


@pytest.mark.parametrize(("module", "names"), [
    ("kvest.reference._kernels", "ARRAY_FUNCTIONS"), ("kvest.reference._reqs", "REQ_FUNCTIONS"),
    ("kvest.reference._writes", "WRITE_FUNCTIONS"), ("kvest.reference", "FUNCTIONS"),
])
def test_the_twins_all_is_the_names_list(module, names):
    """The pure twin's modules take ``__all__`` from kvest._names (as the compiled
    modules do), and define every name in it."""
    import importlib

    from kvest import _names

    found = importlib.import_module(module)
    assert list(found.__all__) == list(getattr(_names, names))
    for name in found.__all__:
        assert callable(getattr(found, name)), name


def test_what_type_checkers_import_is_the_names_list():
    """``kvest/__init__.py`` imports each public function from its compiled
    module's stub under ``TYPE_CHECKING`` (type checkers run no code): exactly
    kvest._names' list of that module."""
    from kvest import _names

    tree = ast.parse(resources.files("kvest").joinpath("__init__.py").read_text())
    (block,) = [node for node in tree.body if isinstance(node, ast.If)
                and getattr(node.test, "id", None) == "TYPE_CHECKING"]
    imported = {node.module: sorted(a.name for a in node.names) for node in block.body
                if isinstance(node, ast.ImportFrom)}
    assert imported == {"kvest._kernels": sorted(_names.ARRAY_FUNCTIONS),
                        "kvest._reqs": sorted(_names.REQ_FUNCTIONS),
                        "kvest._writes": sorted(_names.WRITE_FUNCTIONS)}
