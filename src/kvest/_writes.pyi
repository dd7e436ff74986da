# Type stubs for the compiled request-object writers; kvest.reference._writes has the same
# signatures.
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

__all__ = [
    "add_to_attrs",
    "max_into_attr",
]

# A path: a dotted string ("kv.kv_allocated_len") or a tuple/list of attribute names.
# `paths` is a tuple/list of paths, or a single dotted string.
# `pure=True`: no Python code of the caller's runs, and every request is checked before
# anything is written; the first that would need such code (or would raise) raises
# kvest.ImpureRequest, nothing written.
AttrPath: TypeAlias = str | tuple[str, ...] | list[str]

def add_to_attrs(
    reqs: Iterable[Any],
    paths: str | Sequence[AttrPath],
    delta: Any,
    *,
    pure: bool = False,
) -> None: ...
def max_into_attr(
    reqs: Iterable[Any],
    path: AttrPath,
    values: Iterable[Any],
    *,
    strict: bool = True,
    pure: bool = False,
) -> None: ...

# Private: whether instance-dict entries are read where CPython keeps them.
_DICT_ENTRIES: bool
