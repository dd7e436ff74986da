"""Shadow mode compares every hot spot mode on replaces: the readers whole
(nested ones too), the writers statement by statement, upstream's writes once.

On stand-in modules built from the newest release's files.  A writer's whole
function needs the scheduler's pools and tensors, so each writing statement is
run alone (as the doctor's parity run does), compiled in the shadow form the
plan gives its hot spot and counting into that hot spot.
"""

from __future__ import annotations

import random
import sys

import pytest
from sglang_releases import check_required, nested_releases, releases
from sglang_standins import request_class

import kvest
import kvest.sglang
from kvest.sglang import glue, hotspots, monitor, parity, patterns, registry, rewrite
from kvest.sglang.upstream import Config, standin_tree

torch = pytest.importorskip("torch")
check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
# The writers and the nested estimate arrived with the nested layout (0.5.19).
NEWEST = (nested_releases() or [None])[-1]
needs_writers = pytest.mark.skipif(NEWEST is None, reason="no release with writers (0.5.19 on)")
ESTIMATE = "new_tokens_required_next_decode"
SPEC_V2 = "_new_tokens_required_next_decode_spec_v2"
WRITER_KINDS = {name for name, kind in registry.KINDS.items() if kind.writes}


def _alone_in_shadow(target, swap):
    """(upstream's writing statement alone, the same in the plan's shadow form
    counting into the target's hot spot, its parameters)."""
    alone, _, params = parity.statement_pair(target.analysis, swap.found, target.spot)
    again = rewrite.analyse(alone, [swap.found.pattern.kind])
    checked, why = hotspots._checked(alone, again.found[0].pattern.globals)
    assert why is None, why
    dry = hotspots.make_swap(again.found[0], target.spot, checked, dry=True)
    assert dry is not None and dry.check is not None
    return alone, rewrite.rebuild(again, [dry], counter=monitor.spot(target.spot)), params


class _Group:
    """A live beam group, as ``append_beam_tail``'s loop reads one."""

    def __init__(self, rows):
        self.num_member_rows, self.retired = rows, False
        self.member_rows = self.member_rows_cpu = list(range(rows))


class _Batch:
    """A batch whose ``reqs`` is its own attribute, as SGLang's dataclass keeps it."""

    def __init__(self, reqs):
        self.reqs = reqs


def _arguments(found, params, reqs, step):
    """What each parameter of a writing statement alone is given on a decode step."""
    roles = {found.name(r): r for r in found.pattern.roles}
    given = {"owner": _Batch(reqs), "delta": 1, "reqs": reqs, "offset": 0,
             "values": [r.kv.kv_committed_len + 3 * (i + step) % 7 for i, r in enumerate(reqs)]}
    return [given.get(roles.get(p), []) for p in params]  # (the loop's own lists: empty)


def _state(reqs):
    return [(r.kv.kv_committed_len, r.kv.kv_allocated_len, vars(r).get("decode_batch_idx"))
            for r in reqs]


def _writers(handle):
    """Every writing statement the shadow plan compares: (target, swap)."""
    return [(t, s) for t in handle.plan.targets for s in t.swaps if s.check is not None]


def _counts(names):
    spots = kvest.sglang.status()["hotspots"]
    return {n: (spots[n]["shadow"]["compared"], spots[n]["shadow"]["mismatches"],
                spots[n]["calls"]) for n in names}


def _decode_loop(tree, handle, steps=12, n=20, page_size=16):
    """A decode loop: each step the estimates (no-spec, EAGLE, a selection), the
    alloc lens, get_num_new_pages, then every writing statement -- kvest's shadow
    form on one world, upstream's statement alone on its twin, which must end
    every step alike (upstream's writes, once)."""
    make = request_class(tree.layout())
    ours = [make(c, c + 3) for c in range(5, 5 + 7 * n, 7)]
    theirs = [make(c, c + 3) for c in range(5, 5 + 7 * n, 7)]
    sizing = sys.modules[registry.ALLOC_SIZING]
    common = sys.modules[registry.COMMON]
    writers = [(_alone_in_shadow(t, s), s.found) for t, s in _writers(handle)]
    for step in range(steps):
        tree.config = Config(None, 3, 1, 4, 16)
        tree.batch(ours, page_size).new_tokens_required_next_decode()
        tree.batch(ours, page_size).new_tokens_required_next_decode([0, 2, -1])
        tree.config = Config("EAGLE", 3, 1, 4, 16)
        tree.batch(ours, page_size, "EAGLE").new_tokens_required_next_decode()
        sizing.page_aligned_decode_alloc_lens(ours, reserve=8 + step, page_size=page_size)
        seq = torch.tensor([r.kv.kv_committed_len + 1 for r in ours], dtype=torch.int64)
        common.get_num_new_pages(seq, page_size, seq - 1, False)
        common.get_num_new_pages(seq, page_size, None, True)
        for (alone, shadowed, params), found in writers:
            shadowed(*_arguments(found, params, ours, step))
            alone(*_arguments(found, params, theirs, step))
            assert _state(ours) == _state(theirs), found.pattern.id
    return ours


def test_every_writer_kind_has_a_dry_run():
    """Each kind the registry says writes is compared in shadow mode."""
    assert WRITER_KINDS
    for kind in WRITER_KINDS:
        assert callable(getattr(glue, f"make_{kind}_dry", None)), kind


@pytest.mark.parametrize("tree", releases(), ids=lambda t: t.version)
def test_every_release_shadows_what_mode_on_replaces(tree):
    """On every release: each hot spot mode on replaces is in shadow, and each
    writing statement mode on swaps has a dry run compared in shadow."""
    with standin_tree(tree, torch=torch):
        with kvest.sglang.patch() as on:
            replaced = {t.spot for t in on.plan.targets}
            writing = {(t.spot, s.found.pattern.id) for t in on.plan.targets for s in t.swaps
                       if registry.KINDS[s.found.pattern.kind].writes}
        with kvest.sglang.patch(shadow=True) as handle:
            states = kvest.sglang.status()["hotspots"]
            assert {n for n, s in states.items() if s["state"] == "shadow"} == replaced
            assert {(t.spot, s.found.pattern.id) for t, s in _writers(handle)} == writing


@needs_writers
def test_shadow_compares_every_hot_spot_mode_on_replaces():
    with standin_tree(NEWEST, torch=torch) as tree:
        with kvest.sglang.patch() as on:
            replaced = {t.spot for t in on.plan.targets}
        with kvest.sglang.patch(shadow=True) as handle:
            states = {n: s["state"] for n, s in kvest.sglang.status()["hotspots"].items()}
            assert {n for n, s in states.items() if s == "shadow"} == replaced
            assert {registry.HOTSPOTS[t.spot].writes for t, _ in _writers(handle)} == {True}
            before = _counts(replaced)
            _decode_loop(tree, handle, steps=12)
            after = _counts(replaced)
    assert {n for n in replaced if registry.HOTSPOTS[n].writes}, "no writer replaced"
    for name in replaced:
        compared, mismatches, calls = (a - b for a, b in zip(after[name], before[name],
                                                             strict=True))
        assert compared >= 12, (name, compared)
        assert mismatches == 0, (name, kvest.sglang.status()["hotspots"][name])
        assert calls >= 12, (name, calls)


@needs_writers
def test_a_nested_hot_spot_is_compared_once_per_call():
    """The spec-v2 method, reached from inside the estimate's shadow call: each
    outer call compared and counted once, each inner call compared once, and
    kvest's inner code run once a call (its calls counted once)."""
    with standin_tree(NEWEST) as tree:
        tree.config = Config("EAGLE", 3, 1, 4, 16)
        make = request_class(tree.layout())
        with kvest.sglang.patch(shadow=True):
            before = _counts([ESTIMATE, SPEC_V2])
            for i in range(7):
                batch = tree.batch([make(c, c + 3) for c in (5, 16, 31, 100 + i)], 16, "EAGLE")
                batch.new_tokens_required_next_decode()
            after = _counts([ESTIMATE, SPEC_V2])
    assert [a - b for a, b in zip(after[ESTIMATE], before[ESTIMATE], strict=True)] == [7, 0, 7]
    assert [a - b for a, b in zip(after[SPEC_V2], before[SPEC_V2], strict=True)] == [7, 0, 7]


@needs_writers
def test_a_wrong_nested_kernel_is_a_mismatch_of_both(monkeypatch):
    monkeypatch.setattr(kvest, "spec_v2_new_tokens_from_reqs", lambda *a, **k: 10**6)
    with standin_tree(NEWEST) as tree:
        tree.config = Config("EAGLE", 3, 1, 4, 16)
        make = request_class(tree.layout())
        original = vars(tree.batch_class)[ESTIMATE]
        batch = tree.batch([make(c, c + 3) for c in (5, 16, 31)], 16, "EAGLE")
        expected = original(batch)
        with kvest.sglang.patch(shadow=True):
            assert batch.new_tokens_required_next_decode() == expected  # upstream's answer
            spots = kvest.sglang.status()["hotspots"]
    assert spots[SPEC_V2]["shadow"]["mismatches"] >= 1
    assert spots[ESTIMATE]["shadow"]["mismatches"] >= 1
    assert "kvest 1000" in spots[SPEC_V2]["shadow"]["first_mismatch"]


@needs_writers
@pytest.mark.parametrize("spot, kernel, wrong", [
    ("alloc_for_decode_default", "add_to_attrs",
     lambda real: lambda reqs, paths, delta, **k: real(reqs, paths, delta + 1, **k)),
    ("alloc_for_spec_decode", "max_into_attr",
     lambda real: lambda reqs, path, values, **k: real(reqs, path, [v + 1 for v in values], **k)),
], ids=["add lengths", "max allocated"])
def test_a_wrong_writer_is_a_mismatch_and_upstream_still_writes(spot, kernel, wrong,
                                                                 monkeypatch):
    """kvest's dry run made wrong: every call a mismatch, the first logged with
    the writes that differ; the requests hold upstream's writes alone."""
    monkeypatch.setattr(kvest, kernel, wrong(getattr(kvest, kernel)))
    with standin_tree(NEWEST, torch=torch) as tree, kvest.sglang.patch(shadow=True) as handle:
        before = _counts([spot])[spot]
        _decode_loop(tree, handle, steps=3)  # (the twin worlds stay alike)
        after = _counts([spot])[spot]
        report = kvest.sglang.status()["hotspots"][spot]["shadow"]["first_mismatch"]
    assert after[0] - before[0] == after[1] - before[1] == 3, (before, after)
    assert "writes differ (attribute, before, kvest, upstream)" in report, report


@needs_writers
def test_a_wrong_beam_tail_answer_is_a_mismatch(monkeypatch):
    """kvest's kernel made to say no request is in a beam group where one is:
    upstream's loop moves its offset, and the comparison says so."""
    with standin_tree(NEWEST, torch=torch) as tree:
        make = request_class(tree.layout())
        with kvest.sglang.patch(shadow=True) as handle:
            (target, swap), = [(t, s) for t, s in _writers(handle)
                               if t.spot == "append_beam_tail"]
            # (the stand-in module has the function, not the named tuple it makes)
            monkeypatch.setitem(target.analysis.fn.__globals__, "BeamTailEntry",
                                lambda *fields: fields)
            honest = _alone_in_shadow(target, swap)
            monkeypatch.setattr(kvest, "beam_groups_from_reqs", lambda *a, **k: 0)
            lying = _alone_in_shadow(target, swap)
            results = []
            for _alone, shadowed, params in (honest, lying):
                before = _counts(["append_beam_tail"])["append_beam_tail"]
                reqs = [make(5, 8), make(9, 12, _Group(3)), make(20, 21)]
                args = _arguments(swap.found, params, reqs, 0)
                shadowed(*args)
                after = _counts(["append_beam_tail"])["append_beam_tail"]
                results.append((after[0] - before[0], after[1] - before[1]))
    # honest: a request is in a group, kvest leaves the loop to upstream (not compared)
    assert results == [(0, 0), (1, 1)]


def test_a_request_read_only_through_code_is_not_compared():
    """A property on a request: the dry run cannot read it without running the
    caller's code, so that call is not compared (and upstream's loop writes)."""

    class Req:
        def __init__(self, c):
            self._c = c
            self.reads = 0

        @property
        def decode_batch_idx(self):
            self.reads += 1
            return self._c

        @decode_batch_idx.setter
        def decode_batch_idx(self, value):
            self._c = value

    with pytest.raises(glue._NotPlain):
        glue.plain_attr(Req(3), "decode_batch_idx")
    dry = glue.make_batch_idx_loop_dry(
        next(p for p in patterns.by_kind("batch_idx_loop")), "prepare_for_decode",
        {})
    req = Req(3)
    assert dry(_Batch([req])) is glue.DECLINED
    assert req.reads == 0


@needs_writers
def test_the_dry_run_mirrors_shared_objects():
    """A request listed twice: upstream adds to it twice, and so does kvest's copy."""
    with standin_tree(NEWEST) as tree:
        make = request_class(tree.layout())
        pattern = next(p for p in patterns.by_kind("add_lengths_loop"))
        dry = glue.make_add_lengths_loop_dry(pattern, "alloc_for_decode_default", {})
        check = glue.shadow_check("alloc_for_decode_default")
        req = make(5, 9)
        spot = monitor.spot("alloc_for_decode_default")
        before = (spot.compared, spot.mismatches)
        answer = dry(_Batch([req, req]), 2)
        for _ in range(2):
            req.kv.kv_allocated_len += 2
            req.kv.kv_committed_len += 2
        check(answer, 0)
        assert (spot.compared - before[0], spot.mismatches - before[1]) == (1, 0)
        answer = dry(_Batch([req, req]), 2)
        req.kv.kv_allocated_len += 2  # (written once: not what the loop does)
        req.kv.kv_committed_len += 4
        check(answer, 0)
        assert (spot.compared - before[0], spot.mismatches - before[1]) == (2, 1)


@needs_writers
def test_shadow_leaves_each_step_as_upstream_does_on_random_loops():
    """Random decode loops (sizes, page sizes): kvest's shadow world and
    upstream's twin end alike, with no mismatch."""
    rng = random.Random(7)
    with standin_tree(NEWEST, torch=torch) as tree, kvest.sglang.patch(shadow=True) as handle:
        names = {t.spot for t in handle.plan.targets}
        before = _counts(names)
        for _ in range(4):
            _decode_loop(tree, handle, steps=3, n=rng.randint(0, 40),
                         page_size=rng.choice([1, 16, 64, rng.randint(1, 100)]))
        after = _counts(names)
    assert all(after[n][0] > before[n][0] and after[n][1] == before[n][1] for n in names), after
