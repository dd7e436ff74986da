"""What an operator reads is true: status(), the counters, shadow mode's summary,
one registry behind the plugin, status() and the doctor.

On stand-in modules built from a release's own files (the newest at hand).
"""

from __future__ import annotations

import functools
import logging
import random
import shutil
import sys
import threading
import warnings

import numpy as np
import pytest
from sglang_releases import check_required, releases
from sglang_standins import request_class

import kvest
import kvest.sglang
from kvest.sglang import monitor, parity, plugin, registry
from kvest.sglang.upstream import Config, SourceTree, standin_tree

check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = releases()[-1]
ESTIMATE = "new_tokens_required_next_decode"
SPEC_V2 = "_new_tokens_required_next_decode_spec_v2"

# The keys of status(), pinned: monitoring scripts read them (docs/sglang.md).
TOP_KEYS = {"kvest", "implementation", "sglang", "mode", "reason", "scheduler",
            "scheduler_mode", "hotspots", "audit"}
SPOT_KEYS = {"state", "reason", "patterns", "notes", "calls", "kernel", "fallbacks", "upstream",
             "failures", "first_failure", "shadow"}
SHADOW_KEYS = {"compared", "mismatches", "kvest_us", "upstream_us", "ratio", "first_mismatch"}


def _batch(tree, spec, committed=(5, 16, 31, 100, 128)):
    tree.config = Config("EAGLE" if spec else None, 3, 1, 4, 16)
    make = request_class(tree.layout())
    reqs = [make(c, c + 3) for c in committed]
    return tree.batch(reqs, 16, "EAGLE" if spec else None)


def _check_keys(report):
    assert set(report) == TOP_KEYS
    assert report["kvest"] == kvest.__version__
    assert report["implementation"] == kvest.IMPLEMENTATION
    assert set(report["hotspots"]) == set(registry.HOTSPOTS)
    for spot in report["hotspots"].values():
        assert set(spot) == SPOT_KEYS
        assert set(spot["shadow"]) == SHADOW_KEYS
        assert spot["state"] in {s.value for s in registry.State}


def test_counters_count_calls_of_the_hot_spot():
    """N calls read N: each call counts once, whatever number of kernels it
    reaches (the selection and the count), and a declined call is one fallback."""
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        before = kvest.sglang.status()["hotspots"][ESTIMATE]
        batch = _batch(tree, False)
        for _ in range(10):
            batch.new_tokens_required_next_decode()
        for _ in range(10):
            batch.new_tokens_required_next_decode([0, 2, -1])
        bad = _batch(tree, False, committed=(5, 16))
        first = bad.reqs[0]
        if hasattr(first, "kv") and hasattr(first.kv, "kv_committed_len"):
            first.kv.kv_committed_len = True  # a bool: kvest declines, upstream answers
        else:
            first.kv_committed_len = True
        bad.new_tokens_required_next_decode()
        after = kvest.sglang.status()["hotspots"][ESTIMATE]
    assert after["calls"] - before["calls"] == 21
    assert after["kernel"] - before["kernel"] == 20
    assert after["fallbacks"] - before["fallbacks"] == 1


@pytest.mark.parametrize("env", [{}, {"KVEST_SGLANG": "0"}, {"KVEST_SGLANG": "shadow"},
                                 {"KVEST_SGLANG": "bogus"}])
def test_status_keys_are_the_same_in_every_mode(env, monkeypatch):
    monkeypatch.delenv("KVEST_SGLANG", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with standin_tree(NEWEST, plugins=True) as tree, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree.modules["sglang.srt.plugins"].load_plugins()
        report = kvest.sglang.status()
    _check_keys(report)
    assert report["sglang"] == NEWEST.version
    assert report["scheduler"] is True
    value = env.get("KVEST_SGLANG")
    expected = {None: "on", "0": "off", "shadow": "shadow", "bogus": "off"}[value]
    assert report["mode"] == expected
    # Why, in words: a typo never reads like a deliberate switch-off.
    assert (repr(value) if value else "not set") in report["reason"]
    if value == "bogus":
        assert "not one of" in report["reason"]
    if expected == "off":  # (a hot spot the release lacks reads absent in every mode)
        assert {s["state"] for s in report["hotspots"].values()} - {"absent"} == {"off"}


def test_without_the_scheduler_nothing_is_replaced_and_status_says_why():
    with standin_tree(NEWEST, plugins=True) as tree:
        del sys.modules[registry.BATCH]
        common = tree.modules[registry.COMMON]
        original = common.get_num_new_pages
        tree.modules["sglang.srt.plugins"].load_plugins()
        report = kvest.sglang.status()
        assert common.get_num_new_pages is original
    _check_keys(report)
    assert report["mode"] == "off" and report["scheduler"] is False
    assert "no SGLang scheduler in this process" in report["reason"]
    assert not any(s["state"] in ("replaced", "shadow") for s in report["hotspots"].values())


def test_a_second_patch_keeps_one_monitor():
    """The plugin, then a launcher's patch(shadow=True): the glue installed first
    still counts where status() reads."""
    with standin_tree(NEWEST) as tree:
        first = kvest.sglang.patch()
        try:
            batch = _batch(tree, False)
            hooked = vars(tree.batch_class)[ESTIMATE]
            before = kvest.sglang.status()["hotspots"][ESTIMATE]["calls"]
            second = kvest.sglang.patch(shadow=True)  # finds kvest's function: skipped
            second.undo()
            hooked(batch)
            hooked(batch)
            assert kvest.sglang.status()["hotspots"][ESTIMATE]["calls"] == before + 2
        finally:
            first.undo()


def test_status_polled_from_another_thread_during_patch():
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                _check_keys(kvest.sglang.status())
            except BaseException as exc:
                errors.append(exc)
                return

    with standin_tree(NEWEST):
        poller = threading.Thread(target=poll)
        poller.start()
        try:
            for _ in range(20):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kvest.sglang.patch(shadow=bool(_ % 2)).undo()
        finally:
            stop.set()
            poller.join()
    assert not errors, errors


def test_a_shadow_report_never_changes_the_answer(monkeypatch):
    """Reading the arguments again for a mismatch report may raise: the shadowed
    call still returns upstream's answer."""
    monkeypatch.setattr(kvest, "decode_new_tokens_from_reqs", lambda *a, **k: 10**9)

    def fails(*args, **kwargs):
        raise RuntimeError("a property that raises when read again")

    monkeypatch.setattr(monitor, "_lengths", fails)
    with standin_tree(NEWEST) as tree:
        original = vars(tree.batch_class)[ESTIMATE]
        expected = original(_batch(tree, False))
        with kvest.sglang.patch(shadow=True):
            assert _batch(tree, False).new_tokens_required_next_decode() == expected
            shadow = kvest.sglang.status()["hotspots"][ESTIMATE]["shadow"]
    assert shadow["mismatches"] >= 1
    assert "no reproduction" in shadow["first_mismatch"]


def test_one_outlier_cannot_flip_the_shadow_verdict():
    """Medians of a bounded sample: one slow call (a collection, a page fault)
    moves neither median, whichever side it lands on."""
    kvest_side, upstream_side = monitor.Samples(), monitor.Samples()
    for i in range(999):
        kvest_side.add(500 + i % 7)
        upstream_side.add(900 + i % 5)
    kvest_side.add(2_000_000)  # 2 ms
    assert kvest_side.quantile(0.5) < 0.6 < upstream_side.quantile(0.5)
    assert kvest_side.quantile(0.99) < 1.0  # the outlier is above the 99th percentile
    for _ in range(10 * monitor.SAMPLES):  # bounded: the oldest samples go
        upstream_side.add(100)
    assert len(upstream_side.values) == monitor.SAMPLES
    assert upstream_side.quantile(0.5) == 0.1


def test_the_shadow_summary_logs_medians(caplog):
    with standin_tree(NEWEST) as tree, kvest.sglang.patch(shadow=True):
        for _ in range(5):
            _batch(tree, False).new_tokens_required_next_decode()
        with caplog.at_level(logging.INFO, logger="kvest.sglang"):
            monitor.summary()
        report = kvest.sglang.status()["hotspots"][ESTIMATE]["shadow"]
    assert "kvest median" in caplog.text and "upstream median" in caplog.text
    assert report["kvest_us"]["median"] is not None and report["ratio"] is not None


def test_a_release_without_patterns_for_an_older_loop_raises_no_edit_warning():
    """Every release as shipped: nothing is said to be edited."""
    for tree_source in releases():
        with standin_tree(tree_source), warnings.catch_warnings():
            warnings.simplefilter("error")
            kvest.sglang.patch().undo()


class _Plain:
    """A plain object: its attributes in its instance dict."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


EXTRA_MODULE = "sglang.srt.kvest_extra"
EXTRA_SOURCE = '''
def count_new_pages(requests, page_size):
    new_pages = sum(1 for r in requests if r.kv.kv_committed_len % page_size == 0)
    return new_pages
'''


def _extra_spot(tmp_path, monkeypatch, source, name):
    """The newest release's files and EXTRA_MODULE holding ``source``, whose
    function ``name`` is registered as a hot spot of the decode count."""
    for file in registry.files():
        if NEWEST.exists(file):
            (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(NEWEST.path(file), tmp_path / file)
    (tmp_path / registry.module_file(EXTRA_MODULE)).write_text(source)
    roles = {"target": "new_pages", "requests": "requests", "page_size": "page_size"}
    spot = registry.HotSpot(name, (EXTRA_MODULE,), None, name,
                            (registry.Use("decode_count", roles),))
    monkeypatch.setitem(registry.HOTSPOTS, spot.name, spot)  # type: ignore[index]
    monkeypatch.setattr(monitor.STATE, "spots", dict(monitor.STATE.spots))
    return SourceTree(tmp_path, NEWEST.version)


def test_a_new_hot_spot_is_one_registry_record(tmp_path, monkeypatch, capsys):
    """A stand-in hot spot added to the registry (an existing kind of statement
    in a new function): the stand-in loader, the plan, status(), the plugin and
    the doctor's parity run all pick it up."""
    source = _extra_spot(tmp_path, monkeypatch, EXTRA_SOURCE, "count_new_pages")
    with standin_tree(source, plugins=True) as tree:
        assert EXTRA_MODULE in tree.modules  # the loader read the registry
        module = tree.modules[EXTRA_MODULE]
        original = module.count_new_pages
        tree.modules["sglang.srt.plugins"].load_plugins()
        assert module.count_new_pages is not original
        report = kvest.sglang.status()["hotspots"]["count_new_pages"]
        assert report["state"] == "replaced" and report["patterns"][0].startswith("decode_count")
        reqs = [_Plain(kv=_Plain(kv_committed_len=c)) for c in (32, 33, 48)]
        assert module.count_new_pages(reqs, 16) == original(reqs, 16) == 2
        assert kvest.sglang.status()["hotspots"]["count_new_pages"]["kernel"] >= 1
    from kvest.cli import main as cli_main

    assert cli_main(["sglang", "--batches", "8", "--sglang-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  count_new_pages: replaced (decode_count/nested at line 3)" in out
    assert "  count_new_pages: decode_count/nested at line 3: " in out


LOOPED_SOURCE = '''
def count_each_size(requests, sizes):
    total = 0
    for page_size in sizes:
        new_pages = sum(1 for r in requests if r.kv.kv_committed_len % page_size == 0)
        total += new_pages
    return total
'''


@pytest.mark.parametrize(("sizes", "outcome"), [
    ((np.int64(16), 16), "fallbacks"), ((16, np.int64(16)), "fallbacks"), ((16, 8), "kernel")])
def test_a_statement_in_a_loop_counts_its_call_once(sizes, outcome, tmp_path, monkeypatch):
    """A swapped statement run on every pass of a loop: a call where one pass
    declined (a NumPy page size) is one fallback, whichever pass it was; a
    call whose every pass answered, one kernel call."""
    source = _extra_spot(tmp_path, monkeypatch, LOOPED_SOURCE, "count_each_size")
    with standin_tree(source, plugins=True) as tree:
        module = tree.modules[EXTRA_MODULE]
        original = module.count_each_size
        tree.modules["sglang.srt.plugins"].load_plugins()
        assert module.count_each_size is not original
        reqs = [_Plain(kv=_Plain(kv_committed_len=c)) for c in (32, 33, 48)]
        before = dict(kvest.sglang.status()["hotspots"]["count_each_size"])
        assert module.count_each_size(reqs, sizes) == original(reqs, sizes)
        after = kvest.sglang.status()["hotspots"]["count_each_size"]
    moved = {k: after[k] - before[k] for k in ("calls", "kernel", "fallbacks", "upstream")}
    assert moved == {"calls": 1, "kernel": 0, "fallbacks": 0, "upstream": 0, outcome: 1}


def _raiser(*args, **kwargs):
    raise LookupError("the shadowing definition ran")


@functools.cache
def _layouts():
    """The newest release at hand of each request layout (flat, mixed, nested)."""
    newest = {}
    for tree_source in releases():
        with standin_tree(tree_source) as tree:
            newest[parity.request_maker(tree.layout())] = tree_source
    return list(newest.values())


def _statements():
    """(release, hot spot, analysis, found) for every statement kvest swaps in
    the newest release of each layout at hand."""
    cases = []
    for tree_source in _layouts():
        with standin_tree(tree_source), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle = kvest.sglang.patch()
            handle.undo()
        cases += [(tree_source, t.spot, t.analysis, s.found) for t in handle.plan.targets
                  for s in t.swaps]
    return cases


@pytest.mark.parametrize("case", _statements(),
                         ids=lambda c: f"{c[0].version}:{c[1]}:{c[3].pattern.id}")
def test_a_shadowed_builtin_is_left_to_upstream(case):
    """Every builtin a swapped statement reads, shadowed at module level (a
    ``def max`` or ``max = ...`` added to the file, before or after import):
    the statement is upstream's, so the shadowing definition runs."""
    import builtins

    tree_source, name, analysis, found = case
    with standin_tree(tree_source) as tree:
        alone, swapped, params = parity.statement_pair(analysis, found, name)
        namespace = alone.__globals__
        builtins_read = [g for g in found.pattern.globals if hasattr(builtins, g)]
        make = parity.request_maker(tree.layout())
        rng = random.Random(7)
        for builtin in builtins_read:
            assert builtin not in namespace
            namespace[builtin] = _raiser
            try:
                for _ in range(5):
                    world = parity.World(rng, make, beams=False)
                    args = [parity.ROLES.get(parity._role(found, p), lambda w: None)(world)
                            for p in params]
                    expected = parity._outcome(alone, *args)
                    assert parity._outcome(swapped, *args) == expected
            finally:
                del namespace[builtin]


def test_a_shadowed_builtin_sends_the_int32_form_to_upstream():
    """kvest's whole-function int32 version reads ``max``, ``enumerate`` and
    ``len`` from the module, as upstream's function does, on every call."""
    with standin_tree(NEWEST) as tree:
        sizing = tree.modules.get(registry.ALLOC_SIZING)
        eagle = tree.modules.get(registry.EAGLE_UTILS)
        if sizing is None or eagle is None:
            pytest.skip(f"sglang {NEWEST.version} has no page_aligned_decode_alloc_lens")
        with kvest.sglang.patch():
            int32_form = eagle.page_aligned_decode_alloc_lens
            if getattr(int32_form, "__kvest_original__", None) is None:
                pytest.skip("the int32 form is not installed for this release")
            make = request_class(tree.layout())
            reqs = [make(100, 130), make(64, 64)]
            sizing.max = lambda a, b: b  # an edit a fork might make
            try:
                cur, nxt, total = int32_form(reqs, reserve=8, page_size=16)
                expected = int32_form.__wrapped__(reqs, reserve=8, page_size=16)
            finally:
                del sizing.max
    assert (list(cur), list(nxt), total) == expected
    assert expected[2] == -2  # the shadowing max made it so


def test_plugin_and_status_read_one_registry():
    """The plugin plans from the registry's hot spots and nothing else."""
    assert plugin.load.__module__ == "kvest.sglang.plugin"
    assert set(monitor.STATE.spots) >= set(registry.HOTSPOTS)
    for spot in registry.HOTSPOTS.values():
        for use in spot.uses:
            kind = registry.KINDS[use.kind]
            assert set(kind.inputs) <= set(use.roles) | {"target"}, (spot.name, kind.name)
            if not kind.whole:
                from kvest.sglang import glue

                assert callable(getattr(glue, f"make_{kind.name}")), kind.name


class _Rebinding:
    """An index whose ``__index__`` rebinds the batch's requests: Python code
    that upstream's comprehension runs between two reads of ``self.reqs``."""

    def __init__(self, batch, value):
        self.batch, self.value = batch, value

    def __index__(self):
        self.batch.reqs = self.batch.reqs[:1]
        return self.value


def test_an_index_that_runs_code_is_left_to_upstream():
    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        original = vars(tree.batch_class)[ESTIMATE].__wrapped__
        twin, batch = _batch(tree, False), _batch(tree, False)
        # upstream reads self.reqs again for the second index: the shortened list
        with pytest.raises(IndexError):
            original(twin, [_Rebinding(twin, 0), 3])
        with pytest.raises(IndexError):
            batch.new_tokens_required_next_decode([_Rebinding(batch, 0), 3])
        assert len(batch.reqs) == len(twin.reqs) == 1


def _annotated_tree(tree_source, tmp_path):
    """The release's files with ``x: int = max(0, ...)`` in the spec-v2 loop and
    ``new_pages: int = sum(...)`` in the estimate: annotations on locals, which
    a function never evaluates (the same code)."""
    for name in registry.files():
        if tree_source.exists(name):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(tree_source.path(name), tmp_path / name)
    path = tmp_path / registry.module_file(registry.BATCH)
    text = path.read_text()
    for old in ("            x = max(0, ", "            new_pages = sum("):
        assert text.count(old) == 1, old
        text = text.replace(old, old.replace(" = ", ": int = ", 1))
    path.write_text(text)
    return SourceTree(tmp_path, tree_source.version)


@pytest.mark.parametrize("tree_source", _layouts(), ids=lambda t: t.version)
def test_an_annotated_local_keeps_the_kernel(tree_source, tmp_path):
    """On the newest release of each layout: the annotated statements are still
    the patterns, compiled, and exact against the annotated code."""
    source = _annotated_tree(tree_source, tmp_path)
    with standin_tree(source) as tree:
        original = vars(tree.batch_class)[SPEC_V2]
        estimate = vars(tree.batch_class)[ESTIMATE]
        batches = [(_batch(tree, spec), spec) for spec in (False, True)]
        expected = [original(b, b.reqs, 16) for b, _ in batches] + [
            estimate(b) for b, spec in batches if not spec]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing said to be edited
            handle = kvest.sglang.patch()
        try:
            spots = kvest.sglang.status()["hotspots"]
            assert spots[SPEC_V2]["state"] == "replaced", spots[SPEC_V2]
            assert any(p.startswith("decode_count") for p in spots[ESTIMATE]["patterns"])
            got = [b._new_tokens_required_next_decode_spec_v2(b.reqs, 16) for b, _ in batches] \
                + [b.new_tokens_required_next_decode() for b, spec in batches if not spec]
            assert got == expected
        finally:
            handle.undo()


_PLAIN = """
import json, kvest.sglang
report = kvest.sglang.status()
print(json.dumps({"repr": repr(report), "str": str(report), "dict": dict(report),
                  "is_dict": isinstance(report, dict)}))
"""


@pytest.mark.parametrize(("env", "says"), [
    ({}, "in mode on (KVEST_SGLANG is not set: on by default)"),
    ({"KVEST_SGLANG": "0"}, "in mode off (KVEST_SGLANG='0' turns kvest off)"),
    ({"KVEST_SGLANG": "shadow"}, "in mode shadow (KVEST_SGLANG='shadow')"),
    ({"KVEST_SGLANG": "bogus"}, "in mode off (KVEST_SGLANG='bogus' is not one of 1/on, "
                                "shadow, audit, 0/off"),
    ({"KVEST_SGLANG": "audit"}, "in mode audit (KVEST_SGLANG='audit': SGLang runs its own "
                                "code, with kvest's KV audit)"),
    ({"SGLANG_PLUGINS": "someone_else"}, "would not load (SGLANG_PLUGINS='someone_else' "
                                         "does not list kvest)"),
])
def test_status_in_a_plain_process_is_short_and_points_to_the_instruments(env, says):
    """A launcher or a notebook, where the plugin never runs: status() prints a
    few lines, not the dict; says that kvest runs in the scheduler processes,
    what the switches would make of it there (a bad value as bad), and names
    the log, the doctor, the metrics and the audit.  The dict is unchanged."""
    import json
    import os
    import subprocess

    environ = {k: v for k, v in os.environ.items()
               if k not in ("KVEST_SGLANG", "SGLANG_PLUGINS")}
    done = subprocess.run([sys.executable, "-c", _PLAIN], capture_output=True, text=True,
                          env={**environ, **env}, timeout=120, check=True)
    out = json.loads(done.stdout)
    text, report = out["repr"], out["dict"]
    assert out["is_dict"] and out["str"] == text
    _check_keys(report)
    assert report["mode"] == "off" and report["scheduler"] is False
    would = says.split("in mode ")[1].split(" ")[0] if "in mode " in says else "off"
    assert report["scheduler_mode"] == would
    assert "not an SGLang scheduler process" in " ".join(text.split())
    assert f"a scheduler started with this environment runs in mode {would}" in \
        " ".join(text.split())
    assert "\n  audit: " not in text  # the audit runs in no such process: no counters
    assert report["reason"].startswith("kvest's SGLang plugin has not run in this process")
    assert "scheduler processes" in report["reason"] and says in report["reason"]
    assert len(text) < 2_000 and max(len(line) for line in text.splitlines()) <= 100
    flat = " ".join(text.split())
    assert says in flat
    for instrument in ('logger "kvest.sglang"', "python -m kvest sglang", "/metrics",
                       "python -m kvest audit"):
        assert instrument in flat, instrument
    assert "every hot spot: not loaded" in flat
    assert "{'" not in text  # not the dict


def test_status_in_a_scheduler_reads_as_a_table():
    """Where kvest planned: one row per hot spot in the release, with its state
    and counters; the hot spots the release lacks on one line."""
    from kvest.sglang import readout

    with standin_tree(NEWEST) as tree, kvest.sglang.patch():
        for _ in range(3):
            _batch(tree, False).new_tokens_required_next_decode()
        report = kvest.sglang.status()
    text = repr(report)
    # (a row: the name, its state, four counters; a wrapped line of the
    # grouped hot spots is a list of names)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]
            if line.startswith("  ") and line.split()[0] in registry.HOTSPOTS
            and len(line.split()) >= 6 and line.split()[1].rstrip(",") not in registry.HOTSPOTS}
    spot = report["hotspots"][ESTIMATE]
    assert rows[ESTIMATE][1] == spot["state"] == "replaced"
    assert rows[ESTIMATE][2:6] == [f"{spot[k]:,}" for k in
                                   ("calls", "kernel", "fallbacks", "upstream")]
    for name, entry in report["hotspots"].items():
        if entry["state"] in ("absent", "not loaded", "off"):
            assert name not in rows and name in text
        else:
            assert name in rows
    assert max(len(line) for line in text.splitlines()) <= 120
    # A key another part of kvest adds (the audit's counters) is shown, not a crash.
    audit = {"installed": True, "steps": 5, "undercounts": 1, "bookkeeping_gaps": 0}
    assert "audit: steps 5, undercounts 1" in readout.render({**report, "audit": audit})
    # ... where the audit runs, and only there
    assert "audit: steps" not in readout.render({**report, "audit": {**audit,
                                                                       "installed": False}})


@pytest.mark.parametrize("tree_source", releases(), ids=lambda t: t.version)
def test_absent_is_code_the_release_lacks_and_not_recognised_an_older_shape(tree_source):
    """On each release's own files: a hot spot whose function is missing, or
    holds no statement of its kind (a dispatcher whose loop moved, 0.5.11's
    check_decode_mem), is "absent"; "not recognised in this release" is kept
    for the release's own older statement, which kvest has no pattern for."""
    from kvest.sglang.registry import NoteKind, State

    with standin_tree(tree_source), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = kvest.sglang.patch()
        try:
            spots = {name: (s.state, {n.kind for n in s.notes})
                     for name, s in monitor.STATE.spots.items() if name in registry.HOTSPOTS}
            report = kvest.sglang.status()["hotspots"]
        finally:
            handle.undo()
    for name, (state, kinds) in spots.items():
        if state is State.ABSENT:
            assert kinds <= {NoteKind.NO_STATEMENT}, (name, kinds)
        if NoteKind.NO_STATEMENT in kinds and len(kinds) == 1:
            assert state is State.ABSENT, name
        if state is State.NOT_RECOGNISED:
            assert NoteKind.OLDER_SHAPE in kinds, (name, kinds)
    version = tuple(int(x) for x in tree_source.version.split(".")[:3] if x.isdigit())
    if version == (0, 5, 11):
        assert report["check_decode_mem"]["state"] == "absent"
        assert "has no select_requests statement" in report["check_decode_mem"]["reason"]
    if (0, 5, 16) <= version <= (0, 5, 18):
        assert report["alloc_for_decode"]["state"] == "not recognised in this release"
    if version >= (0, 5, 22):
        assert report["alloc_for_decode"]["state"] == "absent"
        assert report["alloc_for_decode_default"]["state"] == "replaced"
