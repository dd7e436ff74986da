"""One decode step's bookkeeping in real SGLang, upstream against kvest.

Runs where SGLang's scheduler modules import (see the README's benchmark
recipe) and skips elsewhere.  A group is one hot spot at one batch size, with
upstream's own code and kvest's drop-in as its members; the cases come from
``kvest._bench_sglang``, shared with ``python -m kvest bench --sglang``, and
each pair's answers are compared before timing.
"""

from __future__ import annotations

import pytest

from kvest import _bench_sglang

WHY_NOT = _bench_sglang.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


@pytest.fixture(scope="module")
def spec_config():
    up = _bench_sglang.upstream()
    override = up.get_context().override_server_args(
        page_size=_bench_sglang.PAGE_SIZE, **_bench_sglang.SPEC)
    override.install()
    yield
    override.restore()


@pytest.mark.parametrize("side", ["upstream", "kvest"])
@pytest.mark.parametrize("hot_spot", _bench_sglang.HOT_SPOTS)
@pytest.mark.parametrize("n", _bench_sglang.SIZES)
def test_step(benchmark, spec_config, n, hot_spot, side):
    up_call, kv_call = _bench_sglang.cases(n)[hot_spot]
    assert _bench_sglang._same(up_call(), kv_call())
    benchmark.group = f"sglang {hot_spot} n={n:>5}"
    benchmark.extra_info.update(hot_spot=hot_spot, n=n, side=side)
    benchmark(up_call if side == "upstream" else kv_call)
