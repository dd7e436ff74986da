"""How kvest decides what to replace, without any SGLang release: fingerprints,
the patterns' data, the proof that a source is the code that runs, the switch,
which callers get int32 arrays."""

from __future__ import annotations

import ast

import pytest

from kvest.sglang import fingerprint, monitor, patterns, rewrite
from kvest.sglang.hotspots import _int32_tensor_use
from kvest.sglang.registry import KINDS


@pytest.mark.parametrize(("value", "mode", "warns"), [
    (None, "on", False), ("1", "on", False), ("on", "on", False), ("shadow", "shadow", False),
    (" Shadow ", "shadow", False), ("0", "off", False), ("off", "off", False),
    ("nope", "off", True), ("2", "off", True),
])
def test_the_switch(value, mode, warns):
    env = {} if value is None else {"KVEST_SGLANG": value}
    got = monitor.switch(env)
    assert got.mode is monitor.Mode(mode)
    assert (got.warning is not None) == warns
    # The reason quotes the value (or says it is not set): a typo never looks deliberate.
    assert (repr(value) if value is not None else "not set") in got.reason
    if warns:
        assert repr(value) in got.warning and "not one of" in got.reason


def test_the_source_must_be_the_code_that_runs(tmp_path):
    """A function whose file no longer holds its code is left alone."""
    path = tmp_path / "mod.py"
    path.write_text("def f(reqs):\n    return sum(r.beam_group.num_member_rows for r in reqs"
                    " if r.beam_group is not None)\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    fn = namespace["f"]
    assert rewrite.analyse(fn, ["beam_rows"]).found  # as shipped: found
    path.write_text(path.read_text().replace("is not None", "is None"))
    with pytest.raises(rewrite.Unreadable, match="not the code that runs"):
        rewrite.analyse(fn, ["beam_rows"])


def test_fingerprints_ignore_layout_and_see_arithmetic():
    import ast

    def printed(src):
        fn = ast.parse(src).body[0]
        return fingerprint.print_statement(fn.body[-1], fingerprint.function_locals(fn)).digest

    base = printed("def f(a, b):\n    x = sum(1 for r in a if r.c % b == 0)")
    assert base == printed("def g(q, w):  # renamed, reformatted\n"
                           "    y = sum(\n        1 for s in q if s.c % w == 0\n    )")
    assert base != printed("def f(a, b):\n    x = sum(1 for r in a if r.c % b == 1)")
    assert base != printed("def f(a, b):\n    x = sum(1 for r in a if r.d % b == 0)")
    assert base != printed("def f(a, b):\n    x = sum(True for r in a if r.c % b == 0)")


def test_patterns_are_data_with_their_releases():
    loaded = patterns.load()
    assert {p.kind for p in loaded} >= {"decode_count", "spec_v2_total", "beam_rows",
                                        "alloc_lens_loop", "get_num_new_pages"}
    for pattern in loaded:
        assert len(pattern.digest) == 64 and pattern.releases
        assert pattern.kind in KINDS
        assert pattern.functions


CALLER_OK = """
def prepare(batch):
    cur, nxt, n = page_aligned_decode_alloc_lens(batch.reqs, reserve=8, page_size=16)
    cur_t = torch.tensor(cur, dtype=torch.int32, device="cpu")
    nxt_t = torch.tensor(nxt, dtype=torch.int32, device="cpu")
    cur = cur_t.to("cuda")
    return cur, nxt_t, n
"""


@pytest.mark.parametrize("source, ok", [
    (CALLER_OK, True),
    (CALLER_OK.replace("torch.int32", "torch.int64"), False),        # other dtype
    (CALLER_OK.replace("return cur, nxt_t, n", "return max(nxt), n"), False),  # list use
    (CALLER_OK.replace("    cur = cur_t", "    if n:\n        cur = cur_t"), False),
    (CALLER_OK.replace("cur, nxt, n = page", "lens = page"), False),  # not unpacked
])
def test_which_callers_get_int32_arrays(source, ok):
    assert _int32_tensor_use(ast.parse(source), "page_aligned_decode_alloc_lens")[0] is ok


def test_the_docs_table_is_the_registry():
    """docs/sglang.md's pattern table is made from the registry and patterns.json."""
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs" / "sglang.md"
    assert patterns.table() in docs.read_text(), (
        "docs/sglang.md's table is stale: paste kvest.sglang.patterns.table() there")
