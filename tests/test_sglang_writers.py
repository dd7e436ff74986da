"""The loops that write to requests, swapped for kvest's writers: exact.

Each loop is taken from the newest release's wheel (never copied into the
repository), put alone in a function with the release's own variable names,
and compiled twice: as upstream wrote it, and by kvest's rewriter with the
loop swapped for its writer.  Both run on identical worlds of requests --
release-shaped, with odd values, with properties that fail part-way -- and
must leave them in the same state, with the same exception.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import sys
import textwrap
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from request_standins import FlatReq, MixedReq, NestedReq
from sglang_releases import check_required, releases

from kvest.sglang import fingerprint, hotspots, patterns, rewrite
from kvest.sglang.registry import KINDS

RELEASES = [t for t in releases() if t.exists("sglang/srt/mem_cache/allocation.py")]
check_required(releases())
NEWEST = next((t for t in reversed(RELEASES) if any(
    p.kind == "add_lengths_loop" and t.version in p.releases for p in patterns.load())), None)
if NEWEST is None:
    pytest.skip("no sglang release with the writing loops available", allow_module_level=True)

ALLOCATION = "sglang/srt/mem_cache/allocation.py"
BATCH = "sglang/srt/managers/schedule_batch.py"
CASES = {
    # case: (file, function, the function's parameters the loop reads, pattern id,
    #        the request shape of the releases it is in)
    "add_lengths_loop": (ALLOCATION, "alloc_for_decode_default", ("batch", "token_per_req"),
                         "add_lengths_loop/nested", NestedReq),
    "max_allocated_loop": (ALLOCATION, "alloc_for_spec_decode", ("reqs", "nxt_kv_lens_list"),
                           "max_allocated_loop/nested", NestedReq),
    "batch_idx_loop": ("sglang/srt/speculative/eagle_utils.py", "eagle_prepare_for_decode",
                       ("batch",), "batch_idx_loop", NestedReq),
    "batch_idx_loop (method)": (BATCH, "prepare_for_decode", ("self",), "batch_idx_loop",
                                NestedReq),
    "batch_idx_loop (0.5.16-0.5.18)": (BATCH, "prepare_for_decode", ("self",),
                                       "batch_idx_loop/flat2", MixedReq),
    "batch_idx_loop (0.5.11-0.5.15)": (BATCH, "prepare_for_decode", ("self",),
                                       "batch_idx_loop/flat3", FlatReq),
}


def _release(pattern_id: str):
    """The newest release at hand whose loop has the pattern's fingerprint."""
    pattern = next(p for p in patterns.load() if p.id == pattern_id)
    return next((t for t in reversed(releases()) if t.version in pattern.releases), None)


def _loop_function(case: str, tmp_path) -> tuple[types.FunctionType, types.FunctionType]:
    """(upstream's loop in a function of its own, the same compiled by kvest)."""
    relpath, name, params, pattern_id, _ = CASES[case]
    kind = pattern_id.split("/")[0]
    release = _release(pattern_id)
    if release is None:
        pytest.skip(f"no release with {pattern_id} at hand")
    tree = release.tree(relpath)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    text = release.path(relpath).read_text()
    loops = [s for s in fingerprint.statements(fn.body) if KINDS[kind].select(s)]
    assert len(loops) == 1
    body = textwrap.indent(textwrap.dedent(ast.get_source_segment(text, loops[0],
                                                                  padded=True)), "    ")
    module_name = "loop_" + "".join(c if c.isalnum() else "_" for c in case)
    path = tmp_path / f"{module_name}.py"
    path.write_text(f"def {name}({', '.join(params)}):\n{body}\n")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    original = getattr(module, name)
    analysis = rewrite.analyse(original, [kind])
    assert [f.pattern.id for f in analysis.found] == [pattern_id], analysis.notes
    found = analysis.found[0]
    return original, rewrite.rebuild(analysis, [hotspots.make_swap(found, name, {})])


class Failing:
    """A value whose ``+`` or ``>`` raises: the loop stops there."""

    def __add__(self, other):
        raise ArithmeticError("add")

    __radd__ = __add__

    def __gt__(self, other):
        raise ArithmeticError("gt")

    __lt__ = __gt__

    def __repr__(self):
        return "Failing()"


VALUES = st.one_of(st.integers(0, 2**21), st.integers(-2**70, 2**70),
                   st.sampled_from([True, 1.5, Failing()]))


@st.composite
def worlds(draw, cls=NestedReq):
    reqs = []
    for _ in range(draw(st.integers(0, 12))):
        req = cls(draw(VALUES), draw(VALUES))
        req.decode_batch_idx = draw(VALUES)
        if draw(st.integers(0, 9)) == 0:
            req.kv = None  # a request whose KV info is gone: AttributeError
        if draw(st.integers(0, 9)) == 0:
            del req.decode_batch_idx  # AttributeError part-way
        reqs.append(req)
    return reqs


def _state(reqs):
    """Each request's lengths and batch index, wherever its shape keeps them."""
    def value(obj, name):
        v = getattr(obj, name, "missing") if obj is not None else "no kv"
        return type(v).__name__, repr(v)

    return [value(r, "decode_batch_idx")
            + value(r, "kv_committed_len") + value(r, "kv_allocated_len")
            + value(getattr(r, "kv", None), "kv_committed_len")
            + value(getattr(r, "kv", None), "kv_allocated_len") for r in reqs]


def _run(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    return None


@pytest.fixture(scope="module", params=sorted(CASES))
def loop(request, tmp_path_factory):
    return request.param, *_loop_function(request.param, tmp_path_factory.mktemp("loops"))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_writer_leaves_requests_as_the_loop_does(loop, data):
    case, original, compiled = loop
    reqs = data.draw(worlds(CASES[case][4]))
    twin = copy.deepcopy(reqs)
    if case.startswith("batch_idx_loop"):
        args, twin_args = (types.SimpleNamespace(reqs=reqs),), (types.SimpleNamespace(reqs=twin),)
    elif case == "add_lengths_loop":
        delta = data.draw(st.one_of(st.integers(-5, 5), st.sampled_from([2**64, 0.5])))
        args = (types.SimpleNamespace(reqs=reqs), delta)
        twin_args = (types.SimpleNamespace(reqs=twin), delta)
    else:
        values = data.draw(st.lists(VALUES, max_size=14))
        args, twin_args = (reqs, values), (twin, copy.deepcopy(values))
    expected = _run(original, *twin_args)
    got = _run(compiled, *args)
    assert got == expected
    assert _state(reqs) == _state(twin)


def test_the_loop_is_swapped(loop):
    _, original, compiled = loop
    assert compiled.__code__ is not original.__code__
    assert any(name.startswith("__kvest_glue") for name in compiled.__code__.co_freevars)
