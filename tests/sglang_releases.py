"""SGLang releases for the tests: the installed distribution and downloaded wheels
(named so as not to be mistaken for :mod:`kvest.sglang.upstream`).

The files are read where they are (kvest.sglang.upstream loads the functions
with ast into stand-in modules); nothing is copied into the repository.  CI
downloads one wheel per release shape (``pip download --no-deps``) into the
directory named by ``KVEST_SGLANG_WHEELS``; ``KVEST_REQUIRE_SGLANG`` lists the
releases that must be there (comma-separated; ``1`` means at least one).
"""

from __future__ import annotations

import os
from pathlib import Path

import kvest.sglang
from kvest._env import flag
from kvest.sglang.upstream import SourceTree, installed, wheel


def fallbacks(name: str | None = None) -> int:
    """How often kvest declined and upstream's code answered, since the last
    patch (for one hot spot, or all)."""
    spots = kvest.sglang.status()["hotspots"]
    return sum(s["fallbacks"] for n, s in spots.items() if name is None or n == name)


def releases() -> list[SourceTree]:
    """Every release available here, oldest first, one tree per version."""
    found: dict[str, SourceTree] = {}
    directory = os.environ.get("KVEST_SGLANG_WHEELS")
    if directory:
        for path in sorted(Path(directory).glob("sglang-*.whl")):
            tree = wheel(path)
            found.setdefault(tree.version, tree)
    tree = installed()
    if tree is not None:
        found.setdefault(tree.version, tree)
    def key(version: str) -> list[int]:
        return [int(x) for x in version.replace("post", "").split(".") if x.isdigit()]

    return [found[v] for v in sorted(found, key=key)]


def nested_releases() -> list[SourceTree]:
    """The releases (0.5.19 on) whose requests keep their lengths under
    ``req.kv`` (mem_cache/allocation.py) and whose batch has a beam tail."""
    return [t for t in releases() if t.exists("sglang/srt/mem_cache/allocation.py")
            and t.exists("sglang/srt/beam_search/batch_tail.py")]


def check_required(trees: list[SourceTree]) -> None:
    """Fail (rather than skip) when CI asked for releases that are not here."""
    required = os.environ.get("KVEST_REQUIRE_SGLANG", "").strip()
    if not required or required == "0":
        return
    have = {t.version for t in trees}
    if required == "1":
        if not have:
            raise RuntimeError("KVEST_REQUIRE_SGLANG=1 but no sglang release is available")
        return
    missing = [v for v in required.split(",") if v.strip() and v.strip() not in have]
    if missing:
        raise RuntimeError(f"KVEST_REQUIRE_SGLANG lists {missing}, not available here")


def real_sglang_missing(exc: Exception) -> str:
    """The real scheduler modules did not import: fail where CI asked for them
    (``KVEST_REQUIRE_REAL_SGLANG=1``), else the reason the caller skips with."""
    if flag("KVEST_REQUIRE_REAL_SGLANG"):
        raise RuntimeError(f"KVEST_REQUIRE_REAL_SGLANG is set but sglang does not import: {exc}"
                           ) from exc
    return f"the real sglang scheduler modules do not import here ({exc})"
