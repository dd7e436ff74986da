"""kvest's replacements give SGLang's own answers -- or raise its own exceptions.

For every release available (tests/upstream.py), SGLang's functions are taken
from the release's files into stand-in modules under sglang's names, and
``kvest.sglang.patch()`` -- no arguments, the real entry path -- replaces them.
Random batches shaped like that release's own go through the original and the
replacement, speculative and not, beam rows, ``selected_indices``, page sizes
1 to 256, and odd inputs kvest declines (which the original must then answer).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_releases import check_required, fallbacks, releases
from sglang_standins import BeamGroup, Unpatched, request_class

import kvest.sglang
from kvest.sglang.registry import KINDS
from kvest.sglang.upstream import Config, standin_tree

try:
    import torch
except ImportError:
    torch = None

RELEASES = releases()
check_required(RELEASES)
if not RELEASES:
    pytest.skip("no sglang release available (pip install --no-deps sglang==0.5.23, or "
                "KVEST_SGLANG_WHEELS=<dir of downloaded wheels>)", allow_module_level=True)

EXAMPLES = int(os.environ.get("KVEST_PARITY_EXAMPLES", "300"))
CONFIGS = [(3, 1, 4), (5, 1, 8), (3, 2, 6), (5, 4, 8), (5, 8, 64), (None, None, 4), (1, 1, 2)]
PAGES = st.one_of(st.sampled_from([1, 16, 32, 64, 128, 256]), st.integers(1, 256))


@pytest.fixture(scope="module", params=RELEASES, ids=[t.version for t in RELEASES])
def release(request):
    """A release's stand-in tree, its originals kept, then patched by patch()."""
    with standin_tree(request.param, torch=torch) as tree:
        cls = tree.batch_class
        originals = {name: cls.__dict__[name] for name in
                     ("new_tokens_required_next_decode",
                      "_new_tokens_required_next_decode_spec_v2")}
        alloc = tree.alloc_function("page_aligned_decode_alloc_lens")
        common = tree.modules["sglang.srt.utils.common"]
        originals["page_aligned_decode_alloc_lens"] = alloc
        originals["get_num_new_pages"] = common.get_num_new_pages
        handle = kvest.sglang.patch()
        try:
            yield tree, originals, handle
        finally:
            handle.undo()


def outcome(fn, *args, **kwargs):
    """What a call gives: ("ok", value) or ("raise", type, message)."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return ("raise", type(exc), str(exc))
    if isinstance(value, tuple):
        value = tuple(v.tolist() if isinstance(v, np.ndarray) else v for v in value)
    return ("ok", value)


@st.composite
def lengths(draw, p, clean):
    c = draw(st.integers(0, 2**21) | st.integers(0, 4 * p))
    a = c + draw(st.integers(0, 3 * p + 160))
    if draw(st.integers(0, 9)) == 0:  # allocation behind the committed length
        a = draw(st.integers(0, c))
    if not clean:
        odd = st.sampled_from([-1, -p, 2**63, 2**31, True, np.int64(7), 2**64 + 3])
        if draw(st.booleans()):
            c = draw(odd)
        else:
            a = draw(odd)
    return c, a


@st.composite
def batches(draw, tree, spec):
    clean = draw(st.integers(0, 7)) > 0  # mostly inputs kvest answers itself
    p = draw(PAGES) if clean else draw(PAGES | st.sampled_from([0, -1]))
    steps, topk, draft = draw(st.sampled_from(CONFIGS))
    algorithm = draw(st.sampled_from(["EAGLE", "EAGLE3"])) if spec else None
    tree.config = Config(algorithm, steps, topk, draft, max(p, 1))
    make = request_class(tree.layout())
    beams = tree.has("beam_rows")
    n = draw(st.integers(0, 48))
    reqs = []
    for _ in range(n):
        c, a = draw(lengths(max(p, 1), clean or draw(st.integers(0, 3)) > 0))
        beam = BeamGroup(draw(st.integers(0, 8))) if beams and draw(st.integers(0, 5)) == 0 \
            else None
        reqs.append(make(c, a, beam))
    if reqs and not clean and hasattr(reqs[0], "kv") and draw(st.booleans()):
        # A request whose KV info is gone (0.5.16-0.5.18 set req.kv = None on free).
        draw(st.sampled_from(reqs)).kv = None
    selected = None
    if draw(st.booleans()):
        lo, hi = (-n, n - 1) if clean else (-n - 2, n + 1)
        selected = draw(st.lists(st.integers(lo, hi), max_size=2 * n + 1)) if n or not clean \
            else []
        if draw(st.booleans()):
            selected = np.array(selected, dtype=np.int64)
    clean = clean and all(x >= 0 and not isinstance(x, bool) and x < 2**31
                          for r in reqs for x in _pair(r))
    overlap = draw(st.booleans())
    return tree.batch(reqs, p, algorithm, overlap), selected, clean


def _pair(req):
    kv = getattr(req, "kv", None)
    c = req.kv_committed_len if hasattr(req, "kv_committed_len") else kv.kv_committed_len
    a = req.kv_allocated_len if hasattr(req, "kv_allocated_len") else kv.kv_allocated_len
    return c, a


@pytest.mark.parametrize("spec", [False, True], ids=["no-spec", "spec"])
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_estimate(release, spec, data):
    tree, originals, _ = release
    batch, selected, clean = data.draw(batches(tree, spec))
    before = fallbacks()
    unpatched = Unpatched(batch, originals["_new_tokens_required_next_decode_spec_v2"])
    expected = outcome(originals["new_tokens_required_next_decode"], unpatched, selected)
    got = outcome(batch.new_tokens_required_next_decode, selected)
    assert got == expected
    if clean and expected[0] == "ok" and not (tree.has("spec_v1") and spec
                                             and not batch.is_spec_v2):
        assert fallbacks() == before, "kvest declined a clean batch"


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(data=st.data())
def test_spec_v2_method(release, data):
    tree, originals, _ = release
    batch, _, _ = data.draw(batches(tree, True))
    reqs = batch.reqs
    p = batch.token_to_kv_pool_allocator.page_size
    expected = outcome(originals["_new_tokens_required_next_decode_spec_v2"], batch, reqs, p)
    assert outcome(batch._new_tokens_required_next_decode_spec_v2, reqs, p) == expected


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(data=st.data(), reserve=st.integers(0, 600) | st.sampled_from([-1, 2**62]))
def test_page_aligned_decode_alloc_lens(release, data, reserve):
    tree, originals, _ = release
    if not tree.has("alloc_lens"):
        pytest.skip(f"sglang {tree.version} has no page_aligned_decode_alloc_lens")
    eagle = tree.modules["sglang.srt.speculative.eagle_utils"]
    replaced = eagle.page_aligned_decode_alloc_lens
    assert getattr(replaced, "__kvest_original__", None) is originals[
        "page_aligned_decode_alloc_lens"], kvest.sglang.status()["hotspots"]
    batch, _, clean = data.draw(batches(tree, True))
    p = batch.token_to_kv_pool_allocator.page_size
    expected = outcome(originals["page_aligned_decode_alloc_lens"], batch.reqs,
                       reserve=reserve, page_size=p)
    before = fallbacks("page_aligned_decode_alloc_lens")
    got = outcome(replaced, batch.reqs, reserve=reserve, page_size=p)
    assert got == expected
    if fallbacks("page_aligned_decode_alloc_lens") == before:
        # kvest answered: int32 arrays, or below the kind's lists_below
        # upstream's own lists (of ints, as the caller's tensors want them)
        cur, nxt, _ = replaced(batch.reqs, reserve=reserve, page_size=p)
        if len(batch.reqs) < KINDS["alloc_lens_function"].lists_below:
            assert type(cur) is type(nxt) is list
            assert {type(v) for v in cur + nxt} <= {int}
        else:
            assert cur.dtype == nxt.dtype == np.int32
    elif clean and 0 <= reserve < 2**20:
        raise AssertionError("kvest declined a clean batch")


@pytest.mark.skipif(torch is None, reason="get_num_new_pages runs on torch tensors")
@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(
    seq=st.lists(st.integers(0, 2**40), max_size=64),
    extra=st.lists(st.integers(0, 300), max_size=64),
    p=PAGES,
    dtype=st.sampled_from(["int64", "int32", "int16", "float32"]),
    decode=st.booleans(),
)
def test_get_num_new_pages(release, seq, extra, p, dtype, decode):
    tree, originals, _ = release
    fn = tree.modules["sglang.srt.utils.common"].get_num_new_pages
    dt = getattr(torch, dtype)
    info = torch.iinfo(dt) if dtype.startswith("int") else None
    if info is not None:
        seq = [min(s, info.max) for s in seq]
    n = min(len(seq), len(extra))
    seq_t = torch.tensor(seq[:n], dtype=dt)
    prefix_t = torch.tensor([max(s - e, 0) for s, e in zip(seq[:n], extra[:n], strict=True)],
                            dtype=dt)
    expected = outcome(originals["get_num_new_pages"], seq_t, p, prefix_t, decode)
    assert outcome(fn, seq_t, p, prefix_t, decode) == expected
    assert outcome(fn, seq_lens=seq_t, page_size=p, decode=True) == outcome(
        originals["get_num_new_pages"], seq_lens=seq_t, page_size=p, decode=True)


def test_patch_covers_what_the_release_has(release):
    tree, _, handle = release
    replaced = set(handle.replaced)
    assert {"ScheduleBatch.new_tokens_required_next_decode",
            "ScheduleBatch._new_tokens_required_next_decode_spec_v2"} <= replaced
    assert not handle.plan.problems
    if tree.has("alloc_lens"):
        assert "page_aligned_decode_alloc_lens (in eagle_utils)" in replaced
    if torch is not None:
        assert "get_num_new_pages" in replaced
        # Importers were rebound: the package that re-exports it too.
        assert tree.modules["sglang.srt.utils"].get_num_new_pages is \
            tree.modules["sglang.srt.utils.common"].get_num_new_pages
