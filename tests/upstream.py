"""SGLang's estimator code as shipped in its wheel, loaded without importing sglang.

The files are found through importlib.metadata, the functions taken out with
``ast`` and compiled on their own, with the names they use from elsewhere
supplied by the caller.  Nothing from upstream is copied into this repository:
if sglang is not installed, ``load()`` returns None and the parity tests skip
(or fail, under KVEST_REQUIRE_SGLANG=1 as in CI).
"""

from __future__ import annotations
import __future__

import ast
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType
from typing import Any

# Re-exported: the request stand-ins the tests build batches from.
from kvest._bench import NestedReq as NestedReq
from kvest._bench import Req

SGLANG_VERSION = "0.5.11"

FILES = {
    "schedule_batch": "sglang/srt/managers/schedule_batch.py",
    "utils": "sglang/srt/managers/utils.py",
    "common": "sglang/srt/utils/common.py",
}


def _source(dist: importlib.metadata.Distribution, relpath: str) -> tuple[str, str]:
    path = Path(str(dist.locate_file(relpath)))
    return path.read_text(encoding="utf-8"), str(path)


class _DropImports(ast.NodeTransformer):
    def visit_Import(self, node: ast.AST) -> ast.AST:
        return ast.copy_location(ast.Pass(), node)

    visit_ImportFrom = visit_Import


def _without_imports(fn: ast.FunctionDef) -> ast.FunctionDef:
    """Turn the function-local imports into ``pass``: the caller supplies those names."""
    return _DropImports().visit(fn)


def _compile(defs: list[ast.stmt], filename: str, namespace: dict[str, Any]) -> dict[str, Any]:
    module = ast.Module(body=defs, type_ignores=[])
    ast.fix_missing_locations(module)
    flags = __future__.annotations.compiler_flag  # upstream files use postponed annotations
    exec(compile(module, filename, "exec", flags=flags, dont_inherit=True), namespace)
    return namespace


def _top_level(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return _without_imports(node)
    raise LookupError(name)


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return _without_imports(item)
    raise LookupError(f"{cls}.{name}")


@dataclass
class Upstream:
    version: str
    ceil_align: FunctionType
    get_alloc_len_per_decode: FunctionType
    new_tokens_required_next_decode: FunctionType
    new_tokens_required_next_decode_spec_v2: FunctionType
    is_spec_v2: property
    server_args: dict[str, Any]  # the global server args the functions read: set ["value"]


def load() -> Upstream | None:
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    sources = {key: _source(dist, rel) for key, rel in FILES.items()}
    trees = {key: ast.parse(text, path) for key, (text, path) in sources.items()}

    holder: dict[str, Any] = {"value": None}

    def get_global_server_args() -> Any:
        return holder["value"]

    common = _compile(
        [_top_level(trees["common"], "ceil_div"), _top_level(trees["common"], "ceil_align")],
        sources["common"][1], {},
    )
    utils = _compile(
        [_top_level(trees["utils"], "get_alloc_len_per_decode")], sources["utils"][1],
        {"get_global_server_args": get_global_server_args, "Optional": Any, "ServerArgs": Any},
    )
    batch = _compile(
        [
            _method(trees["schedule_batch"], "ScheduleBatch", "new_tokens_required_next_decode"),
            _method(trees["schedule_batch"], "ScheduleBatch",
                    "_new_tokens_required_next_decode_spec_v2"),
            _method(trees["schedule_batch"], "ScheduleBatch", "is_spec_v2"),
        ],
        sources["schedule_batch"][1],
        {
            "ceil_align": common["ceil_align"],
            "get_global_server_args": get_global_server_args,
            "get_alloc_len_per_decode": utils["get_alloc_len_per_decode"],
        },
    )
    return Upstream(
        version=dist.version,
        ceil_align=common["ceil_align"],
        get_alloc_len_per_decode=utils["get_alloc_len_per_decode"],
        new_tokens_required_next_decode=batch["new_tokens_required_next_decode"],
        new_tokens_required_next_decode_spec_v2=batch["_new_tokens_required_next_decode_spec_v2"],
        is_spec_v2=batch["is_spec_v2"],
        server_args=holder,
    )


# ------------------------------------------------------------ stand-in objects

class Algorithm:
    """Stands in for SpeculativeAlgorithm: none, or an algorithm with spec v2."""

    def __init__(self, name: str | None) -> None:
        self.name = name

    def is_none(self) -> bool:
        return self.name is None

    def supports_spec_v2(self) -> bool:
        return True


@dataclass
class ServerArgs:
    speculative_algorithm: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    page_size: int


@dataclass
class Allocator:
    page_size: int


# Request stand-ins in both layouts: the benchmark's own (flat, as in 0.5.11,
# and nested under req.kv, as in later releases).
FlatReq = Req


def stand_in_batch_class(up: Upstream) -> type:
    """A ScheduleBatch stand-in whose estimator methods are upstream's own."""
    return type("ScheduleBatch", (), {
        "new_tokens_required_next_decode": up.new_tokens_required_next_decode,
        "_new_tokens_required_next_decode_spec_v2": up.new_tokens_required_next_decode_spec_v2,
        "is_spec_v2": up.is_spec_v2,  # upstream declares it a property
        "__init__": _batch_init,
    })


def _batch_init(self: Any, reqs: list[Any], page_size: int, algorithm: str | None,
                overlap: bool) -> None:
    self.reqs = reqs
    self.token_to_kv_pool_allocator = Allocator(page_size)
    self.spec_algorithm = Algorithm(algorithm)
    self.enable_overlap = overlap
