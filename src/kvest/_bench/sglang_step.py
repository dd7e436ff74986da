"""The decode step's bookkeeping in real SGLang, as the scheduler runs it, upstream against kvest.

Worker processes are started the same way (``python -m
kvest._bench.sglang_step --worker``), in pairs, one of each pair with
``KVEST_SGLANG=0``: each imports SGLang's scheduler modules and calls SGLang's
own ``load_plugins()``, so each times what is installed (kvest's replacements,
or upstream's functions), and reports ``kvest.sglang.status()``.  All build the
same world from the same seed (:class:`kvest._bench.sglang_world.World`: real
``Req``, ``ScheduleBatch``, ``ReqToTokenPool`` and
``PagedTokenToKVPoolAllocator(device="cpu")``, the GPU parts answered at once).
A cell is first run once on each side of every pair and the outcomes compared.
Its times come from kvest's worker, which swaps every binding
``load_plugins()`` changed back to upstream's function and forth between
samples (:class:`Bindings`), so that upstream and kvest are measured side by
side in one process, on the same objects where they lie; the samples are
taken from the pairs in turn (:class:`Pairs`: how a process's objects land in
memory moves its times).  The bound (kvest's kernels answering from a replay:
kvest's functions planned again there with its kernels made free) is timed
in kvest's worker too.

Steps (``n`` requests, page size 16, EAGLE (steps, topk, draft) = (3, 1, 4)),
each timed from the same state (restored outside the timed region):

- ``step, no spec``: ``batch.check_decode_mem()`` + ``batch.prepare_for_decode()``;
- ``step, EAGLE``: ``batch.check_decode_mem()`` + ``eagle_prepare_for_decode(batch)``;
- ``retract k=8``: ``batch.retract_decode()`` (EAGLE batch) with the pool's
  capacity answer "does not fit" until 8 requests are retracted.

Per loop, each replaced hot spot alone, called as its caller calls it: the
estimates (the EAGLE one also over all requests selected in a shuffled order,
as the retract loop selects them), ``append_beam_tail``,
``alloc_for_decode_default``, ``page_aligned_decode_alloc_lens`` with its two
int32 tensors, ``alloc_for_spec_decode``, ``get_num_new_pages``.

torch runs one intra-op thread in each worker (:func:`sglang_world.one_thread`).

Line events: ``sys.settrace`` counts the 'line' events of one step in each
worker at n = 64 and 512; the slope is the events per request per step.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvest._bench.tables import fmt_time, render, select
from kvest._bench.targets import Verdict

SIZES = [1, 16, 64, 256, 1024, 4096]
# The sizes docs/benchmarks.md's tables show (the terminal and the figure show
# every size; the targets judge every cell).
MARKDOWN_SIZES = ("n=1", "n=256", "n=1,024", "n=4,096")
# --quick: the smallest batch and the one the headline and the targets read.
QUICK_SIZES = [1, 1024]
PAGE_SIZE = 16
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=3,
            speculative_eagle_topk=1, speculative_num_draft_tokens=4)
RETRACTIONS = 8
STEPS = ["step, no spec", "step, EAGLE", f"retract k={RETRACTIONS}"]
SHUFFLED = "estimate spec, shuffled selection"


def _loop_rows() -> dict[str, tuple[Any, Any]]:
    """label -> (hot spot, its Step): every loop row of the registry's hot spots
    (:class:`kvest.sglang.registry.Step`), in the registry's order."""
    from kvest.sglang.registry import HOTSPOTS

    return {step.label: (spot, step) for spot in HOTSPOTS.values() for step in spot.steps}


LOOPS = list(_loop_rows())
HOT_SPOTS = STEPS + LOOPS
LINE_SIZES = (64, 512)
LINE_STEPS = ("step, no spec", "step, EAGLE")
# The targets: kvest at least this many times faster at n = 1,024 (steps), and
# at most this many Python line events per request per step (line events).
TARGETS = {"step, no spec": 3.0, "step, EAGLE": 10.0,
           "line events, no spec": 1.0, "line events, EAGLE": 1.0}
# kvest's share of the loops' cost, (kvest - free) / (upstream - free), at most
# this much at each of BOUND_SIZES; and every replaced hot spot at least 1.0x
# upstream at every size measured.
SHARE_TARGETS = {"step, no spec": 0.35, "step, EAGLE": 0.15}
EVERY_SIZE = 1.0
SIDES = ("upstream", "kvest")
# Worker pairs a run spreads each cell's samples over (see Pairs).
PAIRS = 3
# The bound: kvest's functions planned again with its kernels made free
# (Bindings.add_bound), timed on the two steps at these sizes.
FREE = "kernels free"
BOUND_SIZES = (1024, 4096)
BOUND_STEPS = ("step, no spec", "step, EAGLE")


@dataclass(frozen=True)
class Plan:
    """What a run of the section does: the batch sizes, how many pairs of
    workers the samples are spread over, and whether the bound is timed.

    Where the time of a run goes, on 2 cores: each worker's start (importing
    SGLang's scheduler, over 10 s of CPU each, 6 workers in a full run), and
    in each cell building the world and comparing both sides' outcomes (a
    digest of every request's row of the pool: about a second a cell at 1,024
    requests, several at 4,096), far more than the timed calls.  --quick
    therefore runs one pair without the bound, at n = 1 and the size the
    headline and targets read; the full run is unchanged."""

    sizes: tuple[int, ...]
    pairs: int = PAIRS
    bound: bool = True
    names: tuple[str, ...] = tuple(HOT_SPOTS)

    def cells(self) -> list[tuple[str, int]]:
        """(hot spot, n) in the order they run."""
        return [(name, n) for n in self.sizes for name in self.names]

    def timed(self, name: str, n: int) -> tuple[str, ...]:
        """The sides one cell times: the bound beside the steps at BOUND_SIZES."""
        if self.bound and name in BOUND_STEPS and n in BOUND_SIZES:
            return (*SIDES, FREE)
        return SIDES

    def sides(self) -> tuple[str, ...]:
        """The workers each pair starts (the bound is timed in kvest's)."""
        return SIDES


FULL = Plan(tuple(SIZES))
QUICK = Plan(tuple(QUICK_SIZES), pairs=1, bound=False)


def plan(quick: bool = False) -> Plan:
    """The full run's plan, or --quick's."""
    return QUICK if quick else FULL


def available() -> str | None:
    """Why the section cannot run here, or None if it can."""
    try:
        import torch  # noqa: F401
        from sglang.srt.managers.schedule_batch import Req  # noqa: F401
        from sglang.srt.mem_cache import allocation_sizing
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: F401
        from sglang.srt.plugins import load_plugins  # noqa: F401
        from sglang.srt.runtime_context import get_context  # noqa: F401
    except Exception as exc:  # anything: a missing, broken or older installation
        return f"sglang's scheduler modules do not import here ({type(exc).__name__}: {exc})"
    if not hasattr(allocation_sizing, "page_aligned_decode_alloc_lens"):
        return "this sglang has no page_aligned_decode_alloc_lens (the 0.5.19+ shape)"
    return None


class Unavailable(RuntimeError):
    """SGLang's scheduler modules do not import where the workers run (the message says why)."""


def missing() -> str | None:
    """Why the section cannot run here, from what is installed alone, or None.

    Nothing is imported (importing SGLang's scheduler takes seconds): where
    torch and sglang are installed, the workers, which import them anyway,
    tell whether they import (:func:`available`, in :func:`worker`)."""
    for name in ("torch", "sglang"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError) as exc:
            return f"sglang's scheduler modules do not import here ({type(exc).__name__}: {exc})"
        if not found:
            return f"sglang's scheduler modules do not import here (no module named {name!r})"
    return None


def upstream() -> Any:
    """The installed sglang's version (``.version``), for titles."""
    import sglang

    return type("Upstream", (), {"version": sglang.__version__})()


# ------------------------------------------------------------------ the worker


class Cells:
    """In a worker: one world per cell, the calls to time, and how to re-arm them."""

    def __init__(self) -> None:
        self.key: tuple[str, int] | None = None
        self.arm: Callable[[], None] = lambda: None
        self.call: Callable[[], Any] = lambda: None
        self.outcome: Callable[[Any], Any] = lambda result: result
        self.override: Any = None

    def use(self, name: str, n: int) -> None:
        if self.key == (name, n):
            return
        from kvest._bench import sglang_world as w

        if self.override is not None:
            self.override.restore()
        self.key = (name, n)
        _FREE_ANSWERS.clear()
        row = _loop_rows().get(name)
        spec = name in ("step, EAGLE", f"retract k={RETRACTIONS}") or (
            row is not None and row[1].spec)
        algorithm = "EAGLE" if spec else None
        self.override = w.context(algorithm, PAGE_SIZE)
        self.override.install()
        self.outcome = lambda result: result
        if name.startswith("retract"):
            holder: dict[str, Any] = {}

            def arm() -> None:
                holder["world"] = w.World(n, PAGE_SIZE, algorithm)

            def call() -> Any:
                return holder["world"].retract(RETRACTIONS)

            self.arm, self.call = arm, call
            self.outcome = lambda result: [result, holder["world"].state()]
            return
        world = w.World(n, PAGE_SIZE, algorithm)
        self.arm = world.restore
        self.outcome = lambda result: [_plain(result), world.state()]
        if row is None:  # a step: "step, no spec" or "step, EAGLE"
            self.call = world.step
            return
        spot, step = row
        self.call = loop_call(spot, step, _world_values(world, n), world.batch, w.sg().torch)

    def sample(self, number: int) -> float:
        """Seconds per call, over ``number`` calls each from the same state."""
        total = 0.0
        arm, call, clock = self.arm, self.call, time.perf_counter
        for _ in range(number):
            arm()
            start = clock()
            call()
            total += clock() - start
        return total / number

    def check(self) -> str:
        """A digest of one call's result and the state it leaves (the rows of
        4,096 requests are too many to send)."""
        self.arm()
        text = json.dumps(self.outcome(self.call()), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def lines(self) -> int:
        """Python 'line' events during one call."""
        count = 0

        def local(frame: Any, event: str, arg: Any) -> Any:
            nonlocal count
            if event == "line":
                count += 1
            return local

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            return local

        self.arm()
        sys.settrace(tracer)
        try:
            self.call()
        finally:
            sys.settrace(None)
        return count


def _world_values(world: Any, n: int) -> Callable[[str], Any]:
    """The values a loop row's call names (:class:`kvest.sglang.registry.Step`),
    each made once, when first asked for."""
    batch, reqs = world.batch, world.reqs
    made: dict[str, Any] = {}

    def sg() -> Any:
        from kvest._bench import sglang_world as w

        return w.sg()

    def lens() -> tuple[Any, Any, Any]:
        s = sg()
        reserve = s.sizing.get_alloc_reserve_per_decode()
        cur, nxt, need = s.sizing.page_aligned_decode_alloc_lens(
            reqs, reserve=reserve, page_size=PAGE_SIZE)
        torch = s.torch
        return torch.tensor(cur, dtype=torch.int32), torch.tensor(nxt, dtype=torch.int32), need

    def picked() -> list[int]:
        # As the retract loop asks (check_decode_mem(selected_indices)): its
        # indices come in retraction order, as good as shuffled.
        order = list(range(n))
        random.Random(n).shuffle(order)
        return order

    makers: dict[str, Callable[[], Any]] = {
        "batch": lambda: batch, "reqs": lambda: reqs, "picked": picked,
        "token_per_req": lambda: 1, "page_size": lambda: PAGE_SIZE, "true": lambda: True,
        "reserve": lambda: sg().sizing.get_alloc_reserve_per_decode(),
        "cache": lambda: world.cache, "pool": lambda: world.pool,
        "req_pool_indices": lambda: batch.req_pool_indices,
        "cur": lambda: value("lens")[0], "nxt": lambda: value("lens")[1],
        "need": lambda: value("lens")[2], "lens": lens,
        "next_seq_lens": lambda: batch.seq_lens_cpu + 1,
    }

    def value(name: str) -> Any:
        if name not in made:
            made[name] = makers[name]()
        return made[name]

    value.names = frozenset(makers)  # type: ignore[attr-defined]
    return value


def loop_call(spot: Any, step: Any, value: Callable[[str], Any], batch: Any, torch: Any
              ) -> Callable[[], Any]:
    """One loop row's call, as its caller makes it: the hot spot looked up at
    every call where its caller finds it (a method on the batch; the binding in
    ``step.via``, else in the first of the hot spot's modules that defines it),
    with the world's values the row names; with ``step.tensors``, the first two
    results made int32 tensors."""
    args = tuple(value(a) for a in step.args)
    kwargs = {k: value(v) for k, v in step.kwargs}
    if spot.cls is not None:
        attr = spot.attr

        def method() -> Any:
            return getattr(batch, attr)(*args, **kwargs)  # looked up per call

        return method
    homes = (step.via,) if step.via else spot.modules
    module = next(sys.modules[m] for m in homes
                  if m in sys.modules and spot.attr in vars(sys.modules[m]))
    attr = spot.attr
    if not step.tensors:
        return lambda: getattr(module, attr)(*args, **kwargs)

    def with_tensors() -> Any:
        cur, nxt, need = getattr(module, attr)(*args, **kwargs)
        return (torch.tensor(cur, dtype=torch.int32, device="cpu"),
                torch.tensor(nxt, dtype=torch.int32, device="cpu"), need)

    return with_tensors


def _plain(value: Any) -> Any:
    """JSON-able: tensors and tuples to lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


# The kernels whose answers the bound replays.
# (The array kernel behind get_num_new_pages is left as it is: its input is a
# new array each call, and it costs a few microseconds.)
_FREE_KERNELS = ("decode_new_tokens_from_reqs", "spec_v2_new_tokens_from_reqs",
                 "beam_member_rows_from_reqs", "beam_groups_from_reqs",
                 "decode_alloc_plan_from_reqs", "add_to_attrs", "max_into_attr")
_FREE_ANSWERS: dict[tuple[Any, ...], Any] = {}
_FREE_KEYED = (int, str, tuple, bool, type(None))


def _make_kernels_free() -> None:
    """For the bound only, never for a result: each kernel (read by kvest's
    glue when the plugin installs it) answers what it answered the first time
    it was called the same way in the current cell -- the cells restore the
    world before every call, so the answers repeat -- and a writer writes on
    its first call only.  What is left of kvest's step is the glue and
    upstream's own code: the most that replacing the loops can save."""
    import kvest

    for name in _FREE_KERNELS:
        real = getattr(kvest, name)

        def free(*args: Any, __real: Any = real, __name: str = name, **kwargs: Any) -> Any:
            first = args[0]
            key = (__name, id(first), len(first) if hasattr(first, "__len__") else -1,
                   *(a for a in args[1:] if type(a) in _FREE_KEYED),
                   *sorted((k, v) for k, v in kwargs.items() if type(v) in _FREE_KEYED))
            if key not in _FREE_ANSWERS:
                _FREE_ANSWERS[key] = __real(*args, **kwargs)
            return _FREE_ANSWERS[key]

        setattr(kvest, name, free)


class Bindings:
    """In kvest's worker: every module and class attribute ``load_plugins()``
    changed, with upstream's value and kvest's, so that one process times
    both sides' functions, swapped between samples (:meth:`use`).  Where
    objects land in memory moves a process's times by tens of percent
    (:class:`Pairs`); within one process both sides meet the same layout, so
    the comparison is paired."""

    def __init__(self) -> None:
        self.before = self._snapshot()
        self.changes: list[tuple[Any, str, Any, Any]] = []
        self.bound: list[tuple[Any, str, Any]] = []
        self.side = "kvest"

    @staticmethod
    def _snapshot() -> dict[int, tuple[Any, dict[str, Any]]]:
        owners: dict[int, tuple[Any, dict[str, Any]]] = {}
        for module in list(sys.modules.values()):
            if not isinstance(module, types.ModuleType):
                continue
            owners[id(module)] = (module, dict(vars(module)))
            if module.__name__.startswith("sglang"):
                for value in list(vars(module).values()):
                    if isinstance(value, type):
                        owners.setdefault(id(value), (value, dict(vars(value))))
        return owners

    def installed(self) -> None:
        """What ``load_plugins()`` changed, read once kvest's functions have run
        (the status line, on the first call, drops SGLang's pass-through
        wrappers: :mod:`kvest.sglang.monitor`), as in a scheduler's steps."""
        for owner, old in self.before.values():
            now = vars(owner)
            for name, value in old.items():
                # (only kvest's functions, each marked with the one it replaced:
                # not the module state SGLang's imports and first calls change)
                new = now.get(name, value)
                if new is not value and getattr(new, "__kvest_original__", owner) is value:
                    self.changes.append((owner, name, value, new))
        self.before = {}
        if not self.changes:
            raise RuntimeError("kvest's worker found nothing load_plugins() changed")

    def add_bound(self) -> None:
        """A third side, the bound (FREE): kvest's functions planned again in
        this process with its kernels answering from a replay
        (:func:`_make_kernels_free`), so that all three sides are timed on the
        same objects where they lie."""
        import kvest
        from kvest.sglang import hotspots, monitor

        real = {name: getattr(kvest, name) for name in _FREE_KERNELS}
        self.use("upstream")  # (the plan reads SGLang's own functions)
        try:
            _make_kernels_free()
            found = hotspots.plan(import_modules=False, mode=monitor.Mode.ON,
                                  reason="the benchmark's bound")
        finally:
            for name, fn in real.items():
                setattr(kvest, name, fn)
            self.use("kvest")
        by_original = {id(t.original): t.new for t in found.targets}
        self.bound = [(owner, name, by_original.get(id(upstream), kv))
                      for owner, name, upstream, kv in self.changes]

    def use(self, side: str) -> None:
        """Bind ``side``'s functions (``"upstream"``, ``"kvest"`` or FREE) everywhere."""
        if side != self.side:
            if side == FREE:
                for owner, name, free in self.bound:
                    setattr(owner, name, free)
            else:
                for owner, name, upstream, kvest in self.changes:
                    setattr(owner, name, upstream if side == "upstream" else kvest)
            self.side = side


def _status() -> dict[str, Any]:
    import kvest.sglang

    report = kvest.sglang.status()
    return {"mode": report["mode"], "sglang": upstream().version,
            "hotspots": {k: v["state"] for k, v in report["hotspots"].items()}}


def worker() -> int:
    """Serve the parent: one JSON request per line on stdin, one answer per line."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever SGLang prints must not reach the protocol
    # Whether SGLang's scheduler imports here is told by the workers, which
    # import it anyway: the parent never imports it (seconds saved).
    why_not = available()
    bindings = None
    if why_not is None:
        from kvest._bench import sglang_world as w

        w.sg()  # the scheduler's modules, loaded before the plugins look for them
        w.one_thread()
        from sglang.srt.plugins import load_plugins

        w.use_assign(w.assign_nothing)  # both sides' (before the snapshot)
        bindings = Bindings()
        load_plugins()
    cells = Cells()
    for line in sys.stdin:
        ask = json.loads(line)
        if why_not is not None:
            out.write(json.dumps({"unavailable": why_not}) + "\n")
            out.flush()
            continue
        try:
            op = ask["op"]
            if op == "status":
                answer: Any = _status()
            else:
                cells.use(ask["cell"], ask["n"])
                if op == "sample":
                    if bindings is not None:
                        side = ask.get("side", "kvest")
                        if bindings.before:
                            cells.check()  # kvest's functions run once first (see installed)
                            bindings.installed()
                        if side == FREE and not bindings.bound:
                            bindings.add_bound()
                        bindings.use(side)
                    try:
                        answer = cells.sample(ask["number"])
                    finally:
                        if bindings is not None:
                            bindings.use("kvest")
                elif op == "check":
                    answer = cells.check()
                elif op == "lines":
                    answer = cells.lines()
                else:
                    raise ValueError(f"unknown op {op!r}")
            reply = {"ok": answer}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    # The parent is done with us, and nothing here needs saving: skip the
    # interpreter's teardown, seconds with SGLang's modules and the worlds loaded.
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------ the parent


class Worker:
    """One worker process: upstream's (``KVEST_SGLANG=0``) or kvest's (as installed)."""

    def __init__(self, side: str) -> None:
        env = dict(os.environ)
        env.pop("KVEST_SGLANG", None)
        if side == "upstream":
            env["KVEST_SGLANG"] = "0"
        env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")  # sglang's CPU notices
        self.side = side
        self.asked: dict[str, Any] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvest._bench.sglang_step", "--worker"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, op: str, **kwargs: Any) -> None:
        """Ask without waiting for the answer (:meth:`receive` reads it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        self.asked = kwargs

    def receive(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.side} worker ended (exit {self.proc.wait()})")
        reply = json.loads(line)
        if "unavailable" in reply:
            raise Unavailable(reply["unavailable"])
        if "error" in reply:
            raise RuntimeError(f"{self.side} worker: {reply['error']} ({self.asked})")
        return reply["ok"]

    def ask(self, op: str, **kwargs: Any) -> Any:
        self.send(op, **kwargs)
        return self.receive()

    def finish(self) -> None:
        """Tell the worker to end (it ends when its input does), without waiting."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def close(self) -> None:
        self.finish()
        self.proc.wait(timeout=60)


class Pair:
    """The two workers, started the same way; checked to run what they should."""

    def __init__(self, sides: tuple[str, ...] = SIDES) -> None:
        self.workers = {side: Worker(side) for side in sides}
        self.status: dict[str, Any] = {}

    def verify(self) -> None:
        """Ask each worker's status (waiting for it to load) and check it."""
        self.status = {side: w.ask("status") for side, w in self.workers.items()}
        up, kv = self.status["upstream"], self.status["kvest"]
        if up["mode"] != "off":
            raise RuntimeError(f"the upstream worker is not off: {up}")
        wanted = ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2",
                  "page_aligned_decode_alloc_lens", "get_num_new_pages",
                  "alloc_for_spec_decode")
        for side in self.status.keys() - {"upstream"}:
            kv = self.status[side]
            missing = [h for h in wanted if kv["hotspots"].get(h) != "replaced"]
            if kv["mode"] != "on" or missing:
                raise RuntimeError(f"the {side} worker did not replace {missing}: {kv}")

    def close(self) -> None:
        for w in self.workers.values():  # all told first: they wind down side by side
            w.finish()
        for w in self.workers.values():
            w.close()

    def ask(self, worker: str, op: str, **kwargs: Any) -> Any:
        return self.workers[worker].ask(op, **kwargs)


class Pairs:
    """``count`` pairs of workers.  Where a process's objects land in memory
    (its allocator's history, address-space layout) moves a step's time by
    tens of percent from one process to the next, the same for both sides'
    code; so the samples of a cell are spread over several pairs, and each
    side's median is taken over all of them."""

    def __init__(self, count: int = PAIRS, sides: tuple[str, ...] = SIDES,
                 progress: Callable[[str], None] | None = None) -> None:
        count = max(1, count)
        start = time.perf_counter()
        if progress:
            progress(f"starting {count * len(sides)} worker processes ({count} "
                     f"{'pair' if count == 1 else 'pairs'}: {', '.join(sides)}); each "
                     "imports SGLang's scheduler first")
        self.pairs = [Pair(sides) for _ in range(count)]  # all started, then awaited
        try:
            for pair in self.pairs:
                pair.verify()
        except BaseException:
            self.__exit__()
            raise
        self.status = self.pairs[0].status
        if progress:
            progress(f"workers ready after {time.perf_counter() - start:.0f} s")

    def __enter__(self) -> Pairs:
        return self

    def __exit__(self, *exc: object) -> None:
        for pair in self.pairs:  # all told first: they wind down side by side
            for w in pair.workers.values():
                w.finish()
        for pair in self.pairs:
            pair.close()

    def check(self, cell: str, n: int) -> Any:
        """Both sides' outcome of one call from the same state, in every pair;
        they must be equal.  Nothing is timed here, so every worker is asked at
        once and builds its world for the cell beside the others."""
        for pair in self.pairs:
            for side in SIDES:
                pair.workers[side].send("check", cell=cell, n=n)
        outcomes = []
        for pair in self.pairs:
            got = {side: pair.workers[side].receive() for side in SIDES}
            if got["upstream"] != got["kvest"]:
                raise AssertionError(f"{cell} at n={n}: upstream and kvest differ")
            outcomes.append(got["upstream"])
        return outcomes[0]

    def measure(self, cell: str, n: int, samples: int, target: float,
                sides: tuple[str, ...] = SIDES) -> dict[str, float]:
        """Median seconds per call of each side: sample k from pair k mod count,
        the sides alternating within it."""
        first = self.pairs[0]
        number = 1
        while True:  # calls per sample: about ``target`` seconds on the upstream side
            t = first.ask("kvest", "sample", cell=cell, n=n, number=number, side="upstream")
            if t * number >= target / 4 or number >= 4096:
                number = max(1, min(4096, int(target / max(t, 1e-9))))
                break
            number *= 4
        # every side's functions in kvest's worker, side by side (Bindings)
        times: dict[str, list[float]] = {side: [] for side in sides}
        for k in range(max(samples, len(self.pairs))):
            pair = self.pairs[k % len(self.pairs)]
            for side in sides:
                times[side].append(pair.ask("kvest", "sample", cell=cell, n=n, number=number,
                                            side=side))
        return {side: statistics.median(ts) for side, ts in times.items()}

    def lines(self) -> dict[tuple[str, str, int], int]:
        """(step, side, n) -> line events of one step (deterministic: one pair;
        counted, not timed, so both sides are asked at once)."""
        first = self.pairs[0]
        out = {}
        for cell in LINE_STEPS:
            for n in LINE_SIZES:
                for side in SIDES:
                    first.workers[side].send("lines", cell=cell, n=n)
                for side in SIDES:
                    out[cell, side, n] = first.workers[side].receive()
        return out


@dataclass
class StepRow:
    hot_spot: str
    n: int
    upstream: float  # seconds per call
    kvest: float
    free: float | None = None  # kvest with its kernels made free (the bound), where timed

    @property
    def speedup(self) -> float:
        return self.upstream / self.kvest


class StepRows(list):  # type: ignore[type-arg]
    """The rows of a run, with its line events and the workers' status."""

    lines: dict[tuple[str, str, int], int] | None = None
    status: dict[str, Any] | None = None
    version: str | None = None  # the workers' sglang


def slopes(lines: dict[tuple[str, str, int], int]) -> dict[tuple[str, str], float]:
    """(step, side) -> line events per request per step, from n = 64 to 512."""
    lo, hi = LINE_SIZES
    return {(cell, side): (lines[cell, side, hi] - lines[cell, side, lo]) / (hi - lo)
            for cell in LINE_STEPS for side in SIDES}


def progress_line(done: int, total: int, name: str, n: int) -> str:
    """``[3/24] step, EAGLE, 1024 requests``: one cell done."""
    width = len(str(total))
    return f"[{done:{width}d}/{total}] {name}, {n} request{'' if n == 1 else 's'}"


def run_section(sizes: list[int] | Plan, samples: int, target: float,
                progress: Callable[[str], None] | None = None,
                names: list[str] | None = None) -> StepRows:
    """Every step and loop at every size of the plan (a list of sizes: the
    full run's plan at those sizes), upstream and kvest side by side (and the
    bound beside them: the steps at BOUND_SIZES); outcomes compared first;
    then the line events.  ``progress`` hears of the workers' start and of
    each cell as it is done."""
    the_plan = sizes if isinstance(sizes, Plan) else Plan(tuple(sizes))
    if names:
        the_plan = Plan(the_plan.sizes, the_plan.pairs, the_plan.bound, tuple(names))
    why_not = missing()
    if why_not:
        raise Unavailable(why_not)
    rows = StepRows()
    cells = the_plan.cells()
    with Pairs(the_plan.pairs, the_plan.sides(), progress) as pairs:
        rows.status = pairs.status
        rows.version = pairs.status["upstream"]["sglang"]
        for done, (name, n) in enumerate(cells, 1):
            pairs.check(name, n)
            t = pairs.measure(name, n, samples, target, the_plan.timed(name, n))
            rows.append(StepRow(name, n, t["upstream"], t["kvest"], t.get(FREE)))
            if progress:
                progress(progress_line(done, len(cells), name, n))
        if progress:
            progress(f"line events of one step at n = {LINE_SIZES[0]} and {LINE_SIZES[1]}")
        rows.lines = pairs.lines()
    return rows


def _one_table(rows: list[StepRow], names: list[str], head: str, markdown: bool) -> str:
    sizes = sorted({r.n for r in rows})
    body = []
    for name in names:
        cells = [name]
        for n in sizes:
            r = next((r for r in rows if r.hot_spot == name and r.n == n), None)
            cells.append("–" if r is None else
                         f"{fmt_time(r.upstream)} → {fmt_time(r.kvest)} ({r.speedup:.1f}×)")
        body.append(cells)
    return render([head, *(f"n={n:,}" for n in sizes)], body, markdown)


def lines_table(lines: dict[tuple[str, str, int], int], markdown: bool = False) -> str:
    """Line events of one step at n = 64 and 512 and the slope, per side."""
    slope = slopes(lines)
    lo, hi = LINE_SIZES
    body = [[cell, side, f"{lines[cell, side, lo]:,}", f"{lines[cell, side, hi]:,}",
             f"{slope[cell, side]:.2f}"] for cell in LINE_STEPS for side in SIDES]
    return render(["line events", "side", f"n={lo}", f"n={hi}", "per request"], body,
                  markdown, left=2)


def bound_table(rows: list[StepRow], markdown: bool = False) -> str:
    """The steps beside the bound: kvest's step with its kernels made free."""
    body = [[r.hot_spot, f"{r.n:,}", fmt_time(r.upstream), fmt_time(r.kvest),
             fmt_time(r.free), f"{r.speedup:.1f}×", f"{r.upstream / r.free:.1f}×"]
            for r in rows if r.free is not None]
    return render(["step", "n", "upstream", "kvest", FREE, "kvest's speedup",
                   "bound on any loop replacement"], body, markdown, left=1)


def table(rows: list[StepRow], markdown: bool = False) -> str:
    """The step table, the bound, the per-loop table and (where measured, in
    the terminal only) the line events: ``upstream → kvest (speedup)`` in each
    cell."""
    cut = dense if markdown else (lambda text: text)
    parts = [cut(_one_table(rows, STEPS, "hot spot", markdown))]
    if any(r.free is not None for r in rows):
        parts.append(bound_table(rows, markdown))
    if any(r.hot_spot in LOOPS for r in rows):
        parts.append(cut(_one_table(rows, LOOPS, "hot spot", markdown)))
    lines = getattr(rows, "lines", None)
    if lines and not markdown:  # docs/benchmarks.md: the slopes are in the targets
        parts.append(lines_table(lines, markdown))
    return "\n\n".join(parts)


def dense(table: str) -> str:
    """A Markdown hot-spot table as docs/benchmarks.md shows it (MARKDOWN_SIZES)."""
    return select(table, lambda h: h == "hot spot" or h in MARKDOWN_SIZES)


def headline(rows: list[StepRow], n: int = 1024) -> str | None:
    """The one sentence a reader should remember: the EAGLE step at batch ``n``."""
    r = next((r for r in rows if r.hot_spot == "step, EAGLE" and r.n == n), None)
    if r is None:
        return None
    return (f"EAGLE decode-step bookkeeping at batch {n:,}, from {r.upstream * 1e6:,.0f} µs to "
            f"{r.kvest * 1e6:,.0f} µs ({r.speedup:.1f}× less time)")


def targets(rows: list[StepRow]) -> list[Verdict]:
    """(target, measured, met) for each target: steps at n = 1,024, line events,
    kvest's share of the loops' cost (against the bound), every hot spot at
    every size."""
    out: list[Verdict] = []
    lines = getattr(rows, "lines", None)
    slope = slopes(lines) if lines else None
    for name, want in TARGETS.items():
        if name.startswith("line events"):
            cell = "step, EAGLE" if name.endswith("EAGLE") else "step, no spec"
            label = f"{name}: ≤ {want:g} per request per step (kvest)"
            if slope is None:
                out.append((label, "–", None))
            else:
                kv, up = slope[cell, "kvest"], slope[cell, "upstream"]
                out.append((label, f"{kv:.2f} (upstream {up:.2f})", kv <= want))
            continue
        r = next((r for r in rows if r.hot_spot == name and r.n == 1024), None)
        label = f"{name} at n=1,024: ≥ {want:g}×"
        if r is None:
            out.append((label, "–", None))
            continue
        bound = "" if r.free is None else f" (bound {r.upstream / r.free:.1f}×)"
        out.append((label, f"{r.speedup:.1f}×{bound}", r.speedup >= want))
    for name, most in SHARE_TARGETS.items():
        for n in BOUND_SIZES:
            r = next((r for r in rows if r.hot_spot == name and r.n == n), None)
            label = f"{name} at n={n:,}: kvest's share of the loops' cost ≤ {most:g}"
            if r is None or r.free is None or r.upstream <= r.free:
                out.append((label, "–", None))
                continue
            share = (r.kvest - r.free) / (r.upstream - r.free)
            # (below 0: kvest's step took less than the bound's, whose replayed
            # answers leave the requests' cache misses to upstream's own passes)
            below = " (kvest below the bound)" if share < 0 else ""
            out.append((label, f"{share:.2f}{below}", share <= most))
    loops = [r for r in rows if r.hot_spot in LOOPS]
    label = f"every hot spot at every size: ≥ {EVERY_SIZE:g}× upstream"
    if not loops:
        out.append((label, "–", None))
    else:
        low = sorted(loops, key=lambda r: r.speedup)
        below = [r for r in low if r.speedup < EVERY_SIZE]
        worst = ", ".join(f"{r.hot_spot} n={r.n:,} {r.speedup:.1f}×" for r in below[:3])
        out.append((label, f"{len(below)} of {len(loops)} cells below" + (
            f" (lowest: {worst})" if below else ""), not below))
    return out


def main(argv: list[str]) -> int:
    """``--worker`` (the parent's), or a run printing the tables:
    ``python -m kvest._bench.sglang_step [--quick] [--samples S] [--target SECONDS]``."""
    if "--worker" in argv:
        return worker()
    import argparse

    from kvest._args import int_at_least, int_list, positive_seconds
    from kvest._bench.targets import verdicts

    parser = argparse.ArgumentParser(prog="python -m kvest._bench.sglang_step")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int_at_least(1, 10_000), default=7)
    parser.add_argument("--target", type=positive_seconds(60.0), default=0.02)
    parser.add_argument("--sizes", type=int_list(1, 1 << 20))
    args = parser.parse_args(argv)
    why = missing()
    if why:
        print(f"skipped: {why}")
        return 0
    the_plan = plan(args.quick)
    if args.sizes:
        the_plan = Plan(tuple(args.sizes), the_plan.pairs, the_plan.bound)
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    start = time.perf_counter()
    try:
        rows = run_section(the_plan, args.samples, args.target, progress=say)
    except Unavailable as exc:
        print(f"skipped: {exc}")
        return 0
    print(f"real sglang {rows.version}; median of {args.samples} samples per cell, "
          f"sides alternating; {time.perf_counter() - start:.0f} s")
    print(f"workers: {rows.status}\n")
    print(table(rows), "", headline(rows) or "", "", verdicts(targets(rows), False), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
