"""The code kvest replaces, as data: fingerprints in ``patterns.json``.

Each pattern is the fingerprint (:mod:`kvest.sglang.fingerprint`) of one
statement -- a per-request loop or expression -- or of one whole function, the
kind of kernel that answers for it, what its variables mean (``roles``: the
canonical local names of the fingerprint), and the releases it was found in.
``tools/sglang_patterns.py`` regenerates the file from SGLang's wheels and CI
checks it; only fingerprints a human has read and proven a kernel equal to are
in it.  :data:`PLACES` says where each kind lives, :data:`SELECT` how to pick its
statement out of the function.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

__all__ = ["PLACES", "SELECT", "Pattern", "Place", "by_kind", "load"]


def _assign_of_sum(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "sum")


def _is_for(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.For)


def _is_return(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Return)


def _selection(stmt: ast.stmt) -> bool:
    """``x = (a if c else [... for ... in ...])``: a list of selected requests."""
    return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.IfExp)
            and isinstance(stmt.value.orelse, ast.ListComp))


def _for_writing(*attrs: str) -> Callable[[ast.stmt], bool]:
    """A ``for`` loop whose body assigns one of ``attrs`` on an object."""
    def select(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.For) and any(
            isinstance(target, ast.Attribute) and target.attr in attrs
            for node in stmt.body if isinstance(node, (ast.Assign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))
    return select


def _for_updating(attr: str) -> Callable[[ast.stmt], bool]:
    """A ``for`` loop whose body only updates attributes in place (``x.a op= v``),
    ``attr`` among them (so that an edit of one, ``+= 2``, is still a candidate
    that kvest reports)."""
    def select(stmt: ast.stmt) -> bool:
        if not isinstance(stmt, ast.For):
            return False
        targets = [node.target for node in stmt.body if isinstance(node, ast.AugAssign)]
        return (len(targets) == len(stmt.body)
                and all(isinstance(t, ast.Attribute) for t in targets)
                and any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets))
    return select


BATCH = "sglang/srt/managers/schedule_batch.py"
ALLOCATION = "sglang/srt/mem_cache/allocation.py"
ALLOC_SIZING = "sglang/srt/mem_cache/allocation_sizing.py"
COMMON = "sglang/srt/utils/common.py"
BEAM_TAIL = "sglang/srt/beam_search/batch_tail.py"
EAGLE_UTILS = "sglang/srt/speculative/eagle_utils.py"

# How to pick each kind's statement out of its function (None: the whole
# function is the pattern).
SELECT: dict[str, Callable[[ast.stmt], bool] | None] = {
    "decode_count": _assign_of_sum,
    "select_requests": _selection,
    "spec_v2_total": _is_for,
    "beam_rows": _is_return,
    "alloc_lens_loop": _is_for,
    "alloc_lens_function": None,
    "get_num_new_pages": None,
    "ceil_align": None,
    "ceil_div": None,
    "add_lengths_loop": _for_writing("kv_allocated_len", "kv_committed_len"),
    "max_allocated_loop": _for_writing("kv_allocated_len"),
    "beam_tail_loop": _is_for,
    "batch_idx_loop": _for_updating("decode_batch_idx"),
}


class Place(NamedTuple):
    """Where a kind of pattern lives, and what its variables mean (by the names
    upstream gave them; stored as the fingerprint's canonical names)."""

    kind: str
    file: str
    function: str
    roles: dict[str, str]


PLACES: tuple[Place, ...] = (
    Place("decode_count", BATCH, "ScheduleBatch.new_tokens_required_next_decode",
          {"target": "new_pages", "requests": "requests", "page_size": "page_size"}),
    Place("select_requests", BATCH, "ScheduleBatch.new_tokens_required_next_decode",
          {"target": "requests", "owner": "self", "selected": "selected_indices"}),
    Place("select_requests", BATCH, "ScheduleBatch.check_decode_mem",
          {"target": "requests", "owner": "self", "selected": "selected_indices"}),
    Place("spec_v2_total", BATCH, "ScheduleBatch._new_tokens_required_next_decode_spec_v2",
          {"total": "total", "requests": "requests", "page_size": "page_size"}),
    Place("beam_rows", BEAM_TAIL, "num_beam_member_rows", {"reqs": "reqs"}),
    # ("offset": the running row offset, set before the loop and changed only
    # past its `continue`, which the kernel's answer -- no request in a beam
    # group -- proves the loop never reaches: skipping the loop leaves it as is.)
    Place("beam_tail_loop", BEAM_TAIL, "append_beam_tail", {"owner": "batch", "offset": "t"}),
    Place("alloc_lens_loop", ALLOC_SIZING, "page_aligned_decode_alloc_lens",
          {"reqs": "reqs", "reserve": "reserve", "page_size": "page_size",
           "cur": "cur_kv_lens", "nxt": "nxt_kv_lens", "total": "num_needed_tokens"}),
    Place("alloc_lens_function", ALLOC_SIZING, "page_aligned_decode_alloc_lens", {}),
    Place("get_num_new_pages", COMMON, "get_num_new_pages", {}),
    Place("ceil_align", COMMON, "ceil_align", {}),
    Place("ceil_div", COMMON, "ceil_div", {}),
    Place("add_lengths_loop", ALLOCATION, "alloc_for_decode",  # 0.5.19-0.5.21
          {"owner": "batch", "delta": "token_per_req"}),
    Place("add_lengths_loop", ALLOCATION, "alloc_for_decode_default",  # 0.5.22-
          {"owner": "batch", "delta": "token_per_req"}),
    Place("max_allocated_loop", ALLOCATION, "alloc_for_spec_decode",
          {"reqs": "reqs", "values": "nxt_kv_lens_list"}),
    Place("batch_idx_loop", BATCH, "ScheduleBatch.prepare_for_decode", {"owner": "self"}),
    Place("batch_idx_loop", EAGLE_UTILS, "eagle_prepare_for_decode", {"owner": "batch"}),
)


@dataclasses.dataclass(frozen=True)
class Pattern:
    """One fingerprint kvest accepts (an entry of ``patterns.json``)."""

    id: str
    kind: str
    functions: tuple[str, ...]
    digest: str
    roles: dict[str, str]
    globals: tuple[str, ...]
    nodes: dict[str, tuple[str, str]]
    releases: tuple[str, ...]
    layout: str | None = None
    reserve_factor: int = 1
    # a writing loop's attribute paths (each ``req.<path> += 1``), in its order
    paths: tuple[tuple[str, ...], ...] = ()

    @property
    def whole(self) -> bool:
        """Whether the pattern is a whole function (else one statement of it)."""
        return SELECT[self.kind] is None

    def seen(self) -> str:
        """The releases it was found in, for messages."""
        first, last = self.releases[0], self.releases[-1]
        return first if first == last else f"{first}-{last}"


@functools.cache
def load() -> tuple[Pattern, ...]:
    """Every pattern kvest ships."""
    data = json.loads((Path(__file__).parent / "patterns.json").read_text())
    return tuple(
        Pattern(id=e["id"], kind=e["kind"], functions=tuple(e["functions"]),
                digest=e["digest"],
                roles=dict(e["roles"]), globals=tuple(e["globals"]),
                nodes={p: (n[0], n[1]) for p, n in e["nodes"].items()},
                releases=tuple(e["releases"]), layout=e.get("layout"),
                reserve_factor=int(e.get("reserve_factor", 1)),
                paths=tuple(tuple(path) for path in e.get("paths", ())))
        for e in data["patterns"])


def by_kind(kind: str) -> list[Pattern]:
    return [p for p in load() if p.kind == kind]
