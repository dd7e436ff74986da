"""kvest replaces only code it matched exactly, and keeps the kernel when SGLang
edits around it: a release's own files, edited, in both directions.

Each case copies the newest release's files, makes one edit of the kind a
later release or a fork makes, and runs ``kvest.sglang.patch()`` on stand-in
modules built from the edited files.  An edit inside a loop kvest compiles
must leave that hot spot to upstream, with a warning naming the function and
what differs, and kvest's answers must be the edited code's.  An edit around
the loop must keep the kernel, exact against the edited function.
"""

from __future__ import annotations

import logging
import random
import shutil
import types
import warnings

import pytest
from sglang_releases import check_required, releases
from sglang_standins import request_class

import kvest.sglang
from kvest.sglang import monitor, rewrite
from kvest.sglang.registry import HOTSPOTS, KINDS, files
from kvest.sglang.upstream import Config, SourceTree, standin_tree

RELEASES = [t for t in releases() if t.exists("sglang/srt/beam_search/batch_tail.py")]
check_required(releases())
if not RELEASES:
    pytest.skip("no sglang release 0.5.19+ available", allow_module_level=True)
NEWEST = RELEASES[-1]

BATCH = "sglang/srt/managers/schedule_batch.py"
COMMON = "sglang/srt/utils/common.py"
SIZING = "sglang/srt/mem_cache/allocation_sizing.py"
BEAM = "sglang/srt/beam_search/batch_tail.py"


class Tensor:
    """Enough of a CPU tensor for get_num_new_pages, in both implementations:
    upstream's torch arithmetic and kvest's ``.numpy()`` read."""

    def __init__(self, values):
        import numpy as np

        self.values = np.asarray(values, dtype=np.int64)
        self.device = "cpu"

    def numpy(self):
        return self.values

    def _wrap(self, other, op):
        other = other.values if isinstance(other, Tensor) else other
        return Tensor(op(self.values, other))

    def __add__(self, other):
        return self._wrap(other, lambda a, b: a + b)

    def __sub__(self, other):
        return self._wrap(other, lambda a, b: a - b)

    def __floordiv__(self, other):
        return self._wrap(other, lambda a, b: a // b)

    def __mod__(self, other):
        return self._wrap(other, lambda a, b: a % b)

    def __eq__(self, other):  # type: ignore[override]
        return self._wrap(other, lambda a, b: a == b)

    def int(self):
        return Tensor(self.values.astype("int64"))

    def sum(self):
        return Tensor(self.values.sum())

    def to(self, dtype):
        return self

    def item(self):
        return int(self.values)


TORCH = types.SimpleNamespace(Tensor=Tensor, device=lambda name: name, int64="int64",
                              sum=lambda t: t.sum())


def _edited_tree(tmp_path, rel: str, old: str, new: str) -> SourceTree:
    for name in files():
        if NEWEST.exists(name):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(NEWEST.path(name), tmp_path / name)
    path = tmp_path / rel
    text = path.read_text()
    assert text.count(old) == 1, f"the edit {old!r} is not unique in {rel}"
    path.write_text(text.replace(old, new))
    return SourceTree(tmp_path, NEWEST.version)


def _requests(tree, rng, p, n=None):
    make = request_class(tree.layout())
    reqs = []
    for _ in range(rng.randint(0, 40) if n is None else n):
        committed = rng.randint(0, 4 * p + 300)
        reqs.append(make(committed, committed + rng.randint(0, 2 * p + 40)))
    return reqs


def _answers(tree, calls, seed=0):
    """Each call's answer (or exception) over random batches and page sizes."""
    rng = random.Random(seed)
    out = []
    for _ in range(60):
        p = rng.choice([1, 3, 16, 64])
        spec = rng.random() < 0.5
        tree.config = Config("EAGLE" if spec else None, 3, 1, 4, p)
        reqs = _requests(tree, rng, p)
        batch = tree.batch(reqs, p, "EAGLE" if spec else None)
        for call in calls:
            try:
                out.append(call(tree, batch, reqs, p, rng))
            except Exception as exc:
                out.append((type(exc).__name__, str(exc)))
    return out


def _estimate(tree, batch, reqs, p, rng):
    return batch.new_tokens_required_next_decode()


def _spec_v2(tree, batch, reqs, p, rng):
    return batch._new_tokens_required_next_decode_spec_v2(reqs, p)


def _alloc_lens(tree, batch, reqs, p, rng):
    cur, nxt, total = tree.alloc_function("page_aligned_decode_alloc_lens")(
        reqs, reserve=rng.randint(0, 200), page_size=p)
    return list(cur), list(nxt), total


def _pages(tree, batch, reqs, p, rng):
    seq = [rng.randint(1, 5000) for _ in reqs]
    prefix = [max(0, s - rng.randint(0, 300)) for s in seq]
    fn = tree.modules["sglang.srt.utils.common"].get_num_new_pages
    return fn(Tensor(seq), p, Tensor(prefix), rng.random() < 0.3)


def _beam(tree, batch, reqs, p, rng):
    fn = tree.modules["sglang.srt.beam_search.batch_tail"].num_beam_member_rows
    for r in reqs:
        r.beam_group = types.SimpleNamespace(num_member_rows=rng.randint(0, 5)) \
            if rng.random() < 0.3 else None
    return fn(reqs)


class _Holder:
    """A batch's two fields append_beam_tail reads first (a plain class, as
    ScheduleBatch is: reqs in the instance's __dict__)."""

    def __init__(self, reqs):
        self.reqs = reqs
        self.beam_tail = None


def _beam_tail(tree, batch, reqs, p, rng):
    """append_beam_tail on the batch's requests: half the batches without a beam
    group (the kernel's answer), the others with a tenth of their requests in
    one (upstream's loop runs; a group with member rows needs names the
    stand-ins do not load, so both sides raise alike)."""
    fn = tree.modules["sglang.srt.beam_search.batch_tail"].append_beam_tail
    share = 0.0 if rng.random() < 0.5 else 0.1
    for r in reqs:
        r.beam_group = types.SimpleNamespace(
            member_rows=None if rng.random() < 0.5 else [7], retired=rng.random() < 0.3,
            num_member_rows=1, member_rows_cpu=[7]) if rng.random() < share else None
    holder = _Holder(reqs)
    fn(holder)
    return holder.beam_tail


CALLS = {
    "new_tokens_required_next_decode": _estimate,
    "_new_tokens_required_next_decode_spec_v2": _spec_v2,
    "page_aligned_decode_alloc_lens": _alloc_lens,
    "get_num_new_pages": _pages,
    "num_beam_member_rows": _beam,
    "append_beam_tail": _beam_tail,
}

# (file, old, new, hot spot): arithmetic edits inside what kvest compiles.
INSIDE = [
    (BATCH, "% page_size == 0", "% page_size == 1", "new_tokens_required_next_decode"),
    (BATCH, "nxt = cur + x\n", "nxt = cur + x + 1\n", "_new_tokens_required_next_decode_spec_v2"),
    (BATCH, "x = max(0, r.kv.kv_committed_len + reserve",
     "x = max(1, r.kv.kv_committed_len + reserve", "_new_tokens_required_next_decode_spec_v2"),
    (COMMON, "num_pages_before = (prefix_lens + page_size - 1) // page_size",
     "num_pages_before = prefix_lens // page_size", "get_num_new_pages"),
    (SIZING, "num_needed_tokens += nxt - cur", "num_needed_tokens += nxt - cur + 1",
     "page_aligned_decode_alloc_lens"),
    (BEAM, "if r.beam_group is not None)", "if r.beam_group)", "num_beam_member_rows"),
    (BEAM, "if group is None or group.member_rows is None or group.retired:",
     "if group is None or group.retired:", "append_beam_tail"),
]

# The pattern each INSIDE edit breaks.
EDITED = {"new_tokens_required_next_decode": "decode_count",
          "_new_tokens_required_next_decode_spec_v2": "spec_v2_total",
          "get_num_new_pages": "get_num_new_pages",
          "page_aligned_decode_alloc_lens": "alloc_lens_loop",
          "num_beam_member_rows": "beam_rows",
          "append_beam_tail": "beam_tail_loop"}

# Edits around the loops: the kernels stay.
AROUND = [
    (BATCH, "        page_size = self.token_to_kv_pool_allocator.page_size\n        requests = (",
     "        page_size = self.token_to_kv_pool_allocator.page_size\n"
     "        if getattr(self, 'new_pool_kind', None) == 'x':\n"
     "            return -1\n        requests = (", "new_tokens_required_next_decode"),
    (BATCH, "            total += ceil_align(nxt, page_size) - ceil_align(cur, page_size)\n"
     "        return total",
     "            total += ceil_align(nxt, page_size) - ceil_align(cur, page_size)\n"
     "        if total < 0:\n            raise RuntimeError('negative')\n        return total",
     "_new_tokens_required_next_decode_spec_v2"),
    (SIZING, '    cur_kv_lens = [0] * len(reqs)\n',
     '    if page_size <= 0:\n        raise ValueError("page_size")\n'
     '    cur_kv_lens = [0] * len(reqs)\n', "page_aligned_decode_alloc_lens"),
    (BEAM, "    if not entries:\n        return\n",
     "    if not entries:\n        batch.beam_tail = None\n        return\n", "append_beam_tail"),
    # An annotation on a local is never evaluated inside a function: the same code.
    (BATCH, "            x = max(0, r.kv.kv_committed_len + reserve",
     "            x: int = max(0, r.kv.kv_committed_len + reserve",
     "_new_tokens_required_next_decode_spec_v2"),
    (BATCH, "            new_pages = sum(\n", "            new_pages: int = sum(\n",
     "new_tokens_required_next_decode"),
]


@pytest.mark.parametrize("edit", INSIDE, ids=[e[3] + ":" + e[2][:24] for e in INSIDE])
def test_an_edit_inside_a_loop_is_left_alone_and_answers_as_edited(edit, tmp_path):
    rel, old, new, spot = edit
    source = _edited_tree(tmp_path, rel, old, new)
    with standin_tree(source, torch=TORCH) as tree:
        expected = _answers(tree, [CALLS[spot]])
        with pytest.warns(RuntimeWarning, match=f"left unpatched: {spot}: .*differs from "
                          "kvest's pattern") as caught:
            handle = kvest.sglang.patch()
        try:
            report = monitor.status()["hotspots"][spot]
            # The edited loop is left alone (the function's other loops, if
            # any, stay compiled), and says so.
            assert not any(p.startswith(EDITED[spot]) for p in report["patterns"]), report
            assert report["state"] == "left alone" or report["patterns"], report
            assert any("differs from kvest's pattern" in n for n in report["notes"]), report
            message = str(caught[0].message)
            assert f"line {_line_of(source, rel, new)}" in message, message
            assert _answers(tree, [CALLS[spot]]) == expected
            # The other hot spots are still compiled.
            states = {n: s["state"] for n, s in monitor.status()["hotspots"].items()}
            assert sum(s == "replaced" for s in states.values()) >= 3, states
        finally:
            handle.undo()


def _line_of(source: SourceTree, rel: str, text: str) -> int:
    """The line of ``text`` (its first line) in the edited file."""
    body = source.path(rel).read_text()
    return body[: body.index(text.strip().splitlines()[0])].count("\n") + 1


@pytest.mark.parametrize("edit", AROUND, ids=[e[3] + ":" + e[2][:24] for e in AROUND])
def test_an_edit_around_a_loop_keeps_the_kernel_exact(edit, tmp_path):
    rel, old, new, spot = edit
    source = _edited_tree(tmp_path, rel, old, new)
    with standin_tree(source, torch=TORCH) as tree:
        expected = _answers(tree, [CALLS[spot]])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handle = kvest.sglang.patch()
        # The only thing left alone: kvest's whole-function version of an edited
        # function (the int32 arrays for eagle_utils); its loop stays compiled.
        assert all("whole-function pattern alloc_lens_function" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        try:
            before = monitor.status()["hotspots"][spot]
            assert before["state"] == "replaced", before
            assert _answers(tree, [CALLS[spot]]) == expected
            report = monitor.status()["hotspots"][spot]
            assert report["kernel"] > before["kernel"], report
            # append_beam_tail's loop is upstream's whenever a request is in a beam group.
            assert (report["fallbacks"] > before["fallbacks"]) == (spot == "append_beam_tail"), \
                report
        finally:
            handle.undo()


@pytest.mark.parametrize("tree_source", RELEASES, ids=[t.version for t in RELEASES])
def test_every_hot_spot_is_compiled_and_exact(tree_source):
    with standin_tree(tree_source, torch=TORCH) as tree:
        calls = list(CALLS.values())
        expected = _answers(tree, calls)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handle = kvest.sglang.patch()
        try:
            states = {n: s["state"] for n, s in monitor.status()["hotspots"].items()
                      if s["state"] not in ("absent", "not recognised in this release")}
            # (a hot spot all of whose kinds are upstream's faster code is skipped)
            slower = {n for n, s in states.items() if all(
                KINDS[k].upstream_faster for k in HOTSPOTS[n].kinds)}
            assert {states[n] for n in slower} <= {"skipped"}, states
            assert {s for n, s in states.items() if n not in slower} == {"replaced"}, states
            assert _answers(tree, calls) == expected
            replaced = vars(tree.batch_class)["new_tokens_required_next_decode"]
            assert "[kvest]" in repr(replaced)
            assert replaced.__wrapped__.__qualname__.endswith("new_tokens_required_next_decode")
        finally:
            handle.undo()


def test_shadow_mode_counts_mismatches_on_an_edited_kernel(tmp_path, caplog, monkeypatch):
    """Shadow mode: upstream answers; kvest runs beside it and counts.  On the
    release as shipped, 0 mismatches; with a kernel made wrong, every call that
    differs is counted and the first one logged with its lengths."""
    with standin_tree(NEWEST, torch=TORCH) as tree:
        expected = _answers(tree, [_estimate, _spec_v2])
        names = ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2")
        # (counters go on from earlier tests: what this one adds is compared)
        before = {n: monitor.status()["hotspots"][n]["shadow"] for n in names}
        handle = kvest.sglang.patch(shadow=True)
        try:
            assert _answers(tree, [_estimate, _spec_v2]) == expected
            spots = monitor.status()["hotspots"]
            for name in names:
                assert spots[name]["state"] == "shadow"
                shadow = spots[name]["shadow"]
                assert shadow["compared"] > before[name]["compared"], (name, shadow)
                assert shadow["mismatches"] == before[name]["mismatches"], (name, shadow)
        finally:
            handle.undo()
        # A wrong kernel: upstream still answers, and the mismatches are counted.
        monkeypatch.setattr(kvest, "spec_v2_new_tokens_from_reqs", lambda *a, **k: 1)
        handle = kvest.sglang.patch(shadow=True)
        try:
            with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
                assert _answers(tree, [_spec_v2]) == _answers_unpatched(tree)
            shadow = monitor.status()["hotspots"][
                "_new_tokens_required_next_decode_spec_v2"]["shadow"]
            assert shadow["mismatches"] > 0
            assert "first mismatch" in caplog.text and "'page_size': " in shadow["first_mismatch"]
            assert "inputs (committed, allocated)" in shadow["first_mismatch"]
        finally:
            handle.undo()


def _answers_unpatched(tree):
    original = vars(tree.batch_class)["_new_tokens_required_next_decode_spec_v2"].__wrapped__
    return _answers(tree, [lambda t, b, reqs, p, rng: original(b, reqs, p)])


def test_a_loop_variable_read_after_the_loop_keeps_the_loop(tmp_path):
    """The kernel binds only what the pattern binds: a loop whose variable the
    rest of the function reads is left alone."""
    with standin_tree(NEWEST) as tree:
        fn = vars(tree.batch_class)["_new_tokens_required_next_decode_spec_v2"]
        found = rewrite.analyse(fn, ["spec_v2_total"])
        assert [f.pattern.kind for f in found.found] == ["spec_v2_total"]
    source = _edited_tree(tmp_path, BATCH, "            total += ceil_align(nxt, page_size) - "
                          "ceil_align(cur, page_size)\n        return total",
                          "            total += ceil_align(nxt, page_size) - "
                          "ceil_align(cur, page_size)\n        return total + 0 * nxt")
    with standin_tree(source) as tree:
        fn = vars(tree.batch_class)["_new_tokens_required_next_decode_spec_v2"]
        found = rewrite.analyse(fn, ["spec_v2_total"])
        assert not found.found
        assert any("'nxt' is used outside it" in n.text for n in found.notes)


@pytest.mark.parametrize(("rebind", "says"), [
    (True, "`ceil_align` was rebound: it is"), (False, "`ceil_align` was edited")],
    ids=["rebound", "edited"])
def test_a_changed_helper_is_said_plainly(rebind, says, tmp_path):
    """``ceil_align`` rebound in the module before kvest plans, or edited: the
    loop that calls it is left to upstream, with the reason in words, said once."""
    old, new = ("", "") if rebind else ("    return ceil_div(x, y) * y\n",
                                        "    return ceil_div(x, y)\n")
    source = _edited_tree(tmp_path, COMMON, old, new) if old else NEWEST
    with standin_tree(source) as tree:
        if rebind:
            module = tree.modules["sglang.srt.managers.schedule_batch"]
            module.ceil_align = lambda x, y, _f=module.ceil_align: _f(x, y)
        with pytest.warns(RuntimeWarning) as caught:
            handle = kvest.sglang.patch()
        try:
            spot = monitor.status()["hotspots"]["_new_tokens_required_next_decode_spec_v2"]
            assert spot["state"] == "left alone", spot
            assert says in spot["reason"], spot
            messages = [str(w.message) for w in caught if says in str(w.message)]
            assert len(messages) == 1, [str(w.message) for w in caught]
            assert messages[0].count("left alone") <= 1, messages
            reqs = _requests(tree, random.Random(3), 16, n=6)
            batch = tree.batch(reqs, 16, "EAGLE")
            original = vars(tree.batch_class)["_new_tokens_required_next_decode_spec_v2"]
            assert batch._new_tokens_required_next_decode_spec_v2(reqs, 16) == original(
                batch, reqs, 16)
        finally:
            handle.undo()


def test_a_helper_whose_code_is_replaced_declines():
    """An autoreload replaces a function's ``__code__`` and keeps the object:
    the kernel declines, and upstream's loop calls the new code."""
    with standin_tree(NEWEST) as tree:
        common = tree.modules["sglang.srt.utils.common"]
        handle = kvest.sglang.patch()
        saved = common.ceil_div.__code__
        try:
            common.ceil_div.__code__ = (lambda x, y: 0).__code__
            reqs = _requests(tree, random.Random(2), 16, n=8)
            batch = tree.batch(reqs, 16, "EAGLE")
            assert batch._new_tokens_required_next_decode_spec_v2(reqs, 16) == 0
        finally:
            common.ceil_div.__code__ = saved
            handle.undo()


def test_a_shadowed_helper_declines(tmp_path):
    """``ceil_align`` must be the function kvest matched: rebound in the
    module after patching, the kernel declines and upstream's loop answers."""
    with standin_tree(NEWEST) as tree:
        module = tree.modules["sglang.srt.managers.schedule_batch"]
        handle = kvest.sglang.patch()
        try:
            module.ceil_align = lambda x, y: 0
            reqs = _requests(tree, random.Random(1), 16, n=8)
            batch = tree.batch(reqs, 16, "EAGLE")
            name = "_new_tokens_required_next_decode_spec_v2"
            before = monitor.status()["hotspots"][name]
            assert batch._new_tokens_required_next_decode_spec_v2(reqs, 16) == 0
            spot = monitor.status()["hotspots"][name]
            assert spot["calls"] - before["calls"] == 1
            assert spot["fallbacks"] - before["fallbacks"] == 1
            assert spot["kernel"] == before["kernel"]
        finally:
            handle.undo()


EAGLE = "sglang/srt/speculative/eagle_utils.py"


@pytest.mark.parametrize(("rel", "old", "new", "spot", "kept", "above"), [
    (EAGLE, "        r.decode_batch_idx += 1\n", "        r.decode_batch_idx += 2\n",
     "eagle_prepare_for_decode", False, 0),
    # (a statement added to the body: the message names it, a line below; the
    # nearest pattern is then an older release's two-statement loop)
    (BATCH, "            req.decode_batch_idx += 1\n",
     "            req.decode_batch_idx += 1\n            req.kv.kv_committed_len += 0\n",
     "prepare_for_decode", False, -1),
    (EAGLE, "    for r in batch.reqs:\n        r.decode_batch_idx += 1\n",
     "    assert batch.reqs is not None\n"
     "    for r in batch.reqs:\n        r.decode_batch_idx += 1\n",
     "eagle_prepare_for_decode", True, 0),
    # (a branch added inside the loop: still the loop kvest knows, left alone and said)
    (EAGLE, "    for r in batch.reqs:\n        r.decode_batch_idx += 1\n",
     "    for r in batch.reqs:\n        if r is not None:\n            r.decode_batch_idx += 1\n",
     "eagle_prepare_for_decode", False, -1),
], ids=["edited inside (eagle)", "edited inside (method)", "edited around (eagle)",
        "a branch inside (eagle)"])
def test_the_batch_index_loop_is_compiled_only_as_shipped(rel, old, new, spot, kept, above,
                                                          tmp_path):
    """``decode_batch_idx += 1`` over the batch: an edit inside the loop leaves
    it upstream's, with the line named; an edit around it keeps the writer.
    (The loop's writes themselves: tests/test_sglang_writers.py.)"""
    source = _edited_tree(tmp_path, rel, old, new)
    with standin_tree(source, torch=TORCH):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handle = kvest.sglang.patch()
        try:
            report = monitor.status()["hotspots"][spot]
            if kept:  # found as shipped; left to upstream, whose loop is faster
                assert report["state"] == "skipped", report
                assert "upstream's code is faster" in report["reason"], report
            else:
                assert report["state"] == "left alone", report
                message = " ".join(str(w.message) for w in caught)
                assert f"line {_line_of(source, rel, new) - above} differs from kvest's pattern " \
                       "batch_idx_loop" in message, message
            others = monitor.status()["hotspots"]["new_tokens_required_next_decode"]
            assert others["state"] == "replaced"
        finally:
            handle.undo()


def test_the_beam_tail_offset_read_after_the_loop_keeps_the_loop(tmp_path):
    """append_beam_tail's loop is skipped only while its running offset is not
    read after it (the kernel proves the loop would leave it as it was, but a
    read of a loop variable is refused like any other)."""
    source = _edited_tree(tmp_path, BEAM, "    if not entries:\n        return\n",
                          "    if not entries:\n        return req\n")
    with standin_tree(source) as tree:
        fn = tree.modules["sglang.srt.beam_search.batch_tail"].append_beam_tail
        found = rewrite.analyse(fn, ["beam_tail_loop"])
        assert not found.found
        assert any("'req' is used outside it" in n.text for n in found.notes), found.notes
