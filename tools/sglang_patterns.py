"""Regenerate (or check) ``src/kvest/sglang/patterns.json`` from SGLang's wheels.

kvest replaces a piece of SGLang's code only when its fingerprint
(:mod:`kvest.sglang.fingerprint`: the exact syntax tree, locals renamed) equals
one kvest ships with a kernel proven equal to it.  The patterns are data: each
is one fingerprint, the kernel that answers for it, what its local variables
mean, and the releases it was found in.  This tool reads every wheel given,
finds each pattern's statement (or function) where kvest knows it lives, and

- ``--write``: writes ``patterns.json`` (fingerprints, sub-tree digests for
  telling an edit apart, roles, releases);
- ``--check`` (CI): fails unless the file is exactly what the wheels give, and
  unless every wheel's statement at each place is one that kvest accepts.

A new release with a new fingerprint is never accepted by this tool: a human
reads the new code, proves a kernel equal to it, and adds its digest to its
kind's ``accepted`` in ``kvest.sglang.registry``.  Nothing of SGLang's code is
stored, only digests.

    python tools/sglang_patterns.py --check  WHEEL_OR_DIR [...]
    python tools/sglang_patterns.py --write  WHEEL_OR_DIR [...]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from kvest.sglang import fingerprint
from kvest.sglang.registry import HELPERS, HOTSPOTS, KINDS, module_file

OUT = Path(__file__).resolve().parent.parent / "src/kvest/sglang/patterns.json"



class Place(NamedTuple):
    """Where a kind of statement lives: the files its hot spot has lived in, the
    function, and what the function's variables mean to the kind."""

    kind: str
    files: tuple[str, ...]
    function: str
    roles: Mapping[str, str]


PLACES = tuple(Place(use.kind, tuple(module_file(m) for m in spot.modules), spot.qualname,
                     use.roles)
               for spot in (*HOTSPOTS.values(), *HELPERS.values())
               for use in (*spot.uses, *spot.forms))
# digest prefix -> (kind, what a human accepted)
ACCEPTED = {a.prefix: (kind, a) for kind in KINDS.values() for a in kind.accepted}


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    body: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, ast.FunctionDef) else None


def _added_paths(stmt: ast.stmt) -> list[list[str]]:
    """The attribute paths a ``for`` loop's ``x.<path> += ...`` statements write."""
    paths = []
    for node in getattr(stmt, "body", []):
        target, path = getattr(node, "target", None), []
        while isinstance(target, ast.Attribute):
            path.insert(0, target.attr)
            target = target.value
        paths.append(path)
    return paths


def _wheels(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        found += sorted(path.glob("sglang-*.whl")) if path.is_dir() else [path]
    return found


def _version(path: Path) -> str:
    match = re.match(r"sglang-([^-]+)-", path.name)
    if match is None:
        raise SystemExit(f"{path.name} is not an sglang wheel")
    return match.group(1)


def _key(version: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", version)]


def survey(wheels: list[Path]) -> tuple[dict[str, dict], dict[str, dict], list[str]]:
    """(pattern id -> entry, older shape's digest -> entry, problems) over the wheels."""
    entries: dict[str, dict] = {}
    older: dict[str, dict] = {}
    problems: list[str] = []
    for path in sorted(wheels, key=lambda p: _key(_version(p))):
        version = _version(path)
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            trees = {file: ast.parse(zf.read(file).decode()) for place in PLACES
                     for file in place.files if file in names}
        for place in PLACES:
            fn = next((found for found in (_find(trees[file], place.function)
                                           for file in place.files if file in trees)
                       if found is not None), None)
            if fn is None:
                continue  # not in this release
            kind = KINDS[place.kind]
            stmts: list[ast.stmt] = []
            if kind.select is None:
                prints = [fingerprint.print_function(fn)]
            else:
                local = fingerprint.function_locals(fn)
                stmts = [s for s in fingerprint.statements(fn.body) if kind.select(s)]
                prints = [fingerprint.print_statement(s, local) for s in stmts]
            if not prints:
                continue  # this release's function has no such statement
            if len(prints) != 1:
                problems.append(f"{version}: {place.function}: {len(prints)} candidates for "
                                f"{place.kind}")
                continue
            found = prints[0]
            accepted_kind, accepted = ACCEPTED.get(found.digest[:12], (None, None))
            if accepted is None or accepted_kind is not kind:
                if kind.older_shapes:  # a release's own older shape: no kernel, no edit
                    shape = older.setdefault(found.digest, {
                        "digest": found.digest, "kind": place.kind, "functions": [],
                        "releases": []})
                    for key, value in (("functions", place.function), ("releases", version)):
                        if value not in shape[key]:
                            shape[key].append(value)
                    continue
                problems.append(f"{version}: {place.function}: {place.kind} has the "
                                f"fingerprint {found.digest[:12]}, which kvest has not accepted")
                continue
            extra: dict[str, object] = {}
            if accepted.layout is not None:
                extra["layout"] = accepted.layout
            if accepted.reserve_factor != 1:
                extra["reserve_factor"] = accepted.reserve_factor
            if kind.paths:
                extra["paths"] = _added_paths(stmts[0])
            canonical = {actual: canon for canon, actual in found.names.items()}
            wanted = dict(place.roles)
            if accepted.reserve is not None:
                wanted["reserve"] = accepted.reserve
            pattern_id = accepted.id
            entry = entries.setdefault(pattern_id, {
                "id": pattern_id, "kind": place.kind, "functions": [],
                "digest": found.digest,
                "roles": {role: canonical[name] for role, name in wanted.items()},
                "globals": list(found.globals),
                **extra,
                "nodes": {path: list(node) for path, node in found.nodes.items()},
                "releases": [],
            })
            if entry["roles"] != {role: canonical[name] for role, name in wanted.items()}:
                problems.append(f"{version}: {place.function}: {pattern_id} with other roles")
            if place.function not in entry["functions"]:
                entry["functions"].append(place.function)
            if version not in entry["releases"]:
                entry["releases"].append(version)
    return entries, older, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail unless the file is current")
    mode.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    parser.add_argument("wheels", nargs="+", help="sglang wheels, or directories holding them")
    args = parser.parse_args(argv)
    wheels = _wheels(args.wheels)
    if not wheels:
        print("no sglang wheels given", file=sys.stderr)
        return 2
    entries, older, problems = survey(wheels)
    data = {
        "about": "Generated by tools/sglang_patterns.py from SGLang's wheels: fingerprints "
                 "(SHA-256 of the normalised syntax tree) of the code kvest replaces. "
                 "Do not edit by hand.",
        "patterns": sorted(entries.values(), key=lambda e: e["id"]),
        "older": sorted(older.values(), key=lambda e: (e["kind"], e["releases"][0])),
    }
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    versions = sorted({_version(w) for w in wheels}, key=_key)
    if args.write:
        OUT.write_text(text)
        print(f"wrote {OUT.name}: {len(entries)} patterns from {', '.join(versions)}")
        return 1 if problems else 0
    if OUT.read_text() != text:
        print(f"{OUT.name} is not what the wheels give: run --write", file=sys.stderr)
        return 1
    print(f"{OUT.name}: {len(entries)} patterns, current for {', '.join(versions)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
