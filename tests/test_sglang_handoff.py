"""Small batches go to upstream's statement: below a kind's crossover (the
registry's ``Kind.upstream_below``) kvest's glue and kernel would cost more
than upstream's own code, so the glue hands the call back after one length
check, and ``status()`` counts it as ``upstream``, apart from fallbacks.

On stand-in modules built from the newest release at hand.  (The rest of the
suite runs with ``KVEST_SGLANG_HANDOFF=0``, tests/conftest.py, so that its
small batches reach the kernels.)
"""

from __future__ import annotations

import numpy as np
import pytest
from sglang_releases import check_required, releases
from sglang_standins import OWNERS, Own, request_class

import kvest.sglang
from kvest.sglang import metrics, monitor, patterns, registry
from kvest.sglang.upstream import Config, standin_tree

check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = releases()[-1]
ESTIMATE = "new_tokens_required_next_decode"
SPEC_V2 = "_new_tokens_required_next_decode_spec_v2"
# hot spot -> (the kind whose crossover it follows, EAGLE or not)
ESTIMATES = {ESTIMATE: ("decode_count", False), SPEC_V2: ("spec_v2_total", True)}


def _batch(tree, spec, n):
    tree.config = Config("EAGLE" if spec else None, 3, 1, 4, 16)
    make = request_class(tree.layout())
    reqs = [make(16 * (i % 3) + i % 2, 16 * (i % 3) + 5) for i in range(n)]
    # (overlap: before 0.5.19 the estimate takes the spec-v2 loop only with it)
    return tree.batch(reqs, 16, "EAGLE" if spec else None, overlap=spec)


def _counts(spot):
    entry = kvest.sglang.status()["hotspots"][spot]
    return entry["calls"], entry["kernel"], entry["fallbacks"], entry["upstream"]


@pytest.fixture
def handoff_on(monkeypatch):
    monkeypatch.delenv("KVEST_SGLANG_HANDOFF", raising=False)


ALLOC_LENS = "page_aligned_decode_alloc_lens"


def _alloc_lens(tree, n):
    """eagle_prepare_for_decode's call of page_aligned_decode_alloc_lens (its
    int32 callers' kvest form), on ``n`` requests: its answer as lists."""
    make = request_class(tree.layout())
    reqs = [make(16 * (i % 3) + i % 2, 16 * (i % 3) + 5) for i in range(n)]
    lens = tree.modules["sglang.srt.speculative.eagle_utils"].page_aligned_decode_alloc_lens
    cur, nxt, need = lens(reqs, reserve=8, page_size=16)
    return list(cur), list(nxt), need


def test_a_small_batch_gets_upstreams_lists_from_the_kernel(handoff_on):
    """The int32 callers' alloc lens: below the kind's ``lists_below`` kvest's
    kernel answers with lists, as upstream's function does (its int32 arrays
    would cost the caller's tensors more there), from it with int32 arrays;
    either way the kernel's answer, equal to upstream's."""
    below = registry.KINDS["alloc_lens_function"].lists_below
    assert below > 1
    with standin_tree(NEWEST) as tree:
        if not tree.has("alloc_lens"):
            pytest.skip(f"sglang {tree.version} has no page_aligned_decode_alloc_lens")
        expected = [_alloc_lens(tree, n) for n in (1, below - 1, below)]
        lens = tree.modules["sglang.srt.speculative.eagle_utils"]
        with kvest.sglang.patch():
            for n, want in zip((1, below - 1, below), expected, strict=True):
                calls, kernel, fallbacks, upstream = _counts(ALLOC_LENS)
                assert _alloc_lens(tree, n) == want
                assert _counts(ALLOC_LENS) == (calls + 1, kernel + 1, fallbacks, upstream)
                make = request_class(tree.layout())
                cur, nxt, _ = lens.page_aligned_decode_alloc_lens(
                    [make(3, 4)] * n, reserve=8, page_size=16)
                assert (type(cur), type(nxt)) == ((list, list) if n < below else
                                                  (np.ndarray, np.ndarray))


@pytest.mark.parametrize("spot", list(ESTIMATES))
def test_a_kind_without_a_crossover_answers_at_every_size(spot, handoff_on):
    """The estimates' glue (compiled) costs less than upstream's loop over one
    request: no crossover, and one request is the kernel's."""
    kind, spec = ESTIMATES[spot]
    assert registry.KINDS[kind].upstream_below == 0
    with standin_tree(NEWEST) as tree:
        small = _batch(tree, spec, 1)
        expected = small.new_tokens_required_next_decode()
        with kvest.sglang.patch():
            calls, kernel, fallbacks, upstream = _counts(spot)
            assert small.new_tokens_required_next_decode() == expected
            assert _counts(spot) == (calls + 1, kernel + 1, fallbacks, upstream)


def test_the_switch_puts_every_size_on_the_kernels(monkeypatch):
    monkeypatch.setenv("KVEST_SGLANG_HANDOFF", "0")
    with standin_tree(NEWEST) as tree:
        small = _batch(tree, False, 1)
        expected = small.new_tokens_required_next_decode()
        with kvest.sglang.patch():
            calls, kernel, fallbacks, upstream = _counts(ESTIMATE)
            assert small.new_tokens_required_next_decode() == expected
            assert _counts(ESTIMATE) == (calls + 1, kernel + 1, fallbacks, upstream)


def test_shadow_mode_compares_the_kernels_at_every_size(handoff_on):
    with standin_tree(NEWEST) as tree:
        small = _batch(tree, False, 1)
        expected = small.new_tokens_required_next_decode()
        with kvest.sglang.patch(shadow=True):
            before = kvest.sglang.status()["hotspots"][ESTIMATE]
            assert small.new_tokens_required_next_decode() == expected
            after = kvest.sglang.status()["hotspots"][ESTIMATE]
    assert after["upstream"] == before["upstream"]
    assert after["shadow"]["compared"] == before["shadow"]["compared"] + 1


def test_a_handed_call_is_counted_once_and_reaches_the_metrics(handoff_on):
    """The adding loop below its crossover: upstream's loop, counted as
    ``upstream`` once per call, in the metrics too."""
    below = registry.KINDS["add_lengths_loop"].upstream_below
    if not any(NEWEST.version in p.releases for p in patterns.by_kind("add_lengths_loop")):
        pytest.skip(f"sglang {NEWEST.version} has no adding loop kvest compiles")
    with standin_tree(NEWEST) as tree:
        make = request_class(tree.layout())
        with kvest.sglang.patch():
            _, swapped, params = _adding_pair(tree)
            spot = monitor.spot("alloc_for_decode_default (statement alone)")
            before = metrics._counters(monitor._entry(spot))
            for _ in range(3):
                batch = _Batch([make(i, i + 1) for i in range(below - 1)])
                swapped(*[batch if p == "batch" else 2 for p in params])
            after = metrics._counters(monitor._entry(spot))
    assert after["upstream"] - before["upstream"] == 3
    assert after["kernel"] == before["kernel"] and after["fallback"] == before["fallback"]


def test_the_plan_reads_the_switch(monkeypatch):
    for value, expected in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("KVEST_SGLANG_HANDOFF", value)
        assert monitor.handoff() is expected
        with standin_tree(NEWEST), kvest.sglang.patch():
            assert monitor.STATE.handoff is expected


class _Batch:
    """A batch whose ``reqs`` is its own attribute (as SGLang's dataclass keeps it)."""

    def __init__(self, reqs):
        self.reqs = reqs


class _PropertyBatch:
    """A batch whose ``reqs`` is a property: read once, as the loop reads it."""

    def __init__(self, reqs):
        self._reqs, self.reads = reqs, 0

    @property
    def reqs(self):
        self.reads += 1
        return self._reqs


def _adding_pair(tree):
    from kvest.sglang import parity

    analysis, found = parity.found_statement(tree, "alloc_for_decode_default",
                                             "add_lengths_loop")
    return parity.statement_pair(analysis, found, "alloc_for_decode_default")


def test_a_writer_hands_small_batches_back_before_writing(handoff_on):
    """The adding loop: below its crossover upstream's loop writes (nothing
    written twice), from it kvest's writer; a ``reqs`` property is never read
    twice, so such a batch stays on the writer."""
    below = registry.KINDS["add_lengths_loop"].upstream_below
    assert below > 1
    if not any(NEWEST.version in p.releases for p in patterns.by_kind("add_lengths_loop")):
        pytest.skip(f"sglang {NEWEST.version} has no adding loop kvest compiles")
    with standin_tree(NEWEST) as tree:
        make = request_class(tree.layout())
        with kvest.sglang.patch():
            alone, swapped, params = _adding_pair(tree)
            assert params[0] == "batch"
            # (the statement alone counts on a spot of its own)
            spot = monitor.spot("alloc_for_decode_default (statement alone)")
            for n, handed in ((below - 1, True), (below, False)):
                theirs = [make(i, i + 1) for i in range(n)]
                ours = [make(i, i + 1) for i in range(n)]
                before = (spot.calls, spot.fallbacks, spot.kernel)
                alone(*[_Batch(theirs) if p == "batch" else 2 for p in params])
                swapped(*[_Batch(ours) if p == "batch" else 2 for p in params])
                assert [(r.kv.kv_committed_len, r.kv.kv_allocated_len) for r in ours] == \
                    [(r.kv.kv_committed_len, r.kv.kv_allocated_len) for r in theirs] == \
                    [(i + 2, i + 3) for i in range(n)]
                assert (spot.calls - before[0], spot.fallbacks - before[1]) == (1, 0)
                assert spot.kernel - before[2] == int(not handed)  # handed: upstream's
            batch = _PropertyBatch([make(0, 1)])
            swapped(*[batch if p == "batch" else 2 for p in params])
            assert batch.reads == 1 and batch._reqs[0].kv.kv_committed_len == 2


def _owners():
    """Batches of every way a class can hold ``reqs``, with 1 and 5 requests."""
    for cls in OWNERS:
        for n in (1, 5):
            yield cls([object()] * n)
    yield Own((object(),))  # a tuple is not the list the check wants


def test_the_size_check_and_its_python_rule_agree():
    """The rewritten function's check on ``batch.reqs``: the compiled one and
    the pure-Python build's rule read it in the same cases and agree."""
    from kvest.sglang import rewrite

    compiled = pytest.importorskip("kvest.sglang._glue")
    got = [(type(o).__name__, rewrite._small_reqs_rule(o, 3)) for o in _owners()]
    assert got == [(type(o).__name__, compiled._small_reqs(o, 3)) for o in _owners()]
    assert {name for name, small in got if small} == {"Own", "Slotted"}


def test_the_metrics_table_says_what_upstream_counts():
    """docs/sglang.md's metrics table, ``answer="upstream"``: what the code
    counts there (every kind with a crossover, its hot spots by name), never
    that it always reads 0, as its "Small batches" section says too."""
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs" / "sglang.md"
    if not docs.is_file():
        pytest.skip("docs/ is not beside the tests")
    text = docs.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `kvest_calls_total`"))
    assert "reads 0" not in row and "no hot spot does so" not in row
    crossings = {name: kind.upstream_below for name, kind in registry.KINDS.items()
                 if kind.upstream_below}
    assert crossings  # a kind that hands small batches to upstream exists today
    for kind, below in crossings.items():
        assert f"below {below}" in row, kind
        for spot in registry.HOTSPOTS.values():
            if any(use.kind == kind for use in spot.uses):
                assert f"`{spot.name}`" in row, (kind, spot.name)
    small = text.split("**Small batches.**")[1].split("\n\n")[0]
    assert 'kvest_calls_total{answer="upstream"}' in small
