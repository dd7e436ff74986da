"""The KV audit: SGLang's decode estimate against what the KV pools then hand out.

``check_decode_mem`` promises that the next decode step fits: it asks the
allocator's ``check_decode_capacity(num_tokens=<the estimate>, requests=...)``,
and the retract loop asks again after each request it removes.  The step's
allocation then happens inside ``ScheduleBatch.prepare_for_decode`` (with
speculation too: ``spec_prepare_for_decode`` and the algorithms' own
preparations run there), through the underlying pools' ``alloc``,
``alloc_extend`` and ``alloc_decode``.  The audit pairs the two in every
decode step (:mod:`kvest.sglang.registry` names every place):

- **the estimate**: per pool, steps audited, undercounts (a pool was asked for
  more than the estimate: the check said "fits" for a step that can fail),
  the tokens short, and the overcount slack (estimate minus handed out);
- **the bookkeeping**: what the batch's recorded ``kv_allocated_len`` grew by
  in the step, against what the pool it records handed out: exact with
  speculation (the contract since 0.5.16), page-rounded without (one token is
  recorded inside a whole page); a difference is a gap;
- **the reserve held**: sum of allocated minus committed over the batch after
  the step, KV the tree cache cannot reuse.

What a pool hands out is counted at the pool's own method (its free size just
before and after that call, which the call itself only lowers): never from the
free size across the step, which the step's own evictions and SWA's window
frees raise.  A request for ``alloc(n)`` the pool refused counts as asked.
The lengths (bookkeeping, reserve) are read on sampled steps: a step costs
O(1) otherwise.  The sampling keeps the reads' average cost at or under
:data:`LENGTHS_BUDGET_NS` a step, and reads at least one step in
:data:`MAX_EVERY`; ``KVEST_AUDIT_EVERY=N`` reads every N-th step instead.

The audit never changes what SGLang computes or allocates: every wrapper calls
upstream's function with its own arguments and returns its answer or raises
its exception, and the audit's own errors are counted (``errors``), never
raised.  An allocator whose pools kvest does not know is reported by name under
``not_audited``, never guessed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from kvest.sglang import registry
from kvest.sglang.registry import ALLOCATED, COMMITTED, COMPOSITES, KV_INFO, Attach, KnownFinding

__all__ = ["LENGTHS_BUDGET_NS", "MAX_EVERY", "Finding", "Kind", "install", "installed",
           "recorded_growth", "report", "reset", "uninstall"]

logger = logging.getLogger("kvest.sglang")

LENGTHS_BUDGET_NS = 1000  # the sampled length reads' average cost a step, at most
MAX_EVERY = 4096  # the lengths are read at least once in this many steps
EVERY_ENV = "KVEST_AUDIT_EVERY"


class Kind(enum.Enum):
    """What the audit found wrong in a step."""

    UNDERCOUNT = "undercount"  # a pool was asked for more than the estimate
    GAP = "bookkeeping gap"  # recorded kv_allocated_len growth != what the pool handed out
    FAILED = "failed after fits"  # the step raised after its check said it fits
    # the frees (python -m kvest audit's driver, O(pages) a tick: not in a scheduler)
    FREED_TWICE = "freed twice"  # a slot twice in a pool's free list
    NOT_RETURNED = "not returned"  # at the drain, a pool short of its size

    def __str__(self) -> str:
        return self.value


class Finding(NamedTuple):
    """The first finding of a kind: what reproduces it, in words."""

    kind: Kind
    pool: str
    text: str
    step: int  # the decode step it was found in, counted from the last reset


@dataclasses.dataclass(slots=True)
class PoolCounts:
    """One underlying pool's counters (``name``: the allocator class, and the
    attribute of a composite allocator that holds it)."""

    steps: int = 0  # steps whose estimate was compared with this pool's allocation
    undercounts: int = 0
    short_tokens: int = 0
    overcounts: int = 0  # steps where the estimate was above what the pool was asked for
    overcount_slack: int = 0
    handed_out: int = 0  # tokens handed out in audited decode steps
    bookkeeping_steps: int = 0
    bookkeeping_gaps: int = 0
    gap_tokens: int = 0


class _Audit:
    """The process's counters (the scheduler's thread writes them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.steps = 0  # decode steps whose estimate was compared (every pool)
        self.unpaired = 0  # decode steps with no check of this batch before them
        self.undercounts = 0  # steps with an undercount in some pool
        self.short_tokens = 0  # the most any pool was short, summed over steps
        self.failed_after_fits = 0  # raised after "fits", with a pool refusing in the step
        self.raised_other = 0  # steps that raised with no pool refusing: not an allocation failure
        self.last_raised: str | None = None
        self.bookkeeping_steps = 0
        self.bookkeeping_gaps = 0
        self.gap_tokens = 0
        self.reserved_uncommitted: int | None = None  # at the last sampled step
        self.sampled = 0
        self.pools: dict[str, PoolCounts] = {}
        self.not_audited: dict[str, str] = {}
        self.first: dict[Kind, Finding] = {}
        self.errors = 0
        self.last_error: str | None = None


AUDIT = _Audit()
_FIXED_EVERY: int | None = None


class _Step:
    """The step in progress in one thread (each thread has its own: what one
    thread's pools do never counts in another thread's step)."""

    __slots__ = ("__weakref__", "allocator", "asked", "before", "check", "checking",
                 "countdown", "depth", "estimate", "every", "handed", "pools", "read_ns", "reqs",
                 "seq_lens", "window")

    def __init__(self) -> None:
        self.window = False  # inside prepare_for_decode
        self.depth = 0  # inside a pool's allocation method (counted once)
        self.handed: dict[Any, int] = {}  # pool -> tokens handed out in this step
        # pool -> tokens asked and refused (alloc(n); 0 where the size is not known):
        # a pool here refused an allocation in this step
        self.asked: dict[Any, int] = {}
        # the last check_decode_capacity call: (allocator, the estimate, the requests
        # it counted, its answer)
        self.check: tuple[Any, Any, Any, Any] | None = None
        # before check_decode_capacity: inside check_decode_mem, and the estimate
        # it passed to evict_from_tree_cache
        self.checking = False
        self.estimate: Any = _NO_ESTIMATE
        self.every = _FIXED_EVERY or 1  # read the lengths every this many steps
        self.countdown = 0
        # the step in progress: its allocator, pools, and on a sampled step the
        # requests and their kv_allocated_len before it
        self.allocator: Any = None
        self.pools: _Pools | str = ""
        self.reqs: list[Any] | None = None
        self.before: list[int] | None = None
        self.seq_lens: Any = None
        self.read_ns = 0


_NO_ESTIMATE = object()
_STEPS: weakref.WeakSet[_Step] = weakref.WeakSet()  # every thread's, for install and reset
_STEPS_LOCK = threading.Lock()


_LOCAL = threading.local()  # .step: this thread's _Step


def _new_step() -> _Step:
    """This thread's first step (the wrappers' slow path, once a thread)."""
    _LOCAL.step = step = _Step()
    with _STEPS_LOCK:
        _STEPS.add(step)
    return step


def _this_step() -> _Step:
    try:
        return _LOCAL.step
    except AttributeError:
        return _new_step()


def _all_steps() -> list[_Step]:
    _this_step()
    with _STEPS_LOCK:
        return list(_STEPS)


def _every_from_env(environ: Any = None) -> int | None:
    raw = (os.environ if environ is None else environ).get(EVERY_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        logger.warning("kvest: %s=%r is not a positive integer: the audit samples on its own",
                       EVERY_ENV, raw)
        return None
    return value


# ------------------------------------------------------------------ the pools


class _Pools(NamedTuple):
    """An allocator's underlying pools: (name, pool, records kv_allocated_len,
    its counters)."""

    pools: tuple[tuple[str, Any, bool, PoolCounts], ...]
    page_size: int


_WRAPPED: dict[tuple[type, str], Any] = {}  # (class, attribute) -> upstream's function
_POOLS_CACHE: dict[int, tuple[Any, _Pools | str]] = {}


def _counts(name: str) -> PoolCounts:
    counts = AUDIT.pools.get(name)
    if counts is None:
        counts = AUDIT.pools[name] = PoolCounts()
    return counts


def _is_pool(obj: Any) -> bool:
    """Whether every allocation method ``obj`` has is one the audit counts."""
    cls = type(obj)
    seen = False
    for name in registry.POOL_ALLOCS:
        fn = getattr(cls, name, None)
        if fn is None:
            continue
        if getattr(fn, "__kvest_audit__", None) is None:
            # an override of a counted method, or a pool class the audit does not know
            # (the base allocator's own methods only raise NotImplementedError)
            owner = next((k for k in cls.__mro__ if name in vars(k)), None)
            if owner is not None and owner.__name__ != registry.CAPACITY_CHECK.cls:
                return False
            continue
        seen = True
    return seen


def _pools_of(allocator: Any) -> _Pools | str:
    """The allocator's pools, or why they are not audited."""
    cached = _POOLS_CACHE.get(id(allocator))
    if cached is not None and cached[0] is allocator:
        return cached[1]
    answer: _Pools | str
    name = type(allocator).__name__
    page = getattr(allocator, "page_size", 1)
    if _is_pool(allocator):
        answer = _Pools(((name, allocator, True, _counts(name)),), page)
    else:
        composite = next((COMPOSITES[k.__name__] for k in type(allocator).__mro__
                          if k.__name__ in COMPOSITES), None)
        if composite is None:
            answer = f"{name}: an allocator kvest does not know"
        else:
            found: list[tuple[str, Any, bool, PoolCounts]] = []
            answer = ""
            for attr in composite.pools:
                pool = getattr(allocator, attr, None)
                if pool is None or not _is_pool(pool):
                    answer = (f"{name}.{attr}: {type(pool).__name__}, a pool kvest does not "
                              "know")
                    break
                if any(p is pool for _, p, _, _ in found):
                    continue  # one pool under two names (pure SWA)
                found.append((f"{name}.{attr}", pool, attr == composite.recorded,
                              _counts(f"{name}.{attr}")))
            if not answer:
                answer = _Pools(tuple(found), page)
    _POOLS_CACHE[id(allocator)] = (allocator, answer)
    return answer


# ------------------------------------------------------------------ the wrappers


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _argument(sig: inspect.Signature | None, name: str | int, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    """The value ``fn(*args, **kwargs)`` gives its parameter ``name`` (or the
    ``name``-th after ``self``), its own defaults included: as the call binds
    it, whichever way it was passed.  Raises where it cannot tell."""
    if sig is None:
        raise TypeError("no signature")
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    if isinstance(name, int):
        params = list(sig.parameters.values())
        param = params[name + 1]
        value = bound.arguments[param.name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            return value[0]
        return value
    if name in bound.arguments:
        return bound.arguments[name]
    for param in sig.parameters.values():  # absorbed by a **kwargs
        if param.kind is inspect.Parameter.VAR_KEYWORD and name in bound.arguments[param.name]:
            return bound.arguments[param.name][name]
    raise KeyError(name)


def _pool_alloc(original: Any) -> Any:
    # alloc(need_size): a refusal says what was asked, however the size is passed
    sig = _signature(original) if original.__name__ == "alloc" else None

    def alloc(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            step = _LOCAL.step
        except AttributeError:
            step = _new_step()
        if not step.window or step.depth:
            return original(self, *args, **kwargs)
        step.depth = 1
        try:
            before = self.available_size()
        except Exception:
            before = None
        try:
            out = original(self, *args, **kwargs)
        finally:
            step.depth = 0
        if before is not None:
            try:
                taken = before - self.available_size()
                if taken > 0:
                    handed = step.handed
                    handed[self] = handed.get(self, 0) + taken
                elif out is None:  # refused (what alloc(n) asked for; the others' unknown)
                    asked = int(_argument(sig, 0, (self, *args), kwargs)) if sig is not None else 0
                    step.asked[self] = step.asked.get(self, 0) + asked
            except Exception as exc:
                _error(exc)
                if out is None:  # refused all the same
                    with contextlib.suppress(Exception):  # (a pool that cannot be a key)
                        step.asked.setdefault(self, 0)
        elif out is None:
            with contextlib.suppress(Exception):
                step.asked.setdefault(self, 0)
        return out

    return _mark(alloc, original)


def _capacity(original: Any) -> Any:
    """The decode check's question to the allocator, recorded as (allocator,
    the estimate, the requests it counted, the answer) for the step after it.
    Upstream's function gets exactly the call's arguments (its own defaults
    stay its own); the estimate and the requests are read from the call as
    the function binds them."""
    sig = _signature(original)

    def check_decode_capacity(self: Any, *args: Any, **kwargs: Any) -> Any:
        fits = original(self, *args, **kwargs)
        try:
            step = _LOCAL.step
        except AttributeError:
            step = _new_step()
        if not args:  # check_decode_mem's call: all by keyword
            try:
                step.check = (self, kwargs["num_tokens"], kwargs["requests"], fits)
                return fits
            except KeyError:
                pass
        try:
            call = (self, *args)
            tokens = _argument(sig, "num_tokens", call, kwargs)
            try:
                requests = _argument(sig, "requests", call, kwargs)
            except KeyError:
                requests = None
            step.check = (self, tokens, requests, fits)
        except Exception:
            step.check = None  # a call the audit cannot read: the step is unpaired
        return fits

    return _mark(check_decode_capacity, original)


def _decode_check(original: Any) -> Any:
    """Before check_decode_capacity: check_decode_mem, recorded as the capacity
    check is, with the estimate it passed to evict_from_tree_cache and the
    allocator it compared that with."""
    sig = _signature(original)

    def check_decode_mem(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            step = _LOCAL.step
        except AttributeError:
            step = _new_step()
        if step.checking:
            return original(self, *args, **kwargs)
        step.checking = True
        step.estimate = _NO_ESTIMATE
        try:
            fits = original(self, *args, **kwargs)
        finally:
            step.checking = False
        estimate, step.estimate = step.estimate, _NO_ESTIMATE
        try:
            selected = _argument(sig, 0, (self, *args), kwargs)
            step.check = None if estimate is _NO_ESTIMATE else (
                self.token_to_kv_pool_allocator, estimate,
                None if selected is None else list(selected), fits)
        except Exception:
            step.check = None  # a call the audit cannot read: the step is unpaired
        return fits

    return _mark(check_decode_mem, original)


def _decode_evict(original: Any) -> Any:
    """The batch module's evict_from_tree_cache: inside check_decode_mem, its
    num_tokens is the estimate the check decided on."""
    sig = _signature(original)

    def evict_from_tree_cache(*args: Any, **kwargs: Any) -> Any:
        try:
            step = _LOCAL.step
        except AttributeError:
            step = _new_step()
        if step.checking:
            try:
                step.estimate = _argument(sig, "num_tokens", args, kwargs)
            except Exception:
                step.estimate = _NO_ESTIMATE  # a call the audit cannot read: unpaired
        return original(*args, **kwargs)

    return _mark(evict_from_tree_cache, original)


def _decode_step(original: Any) -> Any:
    def prepare_for_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            step = _LOCAL.step
        except AttributeError:
            step = _new_step()
        if step.window:
            return original(self, *args, **kwargs)
        est = None
        fits = False
        try:
            allocator = self.token_to_kv_pool_allocator
            if allocator is not step.allocator:
                step.pools = _pools_of(allocator)
                step.allocator = allocator
            last = step.check
            if last is not None and last[0] is allocator:
                requests = last[2]
                if requests is None or len(requests) == len(self.reqs):
                    est, fits = last[1], last[3]
            step.seq_lens = getattr(self, "seq_lens_cpu", None)
            step.countdown -= 1
            if step.countdown <= 0:
                _read_before(self, step)
            audited = True
        except Exception as exc:
            _error(exc)
            audited = False
        step.window = True
        raised: str | None = None
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            try:
                raised = f"{type(exc).__name__}: {exc}"
            except Exception:  # an exception whose str() raises: upstream's, still raised
                raised = type(exc).__name__
            raise
        finally:
            step.window = False
            step.depth = 0
            if audited:
                try:
                    _end(step, self, est, fits, raised)
                except Exception as exc:
                    _error(exc)
            if step.handed:
                step.handed = {}
            if step.asked:
                step.asked = {}
            step.check = None
            step.reqs = step.before = None

    return _mark(prepare_for_decode, original)


def _mark(wrapper: Any, original: Any) -> Any:
    wrapper.__kvest_audit__ = original
    wrapper.__wrapped__ = original  # inspect.signature(wrapper) is upstream's
    wrapper.__name__ = original.__name__
    wrapper.__qualname__ = f"{original.__qualname__}[kvest audit]"
    wrapper.__doc__ = original.__doc__
    wrapper.__module__ = original.__module__
    return wrapper


def _error(exc: BaseException) -> None:
    AUDIT.errors += 1
    if AUDIT.last_error is None:
        logger.warning("kvest audit: its own error, counted and ignored: %s: %s",
                       type(exc).__name__, exc)
    AUDIT.last_error = f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------ a step


def _getters(reqs: list[Any]) -> tuple[bool, bool]:
    """Where the requests keep their lengths: (allocated under ``req.kv``,
    committed under ``req.kv``) -- flat, mixed or nested (registry.KV_INFO)."""
    kv = getattr(reqs[0], KV_INFO, None)
    return hasattr(kv, ALLOCATED), hasattr(kv, COMMITTED)


def _allocated(reqs: list[Any]) -> list[int]:
    """Every request's kv_allocated_len."""
    if not reqs:
        return []
    if _getters(reqs)[0]:
        return [r.kv.kv_allocated_len for r in reqs]
    return [r.kv_allocated_len for r in reqs]


def _committed(reqs: list[Any]) -> int:
    """The sum of the requests' kv_committed_len."""
    if not reqs:
        return 0
    if _getters(reqs)[1]:
        return sum(r.kv.kv_committed_len for r in reqs)
    return sum(r.kv_committed_len for r in reqs)


def recorded_growth(before: list[int], after: list[int], page: int, speculative: bool) -> int:
    """What the requests' recorded ``kv_allocated_len`` says the step took from
    the pool that records it, to compare with what that pool handed out.

    With speculation (exact, the contract since 0.5.16): a request whose
    allocation grew from ``a0`` to ``a1`` records ``a1 - ceil_align(a0, page)``
    new tokens: the pages it already held are not new, and a tail that the
    record leaves short of a page (0.5.15's ``nxt``) shows.  Without (page-
    rounded): one token is recorded inside a whole page, so the pages its
    records span grew by ``ceil_div(a1) - ceil_div(a0)``.
    """
    if speculative:
        return sum(a1 - -(-a0 // page) * page
                   for a0, a1 in zip(before, after, strict=True) if a1 > a0)
    return page * sum(-(-a1 // page) + (a0 // -page)
                      for a0, a1 in zip(before, after, strict=True))


def _read_before(batch: Any, step: _Step) -> None:
    """On a sampled step: the requests and their allocated lengths before it."""
    if not isinstance(step.pools, _Pools):
        return
    start = time.perf_counter_ns()
    step.reqs = sampled = list(batch.reqs)
    step.before = _allocated(sampled)
    step.read_ns = time.perf_counter_ns() - start


def _end(step: _Step, batch: Any, est: int | None, fits: Any, raised: str | None) -> None:
    audit = AUDIT
    pools = step.pools
    if not isinstance(pools, _Pools):
        audit.not_audited[type(step.allocator).__name__] = pools
        return
    handed = step.handed
    if est is None:
        audit.unpaired += 1
        for _, pool, _, counts in pools.pools:
            counts.handed_out += handed.get(pool, 0)
    else:
        audit.steps += 1
        asked_map = step.asked
        worst = 0
        short_pool = ""
        for name, pool, _, counts in pools.pools:
            taken = handed.get(pool, 0) if handed else 0
            counts.steps += 1
            counts.handed_out += taken
            asked = taken + asked_map.get(pool, 0) if asked_map else taken
            if asked > est:
                counts.undercounts += 1
                counts.short_tokens += asked - est
                if asked - est > worst:
                    worst, short_pool = asked - est, name
            elif asked < est:
                counts.overcounts += 1
                counts.overcount_slack += est - asked
        if worst:
            audit.undercounts += 1
            audit.short_tokens += worst
            if Kind.UNDERCOUNT not in audit.first:
                _found(Kind.UNDERCOUNT, short_pool, batch,
                       f"the estimate was {est} tokens and the pool was asked for {est + worst}")
        if raised and fits and step.asked:
            audit.failed_after_fits += 1
            if Kind.FAILED not in audit.first:
                _found(Kind.FAILED, short_pool or pools.pools[0][0], batch,
                       f"the check said {est} tokens fit, a pool refused an allocation, "
                       f"and the step raised {raised}")
    if raised and not step.asked:  # no pool refused: not an allocation failure
        audit.raised_other += 1
        audit.last_raised = raised
    if step.reqs is not None:
        if raised:
            step.countdown = step.every
        else:
            _bookkeeping(step, batch, pools)


def _bookkeeping(step: _Step, batch: Any, pools: _Pools) -> None:
    audit = AUDIT
    reqs = step.reqs
    before = step.before
    assert reqs is not None and before is not None
    page = pools.page_size
    start = time.perf_counter_ns()
    after = _allocated(reqs)
    committed = _committed(reqs)
    spec = getattr(batch, "spec_algorithm", None)
    speculative = spec is not None and not spec.is_none()
    grew = recorded_growth(before, after, page, speculative)
    audit.sampled += 1
    audit.reserved_uncommitted = sum(after) - committed
    beams = any(getattr(r, "beam_group", None) is not None for r in reqs)
    if len(batch.reqs) == len(reqs) and not beams:  # beam member rows are not requests
        for name, pool, records, counts in pools.pools:
            if not records:
                continue
            counts.bookkeeping_steps += 1
            gap = step.handed.get(pool, 0) - grew
            if gap:
                counts.bookkeeping_gaps += 1
                counts.gap_tokens += abs(gap)
                audit.bookkeeping_gaps += 1
                audit.gap_tokens += abs(gap)
                if Kind.GAP not in audit.first:
                    _found(Kind.GAP, name, batch,
                           f"the pool handed out {step.handed.get(pool, 0)} tokens and the "
                           f"requests' kv_allocated_len grew by {grew}"
                           + ("" if speculative else " (page-rounded)")
                           + _unaligned(before, after, page))
        audit.bookkeeping_steps += 1
    spent = step.read_ns + time.perf_counter_ns() - start
    fixed = _FIXED_EVERY
    step.every = fixed if fixed is not None else min(
        MAX_EVERY, max(1, spent // LENGTHS_BUDGET_NS))
    step.countdown = step.every


def _unaligned(before: list[int], after: list[int], page: int) -> str:
    """Words for the first record the step left off a page boundary, if any."""
    for i, (a0, a1) in enumerate(zip(before, after, strict=True)):
        if a1 != a0 and a1 % page:
            return (f"; a record that is not page-aligned: request {i}'s kv_allocated_len "
                    f"went from {a0} to {a1} at page size {page}")
    return ""


def release(version: str) -> tuple[int, ...]:
    """A release's leading numbers ("0.5.23.post1" -> (0, 5, 23))."""
    parts = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(parts)


def known_finding(kind: str, pool: str, family: str, algorithm: str | None, page: int,
                  version: str) -> KnownFinding | None:
    """The finding kvest knows (registry.KNOWN_FINDINGS) that ``kind`` in ``pool``
    is, on an allocator of ``family``, with speculative ``algorithm`` (None:
    none) at ``page``, on SGLang ``version``; None where it knows none."""
    return next((k for k in known_for(version)
                 if (kind, pool) in k.shows_as and family in k.allocators
                 and (not k.speculation or algorithm in k.speculation)
                 and page >= k.min_page), None)


def known_for(version: str) -> list[KnownFinding]:
    """The findings kvest knows in SGLang ``version``."""
    at = release(version)
    return [k for k in registry.KNOWN_FINDINGS if release(k.releases[0]) <= at
            and (k.releases[1] is None or at <= release(k.releases[1]))]


def _known_in(pool: str, kind: Kind, batch: Any) -> str:
    """", known: NAME (reference)" where this process's finding is one kvest knows."""
    try:
        sglang = sys.modules.get("sglang")
        version = getattr(sglang, "__version__", "")
        spec = getattr(batch, "spec_algorithm", None)
        algorithm = None if spec is None or spec.is_none() else spec.name
        page = getattr(_this_step().allocator, "page_size", 1)
        family = registry.ALLOCATOR_FAMILIES.get(pool.split(".")[0], "")
        k = known_finding(kind.value, pool, family, algorithm, page, version)
    except Exception:
        return ""
    return "" if k is None else f"; known: {k.name} ({k.reference})"


def _found(kind: Kind, pool: str, batch: Any, what: str) -> None:
    # counted from the audit's last reset: a scheduler's start, a configuration
    # of the audit command
    number = AUDIT.steps + AUDIT.unpaired
    what = f"{what} ({pool}), in decode step {number} since the audit's counters started"
    try:
        text = f"{what}; {_reproducer(batch)}"
    except Exception as exc:
        text = f"{what}; (no reproducer: {type(exc).__name__}: {exc})"
    AUDIT.first[kind] = Finding(kind, pool, text, number)
    logger.warning("kvest audit: first %s: %s%s", kind, text, _known_in(pool, kind, batch))


def _reproducer(batch: Any) -> str:
    """The settings and request lengths that reproduce a step."""
    step = _this_step()
    allocator = step.allocator
    spec = getattr(batch, "spec_algorithm", None)
    settings: dict[str, Any] = {
        "allocator": type(allocator).__name__,
        "page_size": getattr(allocator, "page_size", None),
        "speculative": None if spec is None or spec.is_none() else str(spec),
        "requests": len(batch.reqs),
    }
    for name in registry.ALLOC_SETTINGS_MODULES:
        module = sys.modules.get(name)
        for fn_name in registry.ALLOC_SETTINGS[1:]:
            fn = getattr(module, fn_name, None)
            if callable(fn) and fn_name not in settings:
                with contextlib.suppress(Exception):
                    settings[fn_name] = fn()
    coordinator = getattr(batch, "hisparse_coordinator", None)
    if coordinator is not None:
        for attr in ("device_buffer_size", "padded_buffer_size"):
            settings[f"hisparse.{attr}"] = getattr(coordinator, attr, None)
    before = step.seq_lens
    seq = before.tolist() if hasattr(before, "tolist") else before
    after = []
    for r in batch.reqs[:64]:
        kv = getattr(r, KV_INFO, None)
        source = kv if hasattr(kv, ALLOCATED) else r
        after.append((getattr(source, COMMITTED, getattr(r, COMMITTED, None)),
                      getattr(source, ALLOCATED, None)))
    more = " ..." if len(batch.reqs) > 64 else ""
    return (f"settings {settings}; seq_lens before the step "
            f"{list(seq)[:64] if seq is not None else None}{more}; (committed, allocated) "
            f"after it {after}{more}")


# ------------------------------------------------------------------ install


def _find(attach: Attach) -> tuple[type, Any] | None:
    """The class of ``attach`` in a loaded module (never imported here: only a
    process that runs the scheduler has them, and only it is audited)."""
    for name in attach.modules:
        cls = vars(sys.modules[name]).get(attach.cls) if name in sys.modules else None
        if isinstance(cls, type):
            return cls, vars(cls).get(attach.attr) if attach.attr else None
    return None


def _wrap(cls: Any, attr: str, make: Any) -> bool:
    """Wrap ``cls.attr`` (a class's function, or a module's)."""
    fn = vars(cls).get(attr)
    if not inspect.isfunction(fn):
        # absent, or a static/class method or other descriptor: a plain function
        # in its place would not be called as it is (the audit stays off there)
        return False
    if getattr(fn, "__kvest_audit__", None) is not None:
        return True
    _WRAPPED[(cls, attr)] = fn
    setattr(cls, attr, make(fn))
    return True


def install(every: int | None = None) -> list[str]:
    """Wrap SGLang's classes where the audit counts (loaded, or importable,
    scheduler modules only); returns what could not be found, in words.
    ``every``: read the lengths every this many steps (default: as
    ``KVEST_AUDIT_EVERY`` says, else adaptive)."""
    global _FIXED_EVERY
    missing = []
    with AUDIT.lock:
        _FIXED_EVERY = every if every is not None else _every_from_env()
    for step in _all_steps():
        step.every = _FIXED_EVERY or 1
        step.countdown = 0
    with AUDIT.lock:
        found = _find(registry.CAPACITY_CHECK)
        estimated = found is not None and _wrap(found[0], registry.CAPACITY_CHECK.attr,
                                                _capacity)
        if not estimated:
            # (0.5.11-0.5.18) the estimate check_decode_mem itself decided on
            check = _find(registry.DECODE_CHECK)
            home, name = registry.DECODE_EVICT
            module = sys.modules.get(home)
            estimated = (check is not None and module is not None
                         and inspect.isfunction(check[1])
                         and _wrap(module, name, _decode_evict)
                         and _wrap(check[0], registry.DECODE_CHECK.attr, _decode_check))
        if not estimated:
            missing.append(f"{registry.CAPACITY_CHECK.cls}.{registry.CAPACITY_CHECK.attr} "
                           f"or {registry.DECODE_CHECK.cls}.{registry.DECODE_CHECK.attr} with "
                           f"{registry.DECODE_EVICT[1]} (the decode check's estimate): "
                           "not in this release")
        found = _find(registry.DECODE_STEP)
        if found is None or not _wrap(found[0], registry.DECODE_STEP.attr, _decode_step):
            missing.append(f"{registry.DECODE_STEP.cls}.{registry.DECODE_STEP.attr}: not in "
                           "this release")
        for attach in registry.POOLS:
            found = _find(attach)
            if found is None:
                missing.append(f"{attach.cls}: not in this release")
                continue
            for name in registry.POOL_ALLOCS:
                _wrap(found[0], name, _pool_alloc)
        _POOLS_CACHE.clear()
        for step in _all_steps():
            step.allocator = None
        AUDIT.installed = estimated and not any("prepare_for_decode" in m for m in missing)
        AUDIT.missing = missing
    return missing


def installed() -> bool:
    return bool(getattr(AUDIT, "installed", False))


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """The audit's installation as it is now, put back after: what was wrapped
    inside is unwrapped (a stand-in tree's classes vanish with the tree)."""
    with AUDIT.lock:
        before = set(_WRAPPED)
        was, missing = installed(), list(getattr(AUDIT, "missing", []))
    try:
        yield
    finally:
        with AUDIT.lock:
            for cls, attr in [k for k in _WRAPPED if k not in before]:
                fn = _WRAPPED.pop((cls, attr))
                if getattr(vars(cls).get(attr), "__kvest_audit__", None) is fn:
                    setattr(cls, attr, fn)
            _POOLS_CACHE.clear()
            AUDIT.installed, AUDIT.missing = was, missing


def uninstall() -> None:
    """Put SGLang's functions back (tests, the audit command)."""
    with AUDIT.lock:
        for (cls, attr), fn in list(_WRAPPED.items()):
            if getattr(vars(cls).get(attr), "__kvest_audit__", None) is fn:
                setattr(cls, attr, fn)
        _WRAPPED.clear()
        _POOLS_CACHE.clear()
    for step in _all_steps():
        step.allocator = None
    with AUDIT.lock:
        AUDIT.installed = False


def reset() -> None:
    """Counters to zero (tests, the audit command, per configuration)."""
    with AUDIT.lock:
        AUDIT.clear()
        _POOLS_CACHE.clear()
    for step in _all_steps():
        step.countdown = 0
        step.allocator = None


def every() -> int | None:
    """The lengths are read every this many steps (``None``: adaptive)."""
    return _FIXED_EVERY


def report() -> dict[str, Any]:
    """``status()["audit"]``: the keys are documented in docs/sglang.md."""
    a = AUDIT
    with a.lock:
        pools = {name: dataclasses.asdict(c) for name, c in a.pools.items()}
        return {
            "installed": installed(),
            "missing": list(getattr(a, "missing", [])),
            "steps": a.steps,
            "unpaired": a.unpaired,
            "undercounts": a.undercounts,
            "short_tokens": a.short_tokens,
            "failed_after_fits": a.failed_after_fits,
            "raised_other": a.raised_other,
            "last_raised": a.last_raised,
            "last_error": a.last_error,
            "overcount_slack": sum(c["overcount_slack"] for c in pools.values()),
            "bookkeeping_steps": a.bookkeeping_steps,
            "bookkeeping_gaps": a.bookkeeping_gaps,
            "gap_tokens": a.gap_tokens,
            "reserved_uncommitted": a.reserved_uncommitted,
            "lengths_every": _FIXED_EVERY if _FIXED_EVERY is not None else "adaptive",
            "lengths_read": a.sampled,
            "pools": pools,
            "not_audited": dict(a.not_audited),
            "first": {k.value: f.text for k, f in a.first.items()},
            "errors": a.errors,
        }
