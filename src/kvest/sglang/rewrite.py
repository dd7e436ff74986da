"""Find kvest's patterns inside SGLang's own functions and swap them for kernels.

For a running function, :func:`analyse` reads its source, proves the source is
the code that runs (compiled again, the code objects must be equal), and
finds every statement whose fingerprint is a pattern kvest ships.  A pattern
counts only if the loop's own variables are not read elsewhere in the
function and the function does not read its own frame (``locals()``,
``vars()``, ``globals()``, ``eval``, ``exec``, ``sys._getframe``,
``inspect.currentframe``).  :func:`rebuild` then compiles the function again
from that source with each matched statement ``S`` replaced by::

    __kvest_result__ = <glue>(<S's inputs>, <the global names S reads>)
    if __kvest_result__ is DECLINED:
        S
    else:
        <what S binds> = __kvest_result__

so everything else in the function is upstream's, byte for byte, and
whenever the kernel declines an input upstream's own statement runs -- outside
any handler, so that its exceptions are upstream's alone.  The global names
(``sum``, ``max``, ``ceil_align``) are evaluated where ``S`` would evaluate
them and handed to the glue, which declines unless they are the objects it
checked.  A statement that looks like a pattern but differs is left alone,
with what differs (:func:`near_misses`).

Counting (:class:`kvest.sglang.monitor.Spot`'s tally): each call keeps its
outcome in a local of its own, ``__kvest_seen__`` (0 none yet, 1 a kernel
answered, 2 a kernel declined: a call with a decline is a fallback, whatever
else answered in it), and counts it once, when the call ends::

    __kvest_seen__ = 0
    try:
        <the body, each swapped statement also setting __kvest_seen__>
    finally:
        __kvest_count__(__kvest_seen__)

so that two threads, or a call of the same function made inside a call
(code a request runs), each count their own call, and no counter ever shows
an outcome that is taken back later.  The ``finally`` only counts: an
exception passes through it unchanged, with its traceback.
"""

from __future__ import annotations
import __future__

import ast
import copy
import dataclasses
import linecache
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from kvest.sglang import fingerprint, patterns
from kvest.sglang.glue import _NOTHING as _UNBOUND
from kvest.sglang.glue import DECLINED, HANDED, plain_reqs
from kvest.sglang.patterns import Pattern
from kvest.sglang.registry import KINDS, Note, NoteKind

__all__ = ["Analysis", "Found", "Unreadable", "analyse", "module_imports", "rebuild"]

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag
# Names by which a function can read or change its own frame's variables.
_FRAME_READERS = frozenset({"locals", "vars", "eval", "exec", "globals"})
_FRAME_ATTRIBUTES = frozenset({"_getframe", "currentframe"})


class Unreadable(Exception):
    """The function's source cannot be proven to be the code that runs."""


@dataclasses.dataclass
class Found:
    """A statement of the function that equals ``pattern``."""

    pattern: Pattern
    stmt: ast.stmt
    print: fingerprint.Print

    def name(self, role: str) -> str:
        """The function's own name for the pattern's variable ``role``."""
        return self.print.names[self.pattern.roles[role]]


@dataclasses.dataclass
class Analysis:
    fn: types.FunctionType
    node: ast.FunctionDef
    filename: str
    owner: str | None  # the class of a method
    imports: list[ast.stmt]  # the module's import statements (compiled along)
    found: list[Found]
    notes: list[Note]  # why a statement that looks like a pattern was left alone
    candidates: int = 0  # statements of the kinds' shape found (matched or not)


def module_imports(tree: ast.Module) -> list[ast.stmt]:
    """The module's own import statements: the compiler treats ``name.attr(...)``
    differently when ``name`` is bound by a module-level import (3.11's
    LOAD_ATTR instead of LOAD_METHOD), so they are compiled along (never run)."""
    found: list[ast.stmt] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            # (``from __future__`` is a compiler flag, carried by the code's flags)
            if not any(alias.name == "*" for alias in node.names) and not (
                    isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt))
    return found


def _source(fn: types.FunctionType) -> tuple[ast.FunctionDef, str, str | None,
                                             list[ast.stmt]]:
    code = fn.__code__
    filename = code.co_filename
    linecache.checkcache(filename)
    text = "".join(linecache.getlines(filename, fn.__globals__))
    if not text:
        raise Unreadable(f"no source for {filename}")
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as exc:
        raise Unreadable(f"{filename} does not parse: {exc}") from None
    qual = fn.__qualname__.split(".")
    owner = qual[-2] if len(qual) >= 2 and qual[-2] != "<locals>" else None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == code.co_name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if code.co_firstlineno in (first, node.lineno):
                return node, filename, owner, module_imports(tree)
    raise Unreadable(f"{fn.__qualname__} is not at line {code.co_firstlineno} of {filename}")


def _compile(node: ast.FunctionDef, filename: str, owner: str | None, flags: int,
             imports: list[ast.stmt], factory_args: tuple[str, ...] | None = None
             ) -> types.CodeType:
    """The code object of ``node`` compiled as it was (inside a class of the
    same name for a method, so private names are mangled alike), optionally
    inside a factory whose parameters become the function's free variables."""
    inner: ast.stmt = node
    if factory_args is not None:
        inner = ast.FunctionDef(
            name="__kvest_factory__",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in factory_args],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[node, ast.Return(ast.Name(node.name, ast.Load()))], decorator_list=[])
    if owner is not None:
        inner = ast.ClassDef(name=owner, bases=[], keywords=[], body=[inner], decorator_list=[])
    never = ast.If(ast.Constant(False), imports, []) if imports else ast.Pass()
    module = ast.Module(body=[never, inner], type_ignores=[])
    ast.copy_location(inner, node)
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", flags=flags, dont_inherit=True)
    found = _code_named(code, node.name)
    if found is None:
        raise Unreadable(f"compiling {node.name} again did not give its code")
    return found


def _code_named(code: types.CodeType, name: str) -> types.CodeType | None:
    """The code object compiled for the function ``name`` (the only function of
    that name in the module :func:`_compile` builds, but for nested ones)."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            deeper = _code_named(const, name)
            if deeper is not None:
                return deeper
    return None


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    # Every field that changes what the code does, or what a traceback or a
    # handler sees (the exception table, the line table).
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars",
              "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags",
              "co_nlocals", "co_stacksize", "co_firstlineno", "co_name", "co_qualname",
              "co_exceptiontable", "co_linetable", "co_lnotab")
    if any(getattr(a, f, None) != getattr(b, f, None) for f in fields) or len(a.co_consts) != len(
            b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType)
                    and _same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _names_in(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id


def analyse(fn: Any, kinds: list[str]) -> Analysis:
    """Read ``fn`` and find the patterns of ``kinds`` in it (raises
    :class:`Unreadable` where its source is not provably its code)."""
    if not isinstance(fn, types.FunctionType):
        raise Unreadable(f"{fn!r} is not a plain function")
    node, filename, owner, imports = _source(fn)
    flags = fn.__code__.co_flags & _FUTURE_FLAGS
    if not _same_code(_compile(node, filename, owner, flags, imports), fn.__code__):
        raise Unreadable(f"the source of {fn.__qualname__} in {filename} is not the code "
                         "that runs (the file changed after import, or the function was "
                         "made some other way)")
    analysis = Analysis(fn, node, filename, owner, imports, [], [])
    if any((isinstance(n, ast.Name) and n.id in _FRAME_READERS)
           or (isinstance(n, ast.Attribute) and n.attr in _FRAME_ATTRIBUTES)
           for n in ast.walk(node)):
        analysis.notes.append(Note(NoteKind.FRAME, f"{fn.__qualname__} reads its own frame"))
        return analysis
    local = fingerprint.function_locals(node)
    for kind in kinds:
        accepted = {p.digest: p for p in patterns.by_kind(kind)}
        select = KINDS[kind].select
        if select is None:
            whole = fingerprint.print_function(node)
            pattern = accepted.get(whole.digest)
            if pattern is not None:
                analysis.found.append(Found(pattern, node, whole))
            else:
                analysis.notes.append(_near_miss(fn, whole, accepted, node))
            continue
        candidates = [s for s in fingerprint.statements(node.body) if select(s)]
        analysis.candidates += len(candidates)
        hits = []
        misses = []
        for stmt in candidates:
            printed = fingerprint.print_statement(stmt, local)
            pattern = accepted.get(printed.digest)
            if pattern is None:
                misses.append((printed, stmt))
                continue
            leak = _scratch_used_elsewhere(node, stmt, pattern, printed)
            if leak:
                analysis.notes.append(Note(NoteKind.SCRATCH, (
                    f"{fn.__qualname__}: the {kind} loop at line {stmt.lineno} equals "
                    f"pattern {pattern.id}, but its variable {leak!r} is used outside it")))
                continue
            hits.append(Found(pattern, stmt, printed))
        analysis.found += hits
        if not candidates:
            analysis.notes.append(Note(NoteKind.NO_STATEMENT, (
                f"{fn.__qualname__} has no {kind} statement in this release")))
        if not hits:
            for printed, stmt in misses:
                shape = patterns.older().get(printed.digest)
                if shape is not None and shape.kind == kind:
                    analysis.notes.append(Note(NoteKind.OLDER_SHAPE, (
                        f"{fn.__qualname__}: the {kind} statement at line {stmt.lineno} is "
                        f"the shape of releases {shape.seen()}, which kvest has no kernel "
                        "for")))
                else:
                    analysis.notes.append(_near_miss(fn, printed, accepted, stmt))
    return analysis


def _scratch_used_elsewhere(fn: ast.FunctionDef, stmt: ast.stmt, pattern: Pattern,
                            printed: fingerprint.Print) -> str | None:
    """A name the statement binds for itself (a loop variable) that the rest of
    the function reads: the kernel would not bind it."""
    kept = {printed.names[c] for c in pattern.roles.values()}
    bound = {n.id for n in ast.walk(stmt)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - kept
    inside = {id(n) for n in ast.walk(stmt)}
    for other in _same_scope_names(fn, bound):
        if id(other) not in inside:
            return other.id
    return None


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _same_scope_names(fn: ast.FunctionDef, names: set[str]) -> Iterator[ast.Name]:
    """The uses of ``names`` in ``fn`` that are ``fn``'s own variables: not
    those of a comprehension, lambda or nested function that binds the name
    itself (a nested scope that only reads it reads ``fn``'s)."""
    stack: list[tuple[ast.AST, frozenset[str]]] = [(c, frozenset()) for c in
                                                  ast.iter_child_nodes(fn)]
    while stack:
        node, shadowed = stack.pop()
        if isinstance(node, _COMPREHENSIONS):
            shadowed = shadowed | {n.id for g in node.generators for n in ast.walk(g.target)
                                   if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            shadowed = shadowed | fingerprint.function_locals(node)  # type: ignore[arg-type]
        if isinstance(node, ast.Name) and node.id in names and node.id not in shadowed:
            yield node
        stack.extend((child, shadowed) for child in ast.iter_child_nodes(node))


def _near_miss(fn: Any, got: fingerprint.Print, accepted: dict[str, Pattern],
               node: ast.AST) -> Note:
    """Why ``got`` is not one of ``accepted``: the nearest pattern and where it differs."""
    if not accepted:
        return Note(NoteKind.OLDER_SHAPE, f"{fn.__qualname__}: kvest ships no pattern for it")

    def agreement(p: Pattern) -> int:
        return sum(got.nodes.get(path) == digest for path, digest in p.nodes.items())

    nearest = max(accepted.values(), key=agreement)
    path = fingerprint.first_difference(got, nearest.nodes) or ""
    # A lone name or constant says little: show the expression around it.
    while path and isinstance(got.at.get(path), (ast.Name, ast.Constant, ast.operator,
                                                ast.cmpop, ast.boolop, ast.unaryop)):
        path = path.rsplit("/", 1)[0]
    where = got.at.get(path, node)
    if isinstance(where, (ast.FunctionDef, ast.AsyncFunctionDef)):
        line = getattr(node, "lineno", "?")
        return Note(NoteKind.EDITED, (
            f"{fn.__qualname__}: the function (line {line}) differs from kvest's "
            f"whole-function pattern {nearest.id} (seen in {nearest.seen()})"))
    try:
        text = ast.unparse(where)
    except Exception:  # pragma: no cover - unparse handles every node ast makes
        text = type(where).__name__
    if len(text) > 120:
        text = text[:117] + "..."
    line = getattr(where, "lineno", getattr(node, "lineno", "?"))
    return Note(NoteKind.EDITED, (
        f"{fn.__qualname__}: line {line} differs from kvest's pattern {nearest.id} "
        f"(seen in {nearest.seen()}) at `{text}`"))


# ------------------------------------------------------------------ rebuilding

@dataclasses.dataclass
class Swap:
    """One found statement and the glue that answers for it (called with the
    kind's inputs, then the global names it reads: :class:`~kvest.sglang.registry.Kind`)."""

    found: Found
    glue: Callable[..., Any]
    # shadow mode's writer form: ``glue`` is the statement's dry run, and this
    # compares it with what upstream's statement wrote (glue.shadow_check)
    check: Callable[..., Any] | None = None


def _small_list_rule(obj: Any, below: int) -> bool:
    return type(obj) is list and len(obj) < below


def _small_reqs_rule(owner: Any, below: int) -> bool:
    """``kvest.sglang._glue._small_reqs`` in Python: ``owner.reqs`` read only where
    that runs no code (:func:`kvest.sglang.glue.plain_reqs`)."""
    reqs = plain_reqs(owner)
    return type(reqs) is list and len(reqs) < below


try:  # one call each, running no Python code
    from kvest.sglang._glue import _small_list, _small_reqs
except ImportError:  # the pure-Python build: the same rule in Python
    _small_list, _small_reqs = _small_list_rule, _small_reqs_rule
_SIZE_CELLS = {"__kvest_small_list__": _small_list, "__kvest_small_reqs__": _small_reqs}


def _small(role: str, name: str, below: int) -> ast.expr:
    """The size check: ``name`` an exact list of fewer than ``below`` requests
    (the role ``owner``: ``name.reqs``, read only where that runs no code)."""
    check = "__kvest_small_reqs__" if role == "owner" else "__kvest_small_list__"
    return ast.Call(ast.Name(check, ast.Load()),
                    [ast.Name(name, ast.Load()), ast.Constant(below)], [])


_SEEN = "__kvest_seen__"  # the call's outcome so far (the module docstring)
_KERNEL, _FALLBACK = 1, 2


def _seen(value: ast.expr) -> ast.stmt:
    return ast.Assign([ast.Name(_SEEN, ast.Store())], value)


def _seen_kernel(alone: bool) -> ast.stmt:
    """``__kvest_seen__ = __kvest_seen__ or 1``: a kernel answered, unless a
    decline already made the call a fallback; ``= 1`` where the statement is
    ``alone`` (the function's one swap, run at most once a call: nothing can
    have set it before)."""
    if alone:
        return _seen(ast.Constant(_KERNEL))
    return _seen(ast.BoolOp(ast.Or(), [ast.Name(_SEEN, ast.Load()), ast.Constant(_KERNEL)]))


_REPEATING = (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
              ast.Lambda, ast.ClassDef)


def _runs_once(fn: ast.FunctionDef, stmt: ast.stmt) -> bool:
    """Whether ``stmt`` runs at most once a call of ``fn``: no loop (nor a
    nested scope) of ``fn``'s holds it."""
    return stmt is fn or not any(
        stmt in ast.walk(outer) for outer in ast.walk(fn)
        if isinstance(outer, _REPEATING) and outer is not fn and outer is not stmt)


def _bound(target: str, roles: list[str]) -> ast.stmt:
    """``target = (<roles>,)``, or the unbound marker where one of them is not
    bound yet (reading a variable must not raise where upstream's code does not)."""
    value = ast.Tuple([ast.Name(r, ast.Load()) for r in roles], ast.Load())
    unbound = ast.Assign([ast.Name(target, ast.Store())], ast.Name("__kvest_unbound__",
                                                                   ast.Load()))
    return ast.Try([ast.Assign([ast.Name(target, ast.Store())], value)],
                   [ast.ExceptHandler(ast.Name("__kvest_name_error__", ast.Load()), None,
                                      [unbound])],
                   [], [])


def _shadow_form(node: ast.stmt, found: Found, args: list[ast.expr], glue: Any, cell: str,
                 check: str, counting: bool, alone: bool) -> list[ast.stmt]:
    """A writer in shadow mode: kvest's dry run of its inputs, upstream's
    statement (which alone writes), then the comparison::

        __kvest_result__ = <dry run>(<inputs>, <globals>[, (<keeps>,)])
        __kvest_start__ = __kvest_clock__()
        S
        <check>(__kvest_result__, __kvest_start__[, (<keeps>,)])

    counted as the kernel where the dry run answered, else as a fallback."""
    keeps = [found.name(r) for r in getattr(glue, "kvest_keeps", ())]
    out: list[ast.stmt] = []
    if keeps:
        out.append(_bound("__kvest_keeps__", keeps))
        args = [*args, ast.Name("__kvest_keeps__", ast.Load())]
    result = ast.Name("__kvest_result__", ast.Load())
    out.append(ast.Assign([ast.Name("__kvest_result__", ast.Store())],
                          ast.Call(ast.Name(cell, ast.Load()), args, [])))
    if counting:
        test = ast.Compare(result, [ast.Is()], [ast.Name("__kvest_declined__", ast.Load())])
        out.append(ast.If(test, [_seen(ast.Constant(_FALLBACK))], [_seen_kernel(alone)]))
    out.append(ast.Assign([ast.Name("__kvest_start__", ast.Store())],
                          ast.Call(ast.Name("__kvest_clock__", ast.Load()), [], [])))
    out.append(node)
    after: list[ast.expr] = [result, ast.Name("__kvest_start__", ast.Load())]
    if keeps:
        out.append(_bound("__kvest_keeps__", keeps))
        after.append(ast.Name("__kvest_keeps__", ast.Load()))
    out.append(ast.Expr(ast.Call(ast.Name(check, ast.Load()), after, [])))
    for new in out:
        if new is not node:
            ast.copy_location(new, node)
            ast.fix_missing_locations(new)
    return out


def rebuild(analysis: Analysis, swaps: list[Swap], counter: Any = None) -> types.FunctionType:
    """``analysis.fn`` compiled again with each swap made (see the module
    docstring); with ``counter`` (a :class:`kvest.sglang.monitor.Spot`), each
    call's outcome counted once into its tally, when the call ends."""
    fn = analysis.fn
    alone = len(swaps) == 1 and _runs_once(analysis.node, swaps[0].found.stmt)
    node = copy.deepcopy(analysis.node)
    node.decorator_list = []  # already applied to the function running; not re-run
    cells: dict[str, Any] = {"__kvest_declined__": DECLINED}
    counting = counter is not None
    by_position = {}
    for index, swap in enumerate(swaps):
        cell = f"__kvest_glue{index}__"
        cells[cell] = swap.glue
        stmt = swap.found.stmt
        by_position[(stmt.lineno, stmt.col_offset, stmt.end_lineno, stmt.end_col_offset)] = (
            swap, cell)

    class Swapper(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            key = (getattr(node, "lineno", None), getattr(node, "col_offset", None),
                   getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None))
            hit = by_position.get(key) if isinstance(node, ast.stmt) else None
            if hit is None:
                return super().generic_visit(node)
            swap, cell = hit
            found = swap.found
            kind = KINDS[found.pattern.kind]
            args: list[ast.expr] = [ast.Name(found.name(r), ast.Load()) for r in kind.inputs]
            reads = found.pattern.globals if kind.reads is None else kind.reads
            args += [ast.Name(g, ast.Load()) for g in reads]
            if swap.check is not None:
                check = f"{cell[:-2]}_check__"
                cells[check] = swap.check
                cells.update(__kvest_clock__=time.perf_counter_ns, __kvest_unbound__=_UNBOUND,
                             __kvest_name_error__=NameError)
                return _shadow_form(node, found, args, swap.glue, cell, check,  # type: ignore
                                    counting, alone)
            result = "__kvest_result__"
            call = ast.Assign([ast.Name(result, ast.Store())],
                              ast.Call(ast.Name(cell, ast.Load()), args, []))
            answer: list[ast.stmt] = []
            if kind.binds is None:
                answer = [ast.Return(ast.Name(result, ast.Load()))]
            elif kind.binds:
                answer = [ast.Assign([ast.Name(found.name(kind.binds), ast.Store())],
                                     ast.Name(result, ast.Load()))]
            below = getattr(swap.glue, "kvest_below", 0)
            declined: list[ast.stmt] = [node]
            first: list[ast.stmt] = []
            if counting:
                declined.insert(0, _seen(ast.Constant(_FALLBACK)))
                if getattr(swap.glue, "kvest_commits", False):
                    # (a writer: once it starts it is the answer, exception or not)
                    first = [_seen_kernel(alone)]
                else:
                    answer.insert(0, _seen_kernel(alone))
            test = ast.Compare(ast.Name(result, ast.Load()), [ast.Is()],
                               [ast.Name("__kvest_declined__", ast.Load())])
            orelse = answer
            if below:
                # A sequence too small to gain, handed back by the glue (its
                # own size check, for what the one below does not take):
                # upstream's statement, counted as upstream.
                cells["__kvest_handed__"] = HANDED
                handed_test = ast.Compare(ast.Name(result, ast.Load()), [ast.Is()],
                                          [ast.Name("__kvest_handed__", ast.Load())])
                orelse = [ast.If(handed_test, [copy.deepcopy(node)], answer)]
            branch = ast.If(test, declined, orelse)
            for new in (*first, call, branch, *answer, *declined[:-1]):
                ast.copy_location(new, node)
            swapped: list[ast.stmt] = [*map(ast.fix_missing_locations, first),
                                       ast.fix_missing_locations(call),
                                       ast.fix_missing_locations(branch)]
            if kind.sized is None or not below:
                return swapped  # type: ignore[return-value]
            # A list too small to gain goes to upstream's statement here, before
            # any call (the glue's own check is the same, for other sequences).
            # (counted as upstream: the call is neither a kernel's nor a fallback)
            cells.update(_SIZE_CELLS)
            small = _small(kind.sized, found.name(kind.sized), below)
            handed = ast.If(small, [copy.deepcopy(node)], swapped)
            for new in (small, handed):
                ast.copy_location(new, node)
            return ast.fix_missing_locations(handed)

    node = Swapper().visit(node)
    if counting:
        cells["__kvest_count__"] = counter.tally.count
        docstring = int(fingerprint.has_docstring(node))
        body = node.body[docstring:]
        start = _seen(ast.Constant(0))
        count = ast.Expr(ast.Call(ast.Name("__kvest_count__", ast.Load()),
                                  [ast.Name(_SEEN, ast.Load())], []))
        guarded = ast.Try(body, [], [], [count])
        for new in (start, guarded):
            ast.copy_location(new, body[0])
        ast.copy_location(count, body[-1])
        count.lineno = count.end_lineno = getattr(body[-1], "end_lineno", body[-1].lineno)
        node.body[docstring:] = [ast.fix_missing_locations(start),
                                 ast.fix_missing_locations(guarded)]
    flags = fn.__code__.co_flags & _FUTURE_FLAGS
    original_free = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    code = _compile(node, analysis.filename, analysis.owner, flags, analysis.imports,
                    factory_args=tuple(cells) + tuple(original_free))
    closure = []
    for name in code.co_freevars:
        if name in cells:
            closure.append(types.CellType(cells[name]))
        elif name in original_free:
            closure.append(original_free[name])
        else:
            raise Unreadable(f"{fn.__qualname__}: free variable {name!r} has no value")
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                             tuple(closure))
    new.__kwdefaults__ = copy.copy(fn.__kwdefaults__)
    new.__dict__.update(fn.__dict__)
    new.__annotations__ = fn.__annotations__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__qualname__ = fn.__qualname__
    return new
