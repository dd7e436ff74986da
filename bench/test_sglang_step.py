"""One decode step's bookkeeping in real SGLang, upstream against kvest.

Runs where SGLang's scheduler modules import (see the README's benchmark
recipe) and skips elsewhere.  A group is one hot spot at one batch size, with
upstream's own code and kvest's drop-in as its members; the cases come from
``kvest._bench.sglang_step``, shared with ``python -m kvest bench --sglang``, and
each pair's answers are compared before timing.
"""

from __future__ import annotations

import pytest

from kvest._bench import sglang_step

WHY_NOT = sglang_step.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


@pytest.fixture(scope="module")
def spec_config():
    up = sglang_step.upstream()
    override = up.get_context().override_server_args(
        page_size=sglang_step.PAGE_SIZE, **sglang_step.SPEC)
    override.install()
    yield
    override.restore()


@pytest.mark.parametrize("side", ["upstream", "kvest"])
@pytest.mark.parametrize("hot_spot", sglang_step.HOT_SPOTS)
@pytest.mark.parametrize("n", sglang_step.SIZES)
def test_step(benchmark, spec_config, n, hot_spot, side):
    up_call, kv_call = sglang_step.cases(n)[hot_spot]
    assert sglang_step.same(up_call(), kv_call())
    benchmark.group = f"sglang {hot_spot} n={n:>5}"
    benchmark.extra_info.update(hot_spot=hot_spot, n=n, side=side)
    benchmark(up_call if side == "upstream" else kv_call)
