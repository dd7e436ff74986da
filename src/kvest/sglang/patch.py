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
from kvest.sglang.registry import HOTSPOTS

__all__ = ["Patch", "apply", "installed", "patch"]


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


def _kvests(value: Any) -> bool:
    """Whether ``value`` is kvest's function, or a hook's wrapper around one
    (SGLang's HookRegistry: a closure over it)."""
    if getattr(value, "__kvest_original__", None) is not None:
        return True
    cells = getattr(value, "__closure__", None) or ()
    for cell in cells:
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if getattr(inner, "__kvest_original__", None) is not None:
            return True
    return False


def installed() -> list[str]:
    """The hot spots where kvest's function (the plugin's or a ``patch()``'s) is
    what runs in this process now: read from the loaded modules, never imported."""
    names = []
    for spot in HOTSPOTS.values():
        for home in spot.modules:
            owner: Any = sys.modules.get(home)
            if owner is not None and spot.cls is not None:
                owner = vars(owner).get(spot.cls)
            if owner is None:
                continue
            try:
                value = vars(owner).get(spot.attr)
            except TypeError:
                continue
            if _kvests(value):
                names.append(spot.name)
                break
    return names


def patch(shadow: bool = False) -> Patch:
    """Replace SGLang's hot spots in this process with kvest's; returns the undo handle.

    Whatever kvest did not match exactly is left alone, with a ``RuntimeWarning``
    saying why.  With ``shadow=True`` kvest runs beside upstream and upstream
    answers (see :mod:`kvest.sglang.monitor`).

    Where kvest already runs in this process (the plugin, or an earlier
    ``patch()`` not undone), nothing changes -- not the functions, not what
    :func:`kvest.sglang.status` says (the mode and the hot spots of what runs)
    -- and a ``RuntimeWarning`` says so; the handle returned undoes nothing.
    Undo the earlier patch first to plan again (in another mode, say).
    """
    running = installed()
    if running:
        state = monitor.STATE
        warnings.warn(f"kvest.sglang: kvest already runs in this process (mode {state.mode}, "
                      f"{', '.join(running)}): nothing changed", RuntimeWarning, stacklevel=2)
        return Patch(Plan(state.sglang, state.mode), [])
    found = plan(import_modules=True, mode=Mode.SHADOW if shadow else Mode.ON,
                 reason="kvest.sglang.patch(shadow=True)" if shadow else "kvest.sglang.patch()")
    monitor.STATE.by_patch = True  # (status(): this process is not one SGLang started)
    for problem in found.problems:
        warnings.warn(f"kvest.sglang: left unpatched: {problem}", RuntimeWarning, stacklevel=2)
    return Patch(found, apply(found.targets))
