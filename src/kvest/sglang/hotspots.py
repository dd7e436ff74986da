"""Where SGLang's per-step hot spots live, and what kvest does with each.

:func:`plan` looks at the loaded sglang modules.  For each hot spot it reads
the function's source (:mod:`kvest.sglang.rewrite`), finds the patterns kvest
ships (:mod:`kvest.sglang.patterns`) and plans a :class:`Target`: the function
compiled again with each matched statement swapped for a kernel
(:mod:`kvest.sglang.kernels`), or -- where the whole function is a pattern --
kvest's own version of it.  Whatever does not match exactly is left alone, with
the reason in the hot spot's notes (:mod:`kvest.sglang.monitor`).  Nothing here
depends on a version string.

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

from kvest.sglang import kernels, monitor, patterns, rewrite

__all__ = ["HOTSPOTS", "Plan", "Target", "plan"]

BATCH_MODULE = "sglang.srt.managers.schedule_batch"
COMMON_MODULE = "sglang.srt.utils.common"
BEAM_MODULE = "sglang.srt.beam_search.batch_tail"
EAGLE_MODULE = "sglang.srt.speculative.eagle_utils"
ALLOCATION_MODULE = "sglang.srt.mem_cache.allocation"
ALLOC_MODULES = (
    "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.utils",
)

# name: (module(s), class or None, attribute, pattern kinds)
HOTSPOTS: dict[str, tuple[tuple[str, ...], str | None, str, tuple[str, ...]]] = {
    "new_tokens_required_next_decode": ((BATCH_MODULE,), "ScheduleBatch",
                                        "new_tokens_required_next_decode",
                                        ("select_requests", "decode_count")),
    "check_decode_mem": ((BATCH_MODULE,), "ScheduleBatch", "check_decode_mem",
                         ("select_requests",)),
    "_new_tokens_required_next_decode_spec_v2": (
        (BATCH_MODULE,), "ScheduleBatch", "_new_tokens_required_next_decode_spec_v2",
        ("spec_v2_total",)),
    "num_beam_member_rows": ((BEAM_MODULE,), None, "num_beam_member_rows", ("beam_rows",)),
    # The loop of append_beam_tail, skipped when no request is in a beam group.
    "append_beam_tail": ((BEAM_MODULE,), None, "append_beam_tail", ("beam_tail_loop",)),
    "page_aligned_decode_alloc_lens": (ALLOC_MODULES, None, "page_aligned_decode_alloc_lens",
                                       ("alloc_lens_loop",)),
    "get_num_new_pages": ((COMMON_MODULE,), None, "get_num_new_pages", ("get_num_new_pages",)),
    # The loops that write to requests (0.5.19+).
    "alloc_for_decode": ((ALLOCATION_MODULE,), None, "alloc_for_decode", ("add_lengths_loop",)),
    "alloc_for_decode_default": ((ALLOCATION_MODULE,), None, "alloc_for_decode_default",
                                 ("add_lengths_loop",)),
    "prepare_for_decode": ((BATCH_MODULE,), "ScheduleBatch", "prepare_for_decode",
                           ("batch_idx_loop",)),
    "eagle_prepare_for_decode": ((EAGLE_MODULE,), None, "eagle_prepare_for_decode",
                                 ("batch_idx_loop",)),
    "alloc_for_spec_decode": ((ALLOCATION_MODULE,), None, "alloc_for_spec_decode",
                              ("max_allocated_loop",)),
}


@dataclasses.dataclass
class Target:
    """One replacement: ``owner.attr`` (a class or a module) gets ``new``.

    ``registry`` is the dotted target SGLang's HookRegistry would patch (with
    every module that imported the name), or ``None`` where only ``owner``
    itself may change (a caller-specific replacement).
    """

    label: str
    owner: Any
    attr: str
    original: Any
    new: Any
    registry: str | None


@dataclasses.dataclass
class Plan:
    """What :func:`plan` found: the targets, and per hot spot its status entry."""

    version: str
    targets: list[Target] = dataclasses.field(default_factory=list)
    scheduler: bool = False

    @property
    def problems(self) -> list[str]:
        """Code kvest did not match: every note of a hot spot left alone, and the
        loops left alone in a hot spot whose other loops were compiled."""
        return [f"{s.name}: {n}" for s in monitor.STATE.spots.values()
                for n in monitor.left_alone(s)]


def _version() -> str:
    """The loaded sglang's version (for the log line only; never used to decide)."""
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


def plan(import_modules: bool = True, mode: str = "on") -> Plan:
    """Inspect the loaded sglang modules and plan the replacements.

    With ``import_modules`` the scheduler's modules are imported if they are
    not loaded yet (``patch()``); without, only what is in ``sys.modules`` is
    looked at (the plugin, which must not load the scheduler into processes
    that never use it).  ``mode`` is ``"on"`` or ``"shadow"``.
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

    batch = module(BATCH_MODULE)
    result = Plan(version, scheduler=batch is not None)
    monitor.reset(mode, version, batch is not None)
    for name, (homes, cls_name, attr, kinds) in HOTSPOTS.items():
        entry = monitor.spot(name)
        owner = None
        for home in homes:
            candidate = module(home)
            if candidate is not None and (cls_name is not None or attr in vars(candidate)):
                owner = candidate
                break
        if owner is None:
            entry.notes.append(f"not in this release (no {' or '.join(homes)} with it)")
            continue
        if cls_name is not None:
            owner = getattr(owner, cls_name, None)
            if not isinstance(owner, type):
                entry.state = "left alone"
                entry.notes.append(f"no class {cls_name}")
                continue
        fn = vars(owner).get(attr)
        if fn is None:
            entry.notes.append("not in this release")
            continue
        why = _replaced(fn)
        if why is not None:
            entry.state = "skipped"
            entry.notes.append(why)
            continue
        if mode == "shadow" and set(kinds) & kernels.WRITERS:
            entry.state = "skipped"
            entry.notes.append("changes the requests or the batch it is given, so it runs "
                               "once, upstream's, in shadow mode")
            continue
        entry.state = "left alone"  # unless _plan_one says otherwise
        try:
            new = _plan_one(name, fn, kinds, entry)
        except rewrite.Unreadable as exc:
            entry.state = "left alone"
            entry.notes.append(str(exc))
            continue
        if new is None:
            continue
        if mode == "shadow":
            new = monitor.shadow(fn, new, name)
        entry.state = "shadow" if mode == "shadow" else "replaced"
        qual = f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type) \
            else owner.__name__
        label = f"{cls_name}.{attr}" if cls_name is not None else attr
        result.targets.append(Target(label, owner, attr, fn, _mark(new, fn, entry.patterns),
                                     f"{qual}.{attr}"))
        if name == "page_aligned_decode_alloc_lens" and isinstance(owner, types.ModuleType):
            _plan_int32_callers(result, owner, fn, mode)
    return result


def _checked(fn: Any, names: tuple[str, ...]) -> tuple[dict[str, Any], str | None]:
    """The helpers a pattern's statement reads by global name, each proven to
    be a function kvest matched whole: (name -> object, or why not)."""
    checked: dict[str, Any] = {}
    for name in names:
        if name not in patterns.SELECT:
            continue  # a builtin: the glue compares it with the real one on every call
        value = fn.__globals__.get(name)
        try:
            found = rewrite.analyse(value, [name])
        except rewrite.Unreadable as exc:
            return checked, f"{name}: {exc}"
        if not found.found:
            return checked, f"{name} is not the function kvest matched: " + "; ".join(
                found.notes)
        checked[name] = value
        inner, why = _checked(value, found.found[0].pattern.globals)
        if why is not None:
            return checked, why
        checked.update(inner)
    return checked, None


def _plan_one(name: str, fn: Any, kinds: tuple[str, ...], entry: monitor.Spot) -> Any:
    analysis = rewrite.analyse(fn, list(kinds))
    entry.notes += analysis.notes
    if not analysis.found:
        if not analysis.candidates and not found_whole(kinds):
            entry.state = "absent"  # the function has no such loop (any more, or yet)
        return None
    found = analysis.found[0]
    if found.pattern.whole:  # the whole function is the pattern: kvest's own version
        torch = fn.__globals__.get("torch")
        tensor = getattr(torch, "Tensor", None)
        if not isinstance(tensor, type):
            entry.state = "skipped"
            entry.notes.append("torch is not loaded")
            return None
        entry.patterns.append(found.pattern.id)
        return kernels.make_num_new_pages(fn, tensor, name)
    swaps = []
    for found in analysis.found:
        checked, why = _checked(fn, found.pattern.globals)
        if why is not None:
            entry.notes.append(f"line {found.stmt.lineno}: {why}; left alone")
            continue
        maker, inputs, binds = kernels.GLUE[found.pattern.kind]
        swaps.append(rewrite.Swap(found, maker(found.pattern, name, checked), inputs, binds,
                                  kernels.READS.get(found.pattern.kind)))
        entry.patterns.append(f"{found.pattern.id} at line {found.stmt.lineno}")
    if not swaps:
        return None
    return rewrite.rebuild(analysis, swaps)


def found_whole(kinds: tuple[str, ...]) -> bool:
    """Whether the kinds are whole-function patterns (a function is always a candidate)."""
    return any(patterns.SELECT[kind] is None for kind in kinds)


def _plan_int32_callers(result: Plan, alloc: types.ModuleType, fn: Any, mode: str) -> None:
    """Callers that turn both lists straight into int32 tensors get int32 arrays
    from kvest's version of the whole function, where the whole function matched."""
    name = "page_aligned_decode_alloc_lens"
    entry = monitor.spot(name)
    try:
        whole = rewrite.analyse(fn, ["alloc_lens_function"])
    except rewrite.Unreadable:
        return
    if not whole.found:
        entry.notes += [f"int32 arrays for callers: {n}" for n in whole.notes]
        return
    layout = whole.found[0].pattern.layout
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
                entry.notes.append(f"in {short}: {why}; keeps upstream's lists")
                continue
            new = kernels.make_alloc_lens_int32(fn, layout, name)
            if mode == "shadow":
                new = monitor.shadow(fn, new, name)
            entry.patterns.append(f"{whole.found[0].pattern.id} (int32 arrays, in {short})")
            result.targets.append(Target(f"{name} (in {short})", mod, attr, fn,
                                         _mark(new, fn, [whole.found[0].pattern.id]), None))


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
