"""Route SGLang's per-step bookkeeping through kvest in this process, reversibly.

>>> import kvest.sglang
>>> undo = kvest.sglang.patch()     # imports sglang's scheduler modules
>>> ...                             # this process runs on kvest
>>> undo()                          # SGLang's own functions are back

or, scoped: ``with kvest.sglang.patch(): ...``.

SGLang runs its schedulers in spawned processes, where a patch made in the
launcher does not exist: installed into SGLang's environment, kvest's plugin
(:mod:`kvest.sglang.plugin`) does the same in every SGLang process.  This
function is for tests and custom launchers; it replaces the same hot spots
(:func:`kvest.sglang.hotspots.plan` decides which: only code it matched exactly) and rebinds
every module that did ``from X import name``, as SGLang's ``HookRegistry`` does.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

from kvest.sglang import monitor
from kvest.sglang.hotspots import Plan, Target, plan
from kvest.sglang.monitor import Mode

__all__ = ["Patch", "apply", "patch"]


class Patch:
    """Undo handle returned by :func:`patch`; call it or use it as a context manager.

    ``plan`` is what was found; ``replaced`` names what was replaced.
    """

    def __init__(self, plan: Plan, changes: list[tuple[Any, str, Any, Any]]) -> None:
        self.plan = plan
        self._changes = changes

    @property
    def replaced(self) -> list[str]:
        return [target.label for target in self.plan.targets]

    def undo(self) -> None:
        """Put SGLang's functions back where kvest's still are (idempotent)."""
        changes, self._changes = self._changes, []
        for owner, attr, old, new in reversed(changes):
            if vars(owner).get(attr) is new:
                setattr(owner, attr, old)
        if changes:
            monitor.undone({target.spot for target in self.plan.targets})

    __call__ = undo

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _rebind(original: Any, new: Any, home: Any) -> list[tuple[Any, str, Any, Any]]:
    """Every other module's ``from X import name`` binding of ``original``."""
    changes = []
    for module in list(sys.modules.values()):
        if module is home or not isinstance(module, types.ModuleType):
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for attr, value in items:
            if value is original:
                try:
                    setattr(module, attr, new)
                except (AttributeError, TypeError):
                    continue
                changes.append((module, attr, original, new))
    return changes


def apply(targets: list[Target]) -> list[tuple[Any, str, Any, Any]]:
    """Replace every target directly; the (owner, attr, old, new) changes made."""
    changes: list[tuple[Any, str, Any, Any]] = []
    for target in targets:
        new = target.new
        setattr(target.owner, target.attr, new)
        changes.append((target.owner, target.attr, target.original, new))
        if target.registry is not None and isinstance(target.owner, types.ModuleType):
            changes += _rebind(target.original, new, target.owner)
    return changes


def patch(shadow: bool = False) -> Patch:
    """Replace SGLang's hot spots in this process with kvest's; returns the undo handle.

    Whatever kvest did not match exactly is left alone, with a ``RuntimeWarning``
    saying why.  With ``shadow=True`` kvest runs beside upstream and upstream
    answers (see :mod:`kvest.sglang.monitor`).
    """
    found = plan(import_modules=True, mode=Mode.SHADOW if shadow else Mode.ON,
                 reason="kvest.sglang.patch(shadow=True)" if shadow else "kvest.sglang.patch()")
    for problem in found.problems:
        warnings.warn(f"kvest.sglang: left unpatched: {problem}", RuntimeWarning, stacklevel=2)
    return Patch(found, apply(found.targets))
