"""A new hot spot with a new kind of statement takes three files of kvest's:
the registry (a :class:`~kvest.sglang.registry.Kind` and a
:class:`~kvest.sglang.registry.HotSpot`), the kernel, and its pure-Python
twin.  Everything else derives from the registry: the stand-in modules the
doctor loads, the plan and its glue (the generic one,
:func:`kvest.sglang.glue.make_kernel`), ``patch()`` and the plugin,
:func:`kvest.sglang.status`, the doctor and its parity run, and the
benchmarks' tables (``tools/cachegrind_hotspots.py``,
``kvest._bench.sglang_step``).  ``patterns.json`` is ``tools/sglang_patterns.py``'s
output, made here by that tool from a wheel.

Here the registry's records are added by ``monkeypatch``, and the kernel and
its twin are two modules written to a temporary directory; SGLang's side is a
module added to a copy of the newest release at hand."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from sglang_releases import releases

import kvest
import kvest.sglang
from kvest.sglang import fingerprint, monitor, patterns, registry
from kvest.sglang.upstream import SourceTree, standin_tree

ROOT = Path(__file__).resolve().parents[1]
NEWEST = next((t for t in reversed(releases()) if t.version == "0.5.23"), None)
if NEWEST is None:
    pytest.skip("sglang 0.5.23 is not available here", allow_module_level=True)

MODULE = "sglang.srt.kvest_longer"
SOURCE = '''
def count_longer(requests, page_size):
    longer = sum(1 for r in requests if r.kv.kv_committed_len > page_size)
    return longer
'''
# The kernel (in kvest, a compiled module) and its twin (kvest/reference/): each
# answers exactly as the statement does, or raises (then upstream's statement runs).
KERNEL = '''
def count_longer(requests, limit):
    if type(requests) is not list or type(limit) is not int:
        raise TypeError("not a list of requests and an int")
    total = 0
    for r in requests:
        length = r.kv.kv_committed_len
        if type(length) is not int:
            raise TypeError("not an exact int")
        total += length > limit
    return total
'''
TWIN = '''
def count_longer(requests, limit):
    if type(requests) is not list or type(limit) is not int:
        raise TypeError("not a list of requests and an int")
    lengths = [r.kv.kv_committed_len for r in requests]
    if any(type(n) is not int for n in lengths):
        raise TypeError("not an exact int")
    return sum(1 for n in lengths if n > limit)
'''
LABEL = "count_longer"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_fresh", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def new_kind(tmp_path, monkeypatch):
    """The three files: the kernel and its twin, and the registry's records."""
    for name, text in (("kvest_longer_kernel", KERNEL), ("kvest_longer_twin", TWIN)):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    # SGLang's side: the newest release with the new function added.
    release = tmp_path / "release"
    for name in registry.files():
        if NEWEST.exists(name):
            (release / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(NEWEST.path(name), release / name)
    (release / registry.module_file(MODULE)).write_text(SOURCE)
    # What a human read and accepted: the statement's fingerprint.
    fn = ast.parse(SOURCE).body[0]
    assert isinstance(fn, ast.FunctionDef)
    printed = fingerprint.print_statement(fn.body[0], fingerprint.function_locals(fn))
    everywhere = registry.Cost(200, 900, 0)
    kind = registry.Kind(
        "count_longer", "the count of requests longer than the page size", "`count_longer`",
        registry.KINDS["decode_count"].select,
        (registry.Accepted(printed.digest[:12], "count_longer"),),
        inputs=("requests", "page_size"), binds="target", sized="requests",
        costs={build: everywhere for build in registry.Build},
        function=registry.Kernel("count_longer", "kvest_longer_kernel", "kvest_longer_twin"))
    spot = registry.HotSpot(
        "count_longer", (MODULE,), None, "count_longer",
        (registry.Use("count_longer", {"target": "longer", "requests": "requests",
                                       "page_size": "page_size"}),),
        bench=(registry.Bench(LABEL, "`count_longer`", args=("reqs", "page_size")),),
        steps=(registry.Step(LABEL, ("reqs", "page_size")),))
    monkeypatch.setitem(registry.KINDS, kind.name, kind)  # type: ignore[index]
    monkeypatch.setitem(registry.HOTSPOTS, spot.name, spot)  # type: ignore[index]
    monkeypatch.setattr(monitor.STATE, "spots", dict(monitor.STATE.spots))
    # patterns.json as tools/sglang_patterns.py writes it, from a wheel of that release.
    wheel = tmp_path / f"sglang-{NEWEST.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(release / registry.module_file(MODULE), registry.module_file(MODULE))
    entries, _, problems = _tool("sglang_patterns").survey([wheel])
    assert not problems and list(entries) == ["count_longer"], (entries, problems)
    entry = entries["count_longer"]
    made = patterns.Pattern(
        id=entry["id"], kind=entry["kind"], functions=tuple(entry["functions"]),
        digest=entry["digest"], roles=dict(entry["roles"]), globals=tuple(entry["globals"]),
        nodes={p: (n[0], n[1]) for p, n in entry["nodes"].items()},
        releases=tuple(entry["releases"]))
    shipped = patterns.load()
    monkeypatch.setattr(patterns, "load", lambda: (*shipped, made))
    return SourceTree(release, NEWEST.version)


class _Kv:
    def __init__(self, committed):
        self.kv_committed_len = committed


class _Req:
    def __init__(self, committed):
        self.kv = _Kv(committed)


def test_a_new_kind_takes_the_registry_a_kernel_and_its_twin(new_kind, capsys, monkeypatch):
    source = new_kind
    # The kernel serves the compiled build, the twin the pure-Python one.
    kernel = registry.KINDS["count_longer"].function
    assert kernel.resolve() is sys.modules["kvest_longer_kernel"].count_longer
    with monkeypatch.context() as patched:
        patched.setattr(kvest, "IMPLEMENTATION", "python")
        assert kernel.resolve() is sys.modules["kvest_longer_twin"].count_longer

    # The plugin: SGLang's own load_plugins() installs the new hot spot.
    with standin_tree(source, plugins=True) as tree:
        module = tree.modules[MODULE]
        original = module.count_longer
        tree.modules["sglang.srt.plugins"].load_plugins()
        assert module.count_longer is not original
        reqs = [_Req(c) for c in (15, 16, 17, 40)]
        assert module.count_longer(reqs, 16) == original(reqs, 16) == 2
        assert module.count_longer([_Req(1.5)], 1) == original([_Req(1.5)], 1) == 1
        # status(): replaced, its pattern, the kernel's answer and the decline counted
        report = kvest.sglang.status()["hotspots"]["count_longer"]
        assert report["state"] == "replaced", report
        assert report["patterns"] == ["count_longer at line 3"], report
        assert report["kernel"] == 1 and report["fallbacks"] == 1, report

    # The doctor: the state status() gives, and the parity run over the statement.
    from kvest.cli import main as cli_main

    assert cli_main(["sglang", "--batches", "40", "--sglang-root", str(source.root)]) == 0
    out = capsys.readouterr().out
    assert "  count_longer: replaced (count_longer at line 3)" in out
    assert "  count_longer: count_longer at line 3: 10 compared, 0 mismatches" in out

    # The benchmark's tables: a row of tools/cachegrind_hotspots.py, called as
    # its caller calls it, kvest's side answering as upstream's does.
    tool = _tool("cachegrind_hotspots")
    assert tool.SPOTS[LABEL][1:] == ("function", "count_longer", "")
    assert LABEL in tool.PASSES
    answers = {}
    for side in ("upstream", "kvest"):
        with tool.hot_spots(side, [LABEL], [3, 300], str(source.root), source.version) as (
                calls, arguments):
            answers[side] = [calls[LABEL](*a, **k) for a, k in
                             (arguments(LABEL, n) for n in (3, 300))]
    assert answers["kvest"] == answers["upstream"]
    assert kvest.sglang.status()["hotspots"]["count_longer"]["kernel"] >= 2

    # The real-SGLang step benchmark's loop table: its row, called as the caller calls it.
    from kvest._bench import sglang_step

    spot, step = sglang_step._loop_rows()[LABEL]
    assert spot is registry.HOTSPOTS["count_longer"]
    with standin_tree(source), kvest.sglang.patch():
        before = kvest.sglang.status()["hotspots"]["count_longer"]["kernel"]
        reqs = [_Req(c) for c in (15, 16, 17, 40)]
        values = {"reqs": reqs, "page_size": 16}.__getitem__
        assert sglang_step.loop_call(spot, step, values, None, None)() == 2
        assert kvest.sglang.status()["hotspots"]["count_longer"]["kernel"] == before + 1
