"""The code kvest replaces, as data: fingerprints in ``patterns.json``.

Each pattern is the fingerprint (:mod:`kvest.sglang.fingerprint`) of one
statement -- a per-request loop or expression -- or of one whole function, the
kind of kernel that answers for it, what its variables mean (``roles``: the
canonical local names of the fingerprint), and the releases it was found in.
``tools/sglang_patterns.py`` regenerates the file from SGLang's wheels and CI
checks it; only fingerprints a human has read and proven a kernel equal to are
in it.  :data:`PLACES` says where each kind lives and how to pick its
statement out of the function.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path

__all__ = ["PLACES", "Pattern", "by_kind", "load"]


def _assign_of_sum(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "sum")


def _is_for(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.For)


def _is_return(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Return)


BATCH = "sglang/srt/managers/schedule_batch.py"
ESTIMATE = "ScheduleBatch.new_tokens_required_next_decode"
SPEC_V2 = "ScheduleBatch._new_tokens_required_next_decode_spec_v2"
ALLOC_SIZING = "sglang/srt/mem_cache/allocation_sizing.py"


# Where each kind of pattern lives, how to find its statement there (None: the
# whole function), and what its variables mean (by the names upstream gave them;
# stored as the fingerprint's canonical names).
PLACES: dict[str, tuple[str, str, Callable[[ast.stmt], bool] | None, dict[str, str]]] = {
    "decode_count": (BATCH, ESTIMATE, _assign_of_sum,
                     {"target": "new_pages", "requests": "requests", "page_size": "page_size"}),
    "spec_v2_total": (BATCH, SPEC_V2, _is_for,
                      {"total": "total", "requests": "requests", "page_size": "page_size"}),
    "beam_rows": ("sglang/srt/beam_search/batch_tail.py", "num_beam_member_rows", _is_return,
                  {"reqs": "reqs"}),
    "alloc_lens_loop": (ALLOC_SIZING, "page_aligned_decode_alloc_lens", _is_for,
                        {"reqs": "reqs", "reserve": "reserve", "page_size": "page_size",
                         "cur": "cur_kv_lens", "nxt": "nxt_kv_lens",
                         "total": "num_needed_tokens"}),
    "alloc_lens_function": (ALLOC_SIZING, "page_aligned_decode_alloc_lens", None, {}),
    "get_num_new_pages": ("sglang/srt/utils/common.py", "get_num_new_pages", None, {}),
    "ceil_align": ("sglang/srt/utils/common.py", "ceil_align", None, {}),
    "ceil_div": ("sglang/srt/utils/common.py", "ceil_div", None, {}),
}



@dataclasses.dataclass(frozen=True)
class Pattern:
    """One fingerprint kvest accepts (an entry of ``patterns.json``)."""

    id: str
    kind: str
    function: str
    digest: str
    roles: dict[str, str]
    globals: tuple[str, ...]
    nodes: dict[str, tuple[str, str]]
    releases: tuple[str, ...]
    layout: str | None = None
    reserve_factor: int = 1

    @property
    def whole(self) -> bool:
        """Whether the pattern is a whole function (else one statement of it)."""
        return PLACES[self.kind][2] is None

    def seen(self) -> str:
        """The releases it was found in, for messages."""
        first, last = self.releases[0], self.releases[-1]
        return first if first == last else f"{first}-{last}"


@functools.cache
def load() -> tuple[Pattern, ...]:
    """Every pattern kvest ships."""
    data = json.loads((Path(__file__).parent / "patterns.json").read_text())
    return tuple(
        Pattern(id=e["id"], kind=e["kind"], function=e["function"], digest=e["digest"],
                roles=dict(e["roles"]), globals=tuple(e["globals"]),
                nodes={p: (n[0], n[1]) for p, n in e["nodes"].items()},
                releases=tuple(e["releases"]), layout=e.get("layout"),
                reserve_factor=int(e.get("reserve_factor", 1)))
        for e in data["patterns"])


def by_kind(kind: str) -> list[Pattern]:
    return [p for p in load() if p.kind == kind]
