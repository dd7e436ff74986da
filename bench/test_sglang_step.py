"""The decode step's bookkeeping in real SGLang, upstream against kvest.

Runs where SGLang's scheduler modules import (see ``tools/sglang_cpu/``) and
skips elsewhere.  The cases are ``kvest._bench.sglang_step``'s (shared with
``python -m kvest bench --sglang``): the scheduler's step entry points and each
replaced loop alone, on real ``Req``/``ScheduleBatch`` objects over a real CPU
pool.  Here both sides run in this process: upstream is SGLang's own functions,
kvest is the same replacements installed by ``kvest.sglang.patch()`` (what the
plugin installs through ``load_plugins()``; the side-by-side run of the two
installed processes is ``python -m kvest._bench.sglang_step``).  A group is
one case at one batch size; each call is timed from the same state (the
restore is pedantic's untimed setup), and each case first checks that both
sides leave the same result and state.
"""

from __future__ import annotations

import contextlib
import os

import pytest

import kvest.sglang
from kvest._bench import sglang_step

WHY_NOT = sglang_step.available()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


@pytest.fixture(scope="module")
def cells():
    from kvest._bench import sglang_world as w

    s = w.sg()
    original = s.sb.ScheduleBatch.__dict__["new_tokens_required_next_decode"]
    # Upstream's side must be SGLang's own code: nothing installed yet in this process.
    assert getattr(original, "__kvest_original__", None) is None, "kvest already installed"
    w.use_assign(w.assign_nothing)
    w.one_thread()
    c = sglang_step.Cells()
    yield c
    if c.override is not None:
        c.override.restore()


def installed(side: str) -> contextlib.AbstractContextManager:
    return kvest.sglang.patch() if side == "kvest" else contextlib.nullcontext()


# KVEST_BENCH_SIZES="1,256" narrows the batch sizes (CI checks each case once).
SIZES = [int(n) for n in os.environ.get("KVEST_BENCH_SIZES", "").split(",") if n.strip()] \
    or sglang_step.SIZES


@pytest.mark.parametrize("side", sglang_step.SIDES)
@pytest.mark.parametrize("hot_spot", sglang_step.HOT_SPOTS)
@pytest.mark.parametrize("n", SIZES)
def test_step(benchmark, cells, n, hot_spot, side):
    cells.use(hot_spot, n)
    want = cells.check()
    with installed("kvest"):
        got = cells.check()
    assert got == want, f"{hot_spot} at n={n}: kvest's result or state differs from upstream's"
    benchmark.group = f"sglang {hot_spot} n={n:>5}"
    benchmark.extra_info.update(hot_spot=hot_spot, n=n, side=side)
    rounds = 3 if hot_spot.startswith("retract") else 30
    with installed(side):
        benchmark.pedantic(cells.call, setup=cells.arm, rounds=rounds, iterations=1)


@pytest.fixture
def read_order(request):
    """The request kernels reading a shuffled batch in address order (what
    users run), or in the order given (the same kernels, the reordering
    switched off: what it saves)."""
    if kvest.IMPLEMENTATION != "cython":
        pytest.skip("the compiled kernels' walk order")
    from kvest import _reqs

    least = _reqs._address_order()[2]
    _reqs._address_order(least if request.param == "address" else 1 << 62)
    yield request.param
    _reqs._address_order(least)


@pytest.mark.parametrize("read_order", ["address", "given"], indirect=True)
@pytest.mark.parametrize("hot_spot", ["estimate spec", sglang_step.SHUFFLED])
@pytest.mark.parametrize("n", [n for n in SIZES if n >= 256])
def test_shuffled_selection(benchmark, cells, n, hot_spot, read_order):
    """kvest's EAGLE estimate over the whole batch and over every request
    selected in a shuffled order, each read in address order and in the order
    given: how close the shuffled selection comes to the whole batch."""
    cells.use(hot_spot, n)
    want = cells.check()
    with installed("kvest"):
        assert cells.check() == want
        benchmark.group = f"sglang estimate spec, read order n={n:>5}"
        benchmark.extra_info.update(hot_spot=hot_spot, n=n, read_order=read_order)
        benchmark.pedantic(cells.call, setup=cells.arm, rounds=30, iterations=1)
