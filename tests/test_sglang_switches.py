"""The switches say what they do: ``KVEST_AUDIT`` runs the KV audit or not,
whatever the kernels' mode; ``KVEST_SGLANG_SKIP`` leaves named hot spots to
upstream; a hot spot the release lacks reads ``absent`` in every mode; a
script that called ``patch()`` is not called a scheduler process; the status
line names what is left to upstream; the state gauge shows every hot spot.

On stand-in modules built from the newest release at hand, through SGLang's
own plugin loader where the plugin is what is tested.
"""

from __future__ import annotations

import logging
import warnings

import pytest
from sglang_releases import check_required, releases

import kvest
import kvest.sglang
from kvest.sglang import monitor, plugin
from kvest.sglang.readout import render
from kvest.sglang.upstream import standin_tree

check_required(releases())
if not releases():
    pytest.skip("no sglang release available", allow_module_level=True)
NEWEST = releases()[-1]
ESTIMATE = "new_tokens_required_next_decode"
Mode = monitor.Mode


@pytest.mark.parametrize(("mode", "value", "runs"), [
    (Mode.ON, None, True), (Mode.SHADOW, None, True), (Mode.AUDIT, None, True),
    (Mode.OFF, None, False), (Mode.ON, "0", False), (Mode.ON, " OFF ", False),
    (Mode.AUDIT, "off", False), (Mode.OFF, "1", True), (Mode.OFF, "On", True),
    (Mode.ON, "bogus", True), (Mode.OFF, "yes", False), (Mode.OFF, "", False),
])
def test_the_audit_switch(mode, value, runs):
    choice = monitor.audit_switch(mode, {} if value is None else {"KVEST_AUDIT": value})
    assert choice.runs is runs
    readable = value is None or value.strip().lower() in ("0", "1", "on", "off")
    assert (choice.warning is None) is readable
    if not readable:
        assert repr(value) in choice.warning and choice.warning in choice.reason


def _load_plugin(monkeypatch, **env):
    """SGLang's own loader in a stand-in scheduler process, the environment
    ``env``; which times the plugin installed the audit."""
    for key in ("KVEST_SGLANG", "KVEST_AUDIT", "KVEST_SGLANG_SKIP", "SGLANG_PLUGINS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    installs = []
    monkeypatch.setattr(plugin, "_audit", lambda: installs.append(1))
    return installs


@pytest.mark.parametrize(("env", "audited"), [
    ({}, True), ({"KVEST_AUDIT": "0"}, False), ({"KVEST_SGLANG": "0"}, False),
    ({"KVEST_SGLANG": "0", "KVEST_AUDIT": "1"}, True),
    ({"KVEST_SGLANG": "audit", "KVEST_AUDIT": "off"}, False),
])
def test_the_plugin_audits_as_the_switch_says(env, audited, monkeypatch):
    installs = _load_plugin(monkeypatch, **env)
    with standin_tree(NEWEST, plugins=True) as tree, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree.modules["sglang.srt.plugins"].load_plugins()
        line = monitor.describe()[0][1]
    assert bool(installs) is audited
    assert monitor.STATE.audit is not None and monitor.STATE.audit.runs is audited
    assert ("KV audit" in line) and (("no KV audit" in line) is not audited)


def test_a_hot_spot_named_to_skip_is_upstreams(monkeypatch):
    _load_plugin(monkeypatch, KVEST_SGLANG_SKIP=f" {ESTIMATE}, no_such_spot")
    with standin_tree(NEWEST, plugins=True) as tree, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original = vars(tree.batch_class)[ESTIMATE]
        tree.modules["sglang.srt.plugins"].load_plugins()
        report = kvest.sglang.status()
        records = monitor.describe()
        assert vars(tree.batch_class)[ESTIMATE] is original  # not replaced
    spot = report["hotspots"][ESTIMATE]
    assert spot["state"] == "skipped" and "KVEST_SGLANG_SKIP" in spot["reason"]
    others = [s for n, s in report["hotspots"].items() if n != ESTIMATE]
    assert any(s["state"] == "replaced" for s in others)  # the rest as usual
    assert ESTIMATE in records[0][1] and "left to upstream" in records[0][1]
    assert [m for level, m in records if level == logging.WARNING
            and "'no_such_spot'" in m and "KVEST_SGLANG_SKIP" in m]


def _states(monkeypatch, value):
    _load_plugin(monkeypatch, **({} if value is None else {"KVEST_SGLANG": value}))
    with standin_tree(NEWEST, plugins=True) as tree, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree.modules["sglang.srt.plugins"].load_plugins()
        return {n: s["state"] for n, s in kvest.sglang.status()["hotspots"].items()}


def test_a_hot_spot_the_release_lacks_is_absent_in_every_mode(monkeypatch):
    on = _states(monkeypatch, None)
    absent = {n for n, state in on.items() if state == "absent"}
    if not absent:
        pytest.skip(f"sglang {NEWEST.version} has every hot spot")
    for value in ("shadow", "audit", "0"):
        states = _states(monkeypatch, value)
        assert {n for n, state in states.items() if state == "absent"} == absent, value


def test_a_script_that_patched_is_not_a_scheduler_process():
    with standin_tree(NEWEST), kvest.sglang.patch():
        report = kvest.sglang.status()
        assert any(s["state"] == "replaced" for s in report["hotspots"].values())
        assert report["scheduler"] is False and report["scheduler_mode"] == "on"
        text = " ".join(render(report).split())
    assert "not an SGLang scheduler process" in text
    assert "in an SGLang scheduler process" not in text
