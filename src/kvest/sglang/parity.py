"""The doctor's parity run: kvest against the SGLang code it replaced, on random batches.

Two levels, both driven by what :func:`kvest.sglang.hotspots.plan` replaced:

- **Statements** (every swapped statement of every replaced hot spot, the
  writers included): the statement is taken out of upstream's function, put
  alone in a function of its own with upstream's names
  (:func:`statement_pair`), and compiled twice: as upstream wrote it, and with
  the statement swapped for its glue as the plan swaps it.  Both run on twin
  worlds made from the kind's roles (:data:`ROLES`): the answers or exceptions,
  and the requests' state afterwards, must be equal.
- **Functions** (the estimate end to end, the spec-v2 method, the whole-function
  replacements): upstream's function against kvest's on the same batch.

Requests are shaped like the release's (:mod:`kvest.sglang.standins`), sometimes
with a corrupt (negative) length, so that the declines are exercised too.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
import linecache
import random
import textwrap
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from kvest.sglang import fingerprint, monitor, rewrite, upstream
from kvest.sglang.registry import COMMON, EAGLE_UTILS, HOTSPOTS, KINDS
from kvest.sglang.standins import FlatReq, MixedReq, NestedReq

__all__ = ["BeamGroup", "Unpatched", "request_maker", "self_test", "statement_pair"]

CONFIGS = [(3, 1, 4), (5, 1, 8), (3, 2, 6), (5, 4, 8), (5, 8, 64), (None, None, 4), (1, 1, 2)]
PAGE_SIZES = [1, 16, 32, 64, 128, 256]


@dataclasses.dataclass
class BeamGroup:
    """Stands in for a request's ``beam_group`` (0.5.19+)."""

    num_member_rows: int


class Unpatched:
    """``batch`` as SGLang's original estimate must see it once kvest replaced
    the spec-v2 method on the class: the original method on the instance, every
    other attribute the batch's own.  ``original_estimate(Unpatched(batch,
    original_spec_v2), ...)`` is then SGLang's answer end to end."""

    def __init__(self, batch: Any, spec_v2: Any) -> None:
        self.__dict__["_batch"] = batch
        self.__dict__["_new_tokens_required_next_decode_spec_v2"] = (
            lambda requests, page_size: spec_v2(batch, requests, page_size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


def request_maker(layout: dict[str, str]) -> Callable[[Any, Any], Any]:
    """The request class of a release whose estimator reads the lengths as
    ``layout`` (``StandinTree.layout()``) says."""
    kinds = (layout.get("kv_committed_len"), layout.get("kv_allocated_len"))
    return {("flat", "flat"): FlatReq, ("flat", "nested"): MixedReq}.get(kinds, NestedReq)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return ("raise", type(exc).__name__, str(exc))
    if isinstance(value, tuple):
        value = tuple(v.tolist() if isinstance(v, np.ndarray) else v for v in value)
    return ("ok", value)


def _page_size(rng: random.Random) -> int:
    return rng.choice(PAGE_SIZES) if rng.random() < 0.6 else rng.randint(1, 256)


def _requests(rng: random.Random, make: Callable[[Any, Any], Any], page_size: int,
              beams: bool) -> list[Any]:
    reqs = []
    for _ in range(rng.randint(0, 64)):
        committed = rng.randint(0, 2**21) if rng.random() < 0.5 else rng.randint(0, 4 * page_size)
        allocated = committed + rng.randint(0, 3 * page_size + 160)
        if rng.random() < 0.1:
            allocated = rng.randint(0, committed)
        if rng.random() < 0.02:  # a corrupt length: kvest declines, upstream answers
            committed = -rng.randint(1, page_size)
        req = make(committed, allocated)
        req.decode_batch_idx = rng.randint(0, 2**20)
        req.beam_group = BeamGroup(rng.randint(0, 8)) if beams and rng.random() < 0.05 else None
        reqs.append(req)
    return reqs


# ------------------------------------------------------------------ statements

class World:
    """One random world for a statement: the requests, the page size, a batch."""

    def __init__(self, rng: random.Random, make: Callable[[Any, Any], Any], beams: bool
                 ) -> None:
        self.rng = rng
        self.page_size = _page_size(rng)
        self.reqs = _requests(rng, make, self.page_size, beams)


# What each role of the registry's kinds is given: a value drawn from the world.
ROLES: dict[str, Callable[[World], Any]] = {
    "requests": lambda w: w.reqs,
    "reqs": lambda w: w.reqs,
    "owner": lambda w: types.SimpleNamespace(reqs=w.reqs),
    "selected": lambda w: None if not w.reqs or w.rng.random() < 0.3 else [
        w.rng.randint(-len(w.reqs), len(w.reqs) - 1) for _ in range(w.rng.randint(0, 2 * len(
            w.reqs)))],
    "page_size": lambda w: w.page_size,
    "reserve": lambda w: w.rng.randint(0, 600),
    "total": lambda w: w.rng.randint(0, 1000),
    "cur": lambda w: [0] * len(w.reqs),
    "nxt": lambda w: [0] * len(w.reqs),
    "delta": lambda w: w.rng.choice([1, 1, 2, 5, -1]),
    "values": lambda w: [w.rng.randint(0, 2**21) for _ in w.reqs],
    "offset": lambda w: w.rng.randint(0, 100),
}


def _state(value: Any) -> Any:
    """What a world looks like: every request's lengths and batch index, wherever kept."""
    def attr(obj: Any, name: str) -> tuple[str, str]:
        v = getattr(obj, name, "missing")
        return type(v).__name__, repr(v)

    if isinstance(value, types.SimpleNamespace):
        return ("owner", _state(value.reqs))
    if isinstance(value, list):
        return [_state(v) for v in value]
    if hasattr(value, "decode_batch_idx"):
        kv = getattr(value, "kv", None)
        return (attr(value, "decode_batch_idx"), attr(value, "kv_committed_len"),
                attr(value, "kv_allocated_len"), attr(kv, "kv_committed_len"),
                attr(kv, "kv_allocated_len"))
    return repr(value)


_serial = itertools.count()


def statement_pair(analysis: rewrite.Analysis, found: rewrite.Found, spot: str
                   ) -> tuple[types.FunctionType, types.FunctionType, tuple[str, ...]]:
    """(upstream's statement alone in a function, the same with the statement
    swapped as the plan swaps it, the function's parameters): the statement's
    local names it reads, upstream's own names."""
    from kvest.sglang.hotspots import _checked, make_swap

    fn, stmt = analysis.fn, found.stmt
    kind = KINDS[found.pattern.kind]
    text = "".join(linecache.getlines(analysis.filename, fn.__globals__))
    segment = ast.get_source_segment(text, stmt, padded=True)
    if segment is None:
        raise rewrite.Unreadable(f"no source for line {stmt.lineno}")
    local = fingerprint.function_locals(analysis.node)
    roles = [found.name(r) for r in kind.inputs]
    # (a loop's or a comprehension's own variables are bound there, not passed)
    targets = [node.target for node in ast.walk(stmt)
               if isinstance(node, (ast.For, ast.comprehension))]
    scratch = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    read = [n.id for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and n.id in local and n.id not in scratch]
    params = tuple(dict.fromkeys([*roles, *read]))
    if kind.binds is None:
        tail = ""
    elif kind.binds:
        tail = f"    return {found.name(kind.binds)}\n"
    else:
        tail = "    return None\n"
    source = (f"def __kvest_statement__({', '.join(params)}):\n"
              f"{textwrap.indent(textwrap.dedent(segment), '    ')}\n{tail}")
    filename = f"<kvest statement {next(_serial)}: {fn.__qualname__} line {stmt.lineno}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    scratch: dict[str, Any] = {}
    exec(compile(source, filename, "exec", dont_inherit=True), fn.__globals__, scratch)
    alone = scratch["__kvest_statement__"]
    again = rewrite.analyse(alone, [kind.name])
    hits = [f for f in again.found if f.pattern.id == found.pattern.id]
    if len(hits) != 1:
        raise rewrite.Unreadable(f"line {stmt.lineno} alone is not pattern {found.pattern.id}")
    checked, why = _checked(alone, hits[0].pattern.globals)
    if why is not None:
        raise rewrite.Unreadable(why)
    # (counted apart, per call: a statement alone is no call of the hot spot)
    alone_spot = f"{spot} (statement alone)"
    swap = make_swap(hits[0], alone_spot, checked)
    return alone, rewrite.rebuild(again, [swap], counter=monitor.spot(alone_spot)), params


def found_statement(tree: upstream.StandinTree, spot: str, kind: str
                    ) -> tuple[rewrite.Analysis, rewrite.Found]:
    """The statement of ``kind`` in hot spot ``spot`` of a stand-in tree, found
    as the plan finds it, whether or not kvest installs its kernel there."""
    record = HOTSPOTS[spot]
    module = next(tree.modules[m] for m in record.modules if m in tree.modules)
    owner = vars(module)[record.cls] if record.cls is not None else module
    fn = vars(owner)[record.attr]
    analysis = rewrite.analyse(getattr(fn, "__kvest_original__", fn), [kind])  # upstream's
    return analysis, analysis.found[0]


def check_statements(targets: list[Any], make: Callable[[Any, Any], Any], beams: bool,
                     batches: int, rng: random.Random,
                     check: Callable[[str, Any, Any], None],
                     progress: Callable[[str], None] | None = None) -> None:
    """Every swapped statement of every target, on ``batches`` twin worlds;
    ``progress`` hears of each statement before it runs."""
    for target in targets:
        for swap in target.swaps:
            label = f"{target.spot}: {swap.found.pattern.id} at line {swap.found.stmt.lineno}"
            if progress:
                progress(f"{label}, {batches} batches")
            try:
                alone, swapped, params = statement_pair(target.analysis, swap.found,
                                                        target.spot)
            except rewrite.Unreadable as exc:
                check(label, "comparable", f"not comparable: {exc}")
                continue
            for _ in range(batches):
                world = World(rng, make, beams)
                args = [ROLES.get(_role(swap.found, p), lambda w: None)(world) for p in params]
                twin = copy.deepcopy(args)
                expected = (_seen(_outcome(alone, *twin)), _state(twin))
                got = (_seen(_outcome(swapped, *args)), _state(args))
                check(label, expected, got)


def _seen(outcome: tuple[Any, ...]) -> tuple[Any, ...]:
    """An outcome comparable across twin worlds (requests by their state)."""
    return (outcome[0], _state(outcome[1])) if outcome[0] == "ok" else outcome


def _role(found: rewrite.Found, name: str) -> str:
    roles = {found.name(r): r for r in found.pattern.roles}
    return roles.get(name, "")


# ------------------------------------------------------------------ functions

# The end-to-end run reports this many times (it is most of the doctor's time).
PROGRESS_PARTS = 4


def self_test(tree: upstream.StandinTree, plan: Any, originals: dict[str, Any], batches: int,
              seed: int, torch: Any, progress: Callable[[str], None] | None = None
              ) -> tuple[Counter[str], Counter[str]]:
    """Run ``batches`` random batches through every replaced hot spot;
    (comparisons, mismatches) per check.  ``progress`` hears what runs: each
    statement before it runs, then the whole functions' batches in parts."""
    rng = random.Random(seed)
    make = request_maker(tree.layout())
    beams = tree.has("beam_rows")
    compared: Counter[str] = Counter()
    mismatched: Counter[str] = Counter()

    def check(name: str, expected: Any, got: Any) -> None:
        compared[name] += 1
        if expected != got:
            mismatched[name] += 1
            if mismatched[name] <= 3:
                print(f"  MISMATCH {name}: upstream {expected}, kvest {got}")

    swapped = [t for t in plan.targets if t.swaps]
    steps = sum(len(t.swaps) for t in swapped) + 1
    done = 0

    def step(text: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(f"[{done}/{steps}] {text}")

    check_statements(swapped, make, beams, max(1, batches // 4), rng, check, step)

    replaced = {t.spot for t in plan.targets}
    eagle = tree.modules.get(EAGLE_UTILS)
    alloc_lens = getattr(eagle, "page_aligned_decode_alloc_lens", None)
    if getattr(alloc_lens, "__kvest_original__", None) is None:
        alloc_lens = None
    common = tree.modules[COMMON]
    pages_fn = common.get_num_new_pages
    if getattr(pages_fn, "__kvest_original__", None) is None or torch is None:
        pages_fn = None
    spec_v2_original = originals["_new_tokens_required_next_decode_spec_v2"]
    whole = ("new_tokens_required_next_decode" in replaced
             or "_new_tokens_required_next_decode_spec_v2" in replaced)
    runs = batches if whole or alloc_lens or pages_fn else 0
    step(f"the replaced functions end to end, {runs} batches")
    every = max(1, -(-runs // PROGRESS_PARTS))
    for i in range(runs):
        if progress and i and i % every == 0:
            progress(f"      {i} of {runs} batches")
        p = _page_size(rng)
        steps, topk, draft = rng.choice(CONFIGS)
        spec = rng.random() < 0.5
        algorithm = "EAGLE" if spec else None
        tree.config = upstream.Config(algorithm, steps, topk, draft, p)
        reqs = _requests(rng, make, p, beams)
        batch = tree.batch(reqs, p, algorithm, overlap=rng.random() < 0.5)
        n = len(reqs)
        selected = None
        if n and rng.random() < 0.5:
            selected = [rng.randint(-n, n - 1) for _ in range(rng.randint(0, 2 * n))]
        if "new_tokens_required_next_decode" in replaced:
            check("new_tokens_required_next_decode (the function)",
                  _outcome(originals["new_tokens_required_next_decode"],
                           Unpatched(batch, spec_v2_original), selected),
                  _outcome(batch.new_tokens_required_next_decode, selected))
        if spec and "_new_tokens_required_next_decode_spec_v2" in replaced:
            check("_new_tokens_required_next_decode_spec_v2 (the function)",
                  _outcome(spec_v2_original, batch, reqs, p),
                  _outcome(batch._new_tokens_required_next_decode_spec_v2, reqs, p))
        if alloc_lens is not None:
            reserve = rng.randint(0, 600)
            check("page_aligned_decode_alloc_lens (int32 arrays, in eagle_utils)",
                  _outcome(originals["page_aligned_decode_alloc_lens"], reqs, reserve=reserve,
                           page_size=p),
                  _outcome(alloc_lens, reqs, reserve=reserve, page_size=p))
        if pages_fn is not None:
            seq = [rng.randint(0, 2**21) for _ in range(n)]
            pre = [max(0, s - rng.randint(0, 300)) for s in seq]
            seq_t = torch.tensor(seq, dtype=torch.int64)
            pre_t = torch.tensor(pre, dtype=torch.int64)
            decode = rng.random() < 0.5
            check("get_num_new_pages (the function)",
                  _outcome(originals["get_num_new_pages"], seq_t, p, pre_t, decode),
                  _outcome(pages_fn, seq_t, p, pre_t, decode))
    return compared, mismatched
