"""``python -m kvest audit``: SGLang's own scheduler classes on the CPU, audited.

It drives the installed SGLang's real classes -- ``Req``, ``ScheduleBatch``
(``prepare_for_extend``, ``check_decode_mem``, ``retract_decode``,
``prepare_for_decode``, ``filter_batch``, ``merge_batch``), ``ReqToTokenPool``,
the allocators (token, paged, SWA, HiSparse with ``HiSparseCoordinator``'s own
device-buffer methods), ``RadixCache`` (prefix sharing, with eviction) and
``release_kv_cache`` -- in a small scheduler loop: admission, decode,
retraction, finishing, in both overlap orders.  No GPU and no model: the
"forward pass" samples how many tokens each request commits.  What is stood
in, because on a CPU it needs a GPU kernel, a model or a host memory pool, is
named where it is made (:func:`_standins`).  The audit
(:mod:`kvest.sglang.audit`) pairs every decode step's estimate with what the
pools hand out, and every step's recorded lengths with it.

Exit status (:func:`main`): 0 only when every configuration listed was driven
(its decode steps, nearly all compared: :data:`COMPARED_MIN`) and nothing was
found; 1 an undercount, a bookkeeping gap or an allocation failure after the
check said the step fits (with ``--known-findings=ignore``, only one that
``registry.KNOWN_FINDINGS`` does not hold); 2 a configuration not driven (named, with its
reason; a driver error is one), a usage error, or no SGLang scheduler the
audit can attach to.  2 wins over 1: findings are printed either way.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import importlib
import inspect
import logging
import os
import random
import re
import shlex
import sys
import time
import traceback
from array import array
from collections import deque
from collections.abc import Iterator, Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any, NamedTuple

from kvest.sglang import audit, registry
from kvest.sglang.registry import ALLOCATED, COMMITTED, KV_INFO, KnownFinding
from kvest.sglang.standins import assign_torch

__all__ = ["Config", "KnownPolicy", "Outcome", "Result", "Spec", "found", "known", "main",
           "matrix", "run"]

SWA_INTERVAL = "SGLANG_SWA_EVICTION_INTERVAL"


class Pool(enum.Enum):
    TOKEN = "token"
    PAGED = "paged"
    SWA = "swa"  # a full pool and a sliding-window pool
    PURE_SWA = "pure-swa"  # every layer sliding-window: one pool, window frees in the step
    HISPARSE = "hisparse"

    def __str__(self) -> str:
        return self.value


class Order(enum.Enum):
    """When a decode step's result (the tokens it committed) is processed."""

    PLAIN = "plain"  # before the next step is scheduled
    OVERLAP = "overlap"  # after the next step is prepared (the overlap scheduler)

    def __str__(self) -> str:
        return self.value


class Spec(NamedTuple):
    algorithm: str | None = None
    steps: int = 0
    topk: int = 0
    draft: int = 0

    def __str__(self) -> str:
        if self.algorithm is None:
            return "none"
        return f"{self.algorithm}({self.steps},{self.topk},{self.draft})"


class Config(NamedTuple):
    pool: Pool
    page: int
    spec: Spec
    order: Order
    sharing: bool  # prefix sharing through RadixCache
    seed: int = 0

    def __str__(self) -> str:
        return (f"{self.pool} p={self.page} spec={self.spec} {self.order}"
                f"{' sharing' if self.sharing else ''} seed={self.seed}")

    @classmethod
    def parse(cls, text: str) -> Config:
        """The configuration ``str(config)`` printed (``--config``)."""
        m = _CONFIG.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"not a configuration: {text!r} (e.g. 'paged p=16 "
                             "spec=EAGLE(3,1,4) plain sharing seed=3')")
        pool, page, spec, order, sharing, seed = m.groups()
        alg = None if spec == "none" else _SPEC.fullmatch(spec)
        if alg is None and spec != "none":
            raise ValueError(f"not a speculation: {spec!r} (none, or NAME(steps,topk,draft))")
        return cls(Pool(pool), int(page),
                   Spec(alg[1], int(alg[2]), int(alg[3]), int(alg[4])) if alg else Spec(),
                   Order(order), bool(sharing), int(seed))


_CONFIG = re.compile(r"(\S+) p=(\d+) spec=(\S+) (plain|overlap)( sharing)? seed=(-?\d+)")
_SPEC = re.compile(r"(\w+)\((\d+),(\d+),(\d+)\)")
COMPARED_MIN = 0.99  # exit 0 needs at least this share of the driven steps compared


class Outcome(enum.Enum):
    """How a configuration's run ended."""

    DRIVEN = "driven"  # every decode step it was asked for
    FAILED_AFTER_FITS = "failed after fits"  # SGLang's allocation failed after "fits" (a finding)
    DRIVER_ERROR = "driver error"  # anything else raised: the run says nothing past it
    SHORT = "short"  # fewer steps than asked, nothing raised (the loop ran out of ticks)

    def __str__(self) -> str:
        return self.value


class Result(NamedTuple):
    config: Config
    steps: int  # decode steps compared (the estimate against the pools)
    undercounts: int
    overcounts: int
    gaps: int
    retractions: int
    exercised: dict[str, int]  # evictions, window frees, prefix tokens reused
    ended: str | None  # why the run stopped early, if it did
    findings: dict[str, str]
    report: dict[str, Any]
    skipped: str | None = None  # why the run does not support an answer (undriven)
    driven: int = 0  # decode steps driven
    asked: int = 0  # decode steps asked for
    outcome: Outcome = Outcome.DRIVEN
    first_steps: Mapping[str, int] = MappingProxyType({})  # kind -> the step it was first in
    first_pools: Mapping[str, str] = MappingProxyType({})  # kind -> the pool it was first in
    frees: Mapping[str, int] = MappingProxyType({})  # "kind in pool" -> slots

    @property
    def bad(self) -> bool:
        return bool(self.undercounts or self.gaps or self.report.get("failed_after_fits")
                    or self.frees)


def undriven(outcome: Outcome, driven: int, asked: int, report: dict[str, Any],
             ended: str | None) -> str | None:
    """Why a run does not support an answer for its configuration (None: it does)."""
    if outcome is Outcome.DRIVER_ERROR:
        return (f"not driven: a driver error after {driven} of {asked} decode steps: {ended}"
                if driven else f"not driven: a driver error before its first decode step: "
                f"{ended}")
    if outcome is Outcome.SHORT:
        return f"not driven: {driven} of {asked} decode steps, nothing raised"
    if report.get("errors"):
        return (f"not driven: the audit's own errors ({report['errors']}, last: "
                f"{report.get('last_error')})")
    compared = report.get("steps", 0)
    if compared < COMPARED_MIN * driven or not driven:
        why = ", ".join(f"{k} {v}" for k, v in (("unpaired", report.get("unpaired")),
                                                  ("not audited", report.get("not_audited")))
                        if v)
        return f"not driven: {compared} of {driven} driven decode steps compared ({why})"
    return None


# ------------------------------------------------------------------ SGLang


@functools.lru_cache(maxsize=1)
def sg() -> SimpleNamespace:
    """SGLang's modules and classes (ImportError where the scheduler does not import)."""
    import sglang
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.mem_cache.common as common
    import sglang.srt.server_args as server_args
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    PagedTokenToKVPoolAllocator = allocator_class(Pool.PAGED)
    TokenToKVPoolAllocator = allocator_class(Pool.TOKEN)
    paged = sys.modules[PagedTokenToKVPoolAllocator.__module__]
    return SimpleNamespace(
        version=sglang.__version__, torch=torch, sb=sb, common=common, server_args=server_args,
        paged=paged, Paged=PagedTokenToKVPoolAllocator, Token=TokenToKVPoolAllocator,
        CacheInitParams=CacheInitParams, EvictParams=EvictParams, ReqToTokenPool=ReqToTokenPool,
        RadixCache=RadixCache,
        runtime=_optional(registry.RUNTIME_CONTEXT), SamplingParams=SamplingParams,
        SpeculativeAlgorithm=SpeculativeAlgorithm, has=features(
            sb.Req, common, paged, RadixCache, sb.ScheduleBatch,
            _optional(registry.SPEC_PREPARE[0]), SamplingParams))


def _optional(module: str) -> Any:
    """A module of the release, or None where this release has none."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise  # the module is there, and something it imports is not
        return None


HISPARSE_COORDINATOR = "sglang.srt.managers.hisparse_coordinator"
ALLOCATOR_CLASSES = {Pool(family): cls for cls, family in registry.ALLOCATOR_FAMILIES.items()}


def not_here(pool: Pool) -> str | None:
    """Why this release's ``pool`` cannot be driven here, or None."""
    if allocator_class(pool) is None:
        return f"no {ALLOCATOR_CLASSES[pool]} in this release"
    if pool is Pool.HISPARSE:
        try:  # (0.5.11-0.5.12: its host pool imports sgl_kernel, a GPU build)
            importlib.import_module(HISPARSE_COORDINATOR)
        except ImportError as exc:
            return f"its coordinator does not import on this machine: {exc}"
    return None


def allocator_class(pool: Pool) -> Any:
    """The release's allocator class of ``pool``, None where it has none."""
    name = ALLOCATOR_CLASSES[pool]
    for home in registry.DRIVEN_ALLOCATORS[name]:
        cls = getattr(_optional(home), name, None)
        if isinstance(cls, type):
            return cls
    return None


def _setting(name: str) -> Any:
    """A settings reader (registry.ALLOC_SETTINGS) from its home in this release."""
    for module in registry.ALLOC_SETTINGS_MODULES:
        fn = getattr(_optional(module), name, None)
        if fn is not None:
            return fn
    raise AttributeError(f"no {name} in this release")


class Extend(enum.Enum):
    """How a release sets a matched request's extend."""

    INPUT_LEN = "set_extend_input_len"  # init_next_round_input sets it whole (before 0.5.15)
    RANGE = "set_extend_range"  # 0.5.15-0.5.21
    END = "extend_end"  # an attribute, and prefix_len (0.5.22+)


class Features(NamedTuple):
    """What the driver meets that differs by release, each read once from the
    release's own classes and modules (a feature test, not a version)."""

    extend: Extend
    release_flag: str  # release_kv_cache's keep-in-tree keyword: checkpoint (0.5.22+), is_insert
    paged_cpu: bool  # the paged allocator's own CPU path (alloc_decode_naive: 0.5.22+)
    tree_lock: bool  # the tree cache's lock()/unlock() (0.5.22+; before, inc_lock_ref/unpin)
    retract_args: bool  # retract_decode(server_args) (before 0.5.19; since, it takes none)
    draft_prepares: bool  # the draft input prepares the speculative decode (before 0.5.15)
    token_ids: Any  # what a request keeps token ids in: array("q") (0.5.13+), or a list


def _token_ids(req: type, sampling_params: type) -> Any:
    """The type a fresh request of the release keeps its output ids in, as a
    constructor of the prompt (array("q", ...) or list)."""
    probe = req("probe", "", [1], sampling_params(max_new_tokens=1))
    return list if isinstance(probe.output_ids, list) else functools.partial(array, "q")


def features(req: type, common: Any, paged: Any, cache: type, batch: type, spec_utils: Any,
             sampling_params: type) -> Features:
    """Read from the release's classes and modules (``spec_utils``: None where
    the release has none)."""
    params = inspect.signature(common.release_kv_cache).parameters
    flag = next(name for name in ("checkpoint", "is_insert") if name in params)
    extend = next((e for e in (Extend.RANGE, Extend.INPUT_LEN) if hasattr(req, e.value)),
                  Extend.END)
    return Features(extend=extend, release_flag=flag,
                    paged_cpu=hasattr(paged, "alloc_decode_naive"),
                    tree_lock=hasattr(cache, "lock"),
                    retract_args="server_args" in inspect.signature(
                        batch.retract_decode).parameters,
                    draft_prepares=getattr(spec_utils, registry.SPEC_PREPARE[1], None) is None,
                    token_ids=_token_ids(req, sampling_params))


class _Launch:
    """A Triton kernel's launch (``kernel[grid](*args)``) by a CPU function."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        return self.fn


def _pages(free_pages: Any) -> Any:
    """The free pages the naive path may index: the kernel reads past an empty
    list (garbage the allocator then discards, returning None); the naive path
    would assert instead."""
    return free_pages if free_pages.numel() else free_pages.new_full((1,), -1)


def alloc_extend_cpu(prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any,
                     out_indices: Any, bs_upper: int, page_size: int) -> None:
    """``alloc_extend_kernel`` on the CPU: the release's own ``alloc_extend_naive``."""
    sg().paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, _pages(free_pages),
                                  out_indices, page_size, out_indices.device)


def alloc_decode_cpu(seq_lens: Any, last_loc: Any, free_pages: Any, out_indices: Any,
                     bs_upper: int, page_size: int) -> None:
    """``alloc_decode_kernel`` on the CPU: a one-token extend from ``seq_lens - 1``
    by the release's own ``alloc_extend_naive`` (the kernel's arithmetic: a new
    page for a request whose token starts one, taken in batch order)."""
    sg().paged.alloc_extend_naive(seq_lens - 1, seq_lens, last_loc, _pages(free_pages),
                                  out_indices, page_size, out_indices.device)


def _standins() -> None:
    s = sg()
    # assign_req_to_token_pool_func (a Triton kernel's launch): from its home in
    # this release, and wherever a loaded module bound it by name
    for home in registry.ASSIGN_HOMES:
        module = _optional(home)
        own = getattr(module, registry.ASSIGN, None)
        if own is None or own is assign_torch:
            continue
        for loaded in list(sys.modules.values()):
            if getattr(loaded, registry.ASSIGN, None) is own:
                setattr(loaded, registry.ASSIGN, assign_torch)
    if not s.has.paged_cpu:  # the paged allocator's Triton kernels (no CPU driver)
        s.paged.alloc_extend_kernel = _Launch(alloc_extend_cpu)
        s.paged.alloc_decode_kernel = _Launch(alloc_decode_cpu)


def spec_algorithms() -> list[str]:
    """The speculative algorithms the release offers whose decode step goes
    through ``spec_prepare_for_decode``."""
    names = [m.name for m in sg().SpeculativeAlgorithm if m.name != "NONE"]
    return names


# ------------------------------------------------------------------ HiSparse


class _HiSparseKV:
    """The HiSparse device KV pool as far as the allocator and the coordinator
    read it (a GPU pool upstream): the full -> device index mapping, kept by
    the allocator, and a page size."""

    def __init__(self, page: int) -> None:
        self.page_size = page
        self.layer_num = 1
        self.full_to_hisparse_device_index_mapping: Any = None

    def register_mapping(self, mapping: Any) -> None:
        self.full_to_hisparse_device_index_mapping = mapping

    def _translate_loc_to_hisparse_device(self, locs: Any) -> Any:
        return self.full_to_hisparse_device_index_mapping[locs]

    def translate_loc_from_full_to_hisparse_device(self, locs: Any) -> Any:
        return self.full_to_hisparse_device_index_mapping[locs]

    def translate_loc_from_full_to_compressed(self, locs: Any) -> Any:
        return locs


class _NoSpecSwap:
    """HiSparse's spec scratch manager with speculation off."""

    enabled = False
    scratch_capacity = 0

    def allocate_scratch(self, idx: int) -> None:
        pass

    def reset(self, idx: int) -> None:
        pass

    def invalidate_cache(self, idx: int) -> None:
        pass

    def extend_owned_locs(self, idx: int, locs: Any) -> Any:
        return locs

    def free_unrotated_scratch(self, idx: int) -> None:
        pass

    def clear_scratch(self, idx: int) -> None:
        pass


class _NoHost:
    """The host KV pool (pinned host memory upstream): nothing is backed up."""

    def allocated_host_indices(self, *args: Any) -> Any:
        return sg().torch.empty(0, dtype=sg().torch.int64)

    def free(self, indices: Any) -> None:
        pass


def _hisparse(pool: Any, allocator: Any, kv: _HiSparseKV, buffer: int) -> Any:
    """SGLang's own ``HiSparseCoordinator`` class, its state made as its
    ``__init__`` makes it for one layer, without the streams and the host pool
    (CUDA upstream); the previous token's host backup is a no-op."""
    HiSparseCoordinator = importlib.import_module(HISPARSE_COORDINATOR).HiSparseCoordinator

    torch = sg().torch
    c = object.__new__(HiSparseCoordinator)
    slots, page = pool.req_to_token.shape[0], kv.page_size
    c.req_to_token_pool, c.token_to_kv_pool_allocator = pool, allocator
    c.device_buffer_size, c.mem_pool_device, c.page_size = buffer, kv, page
    c.is_dsv4_hisparse, c.is_m3_hisparse, c.compress_ratio = False, False, 1
    c.padded_buffer_size = buffer + page
    c.req_to_device_buffer = torch.zeros((slots, c.padded_buffer_size), dtype=torch.int64)
    c.req_device_buffer_size = torch.zeros(slots, dtype=torch.int64)
    c.req_to_host_pool = torch.full((slots, pool.max_context_len + page), -1,
                                    dtype=torch.int64)
    c.req_to_host_pool_allocated_len = torch.zeros(slots, dtype=torch.int64)
    c.req_device_buffer_tokens = torch.full((1, slots, c.padded_buffer_size), -1,
                                            dtype=torch.int32)
    c.req_device_buffer_token_locs = torch.full((1, slots, c.padded_buffer_size), -1,
                                                dtype=torch.int32)
    c._lru_init = torch.arange(buffer, dtype=torch.int16)
    c.lru_slots = c._lru_init.view(1, 1, -1).repeat(1, slots, 1).contiguous()
    c._device_buffer_arange_i32 = torch.arange(buffer, dtype=torch.int32)
    c.spec_swap = _NoSpecSwap()
    c.mem_pool_host = _NoHost()
    c.decode_producer_stream = None
    c._has_pending_backup = False
    c._skip_first_backup = [False] * slots
    c.ack_staging_queue = []
    c._eager_backup_previous_token = lambda *args: None  # host IO
    return c


# ------------------------------------------------------------------ the loop


class World:
    """A scheduler loop over SGLang's own classes."""

    def __init__(self, config: Config, *, max_running: int = 10,
                 server_args: Any = None) -> None:
        s = sg()
        self.server_args = server_args  # what retract_decode(server_args) is given
        torch = s.torch
        self.config = config
        self.rng = random.Random(config.seed)
        p = self.page = config.page
        self.max_running = max_running
        self.retractions = 0
        self.steps = 0
        spec = config.spec
        reserve = 0
        if spec.algorithm:
            try:
                reserve = _setting("get_alloc_reserve_per_decode")()
            except AttributeError:  # (before 0.5.13: sized from the decode length, twice)
                reserve = 2 * _setting("get_alloc_len_per_decode")()
        self.reserve = reserve
        # lengths at page multiples +-1
        self.max_prompt = 6 * p + 1 + 40
        self.max_new = 4 * p + 1 + 24
        context = self.max_prompt + self.max_new + 2 * reserve + 4 * p + 64
        self.pool = s.ReqToTokenPool(max_running * 2 + 8, context, "cpu", False)
        # KV for about 0.4 max_running requests at full length (two at least):
        # retractions come
        tokens = (int(max(2.0, max_running * 0.4) * (self.max_prompt + self.max_new + reserve))
                  // p + 2) * p
        self.coordinator = None
        dtype = torch.bfloat16
        if config.pool is Pool.TOKEN:
            self.allocator = s.Token(tokens, dtype, "cpu", None, False)
        elif config.pool is Pool.PAGED:
            self.allocator = s.Paged(tokens, p, dtype, "cpu", None, False)
        elif config.pool is Pool.HISPARSE:
            kv = _HiSparseKV(p)
            self.allocator = allocator_class(Pool.HISPARSE)(tokens, p, dtype, "cpu", kv, False)
            # the device buffer cap: a request reaches it within its lifetime
            buffer = max(p, ((self.max_prompt + self.max_new // 2) // p) * p)
            self.coordinator = _hisparse(self.pool, self.allocator, kv, buffer)
        else:
            self.allocator = _swa_allocator(config.pool, tokens, p)
        params = s.CacheInitParams(
            disable=not config.sharing, req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator, page_size=p,
            is_eagle=spec.algorithm is not None)
        if config.pool is Pool.PURE_SWA:
            from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache

            params.sliding_window_size = self.window = max(8, self.max_prompt // 3)
            self.cache = PureSWARadixCache(params)
        else:
            self.cache = s.RadixCache(params)
        self.ledger = Ledger()
        self.evictions = self.window_frees = self.prefix_hits = 0
        self._count(self.cache, "evict", "evictions")
        self._count(self.cache, "evict_sliding_windows", "window_frees")
        self.algorithm = s.SpeculativeAlgorithm.from_string(spec.algorithm)
        self.running: Any = None
        self.waiting: deque[Any] = deque()
        self.pending: list[int] | None = None  # the overlap order's unprocessed commit
        self.made = 0
        families = [[self.rng.randrange(1, 30000) for _ in range(self._len(5 * p + 30))]
                    for _ in range(3)]
        self.families = families

    def _count(self, obj: Any, name: str, counter: str) -> None:
        """Count the calls of ``obj.name`` in ``self.counter`` (what the loop exercised)."""
        fn = getattr(obj, name, None)
        if fn is None:
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            return fn(*args, **kwargs)

        setattr(obj, name, counted)

    def _len(self, top: int) -> int:
        """A length near a page multiple (k p - 1, k p, k p + 1), or any, up to ``top``."""
        p = self.page
        if self.rng.random() < 0.7 and top > p + 1:
            k = self.rng.randint(1, max(1, (top - 1) // p))
            return max(1, k * p + self.rng.choice((-1, 0, 1)))
        return self.rng.randint(1, top)

    def _new_req(self) -> Any:
        s = sg()
        self.made += 1
        family = self.rng.choice(self.families)
        shared = family[:self.rng.randint(0, len(family))] if self.config.sharing else []
        prompt = shared + [self.rng.randrange(1, 30000)
                           for _ in range(max(1, self._len(self.max_prompt - len(shared))))]
        new = self._len(self.max_new)
        return s.sb.Req(f"q{self.made}", "", s.has.token_ids(prompt),
                        s.SamplingParams(max_new_tokens=max(1, new)))

    # -------------------------------------------------------------- admission

    def admit(self) -> None:
        s = sg()
        running = 0 if self.running is None else len(self.running.reqs)
        while len(self.waiting) < 4:
            self.waiting.append(self._new_req())
        picked = []
        budget = self.allocator.available_size() + self.cache.evictable_size()
        budget -= running * self.page
        while self.waiting and running + len(picked) < self.max_running and len(picked) < 3:
            req = self.waiting[0]
            req.init_next_round_input(self.cache)
            prefix, end = _extend_all(req)
            self.prefix_hits += prefix
            need = (-(-end // self.page) + 1) * self.page + self.reserve
            if need > budget:
                break
            budget -= need
            self._lock_prefix(req)
            picked.append(self.waiting.popleft())
        if not picked:
            return
        batch = s.sb.ScheduleBatch.init_new(
            picked, self.pool, self.allocator, self.cache,
            SimpleNamespace(is_encoder_decoder=False, vocab_size=32000, is_multimodal=False,
                            is_matryoshka=False,
                            attention_arch=None, hf_config=SimpleNamespace()),
            self.config.order is Order.OVERLAP, self.algorithm)
        batch.hisparse_coordinator = self.coordinator
        batch.spec_info = _spec_info(self.config.spec.algorithm, picked)
        batch.prepare_for_extend()
        for req in picked:
            req.output_ids.append(self.rng.randrange(1, 30000))
            if self.coordinator is not None:
                self.coordinator.alloc_device_buffer(req)  # the direct admission path
        _sampled(batch)
        self._finish(batch)
        if batch.is_empty():
            return
        if self.running is None or self.running.is_empty():
            self.running = batch
        else:
            with self._draft_detached(self.running, batch):
                self.running.merge_batch(batch)

    def _lock_prefix(self, req: Any) -> None:
        """Lock the matched prefix in the tree for the request's life, as the
        scheduler's admission (``PrefillAdder``) does: ``release_kv_cache`` and
        retraction let go of it, and eviction must not take it meanwhile."""
        if sg().has.tree_lock:
            req.lock = self.cache.lock(req.last_node)
            return
        from sglang.srt.managers.schedule_policy import PrefillAdder

        adder = SimpleNamespace(tree_cache=self.cache, is_hybrid_swa=self.config.pool in (
            Pool.SWA, Pool.PURE_SWA))  # the fields the release's own method reads
        PrefillAdder._req_inc_lock_ref(adder, req)

    @contextlib.contextmanager
    def _draft_detached(self, *batches: Any) -> Any:
        """DFlash's and UNO's draft state (made by the draft model's forward pass
        upstream) is not carried through merges and filters here: each batch
        gets a fresh idle one after, which is all their decode preparation reads
        (before 0.5.15 the one they hold stays, inert, for the batch's own reads)."""
        fresh = self.config.spec.algorithm is not None and _spec_info(
            self.config.spec.algorithm) is not None
        if fresh and not sg().has.draft_prepares:
            for b in batches:
                b.spec_info = None
        try:
            yield
        finally:
            if fresh:
                for b in batches:
                    b.spec_info = _spec_info(self.config.spec.algorithm, b.reqs)

    # -------------------------------------------------------------- decode

    def decode(self) -> None:
        s = sg()
        batch = self.running
        if batch is None or batch.is_empty():
            return
        with self._draft_detached(batch):
            pass  # the draft state for this batch (DFlash, UNO)
        if not batch.check_decode_mem():
            retracted, _, _aborted = (
                batch.retract_decode(self.server_args) if s.has.retract_args
                else batch.retract_decode())
            self.retractions += len(retracted)
            for req in retracted:
                self.waiting.appendleft(req)
            if batch.is_empty():
                return
        pending = self.pending
        self.pending = None
        self.steps += 1  # driven: a step that raises was driven too (and compared)
        _sampled(batch)
        batch.prepare_for_decode()
        if self.config.order is Order.OVERLAP:
            if pending is not None:
                self._commit(pending)
            self.pending = self._accepted()
        else:
            self._commit(self._accepted())

    def _accepted(self) -> list[int]:
        """What the forward pass commits, per request (sampled)."""
        batch = self.running
        if self.algorithm.is_none():
            return [0] * len(batch.reqs)
        draft = max(1, self.config.spec.draft)
        return [self.rng.randint(1, draft) for _ in batch.reqs]

    def _commit(self, accepted: list[int]) -> None:
        batch = self.running
        torch = sg().torch
        if len(accepted) != len(batch.reqs):
            accepted = (accepted + [1] * len(batch.reqs))[:len(batch.reqs)]
        for req, k in zip(batch.reqs, accepted, strict=True):
            if self.algorithm.is_none():
                req.output_ids.append(self.rng.randrange(1, 30000))
                continue
            held = _holder(req, COMMITTED)
            k = max(0, min(k, _holder(req, ALLOCATED).kv_allocated_len - held.kv_committed_len))
            held.kv_committed_len += k
            req.output_ids.extend(self.rng.randrange(1, 30000) for _ in range(k))
        if not self.algorithm.is_none():
            lens = [_holder(r, COMMITTED).kv_committed_len for r in batch.reqs]
            batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
            batch.seq_lens = batch.seq_lens_cpu.clone()
            batch.orig_seq_lens = batch.seq_lens_cpu.to(torch.int32)
        self._finish(batch)

    def _finish(self, batch: Any) -> None:
        s = sg()
        done = False
        for req in batch.reqs:
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                req.finished_reason = s.sb.FINISH_LENGTH(length=len(req.output_ids))
                if self.coordinator is not None:
                    self.coordinator.request_finished(req)
                keep = {s.has.release_flag: self.config.sharing}  # into the tree
                s.common.release_kv_cache(req, self.cache, **keep)
                done = True
        if done:
            with self._draft_detached(batch):
                batch.filter_batch()

    def tick(self) -> None:
        self.admit()
        self.decode()
        self.ledger.check(self)

    def drain(self) -> None:
        """Every request finished and the tree evicted whole: each pool then holds
        all its slots (the ledger checks)."""
        s = sg()
        batch = self.running
        for req in list(batch.reqs) if batch is not None else ():
            if self.coordinator is not None:
                self.coordinator.request_finished(req)
            s.common.release_kv_cache(req, self.cache, **{s.has.release_flag: False})
        if batch is not None:
            batch.reqs = []
        self.running = None
        everything = 1 << 40
        self.cache.evict(s.EvictParams(num_tokens=everything, swa_num_tokens=everything))
        self.ledger.check(self, drained=True)


class Ledger:
    """What the pools' free lists say, each tick (no slot twice in one) and at
    the drain (every slot back): the frees, where the step's audit sees only
    what is handed out."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[str, str]] = {}  # kind -> (pool, words)
        self.found: dict[str, int] = {}  # "kind in pool" -> slots

    def _note(self, kind: audit.Kind, pool: str, slots: int, words: str) -> None:
        key = f"{kind} in {pool}"
        self.found[key] = max(self.found.get(key, 0), slots)
        self.first.setdefault(kind.value, (pool, words))

    def check(self, world: World, drained: bool = False) -> None:
        torch = sg().torch
        pools = audit._pools_of(world.allocator)
        if isinstance(pools, str):
            return
        for name, pool, _, _ in pools.pools:
            free = _free_list(pool)
            if free is None:
                continue
            distinct = torch.unique(free)
            twice = len(free) - len(distinct)
            if twice:
                self._note(audit.Kind.FREED_TWICE, name, twice,
                           f"{twice} slots twice in the free list of {name} after decode step "
                           f"{world.steps}")
            if drained:
                missing = _slots(pool) - len(distinct)
                if missing:
                    self._note(audit.Kind.NOT_RETURNED, name, missing,
                               f"{missing} of {_slots(pool)} slots not back in {name} when "
                               "every request had finished and the tree was evicted")


def _free_list(pool: Any) -> Any:
    """The pool's free slots (pages of a paged pool), lazily released ones
    included; None for a pool that keeps none."""
    free, released = getattr(pool, "free_pages", None), getattr(pool, "release_pages", None)
    if free is None:
        return None
    return free if released is None or not len(released) else sg().torch.cat((free, released))


def _slots(pool: Any) -> int:
    """The slots a pool hands out: its pages (slot 0 is padding, never handed out)."""
    return pool.size // getattr(pool, "page_size", 1)


def drains(config: Config) -> bool:
    """Whether a driven run of ``config`` ends with the drain: not where its
    draft input prepares the speculative decode (before 0.5.15, whose verify
    step's own frees the driver does not stand in)."""
    return config.spec.algorithm is None or not sg().has.draft_prepares


def _sampled(batch: Any) -> None:
    """The forward pass's sampled tokens on the batch, as the scheduler's result
    processing leaves them (the decode step and merges read them before 0.5.13)."""
    torch = sg().torch
    batch.output_ids = torch.tensor([r.output_ids[-1] for r in batch.reqs], dtype=torch.int64)


def _holder(req: Any, length: str) -> Any:
    """What holds the request's ``length`` (registry.COMMITTED or ALLOCATED):
    ``req.kv`` or the request itself (flat, mixed or nested, by release)."""
    kv = getattr(req, KV_INFO, None)
    return kv if hasattr(kv, length) else req


def _extend_all(req: Any) -> tuple[int, int]:
    """Give a matched request its whole fill as the extend: (prefix reused, end)."""
    extend = sg().has.extend
    if extend is Extend.INPUT_LEN:
        # init_next_round_input set the whole fill as the extend: before 0.5.13 in
        # fill_ids; since, full_untruncated_fill_ids, and admission sets fill_len
        fill = getattr(req, "full_untruncated_fill_ids", None)
        end = len(req.fill_ids if fill is None else fill)
        if fill is not None:
            req.fill_len = end
        return len(req.prefix_indices), end
    end = len(req.full_untruncated_fill_ids)
    if extend is Extend.END:
        req.extend_end = end
        return req.prefix_len, end
    prefix = len(req.prefix_indices)
    req.set_extend_range(prefix, end)
    return prefix, end


def _swa_kv() -> Any:
    """SGLang's own ``SWAKVPool`` with no buffers (GPU tensors upstream): the
    allocator reads its sub-pools (none) and its full -> SWA index mapping."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    kv = object.__new__(SWAKVPool)
    kv.full_kv_pool = kv.swa_kv_pool = None
    kv.swa_req_ring_size = None
    kv.full_to_swa_index_mapping = None
    return kv


def _swa_allocator(pool: Pool, tokens: int, page: int) -> Any:
    torch = sg().torch
    if pool is Pool.PURE_SWA:
        return allocator_class(pool)(tokens, page, torch.bfloat16, "cpu", _swa_kv(), False)
    return allocator_class(pool)(tokens, tokens, page, torch.bfloat16, "cpu", _swa_kv(), False)


def context(config: Config) -> Any:
    spec = config.spec
    extra: dict[str, Any] = {}
    if spec.algorithm is not None:
        extra = dict(speculative_algorithm=spec.algorithm, speculative_num_steps=spec.steps,
                     speculative_eagle_topk=spec.topk, speculative_num_draft_tokens=spec.draft)
    fields = dict(page_size=config.page, attention_backend="torch_native", **extra)
    s = sg()
    runtime = s.runtime.get_context() if s.runtime is not None else None
    if hasattr(runtime, "override_server_args"):  # 0.5.16+
        return runtime.override_server_args(**fields)
    return _published(s.server_args, s.server_args.ServerArgs(model_path="dummy", **fields))


@contextlib.contextmanager
def _published(module: Any, args: Any) -> Any:
    """``args`` as the process's server args (before 0.5.16: set globally), and
    what was set before it after."""
    try:
        previous = module.get_global_server_args()
    except ValueError:  # none set yet
        previous = None
    module.set_global_server_args_for_scheduler(args)
    try:
        yield args
    finally:
        if previous is not None:
            module.set_global_server_args_for_scheduler(previous)


def _where(exc: BaseException) -> str:
    """The exception and the innermost line it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}"[:300] + at


def run(config: Config, steps: int, max_running: int = 10) -> Result:
    """One configuration: ``steps`` decode steps (fewer if SGLang raises), at
    most ``max_running`` requests in the decode batch.  Never raises: what
    went wrong is the result's ``outcome`` and ``ended``."""
    audit.reset()
    ended = None
    outcome = Outcome.DRIVEN
    world: World | None = None
    # SWA slides its windows every few tokens here (128 by default, longer than
    # these requests live), so that frees happen inside decode steps
    interval = os.environ.get(SWA_INTERVAL)
    os.environ[SWA_INTERVAL] = "4"
    try:
        _standins()
        with context(config) as server_args:
            world = World(config, max_running=max_running, server_args=server_args)
            ticks = 0
            while world.steps < steps and ticks < 10 * steps + 100:
                failed = audit.AUDIT.failed_after_fits
                try:
                    world.tick()  # (a tick admits, decodes, or both)
                except Exception as exc:
                    # SGLang's allocation failing after its check said "fits" ends the
                    # run as it ends a server; anything else is the driver's
                    ended = _where(exc)
                    outcome = (Outcome.FAILED_AFTER_FITS
                               if audit.AUDIT.failed_after_fits > failed else
                               Outcome.DRIVER_ERROR)
                    break
                ticks += 1
            else:
                if world.steps < steps:
                    outcome = Outcome.SHORT
            # (after a slot freed twice the pool's own counts are off: its asserts fire)
            if (outcome is Outcome.DRIVEN and drains(config)
                    and audit.Kind.FREED_TWICE.value not in world.ledger.first):
                world.drain()
    except Exception as exc:  # making the world, or the settings: the driver's
        ended = _where(exc)
        outcome = Outcome.DRIVER_ERROR
    finally:
        if interval is None:
            os.environ.pop(SWA_INTERVAL, None)
        else:
            os.environ[SWA_INTERVAL] = interval
    report = audit.report()
    overcounts = sum(p.get("overcounts", 0) for p in report["pools"].values())
    driven = world.steps if world is not None else 0
    exercised = {"evictions": getattr(world, "evictions", 0),
                 "window_frees": getattr(world, "window_frees", 0),
                 "prefix_hits": getattr(world, "prefix_hits", 0)}
    first_steps = {k.value: f.step for k, f in audit.AUDIT.first.items()}
    first_pools = {k.value: f.pool for k, f in audit.AUDIT.first.items()}
    findings = dict(report["first"])
    ledger = getattr(world, "ledger", None) or Ledger()
    for kind, (pool, words) in ledger.first.items():
        findings[kind], first_pools[kind] = words, pool
        first_steps[kind] = driven
    return Result(config, report["steps"], report["undercounts"], overcounts,
                  report["bookkeeping_gaps"], getattr(world, "retractions", 0), exercised,
                  ended, findings, report,
                  undriven(outcome, driven, steps, report, ended), driven, steps, outcome,
                  first_steps, first_pools, dict(ledger.found))


# ------------------------------------------------------------------ the matrix


def _family(alg: Any) -> str:
    return next((f for f in ("dflash", "uno", "ngram") if _is(alg, f)), "eagle")


def _draft_class(alg: Any) -> Any:
    """Before 0.5.15: the draft input class whose prepare_for_decode the batch calls."""
    home = registry.DRAFT_INPUTS.get(_family(alg))
    return None if home is None else getattr(_optional(home[0]), home[1], None)


def decode_allocates(spec: Spec, order: Order) -> str | None:
    """Why this release's decode step allocates nothing for ``spec`` in ``order``
    (its speculative worker does, on a model), or None where it does."""
    s = sg()
    if spec.algorithm is None or not s.has.draft_prepares:
        return None
    alg = s.SpeculativeAlgorithm.from_string(spec.algorithm)
    v2 = getattr(s.sb.ScheduleBatch, "is_spec_v2", None)
    if isinstance(v2, property):  # the release's own test, on what it reads
        try:
            on = v2.fget(SimpleNamespace(enable_overlap=order is Order.OVERLAP,
                                         spec_algorithm=alg))
        except AssertionError:  # (0.5.11-0.5.12: an algorithm with no spec v2)
            on = False
        if not on:
            return "a spec-v1 batch: the speculative worker allocates its KV"
    if not hasattr(_draft_class(alg), "prepare_for_decode"):
        return "no draft input that prepares the decode step"
    return None


def unsupported(config: Config) -> str | None:
    """Why the release's own settings refuse ``config`` (0.5.11-0.5.12: no decode
    length for page size > 1 with topk > 1), or None."""
    if config.spec.algorithm is None:
        return None
    with context(config):
        try:
            _setting("get_alloc_len_per_decode")()
        except NotImplementedError as exc:
            return f"the release refuses it: {exc}"
    return None




def _spec_info(algorithm: str | None, reqs: list[Any] | None = None) -> Any:
    """The draft input a DFlash or UNO batch carries, sized to ``reqs`` (made by
    the draft model's forward pass upstream; their decode preparation reads
    the requests, and the batch size from it)."""
    if algorithm is None:
        return None
    alg = sg().SpeculativeAlgorithm.from_string(algorithm)
    torch = sg().torch
    cpu = torch.device("cpu")
    n = len(reqs or ())
    lens = torch.tensor([_holder(r, COMMITTED).kv_committed_len for r in reqs or ()],
                        dtype=torch.int64)
    if _is(alg, "dflash"):
        from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

        info = DFlashDraftInputV2.create_idle_input(cpu)
        info.topk_p = torch.zeros((n, 1), dtype=torch.float32)
        info.topk_index = torch.zeros((n, 1), dtype=torch.int64)
        info.hidden_states = torch.zeros((n, 1), dtype=torch.float16)
    elif _is(alg, "uno"):
        from sglang.srt.speculative.uno_info import UnoDraftInput

        width = max(1, _setting("get_alloc_len_per_decode")())
        info = UnoDraftInput.create_idle_input(device=cpu, forward_width=width)
    elif sg().has.draft_prepares:  # EAGLE's and NGRAM's: the batch calls its method only
        return _inert(object.__new__(_draft_class(alg)))
    else:
        return None
    info.bonus_tokens = torch.zeros(n, dtype=torch.int64)
    if sg().has.draft_prepares:
        _inert(info)
    info.new_seq_lens = lens
    return info


def _no_op(*args: Any, **kwargs: Any) -> None:
    pass


def _inert(info: Any) -> Any:
    """Before 0.5.15 a retraction's and a finish's filter_batch, and a merge, reach
    the draft input's own, which slice the draft model's tensors (none here) and
    no KV: they do nothing here."""
    info.filter_batch = info.merge_batch = _no_op
    info.verify_done = None  # (0.5.11-0.5.12: the overlap's verify event, none here)
    return info


def _is(alg: Any, family: str) -> bool:
    """Whether ``alg`` is of ``family`` (registry.SPEC_FAMILIES), by the first of
    its predicates the release has; False in a release that has none yet."""
    for name in registry.SPEC_FAMILIES[family]:
        test = getattr(alg, name, None)
        if test is not None:
            return bool(test())
    return False


def specs(quick: bool) -> list[Spec]:
    """No speculation, and every algorithm the release offers (EAGLE's family
    at topk 1, 2 and 4)."""
    out = [Spec()]
    names = spec_algorithms()
    for name in names:
        alg = sg().SpeculativeAlgorithm.from_string(name)
        topks = (1, 2, 4) if name == "EAGLE" else (1,)
        if quick and name not in ("EAGLE", "NGRAM", "DFLASH", "UNO"):
            continue
        for topk in topks:
            if quick and topk == 4:
                continue
            draft = {1: 4, 2: 6, 4: 8}[topk]
            if any(_is(alg, family) for family in ("uno", "dflash", "ngram")):
                out.append(Spec(name, 1, 1, draft))
            else:
                out.append(Spec(name, 3, topk, draft))
    return out


# page sizes per allocator: 1, powers of two and odd ones
PAGES = {Pool.TOKEN: (1,), Pool.PAGED: (16, 7, 64, 100), Pool.SWA: (1, 16, 7),
         Pool.PURE_SWA: (1,), Pool.HISPARSE: (16, 7, 64)}
QUICK_PAGES = {Pool.TOKEN: (1,), Pool.PAGED: (16, 7), Pool.SWA: (16,), Pool.PURE_SWA: (1,),
               Pool.HISPARSE: (16, 7)}


def _candidates(quick: bool, pools: tuple[Pool, ...]) -> Iterator[tuple[Pool, int, Spec, Order]]:
    """Every (allocator, page size, speculation, order) the matrix drives where
    a release has it."""
    for pool in pools:
        for page in (QUICK_PAGES if quick else PAGES)[pool]:
            for spec in specs(quick):
                if pool is Pool.HISPARSE and spec.algorithm is not None:
                    continue  # HiSparse's spec scratch swaps run on a GPU: not driven
                for order in Order:
                    if quick and spec.algorithm is None and order is Order.OVERLAP \
                            and pool is not Pool.HISPARSE:
                        continue
                    yield pool, page, spec, order


def _left_out(pool: Pool, page: int, spec: Spec, order: Order) -> str | None:
    """Why this release cannot be driven through the configuration, in the words
    main() prints under ``not listed:``; None where it can."""
    if (why := not_here(pool)) is not None:
        return f"{pool}: {why}"
    if (why := decode_allocates(spec, order)) is not None:
        return f"spec={spec} {order}, on every allocator: {why}"
    if (why := unsupported(Config(pool, page, spec, order, False, 0))) is not None:
        return f"{pool} p={page} spec={spec}: {why}"
    return None


def matrix(quick: bool = False, pools: tuple[Pool, ...] = tuple(Pool), seed: int = 0
           ) -> list[Config]:
    configs = []
    for pool, page, spec, order in _candidates(quick, pools):
        if _left_out(pool, page, spec, order) is None:  # (else not_listed() names it)
            sharing = pool in (Pool.TOKEN, Pool.PAGED, Pool.PURE_SWA)
            configs.append(Config(pool, page, spec, order, sharing, seed + len(configs)))
    return configs


def not_listed(quick: bool = False, pools: tuple[Pool, ...] = tuple(Pool)) -> list[str]:
    """What the matrix leaves out on this release, and why: allocators it has
    not (or that cannot run here), speculative configurations its decode step
    does not allocate for, and settings it refuses."""
    return list(dict.fromkeys(why for candidate in _candidates(quick, pools)
                              if (why := _left_out(*candidate)) is not None))


COLUMNS = (  # the table's columns, and what each means (printed under it)
    ("allocator", "the KV allocator family"),
    ("page", "page size"),
    ("speculation", "none, or ALGORITHM(steps,topk,draft tokens)"),
    ("order", "plain: a step's result processed before the next is scheduled; overlap: after"),
    ("prefix", "shared: prefix sharing through the radix cache"),
    ("steps", "decode steps whose estimate was compared with what every pool handed out"),
    ("under", "steps where a pool was asked for more than the estimate (undercounts)"),
    ("over", "pool-steps where the estimate was above what the pool was asked for (safe)"),
    ("gaps", "steps whose recorded kv_allocated_len growth differs from what the pool "
             "handed out"),
    ("retract", "requests retracted by retract_decode"),
    ("evict", "the tree cache's evict calls"),
    ("window", "SWA window slides (evict_sliding_windows calls)"),
    ("driven", "decode steps driven (steps above are those of them compared)"),
    ("ended", "why the run ended before its steps: 'failed after fits' (SGLang's allocation "
              "failed after its check said the step fits: a finding), 'driver error' or "
              "'short' (the configuration was not driven); empty: it drove them all"),
)


def _table(results: list[Result]) -> str:
    head = tuple(name for name, _ in COLUMNS)
    rows = [head]
    for r in results:
        c = r.config
        why = "" if r.outcome is Outcome.DRIVEN else f"{r.outcome}: {r.ended or ''}"
        rows.append((str(c.pool), str(c.page), str(c.spec), str(c.order),
                     "shared" if c.sharing else "-", str(r.steps), str(r.undercounts),
                     str(r.overcounts), str(r.gaps), str(r.retractions),
                     str(r.exercised.get("evictions", 0)),
                     str(r.exercised.get("window_frees", 0)), str(r.driven), why[:70]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _legend() -> str:
    width = max(len(name) for name, _ in COLUMNS)
    return "\n".join(f"  {name:{width}}  {what}" for name, what in COLUMNS)


def _pools_found(results: list[Result], key: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in results:
        for name, counts in r.report.get("pools", {}).items():
            if counts.get(key):
                found[name] = found.get(name, 0) + counts[key]
    return found


class KnownPolicy(enum.Enum):
    """What a finding kvest knows (registry.KNOWN_FINDINGS) does to the exit status."""

    FAIL = "fail"  # exit 1, as a new one does (marked known)
    IGNORE = "ignore"  # marked known, printed, and the exit status ignores it

    def __str__(self) -> str:
        return self.value


def found(result: Result) -> list[tuple[str, str]]:
    """What ``result`` found: (kind, pool) for each pool with undercounts or gaps,
    and each kind's first finding (an allocation failure after fits has only that)."""
    out = []
    for pool, counts in result.report.get("pools", {}).items():
        if counts.get("undercounts"):
            out.append((audit.Kind.UNDERCOUNT.value, pool))
        if counts.get("bookkeeping_gaps"):
            out.append((audit.Kind.GAP.value, pool))
    for key in result.frees:  # "kind in pool"
        kind, pool = key.split(" in ", 1)
        out.append((kind, pool))
    kinds = set(result.findings)
    if result.report.get("failed_after_fits"):
        kinds.add(audit.Kind.FAILED.value)
    for kind in sorted(kinds):  # each kind's first, whatever the pools say
        first = (kind, result.first_pools.get(kind, ""))
        if first not in out:
            out.append(first)
    return out


def known(kind: str, pool: str, config: Config, version: str) -> KnownFinding | None:
    """The finding kvest knows that (kind, pool) in ``config`` on ``version`` is, if any."""
    return audit.known_finding(kind, pool, str(config.pool), config.spec.algorithm,
                               config.page, version)


def _known_words(k: KnownFinding) -> str:
    first, last = k.releases
    fixed = f"fixed in {k.fixed_in}" if k.fixed_in else "not fixed"
    return (f"{k.name}: {k.text} (releases {first} to {last or 'this one'}, {fixed}; "
            f"{k.reference})")


def command(config: Config, steps: int, max_running: int) -> str:
    """The command line that runs ``config`` alone, as the matrix ran it."""
    return shlex.join(["python", "-m", "kvest", "audit", "--config", str(config),
                       "--steps", str(steps), "--max-running", str(max_running)])


def main(argv: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(
        prog="python -m kvest audit",
        description="Run the installed SGLang's own scheduler classes on the CPU (admission, "
                    "decode, retraction, finishing, prefix sharing with eviction, both "
                    "overlap orders) over every allocator, page size and speculative "
                    "algorithm, and audit each decode step: the estimate the decode check "
                    "decided on against what the KV pools handed out, and the requests' "
                    "recorded kv_allocated_len against it. Exit status: 0 every "
                    "configuration driven and nothing found, 1 an undercount, a bookkeeping "
                    "gap or an allocation failure after the check said the step fits, 2 a "
                    "configuration not driven (named, with its reason), a driver error, a "
                    "usage error or no SGLang scheduler the audit can attach to.")
    top.add_argument("--quick", action="store_true",
                     help="fewer configurations and steps (about a minute)")
    top.add_argument("--steps", type=int, default=None,
                     help="decode steps per configuration (default 400; 150 with --quick)")
    top.add_argument("--seed", type=int, default=0, help="the first configuration's seed")
    top.add_argument("--allocator", action="append", choices=[str(p) for p in Pool],
                     help="only these allocators (repeatable)")
    top.add_argument("--config", type=_config_arg, default=None,
                     help="run this one configuration, as the table's reproducer prints it")
    top.add_argument("--max-running", type=int, default=10,
                     help="at most this many requests in the decode batch (default 10)")
    top.add_argument("--known-findings", type=KnownPolicy, choices=list(KnownPolicy),
                     default=KnownPolicy.FAIL,
                     help="a finding kvest already knows in this release "
                          "(kvest.sglang.registry.KNOWN_FINDINGS): 'fail' (default) exits 1 "
                          "as a new one does; 'ignore' marks it known and exits 0 if nothing "
                          "else was found, so that with --allocator an operator can gate an "
                          "upgrade on what they run")
    args = top.parse_args(argv)
    steps = args.steps if args.steps is not None else (150 if args.quick else 400)
    if steps < 1:
        top.error("--steps must be at least 1")
    if args.max_running < 1:
        top.error("--max-running must be at least 1")
    start = time.monotonic()
    try:
        s = sg()
    except Exception as exc:
        print(f"kvest audit: SGLang's scheduler does not import here: {type(exc).__name__}: "
              f"{exc}", file=sys.stderr)
        return 2
    # each configuration's first finding is printed below, with its configuration
    logging.getLogger("kvest.sglang").setLevel(logging.ERROR)
    try:
        missing = audit.install(every=1)
    except Exception as exc:
        missing = [f"a driver error: {_where(exc)}"]
    if not audit.installed():
        print(f"kvest audit: cannot attach to this SGLang ({s.version}): {'; '.join(missing)}",
              file=sys.stderr)
        return 2
    try:
        return _main(args, steps, s.version, start)
    except Exception as exc:  # the driver's own: it found nothing, it failed
        print(f"kvest audit: a driver error: {_where(exc)}", file=sys.stderr)
        return 2
    finally:
        print(f"full run: {time.monotonic() - start:.0f} s")


def _config_arg(text: str) -> Config:
    try:
        return Config.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _main(args: argparse.Namespace, steps: int, version: str, start: float) -> int:
    pools = tuple(Pool(a) for a in args.allocator) if args.allocator else tuple(Pool)
    try:
        configs = [args.config] if args.config else matrix(args.quick, pools, args.seed)
    except Exception as exc:
        print(f"kvest audit: the configurations of SGLang {version} cannot be listed: "
              f"{_where(exc)}", file=sys.stderr)
        return 2
    if not configs:  # nothing listed is nothing driven: no all-clear
        print(f"kvest audit: no configuration to drive on SGLang {version}", file=sys.stderr)
        return 2
    if args.config and (why := decode_allocates(args.config.spec, args.config.order)):
        print(f"kvest audit: {args.config} is not audited on SGLang {version}: {why}",
              file=sys.stderr)
        return 2
    print(f"kvest audit: SGLang {version}, {len(configs)} configurations, {steps} decode "
          "steps each", file=sys.stderr)
    if not args.config:
        for note in not_listed(args.quick, pools):
            print(f"  not listed: {note}", file=sys.stderr)
    results = []
    for i, config in enumerate(configs, 1):
        result = run(config, steps, args.max_running)
        results.append(result)
        flag = " UNDERCOUNT" if result.undercounts else ""
        flag += " GAP" if result.gaps else ""
        if result.bad:
            flag += " (known)" if all(known(k, p, config, version) for k, p in
                                      found(result)) else " (new)"
        flag += " NOT DRIVEN" if result.skipped else ""
        print(f"[{i}/{len(configs)} {time.monotonic() - start:5.0f}s] {config}: "
              f"{result.steps} of {result.driven} steps compared{flag}", file=sys.stderr,
              flush=True)
    print(_table(results))
    print("\ncolumns:\n" + _legend())
    bad = [r for r in results if r.bad]
    undriven_ = [r for r in results if r.skipped]
    print(f"\n{len(results)} configurations, {sum(r.driven for r in results)} decode steps "
          f"driven, {sum(r.steps for r in results)} compared, "
          f"{sum(r.retractions for r in results)} retractions, "
          f"{time.monotonic() - start:.0f} s")
    for key, what in (("undercounts", "undercounts"), ("bookkeeping_gaps", "bookkeeping gaps"),
                      ("failed_after_fits", "allocation failures after fits")):
        if key == "failed_after_fits":
            n = sum(r.report.get(key, 0) for r in results)
            if n:
                print(f"{what}: {n}")
            continue
        by_pool = _pools_found(results, key)
        if by_pool:
            print(f"{what}: " + ", ".join(f"{n} in {pool}" for pool, n in by_pool.items()))
    frees = [r for r in results if r.frees]
    if frees:
        print(f"the frees, in {len(frees)} configurations: " + ", ".join(sorted(
            {key for r in frees for key in r.frees})))
    marks = {(r.config, kind, pool): known(kind, pool, r.config, version)
             for r in bad for kind, pool in found(r)}
    new = sorted({f"{kind} in {pool}" for (_, kind, pool), k in marks.items() if k is None})
    seen = {k.name: k for k in marks.values() if k is not None}
    for k in seen.values():
        configs = len({c for (c, _, _), m in marks.items() if m is k})
        print(f"known finding, in {configs} configurations: {_known_words(k)}")
    if new:
        print("new findings (not among kvest's known ones): " + ", ".join(new))
    shown: set[str] = set()
    for r in bad:
        for kind, text in r.findings.items():
            if kind in shown:
                continue
            shown.add(kind)
            small = _smallest(r.config, steps, kind, args.max_running)
            running, at, text = small or (args.max_running, r.first_steps.get(kind), text)
            k = known(kind, r.first_pools.get(kind, ""), r.config, version)
            print(f"\nreproducer, first {kind}: configuration {r.config}, at most {running} "
                  f"running requests, decode step {at} of this configuration\n"
                  f"  {command(r.config, steps, running)}\n  {text}\n  "
                  + (f"known: {k.name}" if k else "new: not among kvest's known findings"))
    if undriven_:
        print(f"\n{len(undriven_)} of {len(results)} configurations not driven: the run "
              "supports no answer for them (exit 2)")
        for r in undriven_:
            print(f"  {r.config}: {r.skipped}\n    {command(r.config, steps, args.max_running)}")
        return 2
    if new or (seen and args.known_findings is KnownPolicy.FAIL):
        return 1
    print(f"No {'new ' if seen else ''}undercount and no {'new ' if seen else ''}bookkeeping "
          f"gap: every one of the {len(results)} configurations driven, and its steps compared"
          + (f"; known findings ignored (--known-findings=ignore): {', '.join(seen)}."
             if seen else "."))
    return 0


def _smallest(config: Config, steps: int, kind: str, most: int
              ) -> tuple[int, int | None, str] | None:
    """The finding of ``kind`` in the same configuration with the fewest running
    requests that still shows it (a minimal reproducer): (that number, the step
    it is found in, its text)."""
    for running in (1, 2, 3, 4, 6):
        if running >= most:
            break
        result = run(config, steps, max_running=running)
        if kind in result.findings:
            return running, result.first_steps.get(kind), result.findings[kind]
    return None
