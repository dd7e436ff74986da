"""The code kvest replaces, as data: fingerprints in ``patterns.json``.

Each pattern is the fingerprint (:mod:`kvest.sglang.fingerprint`) of one
statement -- a per-request loop or expression -- or of one whole function, the
kind of kernel that answers for it, what its variables mean (``roles``: the
canonical local names of the fingerprint), and the releases it was found in.
``tools/sglang_patterns.py`` regenerates the file from SGLang's wheels and CI
checks it; only fingerprints a human has read and proven a kernel equal to are
in it.  Where each kind lives and how to pick it out of a function is
:mod:`kvest.sglang.registry`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import NamedTuple

from kvest.sglang.registry import KINDS

__all__ = ["Older", "Pattern", "by_kind", "load", "older"]


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
        return KINDS[self.kind].whole

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
                # interned, as names in code are: the writer takes them as they come
                paths=tuple(tuple(sys.intern(a) for a in path) for path in e.get("paths", ())))
        for e in data["patterns"])


class Older(NamedTuple):
    """A release's own older shape of a statement kind: no kernel for it, no edit."""

    kind: str
    functions: tuple[str, ...]
    releases: tuple[str, ...]

    def seen(self) -> str:
        first, last = self.releases[0], self.releases[-1]
        return first if first == last else f"{first}-{last}"


@functools.cache
def older() -> dict[str, Older]:
    """The older shapes seen in releases, by digest."""
    data = json.loads((Path(__file__).parent / "patterns.json").read_text())
    return {e["digest"]: Older(e["kind"], tuple(e["functions"]), tuple(e["releases"]))
            for e in data.get("older", ())}


def by_kind(kind: str) -> list[Pattern]:
    return [p for p in load() if p.kind == kind]


def _releases(found: list[str]) -> str:
    """``0.5.11-0.5.18`` from a sorted list of versions."""
    return found[0] if found[0] == found[-1] else f"{found[0]}-{found[-1]}"


def table() -> str:
    """docs/sglang.md's pattern table, made from the registry and ``patterns.json``
    (``tests/test_sglang_matching.py`` checks the page holds it as made here)."""
    from kvest.sglang.registry import HELPERS, HOTSPOTS, Build

    rows = ["| hot spot (function) | kind | patterns (releases) | kernel |",
            "| --- | --- | --- | --- |"]
    for spot in (*HOTSPOTS.values(), *HELPERS.values()):
        for use in (*spot.uses, *spot.forms):
            kind = KINDS[use.kind]
            found = [p for p in by_kind(use.kind) if spot.qualname in p.functions]
            seen = ", ".join(f"`{p.id}` ({_releases(list(p.releases))})" for p in found)
            where = f"`{spot.qualname}`" + (" in its callers" if use in spot.forms else "")
            kernel = kind.kernel or "checked, never replaced"
            slower = [str(build) for build in Build if kind.slower(build)]
            if len(slower) == len(Build):
                kernel += " -- left to upstream, whose code is faster (docs/benchmarks.md)"
            elif slower:
                kernel += (f" -- left to upstream on the {', '.join(slower)} build, whose code "
                           "is faster there (docs/benchmarks.md)")
            rows.append(f"| {where} | `{kind.name}`: {kind.summary} | {seen or 'none yet'} "
                        f"| {kernel} |")
    return "\n".join(rows)
