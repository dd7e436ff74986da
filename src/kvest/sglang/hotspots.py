"""What kvest does with each hot spot of :mod:`kvest.sglang.registry` in this process.

:func:`plan` looks at the loaded sglang modules.  For each hot spot it reads
the function's source (:mod:`kvest.sglang.rewrite`), finds the patterns kvest
ships (:mod:`kvest.sglang.patterns`) and plans a :class:`Target`: the function
compiled again with each matched statement swapped for its glue
(:mod:`kvest.sglang.glue`), or -- where the whole function is a pattern --
kvest's own version of it.  Whatever does not match exactly is left alone, with
the reason in the hot spot's notes (:mod:`kvest.sglang.monitor`).  Nothing here
depends on a version string.  The plugin, ``patch()`` and the doctor all plan
here, so the log, :func:`kvest.sglang.status` and the doctor's report agree.

Callers of ``page_aligned_decode_alloc_lens`` are read too (their source, with
:mod:`ast`): kvest can return int32 NumPy arrays, which only a caller that
hands the two lists straight to ``torch.tensor(..., dtype=torch.int32)``
accepts unchanged; every other caller keeps upstream's lists (from the
function compiled with its loop swapped).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

from kvest.sglang import glue, monitor, rewrite
from kvest.sglang.monitor import Mode, note
from kvest.sglang.registry import BATCH, HELPERS, HOTSPOTS, KINDS, HotSpot, NoteKind, State

__all__ = ["Plan", "Target", "plan"]


@dataclasses.dataclass
class Target:
    """One replacement: ``owner.attr`` (a class or a module) gets ``new``.

    ``registry`` is the dotted target SGLang's HookRegistry would patch (with
    every module that imported the name), or ``None`` where only ``owner``
    itself may change (a caller-specific replacement).  ``swaps`` are the
    statements swapped (none for a whole-function replacement).
    """

    label: str
    spot: str
    owner: Any
    attr: str
    original: Any
    new: Any
    registry: str | None
    swaps: list[rewrite.Swap] = dataclasses.field(default_factory=list)
    analysis: rewrite.Analysis | None = None


@dataclasses.dataclass
class Plan:
    """What :func:`plan` found: the targets, whether this process runs the scheduler."""

    version: str
    mode: Mode
    targets: list[Target] = dataclasses.field(default_factory=list)
    scheduler: bool = False

    @property
    def problems(self) -> list[str]:
        """Compiled code kvest left to upstream: every declining note."""
        return [f"{s.name}: {n.text}" for s in monitor.STATE.spots.values() for n in s.declines]


def _version() -> str:
    """The loaded sglang's version (for the report only; never used to decide)."""
    version = getattr(sys.modules.get("sglang"), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        import importlib.metadata

        return importlib.metadata.version("sglang")
    except Exception:
        return "unknown"


def _replaced(value: Any) -> str | None:
    """Why ``value`` is no longer SGLang's own function, if it is not."""
    if getattr(value, "__kvest_original__", None) is not None:
        return "already replaced by kvest"
    if getattr(value, "__wrapped__", None) is not None:
        return "already wrapped by a plugin hook (kvest's or another plugin's); left as it is"
    return None


def _mark(new: Any, original: Any, patterns_: list[str]) -> Any:
    new.__kvest_original__ = original
    new.__kvest_patterns__ = tuple(patterns_)
    new.__wrapped__ = original
    new.__doc__ = original.__doc__
    new.__module__ = original.__module__
    # Recognisable as kvest's in a repr; __wrapped__ keeps upstream's.
    new.__qualname__ = f"{original.__qualname__}[kvest]"
    return new


def plan(import_modules: bool = True, mode: Mode = Mode.ON, reason: str = "kvest.sglang.patch()",
         complete: bool = False, small_to_upstream: bool | None = None) -> Plan:
    """Inspect the loaded sglang modules and plan the replacements.

    With ``import_modules`` the scheduler's modules are imported if they are
    not loaded yet (``patch()``); without, only what is in ``sys.modules`` is
    looked at (the plugin, which must not load the scheduler into processes
    that never use it), and a hot spot whose module is not there is "not
    loaded" -- or, with ``complete`` (the doctor's stand-in modules: every
    module the release has), "absent".  Without the scheduler nothing is planned.
    ``small_to_upstream`` as in :func:`kvest.sglang.monitor.reset` (the doctor
    checks the kernels at every batch size).
    """
    version = _version()

    def module(name: str) -> types.ModuleType | None:
        if name in sys.modules:
            return sys.modules[name]
        if not import_modules:
            return None
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    scheduler = module(BATCH) is not None
    if not scheduler and mode is not Mode.OFF:
        mode, reason = Mode.OFF, "no SGLang scheduler in this process: nothing to replace"
    result = Plan(version, mode, scheduler=scheduler)
    monitor.reset(mode, reason, version, scheduler, small_to_upstream)
    skip, _ = monitor.skipped_by_operator()
    for spot in HOTSPOTS.values():
        entry = monitor.spot(spot.name)
        found = _locate(spot, module, absent=import_modules or complete)
        if isinstance(found, State):
            if mode.compiles or found is State.ABSENT:  # absent in every mode
                entry.state = found
            continue
        owner, fn = found
        if not mode.compiles:
            if _no_statement(spot, fn):
                entry.state = State.ABSENT
            continue
        why = _replaced(fn)
        if why is not None:
            entry.state = State.SKIPPED
            note(entry, NoteKind.INFO, why)
            continue
        if spot.name in skip and _no_statement(spot, fn):  # (else _plan_one tells absence)
            entry.state = State.ABSENT
            continue
        if spot.name in skip:
            entry.state = State.SKIPPED
            note(entry, NoteKind.INFO, f"{monitor.SKIP_ENV} names it: upstream's code runs")
            continue
        # A writer in shadow mode runs once, upstream's, each writing statement
        # compared where it stands with kvest's dry run of it (rewrite.rebuild).
        dry = mode is Mode.SHADOW and spot.writes
        try:
            new, analysis, swaps = _plan_one(spot, fn, entry, dry)
        except rewrite.Unreadable as exc:
            entry.state = State.LEFT_ALONE
            note(entry, NoteKind.UNREADABLE, str(exc))
            continue
        if new is None:
            continue
        if mode is Mode.SHADOW and not dry:
            new = monitor.shadow(fn, new, spot.name)
        entry.state = State.SHADOW if mode is Mode.SHADOW else State.REPLACED
        qual = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) \
            else owner.__name__
        result.targets.append(Target(spot.qualname, spot.name, owner, spot.attr, fn,
                                     _mark(new, fn, entry.patterns), f"{qual}.{spot.attr}",
                                     swaps, analysis))
        if spot.forms and isinstance(owner, types.ModuleType):
            _plan_int32_callers(result, spot, owner, fn, mode)
    return result


def _locate(spot: HotSpot, module: Callable[[str], types.ModuleType | None], absent: bool
            ) -> tuple[Any, Any] | State:
    """(owner, upstream's function), or the state that says why there is none
    (``absent``: a module that is not there is not in the release)."""
    loaded = absent
    for home in spot.modules:
        candidate = module(home)
        if candidate is None:
            continue
        loaded = True
        owner: Any = candidate
        if spot.cls is not None:
            owner = vars(candidate).get(spot.cls)
            if not isinstance(owner, type):
                continue
        fn = vars(owner).get(spot.attr)
        # the KV audit's wrapper (kvest.sglang.audit) is seen through
        fn = getattr(fn, "__kvest_audit__", fn)
        if fn is not None:
            return owner, fn
    return State.ABSENT if loaded else State.NOT_LOADED


def _no_statement(spot: HotSpot, fn: Any) -> bool:
    """Whether ``fn`` is there but holds no statement of the hot spot's kinds (a
    dispatcher whose loop moved, a release that never had it): the hot spot
    is absent from the release, in every mode."""
    try:
        analysis = rewrite.analyse(fn, list(spot.kinds))
    except rewrite.Unreadable:
        return False
    return not analysis.found and {n.kind for n in analysis.notes} == {NoteKind.NO_STATEMENT}


def _checked(fn: Any, names: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """The helpers a pattern's statement reads by global name, each proven to
    be a function kvest matched whole: (name -> object, or why not)."""
    checked: dict[str, Any] = {}
    for name in names:
        helper = HELPERS.get(name)
        if helper is None:
            continue  # a builtin: the glue compares it with the real one on every call
        value = fn.__globals__.get(name)
        if value is None:
            return checked, f"`{name}` is not defined where the statement reads it"
        if not isinstance(value, types.FunctionType) or value.__name__ != name:
            return checked, (f"`{name}` was rebound: it is {value!r}, not the function "
                             f"`{name}` kvest checked")
        try:
            found = rewrite.analyse(value, list(helper.kinds))
        except rewrite.Unreadable as exc:
            return checked, f"`{name}` cannot be checked: {exc}"
        if not found.found:
            return checked, f"`{name}` was edited: " + "; ".join(n.text for n in found.notes)
        checked[name] = value
        inner, why = _checked(value, found.found[0].pattern.globals)
        if why is not None:
            return checked, why
        checked.update(inner)
    return checked, None


def make_swap(found: rewrite.Found, spot: str, checked: dict[str, Any], dry: bool = False
              ) -> rewrite.Swap | None:
    """The swap of one found statement: its kind's glue, counting into ``spot``;
    with ``dry`` (a writer in shadow mode), its kind's dry run
    (``glue.make_<kind>_dry``) and the comparison after upstream's statement,
    or ``None`` where the kind has none (a reader, or a writer kvest cannot
    yet run dry): upstream's statement, alone."""
    kind = found.pattern.kind
    if dry:
        maker = getattr(glue, f"make_{kind}_dry", None) if KINDS[kind].writes else None
        if maker is None:
            return None
        return rewrite.Swap(found, maker(found.pattern, spot, checked), glue.shadow_check(spot))
    maker = getattr(glue, f"make_{kind}", glue.make_kernel)
    return rewrite.Swap(found, maker(found.pattern, spot, checked))


def _plan_one(spot: HotSpot, fn: Any, entry: monitor.Spot, dry: bool = False
              ) -> tuple[Any, rewrite.Analysis | None, list[rewrite.Swap]]:
    analysis = rewrite.analyse(fn, list(spot.kinds))
    entry.notes += analysis.notes
    if not analysis.found:
        kinds = {n.kind for n in analysis.notes}
        recognised = kinds - {NoteKind.OLDER_SHAPE, NoteKind.NO_STATEMENT}
        if kinds == {NoteKind.NO_STATEMENT}:
            # The function is there, the code is not: a dispatcher whose loop moved
            # to another function, or a release that never had the statement.
            entry.state = State.ABSENT
        else:
            entry.state = State.NOT_RECOGNISED if kinds and not recognised else State.LEFT_ALONE
        return None, analysis, []
    entry.state = State.LEFT_ALONE  # unless something is compiled below
    found = analysis.found[0]
    if found.pattern.whole and _slower(entry, found):
        entry.state = State.SKIPPED
        return None, analysis, []
    if found.pattern.whole:  # the whole function is the pattern: kvest's own version
        torch = fn.__globals__.get("torch")
        tensor = getattr(torch, "Tensor", None)
        if not isinstance(tensor, type):
            entry.state = State.SKIPPED
            note(entry, NoteKind.INFO, "torch is not loaded")
            return None, analysis, []
        entry.patterns.append(found.pattern.id)
        return glue.make_num_new_pages(fn, found.pattern, tensor, spot.name), analysis, []
    swaps = []
    for found in analysis.found:
        if _slower(entry, found):
            continue
        checked, why = _checked(fn, found.pattern.globals)
        if why is not None:
            note(entry, NoteKind.HELPER, f"line {found.stmt.lineno}: {why}")
            continue
        swap = make_swap(found, spot.name, checked, dry)
        if swap is None:
            note(entry, NoteKind.INFO, f"line {found.stmt.lineno} ({found.pattern.id}): "
                                       "not compared in shadow mode (no dry run of its kind): "
                                       "upstream's statement runs")
            continue
        swaps.append(swap)
        entry.patterns.append(f"{found.pattern.id} at line {found.stmt.lineno}")
    if not swaps:
        if any(n.kind is NoteKind.SLOWER for n in entry.notes) and not entry.declines:
            entry.state = State.SKIPPED
        return None, analysis, []
    return rewrite.rebuild(analysis, swaps, counter=entry), analysis, swaps


def _slower(entry: monitor.Spot, found: rewrite.Found) -> bool:
    """Whether upstream's code of the found kind is faster on this build (the
    registry's figures for it, :meth:`~kvest.sglang.registry.Kind.slower`): then
    it is left to upstream, and the note says why, with the numbers."""
    slower = KINDS[found.pattern.kind].upstream_faster
    if slower:
        where = f"line {found.stmt.lineno} " if not found.pattern.whole else ""
        note(entry, NoteKind.SLOWER, f"{where}({found.pattern.id}): {slower}; left to upstream")
    return bool(slower)


def _plan_int32_callers(result: Plan, spot: HotSpot, alloc: types.ModuleType, fn: Any,
                        mode: Mode) -> None:
    """Callers that turn both lists straight into int32 tensors get int32 arrays
    from kvest's version of the whole function, where the whole function matched."""
    entry = monitor.spot(spot.name)
    try:
        whole = rewrite.analyse(fn, [form.kind for form in spot.forms])
    except rewrite.Unreadable:
        return
    if not whole.found:
        for n in whole.notes:
            note(entry, NoteKind.CALLERS, f"no int32 arrays for its callers: {n.text}")
        return
    pattern = whole.found[0].pattern
    if _slower(entry, whole.found[0]):
        return
    for mod_name, mod in sorted(sys.modules.items()):
        if mod is alloc or not isinstance(mod, types.ModuleType):
            continue
        if not mod_name.startswith("sglang."):
            continue
        try:
            bound = [attr for attr, value in vars(mod).items() if value is fn]
        except TypeError:
            continue
        for attr in bound:
            short = mod_name.rsplit(".", 1)[-1]
            ok, why = _callers_take_int32_tensors(mod, attr)
            if not ok:
                note(entry, NoteKind.CALLERS, f"in {short}: {why}; it keeps upstream's lists")
                continue
            new = glue.make_alloc_lens_int32(fn, pattern, spot.name)
            if mode is Mode.SHADOW:
                new = monitor.shadow(fn, new, spot.name)
            entry.patterns.append(f"{pattern.id} (int32 arrays, in {short})")
            result.targets.append(Target(f"{spot.attr} (in {short})", spot.name, mod, attr, fn,
                                         _mark(new, fn, [pattern.id]), None))


def _plain_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType)


def _code_names(fn: Any) -> frozenset[str]:
    names: set[str] = set()

    def walk(code: types.CodeType) -> None:
        names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(fn.__code__)
    return frozenset(names)


def _users(module: types.ModuleType, name: str) -> list[Callable[..., Any]]:
    """The module's functions and class methods that read the global ``name``."""
    found = []
    for value in vars(module).values():
        candidates = [value] if _plain_function(value) else []
        if isinstance(value, type) and value.__module__ == module.__name__:
            candidates += [v for v in vars(value).values() if _plain_function(v)]
        for fn in candidates:
            if fn.__globals__ is vars(module) and name in _code_names(fn):
                found.append(fn)
    return found


def _callers_take_int32_tensors(module: types.ModuleType, name: str) -> tuple[bool, str]:
    users = _users(module, name)
    if not users:
        return False, "no caller found to check"
    for fn in users:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return False, f"the source of {fn.__qualname__} is not readable"
        ok, why = _int32_tensor_use(tree, name)
        if not ok:
            return False, f"{fn.__qualname__} {why}"
    return True, ""


def _int32_tensor_use(tree: ast.AST, name: str) -> tuple[bool, str]:
    """Every call of ``name`` is a statement ``cur, nxt, n = name(...)`` of the
    function's own body, and until a later statement of that body assigns them
    anew, ``cur`` and ``nxt`` are only ever the first argument of
    ``torch.tensor(..., dtype=torch.int32)``."""
    calls = [n for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]
    if not calls:
        return False, "does not call it"
    bodies = [n.body for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                              ast.AsyncFunctionDef))]
    for call in calls:
        found = None
        for body in bodies:
            for index, stmt in enumerate(body):
                if isinstance(stmt, ast.Assign) and stmt.value is call:
                    found = (body, index, stmt)
        if found is None:
            return False, "uses the result other than as a statement unpacking it"
        body, index, stmt = found
        target = stmt.targets[0] if len(stmt.targets) == 1 else None
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 3
                and all(isinstance(e, ast.Name) for e in target.elts[:2])):
            return False, "does not unpack the three results by name"
        for var in (target.elts[0].id, target.elts[1].id):  # type: ignore[attr-defined]
            ok, why = _only_int32_tensors(body[index + 1:], var)
            if not ok:
                return False, why
    return True, ""


def _only_int32_tensors(rest: list[ast.stmt], var: str) -> tuple[bool, str]:
    for stmt in rest:
        allowed = {id(n.args[0]) for n in ast.walk(stmt)
                   if isinstance(n, ast.Call) and _is_torch_tensor(n.func) and n.args
                   and isinstance(n.args[0], ast.Name) and n.args[0].id == var
                   and any(k.arg == "dtype" and _is_int32(k.value) for k in n.keywords)}
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and node.id == var:
                if isinstance(node.ctx, ast.Load) and id(node) not in allowed:
                    return False, f"uses {var} as a Python list"
                if isinstance(node.ctx, ast.Store) and not (
                        isinstance(stmt, ast.Assign) and node in stmt.targets):
                    return False, f"may assign {var} anew in a branch"
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == var for t in stmt.targets):
            return True, ""  # assigned anew: later uses are of something else
    return True, ""


def _is_torch_tensor(func: ast.AST) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "tensor"
            and isinstance(func.value, ast.Name) and func.value.id == "torch")


def _is_int32(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "int32"
            and isinstance(node.value, ast.Name) and node.value.id == "torch")
