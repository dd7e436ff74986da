"""The KV audit's cost per decode step, at 1 to 4,096 requests (budget: 2 us a step).

What the audit adds to a scheduler's step does not depend on SGLang's own work,
so the step here is SGLang's shape with that work taken out: a batch of ``n``
requests (lengths under ``req.kv``, as 0.5.19+ keeps them) whose
``check_decode_mem`` asks the allocator's ``check_decode_capacity`` and whose
``prepare_for_decode`` calls the pools' allocation methods, each doing O(1).
``bare`` runs it without the audit, ``audited`` with it (installed as the
plugin installs it: adaptive sampling of the lengths); a round is
:data:`STEPS` steps, so the sampled length reads are averaged in.  The
audit's cost per step is (audited - bare) / STEPS: each group's
``extra_info["per_step_ns"]`` holds its side's time per step.

Allocators: ``paged`` (one pool, one call a step) and ``hisparse`` (two pools,
three calls a step: the most any allocator makes).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from kvest.sglang import audit, registry

STEPS = 1000
SIZES = (1, 16, 256, 1024, 4096)


class BaseTokenToKVPoolAllocator:
    page_size = 16

    def check_decode_capacity(self, *, num_tokens, tree_cache, requests=None,
                              spec_algorithm=None):
        return True


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(self) -> None:
        self.free = 1 << 60

    def available_size(self) -> int:
        return self.free

    def alloc(self, need: int):
        return need

    def alloc_decode(self, seq_lens):
        return seq_lens

    def alloc_extend(self, *args):
        return None


class TokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
    page_size = 1


class HiSparseTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    def __init__(self) -> None:
        self.logical_attn_allocator = PagedTokenToKVPoolAllocator()
        self.hisparse_attn_allocator = PagedTokenToKVPoolAllocator()


class Spec:
    def is_none(self) -> bool:
        return True


class ScheduleBatch:
    def __init__(self, n: int, allocator) -> None:
        self.reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=1000 + i,
                                                        kv_allocated_len=1000 + i),
                                     beam_group=None) for i in range(n)]
        self.token_to_kv_pool_allocator = allocator
        self.spec_algorithm = Spec()
        self.seq_lens_cpu = None
        self.tree_cache = None

    def check_decode_mem(self, selected_indices=None):
        return self.token_to_kv_pool_allocator.check_decode_capacity(
            num_tokens=16, tree_cache=None, requests=self.reqs, spec_algorithm=None)

    def prepare_for_decode(self):
        alloc = self.token_to_kv_pool_allocator
        pools = getattr(alloc, "logical_attn_allocator", alloc)
        pools.alloc_decode(self.reqs)  # handed out (None would be a refusal: out of memory)
        device = getattr(alloc, "hisparse_attn_allocator", None)
        if device is not None:
            device.alloc(8)
            device.alloc(8)


@pytest.fixture(scope="module")
def standins():
    saved = {}
    names = {registry.ALLOCATOR_BASE: {"BaseTokenToKVPoolAllocator": BaseTokenToKVPoolAllocator},
             registry.BATCH: {"ScheduleBatch": ScheduleBatch},
             registry.POOLS[0].modules[0]: {"TokenToKVPoolAllocator": TokenToKVPoolAllocator},
             registry.POOLS[1].modules[0]: {"PagedTokenToKVPoolAllocator":
                                            PagedTokenToKVPoolAllocator}}
    for name, attrs in names.items():
        saved[name] = sys.modules.get(name)
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules[name] = module
    yield
    audit.uninstall()
    audit.reset()
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def _steps(batch) -> None:
    check, prepare = batch.check_decode_mem, batch.prepare_for_decode
    for _ in range(STEPS):
        check()
        prepare()


@pytest.mark.parametrize("side", ["bare", "audited"])
@pytest.mark.parametrize("allocator", ["paged", "hisparse"])
@pytest.mark.parametrize("n", SIZES)
def test_audit_cost_per_step(benchmark, standins, n, allocator, side):
    audit.uninstall()
    audit.reset()
    if side == "audited":
        assert audit.install() == []  # adaptive sampling, as in a scheduler
    alloc = (PagedTokenToKVPoolAllocator() if allocator == "paged"
             else HiSparseTokenToKVPoolAllocator())
    batch = ScheduleBatch(n, alloc)
    benchmark.group = f"audit {allocator} n={n}"
    benchmark.pedantic(_steps, args=(batch,), rounds=20, warmup_rounds=2)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["per_step_ns"] = stats.stats.min / STEPS * 1e9
    if side == "audited":  # the audit counted every step, and read lengths on some
        report = audit.report()
        assert report["steps"] == 22 * STEPS if stats is not None else report["steps"] > 0
        assert report["errors"] == 0 and report["undercounts"] == 0
        assert 0 < report["lengths_read"] <= report["steps"]
        pools = 1 if allocator == "paged" else 2
        assert len(report["pools"]) == pools
