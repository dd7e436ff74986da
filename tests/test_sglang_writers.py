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
from request_standins import NestedReq
from sglang_releases import check_required, releases

from kvest.sglang import fingerprint, kernels, patterns, rewrite

RELEASES = [t for t in releases() if t.exists("sglang/srt/mem_cache/allocation.py")]
check_required(releases())
NEWEST = next((t for t in reversed(RELEASES) if any(
    p.kind == "add_lengths_loop" and t.version in p.releases for p in patterns.load())), None)
if NEWEST is None:
    pytest.skip("no sglang release with the writing loops available", allow_module_level=True)

CASES = {
    # kind: (function, the function's parameters the loop reads)
    "add_lengths_loop": ("alloc_for_decode_default", ("batch", "token_per_req")),
    "max_allocated_loop": ("alloc_for_spec_decode", ("reqs", "nxt_kv_lens_list")),
}


def _loop_function(kind: str, tmp_path) -> tuple[types.FunctionType, types.FunctionType]:
    """(upstream's loop in a function of its own, the same compiled by kvest)."""
    name, params = CASES[kind]
    relpath = "sglang/srt/mem_cache/allocation.py"
    tree = NEWEST.tree(relpath)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    text = NEWEST.path(relpath).read_text()
    loops = [s for s in fingerprint.statements(fn.body) if patterns.SELECT[kind](s)]
    assert len(loops) == 1
    body = textwrap.indent(textwrap.dedent(ast.get_source_segment(text, loops[0],
                                                                  padded=True)), "    ")
    path = tmp_path / f"loop_{kind}.py"
    path.write_text(f"def {name}({', '.join(params)}):\n{body}\n")
    spec = importlib.util.spec_from_file_location(f"loop_{kind}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    original = getattr(module, name)
    analysis = rewrite.analyse(original, [kind])
    assert [f.pattern.kind for f in analysis.found] == [kind], analysis.notes
    found = analysis.found[0]
    maker, inputs, binds = kernels.GLUE[kind]
    swap = rewrite.Swap(found, maker(found.pattern, name, {}), inputs, binds)
    return original, rewrite.rebuild(analysis, [swap])


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
def worlds(draw):
    reqs = []
    for _ in range(draw(st.integers(0, 12))):
        req = NestedReq(draw(VALUES), draw(VALUES))
        if draw(st.integers(0, 9)) == 0:
            req.kv = None  # a request whose KV info is gone: AttributeError
        reqs.append(req)
    return reqs


def _state(reqs):
    return [(None,) if r.kv is None else
            (type(r.kv.kv_committed_len).__name__, repr(r.kv.kv_committed_len),
             type(r.kv.kv_allocated_len).__name__, repr(r.kv.kv_allocated_len))
            for r in reqs]


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
    kind, original, compiled = loop
    reqs = data.draw(worlds())
    twin = copy.deepcopy(reqs)
    if kind == "add_lengths_loop":
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
