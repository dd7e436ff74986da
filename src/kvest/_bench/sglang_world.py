"""Real SGLang scheduler objects on CPU: a decode batch over a real KV pool.

Used by :mod:`kvest._bench.sglang_step` (timing) and by the exactness test
(``tests/test_sglang_step_real.py``).  Everything is SGLang's own class,
loaded at run time: ``Req``, ``ScheduleBatch``, ``ReqToTokenPool`` and
``PagedTokenToKVPoolAllocator(device="cpu")``.  Three things are stood in,
because on CPU they need a GPU or a full server:

- the tree cache: a :class:`BasePrefixCache` without prefix sharing (SGLang's
  own default methods free KV rows, unlock and so on);
- ``assign_req_to_token_pool_func`` (a Triton kernel, or sgl_kernel on CPU
  builds): :func:`assign_torch` writes the rows with torch, :func:`assign_nothing`
  answers at once (timing);
- with ``instant=True``, the allocator's slot search (``alloc_decode_naive`` /
  ``alloc_extend_naive``, a kernel launch on a GPU): the pages are counted by
  the module's ``get_num_new_pages`` and taken off the free list as upstream
  does, and a ready tensor is handed back, so what is timed is the scheduler's
  Python bookkeeping.

Spec settings come from the release's runtime context
(``override_server_args``), with ``attention_backend="torch_native"`` so that
``get_last_loc`` takes its torch path.
"""

from __future__ import annotations

import functools
import random
from array import array
from types import SimpleNamespace
from typing import Any

# (the benchmark's worlds choose it, as the audit's driver does)
from kvest.sglang.standins import assign_torch as assign_torch

PAGE_SIZE = 16
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=3,
            speculative_eagle_topk=1, speculative_num_draft_tokens=4)
# Accepted tokens per EAGLE verify: 1 .. draft tokens.
MAX_ACCEPT = SPEC["speculative_num_draft_tokens"]


@functools.lru_cache(maxsize=1)
def sg() -> SimpleNamespace:
    """SGLang's modules and classes, imported once (scheduler modules first, so
    that a later ``load_plugins()`` finds them loaded)."""
    import sglang
    import sglang.srt.beam_search.batch_tail as batch_tail
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.mem_cache.allocation as allocation
    import sglang.srt.mem_cache.allocation_sizing as sizing
    import sglang.srt.mem_cache.allocator.paged as paged
    import sglang.srt.speculative.eagle_utils as eagle
    import sglang.srt.speculative.spec_utils
    import sglang.srt.utils.common as common
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class Cache(BasePrefixCache):
        """A tree cache that shares no prefix: SGLang's defaults do the rest."""

        def __init__(self, pool: Any, allocator: Any, page_size: int) -> None:
            self.req_to_token_pool = pool
            self.token_to_kv_pool_allocator = allocator
            self.page_size = page_size

        def supports_prefix_sharing(self) -> bool:
            return False

        def reset(self) -> None:
            pass

        def match_prefix(self, params: Any) -> Any:
            raise NotImplementedError

        def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> Any:
            raise NotImplementedError

        def evict(self, params: Any) -> Any:
            raise NotImplementedError

        def inc_lock_ref(self, node: Any) -> Any:
            raise NotImplementedError

        def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
            raise NotImplementedError

        def pretty_print(self) -> None:
            pass

    class Slots(paged.PagedTokenToKVPoolAllocator):
        """The real allocator; its capacity answer can say "does not fit"."""

        fit_requests: int | None = None  # check_decode_capacity: fits up to this many

        def check_decode_capacity(self, *, num_tokens: int, tree_cache: Any,
                                  requests: Any = None, spec_algorithm: Any = None) -> bool:
            # "Does not fit" until only fit_requests are left: k retractions.
            if self.fit_requests is not None and len(requests) > self.fit_requests:
                return False
            return super().check_decode_capacity(num_tokens=num_tokens, tree_cache=tree_cache,
                                                 requests=requests,
                                                 spec_algorithm=spec_algorithm)

    class InstantSlots(Slots):
        """The real allocator with its slot search answered at once."""

        def _ready(self, count: int) -> Any:
            ready = getattr(self, "_ready_tensor", None)
            if ready is None or ready.shape[0] < count:
                ready = self._ready_tensor = torch.zeros(max(count, 1), dtype=torch.int64)
            return ready[:count]

        def alloc_decode(self, seq_lens: Any, seq_lens_cpu: Any, last_loc: Any,
                         **kwargs: Any) -> Any:
            # paged.get_num_new_pages is whatever is installed (kvest's or upstream's).
            pages = paged.get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size,
                                            decode=True)
            self.free_pages = self.free_pages[pages:]
            return self._ready(len(seq_lens))

        def alloc_extend(self, prefix_lens: Any, prefix_lens_cpu: Any, seq_lens: Any,
                         seq_lens_cpu: Any, last_loc: Any, extend_num_tokens: int,
                         num_new_pages: int | None = None, **kwargs: Any) -> Any:
            if num_new_pages is None:
                num_new_pages = paged.get_num_new_pages(
                    seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu)
            self.free_pages = self.free_pages[num_new_pages:]
            return self._ready(extend_num_tokens)

    return SimpleNamespace(
        version=sglang.__version__, torch=torch, sb=sb, allocation=allocation, sizing=sizing,
        paged=paged, eagle=eagle, common=common, batch_tail=batch_tail, Cache=Cache,
        Slots=Slots,
        InstantSlots=InstantSlots,
        ReqToTokenPool=ReqToTokenPool, ForwardMode=ForwardMode, get_context=get_context,
        SamplingParams=SamplingParams, SpeculativeAlgorithm=SpeculativeAlgorithm)


class _Sampling:
    """The batch's sampling info, as far as the bookkeeping reads it (no penalties)."""

    penalizer_orchestrator = SimpleNamespace(is_required=False)

    def filter_batch(self, keep_indices: Any, keep_indices_device: Any) -> None:
        pass


def assign_nothing(*args: Any) -> None:
    """``assign_req_to_token_pool_func`` answered at once (a kernel launch on a GPU)."""


def one_thread() -> None:
    """One torch intra-op thread: on a shared 2-core machine, a gather of 4,096
    elements measured 15 ms with two threads waiting on each other against
    0.1 ms with one; on a GPU server these host tensors are a kernel launch."""
    sg().torch.set_num_threads(1)


def use_assign(fn: Any) -> None:
    """Install the stand-in where ``alloc_for_spec_decode`` (and kvest's
    recompiled copy, which shares its module's globals) looks it up."""
    sg().allocation.assign_req_to_token_pool_func = fn


def context(algorithm: str | None, page_size: int) -> Any:
    """The release's config override for one step (install/restore, or ``with``)."""
    spec = SPEC if algorithm else {}
    return sg().get_context().override_server_args(page_size=page_size,
                                                   attention_backend="torch_native", **spec)


def _own(x: int) -> int:
    """An int equal to x that nothing else refers to (ints below 257 are shared
    in CPython whatever makes them)."""
    return int(str(x))


class World:
    """n real requests decoding in one real ``ScheduleBatch`` over a real pool."""

    def __init__(self, n: int, page_size: int, algorithm: str | None, seed: int = 0,
                 instant: bool = True, max_len: int = 4096) -> None:
        s = sg()
        torch = s.torch
        rng = random.Random(seed)
        self.algorithm, self.page_size = algorithm, page_size
        lens = [rng.randint(1, max_len) for _ in range(n)]
        headroom = 64 * 16  # rows and pages for the steps to come
        self.pool = s.ReqToTokenPool(n, max(lens) + headroom, "cpu", False)
        tokens = sum(-(-x // page_size) * page_size for x in lens) + (headroom // 4) * n
        cls = s.InstantSlots if instant else s.Slots
        self.allocator = cls(size=tokens + 8 * page_size, page_size=page_size,
                             dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
        self.cache = s.Cache(self.pool, self.allocator, page_size)
        self.reqs = [s.sb.Req(f"r{i}", "", array("q", range(4)),
                              s.SamplingParams(max_new_tokens=1 << 20)) for i in range(n)]
        self.pool.alloc(self.reqs)
        # Each request's prompt KV in whole pages, taken from the pool in one piece.
        rounded = [-(-x // page_size) * page_size for x in lens]
        slots = self.allocator.alloc(sum(rounded)).to(torch.int32)
        at = 0
        for req, length, size in zip(self.reqs, lens, rounded, strict=True):
            self.pool.req_to_token[req.kv.req_pool_idx, :size] = slots[at:at + size]
            at += size
            req.kv.kv_committed_len = req.kv.kv_allocated_len = length
        self.batch = self._batch(lens)
        self.save()

    def _batch(self, lens: list[int]) -> Any:
        s = sg()
        torch = s.torch
        batch = s.sb.ScheduleBatch(
            reqs=self.reqs, req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator, tree_cache=self.cache,
            model_config=SimpleNamespace(is_encoder_decoder=False), enable_overlap=False,
            spec_algorithm=s.SpeculativeAlgorithm.from_string(self.algorithm), device="cpu")
        batch.forward_mode = s.ForwardMode.DECODE
        batch.sampling_info = _Sampling()
        batch.req_pool_indices_cpu = torch.tensor([r.kv.req_pool_idx for r in self.reqs],
                                                  dtype=torch.int64)
        batch.req_pool_indices = batch.req_pool_indices_cpu.clone()
        batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        batch.seq_lens = batch.seq_lens_cpu.clone()
        batch.orig_seq_lens = batch.seq_lens_cpu.to(torch.int32)
        return batch

    # ------------------------------------------------------------ state

    def save(self) -> None:
        """Remember the state a step changes (restored by :meth:`restore`)."""
        b = self.batch
        self._saved = ([(r.kv.kv_committed_len, r.kv.kv_allocated_len, r.decode_batch_idx)
                        for r in self.reqs],
                       b.seq_lens, b.seq_lens_cpu, b.orig_seq_lens, self.allocator.free_pages)

    def restore(self) -> None:
        per_req, seq, seq_cpu, orig, free = self._saved
        # Each request gets int objects of its own, as a real step leaves them
        # (its `+=` made them; nothing else refers to them), not the saved ones.
        for r, (c, a, d) in zip(self.reqs, per_req, strict=True):
            r.kv.kv_committed_len, r.kv.kv_allocated_len, r.decode_batch_idx = (
                _own(c), _own(a), _own(d))
        b = self.batch
        b.seq_lens, b.seq_lens_cpu, b.orig_seq_lens = seq, seq_cpu, orig
        self.allocator.free_pages = free  # slicing made new tensors: the saved one is intact

    # ------------------------------------------------------------ the scheduler's calls

    def step(self) -> bool:
        """One decode step's bookkeeping as the scheduler runs it: whether it fit."""
        fits = self.batch.check_decode_mem()
        if self.algorithm is None:
            self.batch.prepare_for_decode()
        else:
            sg().eagle.eagle_prepare_for_decode(self.batch)
        return fits

    def verify(self, rng: random.Random) -> list[int]:
        """What the forward pass would commit: 1 token without speculation, 1 ..
        MAX_ACCEPT accepted tokens per request with EAGLE (within what is allocated)."""
        accepted = []
        for r in self.batch.reqs:
            if self.algorithm is None:
                k = 0  # prepare_for_decode already committed the token
            else:
                k = min(rng.randint(1, MAX_ACCEPT), r.kv.kv_allocated_len - r.kv.kv_committed_len)
                r.kv.kv_committed_len += k
            accepted.append(k)
        if self.algorithm is not None:
            torch = sg().torch
            lens = [r.kv.kv_committed_len for r in self.batch.reqs]
            self.batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
            self.batch.seq_lens = self.batch.seq_lens_cpu.clone()
            self.batch.orig_seq_lens = self.batch.seq_lens_cpu.to(torch.int32)
        return accepted

    def retract(self, k: int) -> tuple[list[str], float, list[str]]:
        """``retract_decode()`` with k retractions (the capacity answer says "does
        not fit" until k requests are gone); rids of retracted and aborted."""
        self.allocator.fit_requests = max(1, len(self.reqs) - k)
        retracted, ratio, aborted = self.batch.retract_decode()
        return [r.rid for r in retracted], ratio, [r.rid for r in aborted]

    def state(self) -> dict[str, Any]:
        """Every request's lengths and row, the pool's free pages: to compare."""
        torch = sg().torch
        rows = []
        for r in self.reqs:
            idx = r.kv.req_pool_idx
            rows.append(None if idx is None else
                        self.pool.req_to_token[idx, :r.kv.kv_allocated_len].tolist())
        free = self.allocator.get_all_free_pages()
        return {
            "committed": [r.kv.kv_committed_len for r in self.reqs],
            "allocated": [r.kv.kv_allocated_len for r in self.reqs],
            "decode_batch_idx": [r.decode_batch_idx for r in self.reqs],
            "in_batch": [r.rid for r in self.batch.reqs],
            "rows": rows,
            "free_pages": torch.sort(free).values.tolist(),
            "seq_lens": self.batch.seq_lens_cpu.tolist(),
        }


# ------------------------------------------------------------------ the exactness loop

# (algorithm, page size, requests, seed) of the real-allocator decode loops
LOOP_CASES = [(None, 1, 37, 1), (None, 16, 41, 2), ("EAGLE", 1, 29, 3), ("EAGLE", 16, 43, 4),
              (None, 16, 1, 5), ("EAGLE", 16, 2, 6)]
LOOP_STEPS = 7
LOOP_RETRACTIONS = 3


def decode_loop(algorithm: str | None, page_size: int, n: int, seed: int) -> dict[str, Any]:
    """Several decode steps on the real allocator (its slot search too), then
    a retraction and one more step: every number the steps return and every
    request's state after each."""
    rng = random.Random(seed)
    use_assign(assign_torch)
    with context(algorithm, page_size):
        world = World(n, page_size, algorithm, seed=seed, instant=False, max_len=300)
        steps = []
        for i in range(LOOP_STEPS + 1):
            if i == LOOP_STEPS - 2:
                steps.append({"retract": world.retract(LOOP_RETRACTIONS), **world.state()})
                world.allocator.fit_requests = None
            estimate = world.batch.new_tokens_required_next_decode()
            fits = world.step()
            out = world.batch.out_cache_loc
            steps.append({"estimate": estimate, "fits": fits,
                          "out_cache_loc": None if algorithm else out.tolist(),
                          "accepted": world.verify(rng), **world.state()})
    return {"steps": steps}


def _loop_main() -> int:
    """Run every loop case after SGLang's ``load_plugins()``; JSON on stdout."""
    import json
    import sys

    sg()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import kvest.sglang

    loops = [decode_loop(*case) for case in LOOP_CASES]
    report = kvest.sglang.status()
    result = {"mode": report["mode"],
              "hotspots": {k: v["state"] for k, v in report["hotspots"].items()},
              "kernel_calls": {k: v["kernel"] for k, v in report["hotspots"].items()},
              "loops": loops}
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_loop_main())
