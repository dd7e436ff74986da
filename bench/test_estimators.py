"""Each group compares the implementations on identical data.

A group is one function, batch size, page size and dtype; its members are the
per-request Python loop over request objects (the baseline SGLang runs), the
NumPy one-liner, kvest's array kernel, kvest's object kernel, the floor
(``np.add.reduce`` over the inputs: reading the data once) and Numba when it is
installed.  pytest-benchmark prints each group with every column's ratio to its
fastest member.  The implementations live in ``kvest._bench.arrays``, shared with
``python -m kvest bench``.
"""

from __future__ import annotations

import pytest

from kvest._bench.arrays import (
    FUNCTIONS,
    IMPLEMENTATIONS,
    PAGE_SIZES,
    SIZES,
    make_batch,
    numpy_decode,
    numpy_spec_v2,
)


def _expected(fn: str, batch) -> int:
    # The NumPy expression is an implementation independent of kvest.
    if fn == "spec_v2":
        return numpy_spec_v2(batch.committed, batch.allocated, batch.page_size, batch.reserve)
    return numpy_decode(batch.committed, batch.page_size)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_estimator(benchmark, fn, n, page_size, dtype, impl):
    batch = make_batch(n, page_size, dtype)
    call = IMPLEMENTATIONS[impl](fn, batch)
    if call is None:
        pytest.skip(f"{impl} does not run at n={n} (or is not installed)")
    benchmark.group = f"{fn} n={n:>7} p={page_size:>3} {dtype}"
    benchmark.extra_info.update(fn=fn, n=n, page_size=page_size, dtype=dtype, impl=impl)
    result = benchmark(call)
    if impl != "floor":
        assert result == _expected(fn, batch)
