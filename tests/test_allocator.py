"""The estimates against a simulated paged KV allocator, step by step.

A Hypothesis state machine runs a scheduler over a page pool: requests arrive
with random prompts, decode steps grow each request's allocation a page at a
time and commit a random number of accepted tokens, requests finish and give
their pages back. Before every step the estimate must equal page size times
the pages the step then takes from the pool -- exactly, not as a bound
(docs/contract.md: "Why the estimate equals the allocation"). The simulator
computes its own ``nxt`` and page counts from first principles; kvest's outputs
are only compared with it.
Requests are flat or nested (a slots dataclass under req.kv); the object kernels
(estimate, plan, selected rows) must agree with the arrays and the simulator.
A failure shrinks to a minimal trace of arrivals, steps and finishes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvest

CONFIGS = [(3, 1, 4), (5, 1, 8), (3, 2, 6), (5, 4, 8), (5, 8, 64)]
PAGE_SIZES = [1, 2, 16, 32, 64, 100, 128, 256]


class SimRequest:
    """A request as the scheduler sees it (flat layout) plus the pages it holds."""

    def __init__(self, committed: int, pages: list[int]) -> None:
        self.kv_committed_len = committed
        self.kv_allocated_len = committed
        self.pages = pages


@dataclasses.dataclass(slots=True)
class SimKV:
    kv_committed_len: int
    kv_allocated_len: int


class NestedSimRequest:
    """The same in the nested layout of sglang 0.5.19+ (lengths in a slots dataclass)."""

    def __init__(self, committed: int, pages: list[int]) -> None:
        self.kv = SimKV(committed, committed)
        self.pages = pages

    # The simulator's own bookkeeping reads and writes through these.
    kv_committed_len = property(lambda self: self.kv.kv_committed_len,
                                lambda self, v: setattr(self.kv, "kv_committed_len", v))
    kv_allocated_len = property(lambda self: self.kv.kv_allocated_len,
                                lambda self, v: setattr(self.kv, "kv_allocated_len", v))


class NestedOnly:
    """What kvest sees of a NestedSimRequest: the request without the properties."""

    def __init__(self, req: NestedSimRequest) -> None:
        self.kv = req.kv


class PagedAllocatorMachine(RuleBasedStateMachine):
    @initialize(
        p=st.sampled_from(PAGE_SIZES) | st.integers(1, 300),
        config=st.sampled_from(CONFIGS),
        speculative=st.booleans(),
        page_aligned=st.booleans(),
        nested=st.booleans(),
    )
    def setup(self, p, config, speculative, page_aligned, nested):
        self.make = NestedSimRequest if nested else SimRequest
        self.layout = "nested" if nested else "flat"
        self.p = p
        self.steps, self.topk, self.draft = config
        self.speculative = speculative
        self.page_aligned = page_aligned
        self.alloc_len = kvest.alloc_len_per_decode(*config, p)
        self.reserve = kvest.alloc_reserve_per_decode(*config, p)
        self.total_pages = 1 << 20
        self.free = list(range(self.total_pages))
        self.reqs: list[SimRequest] = []
        self.steps_run = 0

    # -- the pool ------------------------------------------------------------
    def take(self, count: int) -> list[int]:
        assert count >= 0
        assert count <= len(self.free), "the pool ran dry: the scheduler was misled"
        taken = self.free[len(self.free) - count:]
        del self.free[len(self.free) - count:]
        return taken

    def grow(self, req: SimRequest, nxt: int) -> int:
        """Grow req's allocation to nxt tokens; return the pages taken."""
        have = -(-req.kv_allocated_len // self.p)
        need = -(-nxt // self.p)
        new = self.take(max(0, need - have))
        req.pages.extend(new)
        req.kv_allocated_len = max(req.kv_allocated_len, nxt)
        return len(new)

    def seen(self) -> list:
        """The requests as kvest reads them (in their layout, without helpers)."""
        if self.layout == "flat":
            return self.reqs
        return [NestedOnly(r) for r in self.reqs]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        c = np.array([r.kv_committed_len for r in self.reqs], dtype=np.int64)
        a = np.array([r.kv_allocated_len for r in self.reqs], dtype=np.int64)
        return c, a

    # -- rules ---------------------------------------------------------------
    @rule(prompt=st.integers(1, 5000))
    def arrive(self, prompt):
        pages = self.take(-(-prompt // self.p))
        self.reqs.append(self.make(prompt, pages))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data):
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.free.extend(req.pages)

    @precondition(lambda self: self.reqs and self.speculative)
    @rule(data=st.data())
    def spec_decode_step(self, data):
        c, a = self.arrays()
        estimate = kvest.spec_v2_new_tokens(c, a, self.p, self.reserve)
        seen = self.seen()
        from_objects = kvest.spec_v2_new_tokens_from_reqs(seen, self.p, self.reserve)
        assert kvest.spec_v2_new_tokens_from_reqs(seen, self.p, self.reserve,
                                                  layout=self.layout) == from_objects
        plan = kvest.decode_alloc_plan(c, a, self.p, self.reserve, page_aligned=self.page_aligned)
        obj_plan = kvest.decode_alloc_plan_from_reqs(seen, self.p, self.reserve,
                                                     page_aligned=self.page_aligned,
                                                     dtype=np.int32, layout=self.layout)
        assert obj_plan.cur.tolist() == plan.cur.tolist()
        assert obj_plan.nxt.tolist() == plan.nxt.tolist()
        assert (obj_plan.num_tokens, obj_plan.num_pages) == (plan.num_tokens, plan.num_pages)
        taken = 0
        for i, req in enumerate(self.reqs):
            target = req.kv_committed_len + self.reserve
            if self.page_aligned:
                target = -(-target // self.p) * self.p
            nxt = max(req.kv_allocated_len, target)
            assert plan.cur[i] == req.kv_allocated_len
            assert plan.nxt[i] == nxt
            taken += self.grow(req, nxt)
        assert estimate == from_objects == taken * self.p
        assert plan.num_pages == taken
        # Commit: each request accepts 1 .. alloc_len tokens (verified drafts + bonus).
        for req in self.reqs:
            req.kv_committed_len += data.draw(st.integers(1, self.alloc_len))
            assert req.kv_committed_len <= req.kv_allocated_len
        self.steps_run += 1

    @precondition(lambda self: self.reqs and not self.speculative)
    @rule()
    def plain_decode_step(self):
        # Without speculation the allocation tracks the committed length and
        # each step adds one token per request.
        c, _ = self.arrays()
        estimate = kvest.decode_new_tokens(c, self.p)
        assert kvest.decode_new_tokens_from_reqs(self.seen(), self.p) == estimate
        # The same step through num_new_pages' decode view (S includes the new token).
        pages_view = kvest.num_new_pages(c + 1, self.p, decode=True)
        taken = 0
        for req in self.reqs:
            taken += self.grow(req, req.kv_committed_len + 1)
            req.kv_committed_len += 1
        assert estimate == taken * self.p
        if self.p > 1:
            assert pages_view == taken
        self.steps_run += 1

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def selected_estimate(self, data):
        """The retract loop's question: the estimate over a subset of the batch."""
        n = len(self.reqs)
        idx = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
        c, a = self.arrays()
        expected = sum(
            -(-max(a[i], c[i] + self.reserve) // self.p) * self.p - -(-a[i] // self.p) * self.p
            for i in idx)
        assert kvest.spec_v2_new_tokens(c, a, self.p, self.reserve, indices=idx) == expected
        assert kvest.spec_v2_new_tokens_from_reqs(self.seen(), self.p, self.reserve, idx,
                                                  layout=self.layout) == expected

    # -- invariants ----------------------------------------------------------
    @invariant()
    def pages_are_accounted_for(self):
        if not hasattr(self, "reqs"):
            return
        held = sum(len(r.pages) for r in self.reqs)
        assert held + len(self.free) == self.total_pages
        for r in self.reqs:
            assert len(r.pages) == -(-r.kv_allocated_len // self.p)
            assert r.kv_committed_len <= r.kv_allocated_len


PagedAllocatorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestPagedAllocator = PagedAllocatorMachine.TestCase
