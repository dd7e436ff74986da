"""The request-object writers against the loops they replace, on SGLang 0.5.23-shaped
requests (``kvest.sglang.standins.NestedReq``: 157 attributes, ``req.kv`` a slots dataclass).

A group is one loop at one batch size; its members are the loop as SGLang 0.5.23
writes it (``loop``) and kvest's writer (``kvest``), each on its own identical batch.
The batches are written on every round, as a decode step writes them: the adds
grow the lengths by one per round, and ``max`` stores the value on the first round
and keeps the (equal) current one after that -- the same work for both members.
"""

from __future__ import annotations

import functools

import pytest

import kvest
from kvest.sglang.standins import NestedReq

SIZES = [1, 64, 1024, 4096]
NESTED = (("kv", "kv_allocated_len"), ("kv", "kv_committed_len"))
BATCH_IDX = (("decode_batch_idx",),)
ALLOCATED = ("kv", "kv_allocated_len")


def alloc_for_decode_loop(reqs, token_per_req):
    for req in reqs:
        req.kv.kv_allocated_len += token_per_req
        req.kv.kv_committed_len += token_per_req


def decode_batch_idx_loop(reqs):
    for r in reqs:
        r.decode_batch_idx += 1


def spec_decode_max_loop(reqs, nxt_kv_lens_list):
    for req, nxt_kv_len in zip(reqs, nxt_kv_lens_list, strict=True):
        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, nxt_kv_len)


def batch(n: int) -> list:
    reqs = [NestedReq(1000 + 7 * i, 1000 + 7 * i + (i % 16)) for i in range(n)]
    for r in reqs:
        r.decode_batch_idx = 0  # set in Req.__init__ upstream; the stand-in lacks it
    return reqs


def calls(loop: str, n: int) -> dict:
    """member -> zero-argument call, each on a batch of its own."""
    if loop == "alloc_for_decode":
        return {"loop": functools.partial(alloc_for_decode_loop, batch(n), 1),
                "kvest": functools.partial(kvest.add_to_attrs, batch(n), NESTED, 1)}
    if loop == "decode_batch_idx":
        return {"loop": functools.partial(decode_batch_idx_loop, batch(n)),
                "kvest": functools.partial(kvest.add_to_attrs, batch(n), BATCH_IDX, 1)}
    values = [1000 + 7 * i + 16 for i in range(n)]
    return {"loop": functools.partial(spec_decode_max_loop, batch(n), values),
            "kvest": functools.partial(kvest.max_into_attr, batch(n), ALLOCATED, values)}


def state(reqs: list) -> list:
    return [(r.kv.kv_allocated_len, r.kv.kv_committed_len, r.decode_batch_idx) for r in reqs]


@pytest.mark.parametrize("impl", ["loop", "kvest"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("loop", ["alloc_for_decode", "decode_batch_idx", "spec_decode_max"])
def test_writes(benchmark, loop, n, impl):
    pair = calls(loop, n)
    # Both members write the same: checked once on their own batches first.
    pair["loop"]()
    pair["kvest"]()
    assert state(pair["loop"].args[0]) == state(pair["kvest"].args[0])
    benchmark.group = f"writes {loop} n={n:>5}"
    benchmark.extra_info.update(loop=loop, n=n, impl=impl)
    benchmark(pair[impl])
