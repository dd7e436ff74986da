"""What the installed package carries: stubs, py.typed, the public names."""

from __future__ import annotations

import ast
from importlib import resources

import kvest
from kvest import reference


def test_typed_package_files_are_installed():
    root = resources.files("kvest")
    assert root.joinpath("py.typed").is_file()
    assert root.joinpath("_kernels.pyi").is_file()


def test_stub_declares_every_public_function():
    stub = ast.parse(resources.files("kvest").joinpath("_kernels.pyi").read_text())
    declared = {node.name for node in stub.body if isinstance(node, ast.FunctionDef)}
    assert set(reference.__all__) <= declared


def test_public_names():
    for name in reference.__all__:
        assert name in kvest.__all__
        assert callable(getattr(kvest, name))
