"""What the installed package carries (stubs, py.typed, the public names) and
what `import kvest` does: no silent fallback, environment switches that never
break the import, compiled modules that never load the pure twin."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib import resources

import pytest

import kvest
from kvest import reference

STUBS = ("_kernels.pyi", "_reqs.pyi", "_writes.pyi")


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


def test_public_names():
    for name in reference.__all__:
        assert name in kvest.__all__
        assert callable(getattr(kvest, name))


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
@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="needs the compiled kernels")
def test_pure_python_off_serves_the_compiled_kernels(value):
    done = _run("import kvest; print(kvest.IMPLEMENTATION)", KVEST_PURE_PYTHON=value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cython"
    assert "Warning" not in done.stderr


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="needs the compiled kernels")
def test_pure_python_bad_value_warns_and_keeps_the_default():
    done = _run("import kvest; print(kvest.IMPLEMENTATION)", KVEST_PURE_PYTHON="maybe")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cython"
    assert "RuntimeWarning" in done.stderr and "KVEST_PURE_PYTHON" in done.stderr


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="needs the compiled kernels")
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


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="needs the compiled kernels")
def test_kvest_cpu_bogus_value_warns_without_failing():
    done = _run("import kvest; print(kvest.decode_new_tokens([16], 16))", KVEST_CPU="avx9000")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "16"
    assert "RuntimeWarning" in done.stderr and "KVEST_CPU" in done.stderr


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="needs the compiled kernels")
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
