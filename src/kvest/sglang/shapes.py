"""Which shape of SGLang is loaded: found by feature, never by version string.

Between 0.5.11 and 0.5.23 the four per-step hot spots changed shape several
times (see the README's support table).  Each is recognised here by what its
code refers to -- the global and attribute names and the constants in its code
object -- against the names kvest knows the meaning of.  A function that refers
to anything else (a later release, a fork) is not recognised and stays as it
is, with the reason in :attr:`Shape.skipped`: kvest never replaces code whose
arithmetic it has not matched.

Callers of ``page_aligned_decode_alloc_lens`` are read too (their source, with
:mod:`ast`): kvest returns int32 NumPy arrays, which only a caller that hands
the two lists straight to ``torch.tensor(..., dtype=torch.int32)`` accepts
unchanged; any other caller keeps upstream's lists.
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

__all__ = ["Shape", "Target", "detect"]

BATCH_MODULE = "sglang.srt.managers.schedule_batch"
COMMON_MODULE = "sglang.srt.utils.common"
ALLOC_MODULES = (
    "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.utils",
)

# The names each hot spot may refer to, and those it must.  Names outside the
# first set mean code kvest has not read: left alone.
ESTIMATE_NAMES = frozenset({
    "token_to_kv_pool_allocator", "page_size", "reqs", "spec_algorithm", "is_none", "sum",
    "kv", "kv_committed_len", "_new_tokens_required_next_decode_spec_v2",
    "num_beam_member_rows",
    # the spec-v1 branch (answered by the original method itself)
    "is_spec_v2", "get_global_server_args", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "ceil_align", "max", "len",
})
ESTIMATE_REQUIRED = frozenset({"page_size", "reqs", "is_none", "kv_committed_len",
                               "_new_tokens_required_next_decode_spec_v2"})
SPEC_V2_NAMES = frozenset({"kv", "kv_committed_len", "kv_allocated_len", "max", "ceil_align",
                           "get_alloc_reserve_per_decode", "get_alloc_len_per_decode"})
SPEC_V2_REQUIRED = frozenset({"kv_committed_len", "kv_allocated_len", "max", "ceil_align"})
BEAM_ROWS_NAMES = frozenset({"sum", "beam_group", "num_member_rows"})
NUM_NEW_PAGES_NAMES = frozenset({"torch", "device", "int", "sum", "item", "to", "int64"})
ALLOC_LENS_NAMES = frozenset({"len", "enumerate", "kv", "kv_allocated_len", "kv_committed_len",
                              "max"})


def code_features(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[Any]]:
    """Global/attribute names and constants a function's code refers to (nested
    code such as generator expressions included; the docstring left out)."""
    code = fn.__code__  # type: ignore[attr-defined]
    names: set[str] = set()
    consts: set[Any] = set()
    doc = fn.__doc__

    def walk(code: types.CodeType) -> None:
        names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)
            elif not (isinstance(const, str) and const == doc):
                consts.add(const)

    walk(code)
    return frozenset(names), frozenset(consts)


@dataclasses.dataclass
class Target:
    """One replacement: ``owner.attr`` (a class or a module) gets ``make(original)``.

    ``registry`` is the dotted target SGLang's HookRegistry would patch (with
    every module that imported the name), or ``None`` where only ``owner``
    itself may change (a caller-specific replacement).
    """

    label: str
    owner: Any
    attr: str
    original: Any
    make: Callable[[Any], Any]
    registry: str | None


@dataclasses.dataclass
class Shape:
    """What :func:`detect` found: the features, the targets, what was left alone and why."""

    version: str
    features: list[str] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    # Left alone on purpose (absent in this release, not loaded, a caller
    # that needs lists) and left alone because the code is not one kvest knows.
    skipped: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(self.features) or "unrecognised"


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


def _plain_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType)


def _replaced(value: Any) -> str | None:
    """Why ``value`` is no longer SGLang's own function, if it is not."""
    if getattr(value, "__kvest_original__", None) is not None:
        return "already replaced by kvest"
    if getattr(value, "__wrapped__", None) is not None:
        return "already wrapped by a plugin hook (kvest's or another plugin's); left as it is"
    return None


def detect(import_modules: bool = True) -> Shape:
    """Inspect the loaded sglang modules and plan the replacements.

    With ``import_modules`` the scheduler's modules are imported if they are
    not loaded yet (``patch()``); without, only what is in ``sys.modules`` is
    looked at (the plugin, which must not load the scheduler into processes
    that never use it).
    """
    from kvest.sglang import replacements

    shape = Shape(version=_version())

    def module(name: str) -> types.ModuleType | None:
        if name in sys.modules:
            return sys.modules[name]
        if not import_modules:
            return None
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    batch_module = module(BATCH_MODULE)
    if batch_module is None:
        shape.skipped.append(f"{BATCH_MODULE} is not loaded in this process")
    else:
        _detect_estimator(shape, batch_module, replacements)
    common = module(COMMON_MODULE)
    if common is None:
        shape.skipped.append(f"get_num_new_pages: {COMMON_MODULE} is not loaded")
    else:
        _detect_num_new_pages(shape, common, replacements)
    alloc = None
    for name in ALLOC_MODULES:
        candidate = module(name) if name in sys.modules or import_modules else None
        if candidate is not None and "page_aligned_decode_alloc_lens" in vars(candidate):
            alloc = candidate
            break
    if alloc is None:
        shape.skipped.append("page_aligned_decode_alloc_lens: not in this release")
    else:
        _detect_alloc_lens(shape, alloc, replacements)
    return shape


def _detect_estimator(shape: Shape, batch_module: types.ModuleType, impl: Any) -> None:
    cls = getattr(batch_module, "ScheduleBatch", None)
    label = "ScheduleBatch estimate"
    if not isinstance(cls, type):
        shape.problems.append(f"{label}: no ScheduleBatch class")
        return
    estimate = cls.__dict__.get("new_tokens_required_next_decode")
    spec_v2 = cls.__dict__.get("_new_tokens_required_next_decode_spec_v2")
    why = _replaced(estimate) or _replaced(spec_v2)
    if why is not None:
        shape.skipped.append(f"{label}: {why}")
        return
    if not (_plain_function(estimate) and _plain_function(spec_v2)):
        shape.problems.append(
            f"{label}: ScheduleBatch has no plain new_tokens_required_next_decode and "
            "_new_tokens_required_next_decode_spec_v2 (a release before 0.5.11, or a fork)")
        return
    names, consts = code_features(estimate)
    unknown = names - ESTIMATE_NAMES
    missing = ESTIMATE_REQUIRED - names
    if unknown or missing or not consts <= {None, 0, 1}:
        shape.problems.append(
            f"{label}: new_tokens_required_next_decode refers to "
            f"{sorted(unknown) or sorted(consts - {None, 0, 1})} that kvest has not matched"
            if not missing else f"{label}: new_tokens_required_next_decode lacks {sorted(missing)}")
        return
    v2_names, v2_consts = code_features(spec_v2)
    unknown = v2_names - SPEC_V2_NAMES - {name for name in v2_names if name.startswith("sglang.")}
    if unknown or not v2_names >= SPEC_V2_REQUIRED:
        shape.problems.append(f"{label}: _new_tokens_required_next_decode_spec_v2 refers to "
                             f"{sorted(unknown)} that kvest has not matched")
        return
    # Where R comes from: upstream's own function, looked up as upstream does.
    if "get_alloc_reserve_per_decode" in v2_names:
        if not v2_consts <= {None, 0}:
            shape.problems.append(f"{label}: unexpected constants in the spec-v2 estimate")
            return
        reserve = impl.global_reserve(spec_v2.__globals__, "get_alloc_reserve_per_decode", 1)
        shape.features.append("R = get_alloc_reserve_per_decode()")
    elif "get_alloc_len_per_decode" in v2_names:
        homes = sorted(n for n in v2_names if n.startswith("sglang."))
        if not v2_consts <= {None, 0, 2, ("get_alloc_len_per_decode",)} or 2 not in v2_consts:
            shape.problems.append(f"{label}: unexpected constants in the spec-v2 estimate")
            return
        if len(homes) == 1:
            reserve = impl.imported_reserve(homes[0], "get_alloc_len_per_decode", 2)
            home = homes[0].rsplit(".", 1)[-1]
            shape.features.append(f"R = 2 * {home}.get_alloc_len_per_decode()")
        else:
            reserve = impl.global_reserve(spec_v2.__globals__, "get_alloc_len_per_decode", 2)
            shape.features.append("R = 2 * get_alloc_len_per_decode()")
    else:
        shape.problems.append(f"{label}: no reserve function found")
        return
    layout = _layout(estimate, spec_v2)
    if layout is None:
        shape.problems.append(f"{label}: reads the lengths in a way kvest has not matched")
        return
    shape.features.append(f"{layout} lengths")
    has_v1 = "is_spec_v2" in names
    beam = "num_beam_member_rows" in names
    if has_v1:
        shape.features.append("spec-v1 branch (left to upstream)")
    beam_rows = None
    if beam:
        candidate = spec_v2.__globals__.get("num_beam_member_rows")
        if _plain_function(candidate) and code_features(candidate)[0] <= BEAM_ROWS_NAMES \
                and code_features(candidate)[1] <= {None}:
            beam_rows = candidate  # kvest's beam_member_rows_from_reqs computes the same
        shape.features.append("beam rows" + (" (kernel)" if beam_rows else " (upstream's)"))
    qual = f"{BATCH_MODULE}.ScheduleBatch"
    shape.targets.append(Target(
        "ScheduleBatch.new_tokens_required_next_decode", cls,
        "new_tokens_required_next_decode", estimate,
        lambda original: impl.make_estimate(original, cls, reserve, layout, has_v1=has_v1,
                                            beam=beam, beam_rows=beam_rows),
        f"{qual}.new_tokens_required_next_decode"))
    shape.targets.append(Target(
        "ScheduleBatch._new_tokens_required_next_decode_spec_v2", cls,
        "_new_tokens_required_next_decode_spec_v2", spec_v2,
        lambda original: impl.make_spec_v2(original, reserve, layout),
        f"{qual}._new_tokens_required_next_decode_spec_v2"))


def _layout(*fns: Callable[..., Any]) -> str | None:
    """Where the release's code reads the two lengths -- kvest's ``layout=``:
    ``"flat"``, ``"mixed"`` (committed flat, allocated under ``req.kv``) or
    ``"nested"`` -- or ``None`` if it reads them some other way."""
    where: dict[str, set[str]] = {}
    for fn in fns:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("kv_committed_len",
                                                                 "kv_allocated_len"):
                nested = isinstance(node.value, ast.Attribute) and node.value.attr == "kv" \
                    and isinstance(node.value.value, ast.Name)
                flat = isinstance(node.value, ast.Name)
                where.setdefault(node.attr, set()).add(
                    "nested" if nested else "flat" if flat else "other")
    kinds = (frozenset(where.get("kv_committed_len", ())),
             frozenset(where.get("kv_allocated_len", ())))
    return {
        (frozenset({"flat"}), frozenset({"flat"})): "flat",
        (frozenset({"flat"}), frozenset({"nested"})): "mixed",
        (frozenset({"nested"}), frozenset({"nested"})): "nested",
    }.get(kinds)


def _detect_num_new_pages(shape: Shape, common: types.ModuleType, impl: Any) -> None:
    fn = vars(common).get("get_num_new_pages")
    label = "get_num_new_pages"
    why = _replaced(fn)
    if why is not None:
        shape.skipped.append(f"{label}: {why}")
        return
    if not _plain_function(fn):
        shape.skipped.append(f"{label}: not in {COMMON_MODULE}")
        return
    names, consts = code_features(fn)
    if not names <= NUM_NEW_PAGES_NAMES or not consts <= {None, 1, "cpu"}:
        shape.problems.append(f"{label}: refers to {sorted(names - NUM_NEW_PAGES_NAMES)} "
                             "that kvest has not matched")
        return
    torch = fn.__globals__.get("torch")
    tensor = getattr(torch, "Tensor", None)
    if not isinstance(tensor, type):
        shape.skipped.append(f"{label}: torch is not loaded")
        return
    shape.targets.append(Target(
        label, common, label, fn, lambda original: impl.make_num_new_pages(original, tensor),
        f"{COMMON_MODULE}.{label}"))


def _detect_alloc_lens(shape: Shape, alloc: types.ModuleType, impl: Any) -> None:
    name = "page_aligned_decode_alloc_lens"
    fn = vars(alloc)[name]
    why = _replaced(fn)
    if why is not None:
        shape.skipped.append(f"{name}: {why}")
        return
    if not _plain_function(fn):
        shape.problems.append(f"{name}: not a plain function")
        return
    names, consts = code_features(fn)
    if not names <= ALLOC_LENS_NAMES or not consts <= {None, 0, 1}:
        shape.problems.append(f"{name}: refers to {sorted(names - ALLOC_LENS_NAMES)} "
                             "that kvest has not matched")
        return
    layout = _layout(fn)
    if layout is None:
        shape.problems.append(f"{name}: reads the lengths in a way kvest has not matched")
        return
    import kvest

    if not hasattr(kvest, "decode_alloc_plan_from_reqs"):
        shape.skipped.append(f"{name}: this kvest has no decode_alloc_plan_from_reqs")
        return
    # Only callers that turn both lists straight into int32 tensors get arrays.
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
                shape.skipped.append(f"{name} in {short}: {why}; keeps upstream's lists")
                continue
            shape.targets.append(Target(
                f"{name} (in {short})", mod, attr, fn,
                lambda original: impl.make_alloc_lens(original, layout), None))


def _users(module: types.ModuleType, name: str) -> list[Callable[..., Any]]:
    """The module's functions and class methods that read the global ``name``."""
    found = []
    for value in vars(module).values():
        candidates = [value] if _plain_function(value) else []
        if isinstance(value, type) and value.__module__ == module.__name__:
            candidates += [v for v in vars(value).values() if _plain_function(v)]
        for fn in candidates:
            if fn.__globals__ is vars(module) and name in code_features(fn)[0]:
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
