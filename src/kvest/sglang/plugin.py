"""kvest's SGLang plugin: the entry point ``kvest`` in the group ``sglang.srt.plugins``.

SGLang calls :func:`load` in each of its processes (``load_plugins()``, first
thing in every scheduler process), then applies the hooks registered with its
``HookRegistry``.  Installed into SGLang's environment, kvest therefore runs
inside every scheduler without any change to how SGLang is launched.

- ``KVEST_SGLANG`` switches it (on, ``shadow``, ``audit``, off; see
  :mod:`kvest.sglang.monitor`); SGLang's own ``SGLANG_PLUGINS`` works as usual.
  In every mode but off, the KV audit (:mod:`kvest.sglang.audit`) is added.
- Only processes that already loaded the scheduler's modules are touched:
  kvest never imports the scheduler into the processes that do not use it
  (the engine, the detokenizer), which log one DEBUG line.
- The status line is logged once SGLang has configured logging, in every mode
  (:mod:`kvest.sglang.announce_hook`; where a release cannot hook that point,
  on the first call of a replaced function); :func:`kvest.sglang.status`
  returns the same, and :mod:`kvest.sglang.metrics` exports its counters.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from kvest.sglang import monitor
from kvest.sglang.registry import BATCH, HOOK_REGISTRY

__all__ = ["load"]

logger = logging.getLogger("kvest.sglang")


def _registry() -> tuple[Any, Any] | None:
    """SGLang's HookRegistry and HookType.REPLACE, where the release has them."""
    module = sys.modules.get(HOOK_REGISTRY)
    registry = getattr(module, "HookRegistry", None)
    hook_type = getattr(module, "HookType", None)
    replace = getattr(hook_type, "REPLACE", None)
    if registry is None or replace is None or not hasattr(registry, "register"):
        return None
    return registry, replace


def _audit() -> None:
    """The KV audit (:mod:`kvest.sglang.audit`): on its own classes, never
    SGLang's start-up broken by it."""
    try:
        from kvest.sglang import audit

        audit.install()  # what it could not attach to: status()["audit"]["missing"]
    except Exception as exc:
        logger.warning("kvest: the KV audit is not installed: %s: %s", type(exc).__name__, exc)


def load() -> None:
    """Register kvest's replacements with SGLang (called by ``load_plugins()``)."""
    choice = monitor.switch()
    # The status line once SGLang has configured logging (every mode), and kvest's
    # counters on SGLang's /metrics; False where the release cannot hook that point.
    from kvest.sglang import announce_hook, metrics

    after_logging = announce_hook.register_after_logging(
        sys.modules.get(HOOK_REGISTRY), monitor.announce, metrics.start)
    if choice.warning is not None:
        # Logging is not configured yet in a scheduler process: stderr too.
        warnings.warn(f"kvest: {choice.warning}", RuntimeWarning, stacklevel=2)
        logger.warning("kvest: %s", choice.warning)
    found: Any = None
    try:
        from kvest.sglang.hotspots import plan
        from kvest.sglang.patch import apply, installed

        running = installed()
        if running:
            # (a patch() before SGLang's loader: planning again would reset
            # status() to "skipped" for functions that run kvest's code)
            logger.warning("kvest: kvest already runs in this process (%s): the plugin "
                           "changes nothing", ", ".join(running))
            return

        found = plan(import_modules=False, mode=choice.mode, reason=choice.reason)
        if not found.scheduler:
            logger.debug("kvest: no SGLang scheduler in this process; nothing to do")
            return
        hooks = _registry()
        direct = []
        for target in found.targets:
            if hooks is not None and target.registry is not None:
                registry, replace = hooks
                # REPLACE swaps the function and rebinds every importer of it.
                registry.register(target.registry, target.new, replace)
                monitor.STATE.hooked.append((target.owner, target.attr, target.original,
                                             target.new))
            else:
                direct.append(target)
        apply(direct)
    except Exception as exc:  # never break SGLang's start-up
        monitor.failed(f"{type(exc).__name__}: {exc}")
        logger.warning("kvest: SGLang left unpatched: %s: %s", type(exc).__name__, exc)
        found = None
    scheduler = found.scheduler if found is not None else BATCH in sys.modules
    monitor.STATE.audit = audit_choice = monitor.audit_switch(choice.mode)
    if audit_choice.warning is not None:
        warnings.warn(f"kvest: {audit_choice.warning}", RuntimeWarning, stacklevel=2)
        logger.warning("kvest: %s", audit_choice.warning)
    if audit_choice.runs and scheduler:
        _audit()
    if found is None:
        return
    if not found.targets and not after_logging:
        # Nothing will call kvest, so nothing would announce: say it now.
        monitor.announce()
