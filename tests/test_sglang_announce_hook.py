"""The status line once SGLang has configured logging: kvest's AFTER hook on
``configure_scheduler_process`` (:mod:`kvest.sglang.announce_hook`).

First with each available release's own plugin framework
(``sglang/srt/plugins/__init__.py`` and ``hook_registry.py`` run from its
files, as in ``test_sglang_plugin.py``) and a stand-in scheduler module whose
``configure_scheduler_process`` configures logging as SGLang's does: SGLang's
``load_plugins()`` runs kvest's entry point, which registers the hook; nothing
is logged until the function runs, then the status line once, in each mode.
Then the registration's edges on a stand-in registry.  The real scheduler
process is in ``test_sglang_metrics_real.py``.
"""

from __future__ import annotations

import io
import logging
import sys
import types
import typing

import pytest
from sglang_releases import check_required, releases

import kvest
from kvest.sglang import announce_hook

RELEASES = [t for t in releases() if t.exists("sglang/srt/plugins/hook_registry.py")]
check_required(RELEASES)


def _scheduler_module(log: io.StringIO) -> types.ModuleType:
    """``sglang.srt.managers.scheduler`` as far as the hook sees it: its
    ``configure_scheduler_process`` configures logging (SGLang's format)."""
    module = types.ModuleType(announce_hook.SCHEDULER_MODULE)

    def configure_scheduler_process(server_args, gpu_id, *rest, **kwargs):
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        module.configured.append(handler)
        return 7  # 0.5.11 returns dp_rank

    module.configured = []
    module.configure_scheduler_process = configure_scheduler_process
    return module


@pytest.mark.skipif(not RELEASES, reason="no sglang release available")
@pytest.mark.parametrize("tree_source", RELEASES, ids=[t.version for t in RELEASES])
@pytest.mark.parametrize("switch", [None, "shadow", "0", "nope"])
def test_status_line_once_after_logging(tree_source, switch, monkeypatch):
    from kvest.sglang.upstream import standin_tree

    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    if switch is None:
        monkeypatch.delenv("KVEST_SGLANG", raising=False)
    else:
        monkeypatch.setenv("KVEST_SGLANG", switch)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    log = io.StringIO()
    with standin_tree(tree_source, plugins=True) as tree:
        scheduler = _scheduler_module(log)
        sys.modules[announce_hook.SCHEDULER_MODULE] = scheduler  # a scheduler process
        original = scheduler.configure_scheduler_process
        try:
            with pytest.warns(RuntimeWarning) if switch == "nope" else _nothing():
                tree.modules["sglang.srt.plugins"].load_plugins()
            hooked = scheduler.configure_scheduler_process
            assert hooked is not original and hooked.__wrapped__ is original
            assert log.getvalue() == ""  # not configured yet: nothing said
            assert hooked(types.SimpleNamespace(enable_metrics=False), 0) == 7
            hooked(types.SimpleNamespace(enable_metrics=False), 0)  # once per process
        finally:
            for handler in scheduler.configured:
                root.removeHandler(handler)
            root.setLevel(level)
    assert root.handlers == handlers
    mode = {None: "on", "shadow": "shadow"}.get(switch, "off")
    lines = [line for line in log.getvalue().splitlines()
             if line.split("] ", 1)[-1].startswith(f"kvest {kvest.__version__} ")]
    assert len(lines) == 1, log.getvalue()
    assert f"mode {mode}" in lines[0] and lines[0].startswith("[")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------ registration edges

class _Registry:
    """SGLang's HookRegistry as far as register_after_logging uses it."""

    hooks: typing.ClassVar[list] = []

    @classmethod
    def register(cls, target, hook, hook_type):
        cls.hooks.append((target, hook, hook_type))


def _hook_registry(after=True):
    module = types.ModuleType("hook_registry")
    module.HookRegistry = type("HookRegistry", (_Registry,), {"hooks": []})
    members = {"REPLACE": "replace", **({"AFTER": "after"} if after else {})}
    module.HookType = types.SimpleNamespace(**members)
    return module


def test_hook_registered_on_configure_scheduler_process(monkeypatch):
    scheduler = types.ModuleType(announce_hook.SCHEDULER_MODULE)
    scheduler.configure_scheduler_process = lambda server_args, gpu_id: None
    monkeypatch.setitem(sys.modules, announce_hook.SCHEDULER_MODULE, scheduler)
    registry = _hook_registry()
    seen = []
    assert announce_hook.register_after_logging(
        registry, lambda: seen.append("announce"), lambda: seen.append("metrics"))
    [(target, hook, hook_type)] = registry.HookRegistry.hooks
    assert target == "sglang.srt.managers.scheduler.configure_scheduler_process"
    assert hook_type == "after" and seen == []  # nothing before logging is configured
    server_args = types.SimpleNamespace(enable_metrics=True)
    assert hook(None, server_args, 0) is None  # AFTER: upstream's result kept
    hook(None, server_args, 0)
    assert seen == ["announce", "metrics"]  # once per process
    # Without --enable-metrics: the line, no metrics.
    seen.clear()
    registry = _hook_registry()
    announce_hook.register_after_logging(
        registry, lambda: seen.append("announce"), lambda: seen.append("metrics"))
    registry.HookRegistry.hooks[0][1](None, server_args=types.SimpleNamespace(
        enable_metrics=False), gpu_id=0)
    assert seen == ["announce"]


def test_hook_failures_stay_in_kvest(monkeypatch, caplog):
    scheduler = types.ModuleType(announce_hook.SCHEDULER_MODULE)
    scheduler.configure_scheduler_process = lambda server_args, gpu_id: None
    monkeypatch.setitem(sys.modules, announce_hook.SCHEDULER_MODULE, scheduler)
    registry = _hook_registry()

    def broken():
        raise RuntimeError("no")

    assert announce_hook.register_after_logging(registry, broken, broken)
    with caplog.at_level(logging.WARNING, logger="kvest.sglang"):
        assert registry.HookRegistry.hooks[0][1](None, object(), 0) is None
    assert "status line not logged" in caplog.text and "metrics not started" in caplog.text


def test_no_hook_point_keeps_todays_behaviour(monkeypatch):
    seen = []
    # A release without HookType.AFTER, or without a hook registry: not registered,
    # metrics start at once in a scheduler process.
    scheduler = types.ModuleType(announce_hook.SCHEDULER_MODULE)
    scheduler.configure_scheduler_process = lambda server_args, gpu_id: None
    monkeypatch.setitem(sys.modules, announce_hook.SCHEDULER_MODULE, scheduler)
    registry = _hook_registry(after=False)
    assert not announce_hook.register_after_logging(registry, seen.append, lambda: seen.append(1))
    assert not announce_hook.register_after_logging(None, seen.append, lambda: seen.append(2))
    assert registry.HookRegistry.hooks == [] and seen == [1, 2]
    # A release whose scheduler module has no configure_scheduler_process.
    del scheduler.configure_scheduler_process
    assert not announce_hook.register_after_logging(_hook_registry(), seen.append)
    # A process without the scheduler (the engine, the detokenizer): nothing at all.
    monkeypatch.delitem(sys.modules, announce_hook.SCHEDULER_MODULE)
    registry = _hook_registry()
    assert not announce_hook.register_after_logging(registry, seen.append,
                                                    lambda: seen.append(3))
    assert registry.HookRegistry.hooks == [] and seen == [1, 2]
