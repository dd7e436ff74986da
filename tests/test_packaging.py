"""What the installed package carries: stubs, py.typed, the public names."""

from __future__ import annotations

import ast
from importlib import resources

import kvest
from kvest import reference

STUBS = ("_kernels.pyi", "_reqs.pyi")


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
