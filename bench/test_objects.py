"""The object kernels on stand-ins shaped like each SGLang release's requests.

A group is one release shape, function and batch size; its members are the
release's own per-request loop (written in ``kvest._bench.objects``), kvest's object
kernel searching the layout (``layout=None``) and told it (``layout=`` the
release's), all from the registry that ``python -m kvest bench`` uses.
"""

from __future__ import annotations

import pytest

from kvest._bench.objects import FUNCTIONS, SHAPES, SIZES, object_calls, plain


@pytest.mark.parametrize("impl", ["loop", "kvest", "kvest layout="])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=[s.label for s in SHAPES])
def test_objects(benchmark, shape, fn, n, impl):
    calls = object_calls(shape, fn, n)
    benchmark.group = f"objects {shape.label} {fn} n={n:>5}"
    benchmark.extra_info.update(shape=shape.label, fn=fn, n=n, impl=impl)
    result = benchmark(calls[impl])
    assert plain(result) == plain(calls["loop"]())
