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
reads the new code, proves a kernel equal to it, and adds its digest to
``ACCEPTED`` below.  Nothing of SGLang's code is stored, only digests.

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
from pathlib import Path

from kvest.sglang import fingerprint
from kvest.sglang.patterns import PLACES, SELECT

OUT = Path(__file__).resolve().parent.parent / "src/kvest/sglang/patterns.json"

# The fingerprints a human has read and proven a kernel equal to (digest
# prefix -> the pattern's id and what the kernel needs to know).
ACCEPTED = {
    "df1187ec4fb9": ("decode_count/flat", {"layout": "flat"}),
    "720dd25ff1a7": ("decode_count/nested", {"layout": "nested"}),
    # R = 2 * alloc_len, alloc_len a local of the method (0.5.11-0.5.12)
    "a7767a028b04": ("spec_v2_total/flat/2x", {"layout": "flat", "reserve_factor": 2,
                                               "reserve": "alloc_len"}),
    "ac283f7fb881": ("spec_v2_total/flat", {"layout": "flat", "reserve_factor": 1,
                                            "reserve": "reserve"}),
    "b26520a658a2": ("spec_v2_total/mixed", {"layout": "mixed", "reserve_factor": 1,
                                             "reserve": "reserve"}),
    "5c9eaf01b495": ("spec_v2_total/nested", {"layout": "nested", "reserve_factor": 1,
                                              "reserve": "reserve"}),
    "000952999d89": ("beam_rows", {}),
    "fca0c46ba1a5": ("select_requests", {}),
    "41109038e55f": ("alloc_lens_loop/nested", {"layout": "nested"}),
    "c7fcaae0bb6b": ("alloc_lens_function/nested", {"layout": "nested"}),
    "9bda6bd0efc8": ("get_num_new_pages", {}),
    "7b40dcca57e9": ("ceil_align", {}),
    "974e86067eb8": ("ceil_div", {}),
    # the loops that write to requests
    "226feb6771b3": ("add_lengths_loop/nested", {}),
    "52ea9dba3a67": ("max_allocated_loop/nested", {}),
    # `for req in <batch>.reqs: req.<path> += 1` for each path (written to the
    # file from the statement, which the digest fixes): decode_batch_idx;
    # then kv_committed_len (flat2); then kv_allocated_len too (flat3)
    "cdc4dffc828b": ("batch_idx_loop", {}),
    "c8bf94dc0a90": ("batch_idx_loop/flat2", {}),
    "5df113efbe18": ("batch_idx_loop/flat3", {}),
    # append_beam_tail's loop, compiled only as "no request is in a beam group"
    "12869f036c9f": ("beam_tail_loop", {}),
}
# Loops kvest compiles only in the releases where they took the shape above;
# older shapes of them are left alone, as the patterns say.
NEW_IN = {"add_lengths_loop", "max_allocated_loop", "select_requests"}
# Loops whose glue is told the attribute paths they add to.
WRITES_PATHS = {"batch_idx_loop"}


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


def survey(wheels: list[Path]) -> tuple[dict[str, dict], list[str]]:
    """(pattern id -> entry, problems) over the wheels."""
    entries: dict[str, dict] = {}
    problems: list[str] = []
    for path in sorted(wheels, key=lambda p: _key(_version(p))):
        version = _version(path)
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            trees = {place.file: ast.parse(zf.read(place.file).decode()) for place in PLACES
                     if place.file in names}
        for place in PLACES:
            fn = _find(trees[place.file], place.function) if place.file in trees else None
            if fn is None:
                continue  # not in this release
            select = SELECT[place.kind]
            stmts: list[ast.stmt] = []
            if select is None:
                prints = [fingerprint.print_function(fn)]
            else:
                local = fingerprint.function_locals(fn)
                stmts = [s for s in fingerprint.statements(fn.body) if select(s)]
                prints = [fingerprint.print_statement(s, local) for s in stmts]
            if not prints:
                continue  # this release's function has no such statement
            if len(prints) != 1:
                problems.append(f"{version}: {place.function}: {len(prints)} candidates for "
                                f"{place.kind}")
                continue
            found = prints[0]
            accepted = ACCEPTED.get(found.digest[:12])
            if accepted is None or not accepted[0].startswith(place.kind):
                if place.kind in NEW_IN:
                    continue  # an older shape of a loop kvest compiles only from NEW_IN on
                problems.append(f"{version}: {place.function}: {place.kind} has the "
                                f"fingerprint {found.digest[:12]}, which kvest has not accepted")
                continue
            pattern_id, extra = accepted
            if place.kind in WRITES_PATHS:
                extra = {**extra, "paths": _added_paths(stmts[0])}
            canonical = {actual: canon for canon, actual in found.names.items()}
            wanted = dict(place.roles)
            if "reserve" in extra:
                wanted["reserve"] = extra["reserve"]
            entry = entries.setdefault(pattern_id, {
                "id": pattern_id, "kind": place.kind, "functions": [],
                "digest": found.digest,
                "roles": {role: canonical[name] for role, name in wanted.items()},
                "globals": list(found.globals),
                **{k: v for k, v in extra.items() if k != "reserve"},
                "nodes": {path: list(node) for path, node in found.nodes.items()},
                "releases": [],
            })
            if entry["roles"] != {role: canonical[name] for role, name in wanted.items()}:
                problems.append(f"{version}: {place.function}: {pattern_id} with other roles")
            if place.function not in entry["functions"]:
                entry["functions"].append(place.function)
            if version not in entry["releases"]:
                entry["releases"].append(version)
    return entries, problems


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
    entries, problems = survey(wheels)
    data = {
        "about": "Generated by tools/sglang_patterns.py from SGLang's wheels: fingerprints "
                 "(SHA-256 of the normalised syntax tree) of the code kvest replaces. "
                 "Do not edit by hand.",
        "patterns": sorted(entries.values(), key=lambda e: e["id"]),
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
