"""The object kernels on request objects shaped like each SGLang release's.

Each shape (:mod:`kvest._bench.requests`) comes with the per-request loop that
release runs (the same arithmetic, written here); kvest's object kernel is timed
searching the layout (``layout=None``) and told it (``layout=`` the release's).
Used by ``python -m kvest bench`` and ``bench/test_objects.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import kvest
from kvest._bench.arrays import RESERVE, make_batch
from kvest._bench.requests import FlatReq, MixedReq, NestedReq, TinyFlat
from kvest._bench.tables import fmt_ratio, fmt_time, render
from kvest._bench.targets import Verdict
from kvest._bench.timing import measure

SIZES = [1, 256, 1024, 4096]
QUICK_SIZES = [1, 1024]
FUNCTIONS = ("spec_v2", "decode", "plan")
PAGE_SIZE = 16
# The targets for the drop-in (kvest with the release's layout) against the
# release's own loop: function -> (at least, at least at n=256).
TARGETS = {"spec_v2": (8.0, 10.0), "decode": (1.5, 1.5), "plan": (10.0, 10.0)}


# ------------------------------------------------ the releases' own loops

def _spec_v2_flat(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv_committed_len + reserve - r.kv_allocated_len)
        cur = r.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _spec_v2_mixed(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv_committed_len + reserve - r.kv.kv_allocated_len)
        cur = r.kv.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _spec_v2_nested(reqs: list[Any], p: int, reserve: int) -> int:
    total = 0
    for r in reqs:
        x = max(0, r.kv.kv_committed_len + reserve - r.kv.kv_allocated_len)
        cur = r.kv.kv_allocated_len
        total += (cur + x + p - 1) // p * p - (cur + p - 1) // p * p
    return total


def _decode_flat(reqs: list[Any], p: int) -> int:
    return sum(1 for r in reqs if r.kv_committed_len % p == 0) * p


def _decode_nested(reqs: list[Any], p: int) -> int:
    return sum(1 for r in reqs if r.kv.kv_committed_len % p == 0) * p


def _plan_flat(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv_allocated_len
        nxt = max(cur, (r.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


def _plan_mixed(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv.kv_allocated_len
        nxt = max(cur, (r.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


def _plan_nested(reqs: list[Any], p: int, reserve: int) -> tuple[list[int], list[int], int]:
    cur_lens, nxt_lens, need = [0] * len(reqs), [0] * len(reqs), 0
    for i, r in enumerate(reqs):
        cur = r.kv.kv_allocated_len
        nxt = max(cur, (r.kv.kv_committed_len + reserve + p - 1) // p * p)
        cur_lens[i], nxt_lens[i] = cur, nxt
        need += nxt - cur
    return cur_lens, nxt_lens, need


@dataclass(frozen=True)
class Shape:
    label: str
    make: Callable[[int, int], Any]
    layout: str
    loops: dict[str, Callable[..., Any]]


_FLAT = {"spec_v2": _spec_v2_flat, "decode": _decode_flat, "plan": _plan_flat}
SHAPES = [
    Shape("tiny stand-in (2 attributes)", TinyFlat, "flat", _FLAT),
    Shape("0.5.11 flat, 128 attributes", FlatReq, "flat", _FLAT),
    Shape("0.5.17 mixed, 140 attributes", MixedReq, "mixed",
          {"spec_v2": _spec_v2_mixed, "decode": _decode_flat, "plan": _plan_mixed}),
    Shape("0.5.23 nested, 157 attributes", NestedReq, "nested",
          {"spec_v2": _spec_v2_nested, "decode": _decode_nested, "plan": _plan_nested}),
]


@functools.lru_cache(maxsize=32)
def shape_batch(label: str, n: int) -> list[Any]:
    shape = next(s for s in SHAPES if s.label == label)
    b = make_batch(n, PAGE_SIZE)
    return [shape.make(c, a) for c, a in zip(b.committed.tolist(), b.allocated.tolist(),
                                             strict=True)]


def object_calls(shape: Shape, fn: str, n: int) -> dict[str, Callable[[], Any]]:
    """implementation -> zero-argument call, on n requests of one release's shape."""
    reqs, p, r = shape_batch(shape.label, n), PAGE_SIZE, RESERVE
    loop = shape.loops[fn]
    if fn == "spec_v2":
        kernel: Callable[..., Any] = functools.partial(kvest.spec_v2_new_tokens_from_reqs,
                                                       reqs, p, r)
        base = functools.partial(loop, reqs, p, r)
    elif fn == "decode":
        kernel = functools.partial(kvest.decode_new_tokens_from_reqs, reqs, p)
        base = functools.partial(loop, reqs, p)
    else:
        kernel = functools.partial(kvest.decode_alloc_plan_from_reqs, reqs, p, r,
                                   dtype=np.int32)
        base = functools.partial(loop, reqs, p, r)
    return {"loop": base, "kvest": kernel,
            "kvest layout=": functools.partial(kernel, layout=shape.layout)}


def plain(result: Any) -> Any:
    """A result in a form that compares equal across implementations."""
    if isinstance(result, kvest.AllocPlan):
        return result.cur.tolist(), result.nxt.tolist(), result.num_tokens
    return result


@dataclass
class ObjectRow:
    shape: str
    layout: str
    fn: str
    n: int
    times: dict[str, float]


def run_objects(sizes: list[int], samples: int, target: float,
                progress: Callable[[str], None] | None = None) -> list[ObjectRow]:
    """Every shape, function and size; the implementations' answers checked first."""
    rows = []
    total = len(SHAPES) * len(FUNCTIONS) * len(sizes)
    for shape in SHAPES:
        for fn in FUNCTIONS:
            for n in sizes:
                calls = object_calls(shape, fn, n)
                answers = {name: plain(call()) for name, call in calls.items()}
                if len({repr(a) for a in answers.values()}) != 1:
                    raise AssertionError(f"{shape.label} {fn} n={n}: {answers}")
                rows.append(ObjectRow(shape.label, shape.layout, fn, n,
                                      measure(calls, samples, target)))
                if progress:
                    progress(f"[{len(rows):{len(str(total))}d}/{total}] objects "
                             f"{shape.label} {fn} n={n}")
    return rows


def table(rows: list[ObjectRow], markdown: bool = False) -> str:
    head = ["requests", "function", "n", "loop", "kvest", "kvest layout=",
            "kvest vs loop", "layout= vs loop"]
    body = [[r.shape, r.fn, f"{r.n:,}", fmt_time(r.times["loop"]), fmt_time(r.times["kvest"]),
             f"{fmt_time(r.times['kvest layout='])} ({r.layout})",
             fmt_ratio(r.times["loop"], r.times["kvest"]),
             fmt_ratio(r.times["loop"], r.times["kvest layout="])] for r in rows]
    return render(head, body, markdown, left=2)


def targets(rows: list[ObjectRow]) -> list[Verdict]:
    """The drop-in's targets on the release shapes, at n = 256, 1,024 and 4,096."""
    out: list[Verdict] = []
    for shape in SHAPES[1:]:
        for fn, (want, want256) in TARGETS.items():
            picked = [r for r in rows if r.shape == shape.label and r.fn == fn
                      and r.n in (256, 1024, 4096)]
            if not picked:
                continue
            ratios = [(r.n, r.times["loop"] / r.times["kvest layout="]) for r in picked]
            met = all(x >= (want256 if n == 256 else want) for n, x in ratios)
            out.append((_label(shape, fn), ", ".join(f"{x:.1f}× at {n:,}" for n, x in ratios),
                        met))
    return out


def _label(shape: Shape, fn: str) -> str:
    want, want256 = TARGETS[fn]
    return f"{shape.label}, {fn}: ≥ {want:g}×" + (
        f" ({want256:g}× at 256)" if want256 != want else "")


def target_labels() -> list[str]:
    """Every target :func:`targets` can judge (docs/benchmarks.md shows the
    verdicts without the table, and tools/redraw_bench.py keeps these)."""
    return [_label(shape, fn) for shape in SHAPES[1:] for fn in TARGETS]
