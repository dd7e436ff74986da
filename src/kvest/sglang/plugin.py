"""kvest's SGLang plugin: the entry point ``kvest`` in the group ``sglang.srt.plugins``.

SGLang calls :func:`load` in each of its processes (``load_plugins()``, first
thing in every scheduler process), then applies the hooks registered with its
``HookRegistry``.  Installed into SGLang's environment, kvest therefore runs
inside every scheduler without any change to how SGLang is launched.

- ``KVEST_SGLANG=0`` turns it off; SGLang's own ``SGLANG_PLUGINS`` works as usual.
- One log line per process (logger ``kvest.sglang``) says the SGLang version,
  the shape found and what was replaced (a warning if something was left
  alone because kvest did not recognise it).
- Only processes that already loaded the scheduler's modules are touched:
  kvest never imports the scheduler into the processes that do not use it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from kvest._env import flag

__all__ = ["load"]

logger = logging.getLogger("kvest.sglang")


def _registry() -> tuple[Any, Any] | None:
    """SGLang's HookRegistry and HookType.REPLACE, where the release has them."""
    module = sys.modules.get("sglang.srt.plugins.hook_registry")
    registry = getattr(module, "HookRegistry", None)
    hook_type = getattr(module, "HookType", None)
    replace = getattr(hook_type, "REPLACE", None)
    if registry is None or replace is None or not hasattr(registry, "register"):
        return None
    return registry, replace


def load() -> None:
    """Register kvest's replacements with SGLang (called by ``load_plugins()``)."""
    if not flag("KVEST_SGLANG", True):
        logger.info("kvest: off (KVEST_SGLANG=0): SGLang runs its own bookkeeping")
        return
    try:
        from kvest.sglang.patch import apply
        from kvest.sglang.shapes import detect

        shape = detect(import_modules=False)
        hooks = _registry()
        direct = []
        for target in shape.targets:
            if hooks is not None and target.registry is not None:
                registry, replace = hooks
                # REPLACE swaps the function and rebinds every importer of it.
                registry.register(target.registry, target.make(target.original), replace)
            else:
                direct.append(target)
        apply(direct)
    except Exception as exc:  # never break SGLang's start-up
        logger.warning("kvest: SGLang left unpatched: %s: %s", type(exc).__name__, exc)
        return
    replaced = ", ".join(t.label for t in shape.targets) or "nothing"
    message = (f"kvest {_kvest_version()}: sglang {shape.version} ({shape.describe()}): "
               f"replaced {replaced}")
    notes = shape.skipped + [f"NOT RECOGNISED, left alone: {p}" for p in shape.problems]
    if notes:
        message += "; " + "; ".join(notes)
    (logger.warning if shape.problems else logger.info)("%s", message)


def _kvest_version() -> str:
    import kvest

    return str(kvest.__version__)
