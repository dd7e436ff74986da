"""Exact fingerprints of Python code: what kvest compares upstream's code against.

A fingerprint is the SHA-256 of a canonical dump of a syntax tree: docstrings,
comments, formatting and annotations set aside (``x: T = v`` is ``x = v``),
local variable names replaced by their order of first appearance (``L0``,
``L1``, ...), every other name, attribute, operator and constant kept as it
is.  Two pieces of code with the same fingerprint therefore compute the same
thing, given the same global names.

Beside the hash, :class:`Print` keeps the hash of every sub-tree by its path,
so a statement that differs from a pattern can be told *where* it differs
(:func:`first_difference`) without kvest storing anyone's code: the patterns
kvest ships are these hashes, never source text.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
from collections.abc import Iterator

__all__ = [
    "Print",
    "first_difference",
    "function_locals",
    "has_docstring",
    "plain_assignment",
    "print_function",
    "print_statement",
    "statements",
]

# Fields that never change what code computes.
_SKIPPED_FIELDS = frozenset({"ctx", "type_comment", "annotation", "returns", "type_params",
                             "kind"})


@dataclasses.dataclass(frozen=True)
class Print:
    """A fingerprint: ``digest`` of the whole, ``nodes`` maps each sub-tree's
    path to ``(node type, short digest)``, ``names`` maps the canonical local
    names back to the code's own, ``globals`` lists the other names it reads."""

    digest: str
    nodes: dict[str, tuple[str, str]]
    names: dict[str, str]
    globals: tuple[str, ...]
    at: dict[str, ast.AST] = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Canon:
    def __init__(self, local: frozenset[str], keep: frozenset[str] = frozenset()) -> None:
        self.local = local
        self.keep = keep  # locals kept by name (a whole function's parameters)
        self.names: dict[str, str] = {}
        self.globals: dict[str, None] = {}
        self.nodes: dict[str, tuple[str, str]] = {}
        self.at: dict[str, ast.AST] = {}

    def name(self, ident: str) -> str:
        if ident in self.local and ident not in self.keep:
            if ident not in self.names:
                self.names[ident] = f"L{len(self.names)}"
            return self.names[ident]
        if ident not in self.local:
            self.globals.setdefault(ident, None)
        return f"N:{ident}"

    def dump(self, node: object, path: str) -> str:
        if isinstance(node, list):  # a list field: ``path`` ends in its name
            return "[" + ",".join(self.dump(v, f"{path}#{i}") for i, v in enumerate(node)) + "]"
        if not isinstance(node, ast.AST):
            return repr((type(node).__name__, node))
        plain = plain_assignment(node)
        if plain is not None:  # ``x: T = v`` inside a function is ``x = v``
            node = plain
        parts = []
        for field, value in ast.iter_fields(node):
            if field in _SKIPPED_FIELDS:
                continue
            if isinstance(node, ast.Name) and field == "id":
                parts.append(f"id={self.name(value)}")
            elif isinstance(node, ast.arg) and field == "arg":
                parts.append(f"arg={self.name(value)}")
            elif field == "body" and has_docstring(node):
                parts.append(f"body={self.dump(value[1:], f'{path}/body')}")
            else:
                parts.append(f"{field}={self.dump(value, f'{path}/{field}')}")
        text = f"{type(node).__name__}({','.join(parts)})"
        self.nodes[path] = (type(node).__name__, _hash(text)[:16])
        self.at[path] = node
        return text


def plain_assignment(node: ast.AST) -> ast.Assign | None:
    """``x: T = v`` with a plain name as the assignment ``x = v``: inside a
    function the annotation is never evaluated (PEP 526), so both compile to the
    same code.  Anything else (no value, a target in parentheses, an attribute or
    a subscript) stays what it is."""
    if (isinstance(node, ast.AnnAssign) and node.simple and node.value is not None
            and isinstance(node.target, ast.Name)):
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)
    return None


def has_docstring(node: ast.AST) -> bool:
    body = getattr(node, "body", None)
    return (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and bool(body) and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str))


def function_locals(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """The names local to ``fn``'s body (parameters included, nested scopes not)."""
    names = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    names.update(a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None)
    declared: set[str] = set()
    for node in _walk_scope(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
    # Comprehension variables live in their own scope, but read the same way:
    # treat them as locals so a renamed one fingerprints the same.
    for node in ast.walk(fn):
        if isinstance(node, ast.comprehension):
            names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
    return frozenset(names - declared)


def _walk_scope(fn: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``fn``'s own scope (not inside nested functions or classes)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                 ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def print_statement(stmt: ast.stmt, local: frozenset[str]) -> Print:
    """The fingerprint of one statement of a function whose locals are ``local``."""
    canon = _Canon(local)
    text = canon.dump(stmt, "")
    return Print(_hash(text), canon.nodes, {v: k for k, v in canon.names.items()},
                 tuple(canon.globals), canon.at)


def print_function(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Print:
    """The fingerprint of a whole function: its parameters keep their names
    (callers pass them by keyword), its decorators and defaults count."""
    local = function_locals(fn)
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    params.update(a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None)
    canon = _Canon(local, keep=frozenset(params))
    node = ast.FunctionDef(name="", args=fn.args, body=fn.body,
                           decorator_list=fn.decorator_list)
    text = canon.dump(node, "")
    return Print(_hash(text), canon.nodes, {v: k for k, v in canon.names.items()},
                 tuple(canon.globals), canon.at)


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of a function body, nested blocks included (not nested
    functions or classes)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from statements(getattr(stmt, field, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            yield from statements(handler.body)
        for case in getattr(stmt, "cases", []) or []:
            yield from statements(case.body)


def first_difference(got: Print, pattern_nodes: dict[str, tuple[str, str]]) -> str | None:
    """The path of the sub-tree of ``got`` where it stops agreeing with the
    pattern: the outermost node whose children all agree but one (descended
    into), or whose own type, fields or set of children differ.  ``None`` if
    the two are equal.  Paths are ``""`` (the statement) and ``/field``,
    ``/field#index`` steps below it."""
    if got.nodes.get("") == pattern_nodes.get(""):
        return None
    path = ""
    while True:
        children = [p for p in got.nodes if _parent(p) == path]
        differing = [p for p in children if got.nodes[p] != pattern_nodes.get(p)]
        same_shape = {p for p in pattern_nodes if _parent(p) == path} == set(children)
        if (len(differing) != 1 or not same_shape
                or got.nodes[path][0] != pattern_nodes.get(path, ("",))[0]):
            return path
        path = differing[0]


def _parent(path: str) -> str | None:
    return None if not path else path.rsplit("/", 1)[0]
