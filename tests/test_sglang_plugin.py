"""The real entry path: SGLang's own load_plugins() finds kvest's entry point.

The release's plugin framework (``sglang/srt/plugins/__init__.py`` and
``hook_registry.py``, which import only the standard library and
``sglang.srt.environ.envs``) runs from its files in a stand-in package tree;
it reads the entry points of the installed distributions, so this needs kvest
installed (as the test suite always has it).
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import types

import pytest
from sglang_releases import check_required, fallbacks, releases
from sglang_standins import request_class

import kvest.sglang
from kvest.sglang import monitor
from kvest.sglang.upstream import Config, standin_tree

RELEASES = [t for t in releases() if t.exists("sglang/srt/plugins/hook_registry.py")]
check_required(RELEASES)
if not RELEASES:
    pytest.skip("no sglang release available", allow_module_level=True)


def test_kvest_has_the_entry_point():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert [ep.value for ep in eps if ep.name == "kvest"] == ["kvest.sglang.plugin:load"]


@pytest.fixture(params=RELEASES, ids=[t.version for t in RELEASES])
def tree(request, monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("KVEST_SGLANG", raising=False)
    with standin_tree(request.param, plugins=True) as standins:
        yield standins


def _batch(tree, spec):
    tree.config = Config("EAGLE" if spec else None, 3, 1, 4, 16)
    make = request_class(tree.layout())
    reqs = [make(c, c + d) for c, d in [(5, 0), (16, 3), (31, 40), (100, 7), (128, 0)]]
    return tree.batch(reqs, 16, "EAGLE" if spec else None, overlap=True)


def test_load_plugins_replaces_the_estimate(tree, caplog):
    cls = tree.batch_class
    original = cls.__dict__["new_tokens_required_next_decode"]
    cases = [(spec, sel) for spec in (False, True) for sel in (None, (4, 0, -1))]
    expected = {case: original(_batch(tree, case[0]), case[1]) for case in cases}  # unpatched
    with caplog.at_level(logging.DEBUG, logger="kvest.sglang"):
        tree.modules["sglang.srt.plugins"].load_plugins()
        # Nothing is logged while the plugin loads (SGLang configures logging after).
        assert not [r for r in caplog.records if r.name == "kvest.sglang"]
        patched = cls.__dict__["new_tokens_required_next_decode"]
        # (0.5.11-0.5.18: the KV audit takes the estimate here, wrapped around it)
        patched = getattr(patched, "__kvest_audit__", patched)
        assert patched is not original
        assert patched.__wrapped__ is original  # SGLang's HookRegistry REPLACE wrapper
        before = fallbacks()
        for (spec, sel), value in expected.items():
            assert _batch(tree, spec).new_tokens_required_next_decode(sel) == value
        assert fallbacks() == before
    records = [r for r in caplog.records if r.name == "kvest.sglang"]
    # The status line, once, on the first call: INFO, and a WARNING only for
    # code left alone (here get_num_new_pages is skipped: no torch).
    assert [r.levelno for r in records] == [logging.INFO], [r.getMessage() for r in records]
    assert "new_tokens_required_next_decode replaced" in records[0].getMessage()
    report = kvest.sglang.status()["hotspots"]["new_tokens_required_next_decode"]
    assert report["state"] == "replaced" and report["kernel"] >= 2
    # From the first call on, kvest's function itself, without the pass-through.
    kvest_fn = cls.__dict__["new_tokens_required_next_decode"]
    assert kvest_fn is patched.__closure__[0].cell_contents
    assert kvest_fn.__kvest_original__ is original
    # Idempotent, as SGLang means load_plugins() to be.
    tree.modules["sglang.srt.plugins"].load_plugins()
    assert cls.__dict__["new_tokens_required_next_decode"] is kvest_fn


@pytest.mark.parametrize("env", [{"KVEST_SGLANG": "0"}, {"SGLANG_PLUGINS": "someone_else"}])
def test_turned_off(tree, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    original = tree.batch_class.__dict__["new_tokens_required_next_decode"]
    tree.modules["sglang.srt.plugins"].load_plugins()
    assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is original


def test_plugin_never_imports_the_scheduler(tree, caplog):
    """In a process without the scheduler's modules, the plugin touches nothing
    and says so in one DEBUG line."""
    import sys

    del sys.modules["sglang.srt.managers.schedule_batch"]
    with caplog.at_level(logging.DEBUG, logger="kvest.sglang"):
        tree.modules["sglang.srt.plugins"].load_plugins()
    assert "sglang.srt.managers.schedule_batch" not in sys.modules
    records = [r for r in caplog.records if r.name == "kvest.sglang"]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert "no SGLang scheduler" in records[0].getMessage()


def test_patch_after_the_plugin_leaves_the_hooks_alone(tree):

    tree.modules["sglang.srt.plugins"].load_plugins()
    hooked = tree.batch_class.__dict__["new_tokens_required_next_decode"]
    planned = kvest.sglang.status()
    with pytest.warns(RuntimeWarning, match="already runs in this process"):
        handle = kvest.sglang.patch(shadow=True)
    assert not handle.plan.problems
    assert "ScheduleBatch.new_tokens_required_next_decode" not in handle.replaced
    # status() still tells what runs: the plugin's plan, in its mode
    assert kvest.sglang.status() == planned
    handle.undo()
    assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is hooked


def test_the_plugin_after_patch_leaves_patch_telling_what_runs(tree, caplog):
    """A launcher's patch(), then SGLang's loader in the same process: the
    plugin plans nothing again, so status() keeps saying what runs (planning
    again would read kvest's own functions as "skipped")."""
    with kvest.sglang.patch() as handle:
        patched = tree.batch_class.__dict__["new_tokens_required_next_decode"]
        planned = kvest.sglang.status()
        assert planned["hotspots"]["new_tokens_required_next_decode"]["state"] == "replaced"
        with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
            tree.modules["sglang.srt.plugins"].load_plugins()
        assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is patched
        assert kvest.sglang.status() == planned
        assert any("already runs in this process" in r.getMessage() for r in caplog.records)
        before = planned["hotspots"]["new_tokens_required_next_decode"]["kernel"]
        _batch(tree, False).new_tokens_required_next_decode()
        after = kvest.sglang.status()["hotspots"]["new_tokens_required_next_decode"]
        assert after["kernel"] == before + 1  # each answer counted once
    assert handle.replaced


def test_the_hook_wrapper_shows_kvest_in_its_repr(tree):
    cls = tree.batch_class
    original = cls.__dict__["new_tokens_required_next_decode"]
    tree.modules["sglang.srt.plugins"].load_plugins()
    _batch(tree, False).new_tokens_required_next_decode()  # the first call names it
    hooked = cls.__dict__["new_tokens_required_next_decode"]
    hooked = getattr(hooked, "__kvest_audit__", hooked)  # (0.5.11-0.5.18: the KV audit's)
    assert "new_tokens_required_next_decode[kvest]" in repr(hooked)
    assert hooked.__wrapped__ is original
    assert "[kvest]" not in repr(hooked.__wrapped__)


def test_the_hook_registrys_pass_through_is_dropped_everywhere(tree):
    """HookRegistry binds a pass-through wrapper of kvest's function wherever
    upstream's was: from the first call (the status line) every binding is
    kvest's function itself -- one Python call less on every call -- and a
    binding that is no such pass-through is left as it is."""
    tree.modules["sglang.srt.plugins"].load_plugins()
    hooked = list(monitor.STATE.hooked)
    assert hooked
    wrappers = {id(vars(owner)[attr]): new for owner, attr, _, new in hooked}
    held = [(m, name) for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)
            for name, value in list(vars(m).items()) if id(value) in wrappers]
    # Another plugin's wrapper around the pass-through (as an AROUND hook
    # binds) is no pass-through of kvest's function: it stays.
    (owner, attr, original, new), *rest = hooked
    inner = vars(owner)[attr]

    def around(*args, **kwargs):
        return inner(*args, **kwargs)

    around.__wrapped__ = original
    setattr(owner, attr, around)
    monitor.announce()
    assert vars(owner)[attr] is around
    for owner, attr, _, new in rest:
        assert vars(owner)[attr] is new, (owner, attr)
    unwrapped = {id(new) for _, _, _, new in rest}
    for module, name in held:
        value = getattr(module, name)
        assert id(value) in unwrapped or value is inner, (module.__name__, name)


def test_an_unreadable_switch_turns_kvest_off_with_a_warning(tree, monkeypatch, caplog):
    monkeypatch.setenv("KVEST_SGLANG", "nope")
    original = tree.batch_class.__dict__["new_tokens_required_next_decode"]
    with pytest.warns(RuntimeWarning, match="KVEST_SGLANG='nope'.*kvest is off"):
        tree.modules["sglang.srt.plugins"].load_plugins()
    assert tree.batch_class.__dict__["new_tokens_required_next_decode"] is original
    assert kvest.sglang.status()["mode"] == "off"


def test_shadow_through_load_plugins(tree, monkeypatch):
    monkeypatch.setenv("KVEST_SGLANG", "shadow")
    cls = tree.batch_class
    original = cls.__dict__["new_tokens_required_next_decode"]
    cases = [(spec, sel) for spec in (False, True) for sel in (None, (4, 0, -1))]
    expected = {case: original(_batch(tree, case[0]), case[1]) for case in cases}
    tree.modules["sglang.srt.plugins"].load_plugins()
    before = kvest.sglang.status()["hotspots"]
    for (spec, sel), value in expected.items():
        assert _batch(tree, spec).new_tokens_required_next_decode(sel) == value
    report = kvest.sglang.status()
    assert report["mode"] == "shadow"
    spot = report["hotspots"]["new_tokens_required_next_decode"]
    assert spot["state"] == "shadow"
    # Each call compared and counted once, and the nested spec-v2 call compared
    # once too.
    old = before["new_tokens_required_next_decode"]
    assert spot["shadow"]["compared"] - old["shadow"]["compared"] == len(cases)
    assert spot["calls"] - old["calls"] == len(cases)
    # (the change: another test's deliberate mismatch may stand before this one)
    assert spot["shadow"]["mismatches"] == old["shadow"]["mismatches"]
    nested = "_new_tokens_required_next_decode_spec_v2"
    spec_calls = sum(spec for spec, _ in cases)
    assert report["hotspots"][nested]["calls"] - before[nested]["calls"] == spec_calls
    assert report["hotspots"][nested]["shadow"]["compared"] - before[nested]["shadow"][
        "compared"] == spec_calls
    assert report["hotspots"][nested]["shadow"]["mismatches"] == before[nested]["shadow"][
        "mismatches"]
