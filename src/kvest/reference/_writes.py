"""The pure-Python twin of ``kvest._writes``: request-object writers as the
plain loops they replace.

Same names, signatures and exceptions as the compiled module.  Each function
is the per-request loop itself, with ``getattr``/``setattr``/``operator.iadd``/
``max`` standing for the statement's own attribute access and operators (the
same calls the interpreter makes for ``req.kv.x += d``), so its semantics are
the loop's by construction.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from sys import intern
from typing import Any

from kvest._errors import impure_argument, impure_request
from kvest._inputs import as_flag, pure_reqs, pure_values
from kvest._names import WRITE_FUNCTIONS
from kvest.reference import _pure

__all__ = list(WRITE_FUNCTIONS)  # kvest._names: the one list


def _names(path: Any, what: str) -> tuple[str, ...]:
    """One path as a tuple of attribute names (exact str names interned)."""
    if isinstance(path, str):
        parts = path.split(".")
        for part in parts:
            if not part:
                raise ValueError(f"{what} {path!r} has an empty name")
        return tuple(intern(part) for part in parts)
    if type(path) is tuple or type(path) is list:
        if len(path) == 0:
            raise ValueError(f"{what} is empty")
        names = []
        for i, name in enumerate(path):
            if not isinstance(name, str):
                raise TypeError(f"{what}[{i}] must be a str, not {type(name).__name__}")
            names.append(intern(name) if type(name) is str else name)
        return tuple(names)
    raise TypeError(f"{what} must be a str or a tuple of str, not {type(path).__name__}")


def _paths(paths: Any) -> tuple[tuple[str, ...], ...]:
    if isinstance(paths, str):
        return (_names(paths, "paths"),)
    if type(paths) is tuple or type(paths) is list:
        return tuple(_names(path, f"paths[{i}]") for i, path in enumerate(paths))
    raise TypeError("paths must be a str, or a tuple or list of paths, "
                    f"not {type(paths).__name__}")


def _pure_paths(norm: tuple[tuple[str, ...], ...]) -> None:
    """Pure mode: no path may read, on its way to its owner, a name some path writes."""
    written = [path[-1] for path in norm]
    for path in norm:
        for name in path[:-1]:
            if any(name is w for w in written):
                raise impure_argument("paths")


def _pure_path_ok(req: Any, names: tuple[str, ...]) -> bool:
    """kw_check_path: req.<names> read and stored with no code of the caller's."""
    obj = req
    for name in names[:-1]:
        obj = _pure.get(obj, name)
        if obj is _pure.IMPURE or obj is _pure.MISSING:
            return False
    value = _pure.get(obj, names[-1])
    return (type(value) is int and -(2**63) <= value < 2**63
            and _pure.can_store(obj, names[-1]))


def add_to_attrs(reqs: Iterable[Any], paths: Any, delta: Any, *, pure: bool = False) -> None:
    """For each request in order, for each path in order: ``req.<path> += delta``.

    See the compiled ``kvest.add_to_attrs`` for the whole contract: the loop's
    semantics exactly, a failure part-way through leaving the requests as the
    loop leaves them; ``pure=True`` checks every request before any write.
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
    norm = _paths(paths)
    if pure:
        if type(delta) is not int or not -(2**63) <= delta < 2**63:
            raise impure_argument("delta")
        _pure_paths(norm)
        for pos, req in enumerate(reqs):
            for path in norm:
                if not _pure_path_ok(req, path):
                    raise impure_request(pos, "written")
    split = [(path[:-1], path[-1]) for path in norm]
    for req in reqs:
        for head, name in split:
            obj = req
            for step in head:
                obj = getattr(obj, step)
            setattr(obj, name, operator.iadd(getattr(obj, name), delta))


def max_into_attr(reqs: Iterable[Any], path: Any, values: Iterable[Any], *,
                  strict: bool = True, pure: bool = False) -> None:
    """``for req, v in zip(reqs, values, strict=strict): req.<path> = max(req.<path>, v)``.

    See the compiled ``kvest.max_into_attr`` for the whole contract.
    """
    pure = as_flag(pure, "pure")
    if pure:
        pure_reqs(reqs)
        pure_values(values, "values")
    names = _names(path, "path")
    strict = as_flag(strict, "strict")
    if pure:
        if strict and len(reqs) != len(values):  # type: ignore[arg-type]
            raise impure_argument("values")
        _pure_paths((names,))
        for pos, req in enumerate(reqs):
            if pos >= len(values):  # type: ignore[arg-type]
                break
            if not _pure_path_ok(req, names):
                raise impure_request(pos, "written")
    head, name = names[:-1], names[-1]
    for req, value in zip(reqs, values, strict=strict):
        obj = req
        for step in head:
            obj = getattr(obj, step)
        new = max(getattr(obj, name), value)
        obj = req  # the target is evaluated after the right side, afresh
        for step in head:
            obj = getattr(obj, step)
        setattr(obj, name, new)
