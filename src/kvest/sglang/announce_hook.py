"""kvest's status line in the operator's log, logged once SGLang has configured logging.

A scheduler process calls ``load_plugins()`` first and configures logging
after (``configure_scheduler_process()``: ``configure_logger``, i.e.
``logging.basicConfig(force=True)`` or ``SGLANG_LOGGING_CONFIG_PATH``), so
whatever a plugin logs while it loads is lost.  SGLang's own ``HookRegistry``
runs a plugin's function right after one of SGLang's (``HookType.AFTER``); the
hook point is ``sglang.srt.managers.scheduler.configure_scheduler_process``,
which every release from 0.5.11 to 0.5.23 defines and calls once per scheduler
process (``run_scheduler_process``, and 0.5.23's Ray actor), after
``load_plugins()`` and before the scheduler exists.  There kvest logs its one
status line -- in every mode: on, shadow, off, an unreadable switch -- and
starts exporting its metrics (``PROMETHEUS_MULTIPROC_DIR`` was set by the
launcher before it spawned the process).

Where the release has no such hook (no ``HookType.AFTER``, no
``configure_scheduler_process``) or the process has not loaded SGLang's
scheduler module, :func:`register_after_logging` returns False and nothing
changes: the status line waits for the first call of a replaced function (as
before), and metrics start at once where a scheduler is present.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from typing import Any

from kvest.sglang.registry import LOGGING_CONFIGURED as TARGET
from kvest.sglang.registry import SCHEDULER as SCHEDULER_MODULE

__all__ = ["SCHEDULER_MODULE", "TARGET", "register_after_logging"]

logger = logging.getLogger("kvest.sglang")


def _hook_point(hook_registry: types.ModuleType | None) -> tuple[Any, Any] | None:
    """(HookRegistry, HookType.AFTER) where this release and process can hook
    the end of ``configure_scheduler_process``; None otherwise."""
    registry = getattr(hook_registry, "HookRegistry", None)
    after = getattr(getattr(hook_registry, "HookType", None), "AFTER", None)
    if registry is None or after is None or not callable(getattr(registry, "register", None)):
        return None
    # Only a process that already loaded the scheduler's module: resolving the
    # target must never import the scheduler into the engine or the detokenizer.
    scheduler = sys.modules.get(SCHEDULER_MODULE)
    if not callable(getattr(scheduler, "configure_scheduler_process", None)):
        return None
    return registry, after


def register_after_logging(hook_registry: types.ModuleType | None,
                           announce: Callable[[], None],
                           start_metrics: Callable[[], Any] | None = None) -> bool:
    """Have SGLang call ``announce()`` (the status line) and then
    ``start_metrics()`` once, right after ``configure_scheduler_process``
    configured logging in this scheduler process.

    ``hook_registry`` is ``sglang.srt.plugins.hook_registry`` (None where the
    release has none).  Returns True if the hook is registered; else False,
    having called ``start_metrics()`` at once where a scheduler is present.
    Never raises.
    """
    try:
        point = _hook_point(hook_registry)
        if point is None:
            if start_metrics is not None and SCHEDULER_MODULE in sys.modules:
                start_metrics()
            return False
        registry, after = point
        done = []

        def kvest_after_logging_configured(result: Any, *args: Any, **kwargs: Any) -> None:
            """kvest: the status line, and metrics, once logging is configured."""
            if done:
                return None
            done.append(True)
            try:
                announce()
            except Exception as exc:
                logger.warning("kvest: status line not logged: %s: %s",
                               type(exc).__name__, exc)
            server_args = args[0] if args else kwargs.get("server_args")
            # Metrics only where SGLang exports them (--enable-metrics).
            if start_metrics is not None and getattr(server_args, "enable_metrics", True) \
                    is not False:
                try:
                    start_metrics()
                except Exception as exc:
                    logger.warning("kvest: metrics not started: %s: %s",
                                   type(exc).__name__, exc)
            return None  # AFTER hooks: None keeps upstream's result

        registry.register(TARGET, kvest_after_logging_configured, after)
        return True
    except Exception as exc:  # never break SGLang's start-up
        logger.warning("kvest: status-line hook not registered: %s: %s",
                       type(exc).__name__, exc)
        return False
