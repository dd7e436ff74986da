"""One decode step's bookkeeping in real SGLang, upstream against kvest, side by side.

Runs where SGLang's scheduler modules import (a 0.5.19+ release: lengths under
``req.kv``, the config published through ``sglang.srt.runtime_context``); see
``tools/sglang_cpu/README.md`` in the repository for the recipe on a CPU-only
machine.  Upstream's
side is upstream's own code, called as the scheduler calls it: the real
``ScheduleBatch`` methods on real ``Req`` objects, the real
``page_aligned_decode_alloc_lens`` followed by the two
``torch.tensor(..., dtype=torch.int32)`` conversions its callers make, and the
real ``get_num_new_pages`` on CPU tensors.  kvest's side does what the drop-in
does in their place (:class:`KvestStep`): the same inputs, kvest's kernels
(the beam rows included), upstream's own reserve function, and the callers'
tensor conversions unchanged.  Each pair is checked to give the same answer before it
is timed.

Hot spots (``n`` requests, page size 16, EAGLE with (steps, topk, draft) = (3, 1, 4)):

- ``estimate spec``: ``new_tokens_required_next_decode()`` with speculation;
- ``estimate no-spec``: the same without (``p * #{C mod p == 0}`` plus beam rows);
- ``estimate spec, selected``: one retract iteration (``selected_indices`` = all but one);
- ``alloc lens + 2 int32 tensors``: ``page_aligned_decode_alloc_lens`` and its tensors;
- ``get_num_new_pages extend`` / ``decode``: on int64 CPU tensors;
- ``step``: one spec-decode step's bookkeeping, estimate + alloc lens + tensors +
  ``get_num_new_pages`` over the plan;
- ``retract k=8``: a retract loop of 8 retractions (estimate over the kept
  requests, then drop the last), over ``n`` requests.
"""

from __future__ import annotations

import functools
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

import kvest
from kvest._bench.tables import fmt_time, render
from kvest._bench.targets import Verdict
from kvest._bench.timing import measure

SIZES = [1, 16, 64, 256, 1024, 4096]
QUICK_SIZES = [1, 256, 1024, 4096]
PAGE_SIZE = 16
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=3,
            speculative_eagle_topk=1, speculative_num_draft_tokens=4)
RETRACTIONS = 8
HOT_SPOTS = ["estimate spec", "estimate no-spec", "estimate spec, selected",
             "alloc lens + 2 int32 tensors", "get_num_new_pages extend",
             "get_num_new_pages decode", "step", f"retract k={RETRACTIONS}"]
# The target per hot spot: kvest at least this many times faster than upstream.
TARGETS = {"estimate spec": 8.0, "estimate spec, selected": 6.0, "estimate no-spec": 1.5,
           "alloc lens + 2 int32 tensors": 10.0, "get_num_new_pages extend": 5.0,
           "get_num_new_pages decode": 5.0, "step": 8.0}


def available() -> str | None:
    """Why the section cannot run here, or None if it can."""
    try:
        import torch  # noqa: F401
        from sglang.srt.managers.schedule_batch import Req  # noqa: F401
        from sglang.srt.mem_cache import allocation_sizing
        from sglang.srt.runtime_context import get_context  # noqa: F401
    except Exception as exc:  # anything: a missing, broken or older installation
        return f"sglang's scheduler modules do not import here ({type(exc).__name__}: {exc})"
    if not hasattr(allocation_sizing, "page_aligned_decode_alloc_lens"):
        return "this sglang has no page_aligned_decode_alloc_lens (the 0.5.19+ shape)"
    return None


@dataclass
class Upstream:
    """The real SGLang pieces, imported once."""

    version: str
    torch: Any
    Req: Any
    ScheduleBatch: Any
    SamplingParams: Any
    SpeculativeAlgorithm: Any
    get_context: Any
    alloc_lens: Callable[..., Any]
    reserve: Callable[[], int]
    num_new_pages: Callable[..., int]


@functools.lru_cache(maxsize=1)
def upstream() -> Upstream:
    import sglang
    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.allocation_sizing import (
        get_alloc_reserve_per_decode,
        page_aligned_decode_alloc_lens,
    )
    from sglang.srt.runtime_context import get_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import get_num_new_pages

    return Upstream(sglang.__version__, torch, Req, ScheduleBatch, SamplingParams,
                    SpeculativeAlgorithm, get_context, page_aligned_decode_alloc_lens,
                    get_alloc_reserve_per_decode, get_num_new_pages)


class KvestStep:
    """What the drop-in runs in place of each upstream hot spot."""

    def __init__(self, up: Upstream) -> None:
        self.up = up

    def estimate(self, batch: Any, selected_indices: Any = None) -> int:
        p = batch.token_to_kv_pool_allocator.page_size
        reqs = batch.reqs
        if batch.spec_algorithm.is_none():
            tokens = kvest.decode_new_tokens_from_reqs(reqs, p, selected_indices,
                                                       layout="nested")
            return tokens + kvest.beam_member_rows_from_reqs(reqs, selected_indices)
        return kvest.spec_v2_new_tokens_from_reqs(reqs, p, self.up.reserve(), selected_indices,
                                                  layout="nested")

    @staticmethod
    def alloc_lens(reqs: list[Any], *, reserve: int, page_size: int) -> tuple[Any, Any, int]:
        plan = kvest.decode_alloc_plan_from_reqs(reqs, page_size, reserve, dtype=np.int32,
                                                 layout="nested")
        return plan.cur, plan.nxt, plan.num_tokens

    @staticmethod
    def num_new_pages(seq_lens: Any, page_size: int, prefix_lens: Any = None,
                      decode: bool = False) -> int:
        # CPU tensors are read through Tensor.numpy(): no copy, torch never imported.
        prefix = None if prefix_lens is None or decode else prefix_lens.numpy()
        return kvest.num_new_pages(seq_lens.numpy(), page_size, prefix, decode)


def make_requests(up: Upstream, n: int, seed: int = 0) -> list[Any]:
    """n real Req objects with decode-time lengths (allocation ahead by up to R)."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        req = up.Req(f"r{i}", "", array("q", range(8)), up.SamplingParams(max_new_tokens=16))
        committed = rng.randint(1, 2**17)
        req.kv.kv_committed_len = committed
        req.kv.kv_allocated_len = committed + rng.randint(0, 16)
        reqs.append(req)
    return reqs


def _batch(up: Upstream, reqs: list[Any], algorithm: str | None) -> Any:
    return up.ScheduleBatch(reqs=reqs,
                            token_to_kv_pool_allocator=SimpleNamespace(page_size=PAGE_SIZE),
                            spec_algorithm=up.SpeculativeAlgorithm.from_string(algorithm))


def _retract(estimate: Callable[..., int], batch: Any, n: int) -> int:
    """The retract loop's bookkeeping: estimate the kept requests, drop one, again."""
    kept = list(range(n))
    total = 0
    for _ in range(min(RETRACTIONS, n)):
        total += estimate(batch, kept)
        kept.pop()
    return total


def same(a: Any, b: Any) -> bool:
    """Whether upstream's answer and kvest's are the same (tensors, arrays, tuples)."""
    torch = upstream().torch
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return bool(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))
    if isinstance(a, (list, np.ndarray)) or isinstance(b, (list, np.ndarray)):
        return list(a) == list(b)
    return a == b


def cases(n: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """hot spot -> (upstream call, kvest call), on the same n real requests."""
    up = upstream()
    torch = up.torch
    kv = KvestStep(up)
    reqs = make_requests(up, n)
    spec, plain = _batch(up, reqs, "EAGLE"), _batch(up, reqs, None)
    selected = list(range(n - 1)) if n > 1 else [0]
    reserve = up.reserve()
    p = PAGE_SIZE
    seq = torch.tensor([r.kv.kv_allocated_len for r in reqs], dtype=torch.int64)
    prefix = torch.tensor([r.kv.kv_committed_len for r in reqs], dtype=torch.int64)
    up_estimate = up.ScheduleBatch.new_tokens_required_next_decode

    def up_lens() -> tuple[Any, Any, int]:
        cur, nxt, need = up.alloc_lens(reqs, reserve=reserve, page_size=p)
        return torch.tensor(cur, dtype=torch.int32), torch.tensor(nxt, dtype=torch.int32), need

    def kv_lens() -> tuple[Any, Any, int]:
        cur, nxt, need = kv.alloc_lens(reqs, reserve=reserve, page_size=p)
        return torch.tensor(cur, dtype=torch.int32), torch.tensor(nxt, dtype=torch.int32), need

    def up_step() -> tuple[int, int]:
        cur, nxt, _ = up_lens()
        return spec.new_tokens_required_next_decode(), up.num_new_pages(nxt, p, cur)

    def kv_step() -> tuple[int, int]:
        cur, nxt, _ = kv_lens()
        return kv.estimate(spec), kv.num_new_pages(nxt, p, cur)

    partial = functools.partial
    return {
        "estimate spec": (spec.new_tokens_required_next_decode, partial(kv.estimate, spec)),
        "estimate no-spec": (plain.new_tokens_required_next_decode, partial(kv.estimate, plain)),
        "estimate spec, selected": (partial(spec.new_tokens_required_next_decode, selected),
                                    partial(kv.estimate, spec, selected)),
        "alloc lens + 2 int32 tensors": (up_lens, kv_lens),
        "get_num_new_pages extend": (functools.partial(up.num_new_pages, seq, p, prefix),
                                     functools.partial(kv.num_new_pages, seq, p, prefix)),
        "get_num_new_pages decode": (functools.partial(up.num_new_pages, seq, p, decode=True),
                                     functools.partial(kv.num_new_pages, seq, p, decode=True)),
        "step": (up_step, kv_step),
        f"retract k={RETRACTIONS}": (functools.partial(_retract, up_estimate, spec, n),
                                     functools.partial(_retract, kv.estimate, spec, n)),
    }


@dataclass
class StepRow:
    hot_spot: str
    n: int
    upstream: float  # seconds per call
    kvest: float

    @property
    def speedup(self) -> float:
        return self.upstream / self.kvest


def run_section(sizes: list[int], samples: int, target: float,
                progress: Callable[[str], None] | None = None) -> list[StepRow]:
    """Every hot spot at every size, upstream and kvest interleaved; answers checked first."""
    up = upstream()
    rows = []
    override = up.get_context().override_server_args(page_size=PAGE_SIZE, **SPEC)
    override.install()  # the speculative config the spec paths read
    try:
        for n in sizes:
            for name, (up_call, kv_call) in cases(n).items():
                want, got = up_call(), kv_call()
                if not same(want, got):
                    raise AssertionError(f"{name} at n={n}: upstream {want!r}, kvest {got!r}")
                t = measure({"upstream": up_call, "kvest": kv_call}, samples, target)
                rows.append(StepRow(name, n, t["upstream"], t["kvest"]))
                if progress:
                    progress(f"sglang {name} n={n}")
    finally:
        override.restore()
    return rows


def table(rows: list[StepRow], markdown: bool = False) -> str:
    """Hot spots down, sizes across: ``upstream → kvest (speedup)`` in each cell."""
    sizes = sorted({r.n for r in rows})
    head = ["hot spot", *(f"n={n:,}" for n in sizes)]
    body = []
    for name in HOT_SPOTS:
        cells = [name]
        for n in sizes:
            r = next((r for r in rows if r.hot_spot == name and r.n == n), None)
            cells.append("–" if r is None else
                         f"{fmt_time(r.upstream)} → {fmt_time(r.kvest)} ({r.speedup:.1f}×)")
        body.append(cells)
    return render(head, body, markdown)


def headline(rows: list[StepRow], n: int = 1024) -> str | None:
    """The one sentence a reader should remember: the whole step at batch ``n``."""
    r = next((r for r in rows if r.hot_spot == "step" and r.n == n), None)
    if r is None:
        return None
    return (f"per-step bookkeeping at batch {n:,}, from {r.upstream * 1e6:,.0f} µs to "
            f"{r.kvest * 1e6:,.0f} µs ({r.speedup:.1f}× less time)")


def targets(rows: list[StepRow]) -> list[Verdict]:
    """(target, measured, met) for each hot spot's target at n = 256, 1,024 and 4,096."""
    out: list[Verdict] = []
    for name, want in TARGETS.items():
        sizes = [1024] if name == "step" else [256, 1024, 4096]
        picked = [r for r in rows if r.hot_spot == name and r.n in sizes]
        if not picked:
            continue
        worst = min(r.speedup for r in picked)
        where = ", ".join(f"{r.speedup:.1f}× at {r.n:,}" for r in picked)
        out.append((f"{name}: ≥ {want:g}×", where, worst >= want))
    return out
