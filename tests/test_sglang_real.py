"""kvest inside the real SGLang: real Req objects through a real ScheduleBatch.

Runs where sglang's scheduler modules import (an environment built by
``tools/make_sglang_env.sh``, see the README); skipped elsewhere, except under
``KVEST_REQUIRE_REAL_SGLANG=1`` (CI), where a missing environment fails.

The originals are kept before SGLang's own ``load_plugins()`` runs; it must
find kvest's entry point and replace the four hot spots; then the replacements
are compared with the originals -- answers and exceptions -- on random batches
of real requests: speculative (through the release's own settings) and not,
beam rows, ``selected_indices``, page sizes 1 to 256.
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_releases import fallbacks, real_sglang_missing
from sglang_standins import Unpatched

import kvest.sglang
from kvest.sglang.registry import KINDS

try:
    import sglang
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.mem_cache.allocation_sizing as sizing
    import sglang.srt.speculative.eagle_utils as eagle
    import sglang.srt.utils.common as common
    import torch
except Exception as exc:  # not a real SGLang environment
    pytest.skip(real_sglang_missing(exc), allow_module_level=True)

import sglang.srt.mem_cache.allocator.paged as paged
from sglang.srt.plugins import load_plugins
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

EXAMPLES = int(os.environ.get("KVEST_PARITY_EXAMPLES", "300"))
CONFIGS = [(3, 1, 4), (5, 1, 8), (3, 2, 6), (5, 4, 8), (5, 8, 64), (1, 1, 2)]
PAGES = st.one_of(st.sampled_from([1, 16, 32, 64, 128, 256]), st.integers(1, 256))

ORIGINAL = {
    "estimate": sb.ScheduleBatch.__dict__["new_tokens_required_next_decode"],
    "spec_v2": sb.ScheduleBatch.__dict__["_new_tokens_required_next_decode_spec_v2"],
    "alloc_lens": sizing.page_aligned_decode_alloc_lens,
    "get_num_new_pages": common.get_num_new_pages,
}
HAS = {
    "alloc_lens": eagle.__dict__.get("page_aligned_decode_alloc_lens") is ORIGINAL["alloc_lens"],
    "beam": hasattr(sb, "num_beam_member_rows"),
}


@pytest.fixture(scope="module", autouse=True)
def plugins_loaded():
    """SGLang's own plugin loader, once (it is idempotent per process by design)."""
    logger = logging.getLogger("kvest.sglang")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        load_plugins()
    finally:
        logger.removeHandler(handler)
    return [r.getMessage() for r in records]


def test_load_plugins_found_kvest(plugins_loaded):
    # Nothing is logged while plugins load (SGLang configures logging after
    # that); the status line comes with the first call of a replaced function.
    assert plugins_loaded == []
    logger = logging.getLogger("kvest.sglang")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        make_batch([make_req(5, 8)], 16, None).new_tokens_required_next_decode()
    finally:
        logger.removeHandler(handler)
    assert [r.levelno for r in records] == [logging.INFO], [r.getMessage() for r in records]
    line = records[0].getMessage()
    assert f"sglang {sglang.__version__}" in line and "mode on" in line
    report = kvest.sglang.status()
    assert report["scheduler"] and report["mode"] == "on"
    for name in ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2",
                 "get_num_new_pages", "page_aligned_decode_alloc_lens", "alloc_for_spec_decode"):
        assert report["hotspots"][name]["state"] == "replaced", (name, report["hotspots"][name])
    assert "[kvest]" in repr(sb.ScheduleBatch.__dict__["new_tokens_required_next_decode"])
    estimate = sb.ScheduleBatch.__dict__["new_tokens_required_next_decode"]
    assert estimate is not ORIGINAL["estimate"]
    assert estimate.__wrapped__ is ORIGINAL["estimate"]  # HookRegistry's REPLACE wrapper
    assert sb.ScheduleBatch.__dict__["_new_tokens_required_next_decode_spec_v2"] \
        is not ORIGINAL["spec_v2"]
    # get_num_new_pages: replaced where it lives and in every importer.
    assert common.get_num_new_pages is not ORIGINAL["get_num_new_pages"]
    assert paged.get_num_new_pages is common.get_num_new_pages
    if HAS["alloc_lens"]:
        # Arrays only for the caller that turns the lists into int32 tensors.
        assert eagle.page_aligned_decode_alloc_lens.__kvest_original__ is ORIGINAL["alloc_lens"]
        # Elsewhere, lists: upstream's function with its loop compiled.
        assert sizing.page_aligned_decode_alloc_lens.__wrapped__ is ORIGINAL["alloc_lens"]


# ------------------------------------------------------------------ real objects

_counter = iter(range(10**9))


def make_req(committed: int, allocated: int) -> sb.Req:
    req = sb.Req(f"r{next(_counter)}", "", array("q", range(4)),
                 SamplingParams(max_new_tokens=16))
    kv = getattr(req, "kv", None)
    (kv if kv is not None and hasattr(kv, "kv_committed_len") else req).kv_committed_len = \
        committed
    (kv if kv is not None and hasattr(kv, "kv_allocated_len") else req).kv_allocated_len = \
        allocated
    return req


def make_batch(reqs, page_size: int, algorithm: str | None):
    return sb.ScheduleBatch(
        reqs=reqs,
        token_to_kv_pool_allocator=types.SimpleNamespace(page_size=page_size),
        spec_algorithm=SpeculativeAlgorithm.from_string(algorithm),
        enable_overlap=True,
    )


@contextlib.contextmanager
def speculative(steps, topk, draft, page_size):
    """The release's own settings, the way this release reads them."""
    fields = dict(speculative_algorithm="EAGLE", speculative_num_steps=steps,
                  speculative_eagle_topk=topk, speculative_num_draft_tokens=draft,
                  page_size=page_size)
    try:
        from sglang.srt.runtime_context import get_context
    except ImportError:
        get_context = None
    if get_context is not None and hasattr(get_context(), "override_server_args"):
        with get_context().override_server_args(**fields):
            yield
        return
    from sglang.srt import server_args as sa

    previous = getattr(sa, "_global_server_args", None)
    sa.set_global_server_args_for_scheduler(sa.ServerArgs(model_path="dummy", **fields))
    try:
        yield
    finally:
        sa._global_server_args = previous


def beam_group(rows: int):
    from sglang.srt.beam_search.beam_group import BeamGroup

    group = BeamGroup(beam_width=max(rows, 1), max_new_tokens=16)
    group.member_rows = torch.arange(rows)
    return group


def outcome(fn, *args, **kwargs):
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return ("raise", type(exc), str(exc))
    return ("ok", value)


@st.composite
def requests(draw, p):
    reqs = []
    for _ in range(draw(st.integers(0, 40))):
        c = draw(st.integers(0, 2**21) | st.integers(0, 4 * p))
        a = c + draw(st.integers(0, 3 * p + 160))
        if draw(st.integers(0, 9)) == 0:
            a = draw(st.integers(0, c))
        reqs.append(make_req(c, a))
    if HAS["beam"] and reqs and draw(st.booleans()):
        for i in draw(st.lists(st.integers(0, len(reqs) - 1), max_size=3)):
            reqs[i].beam_group = beam_group(draw(st.integers(0, 4)))
    return reqs


def selections(n):
    return st.none() | st.lists(st.integers(-n, n - 1), max_size=2 * n) if n else st.none()


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), p=PAGES, config=st.sampled_from(CONFIGS), spec=st.booleans())
def test_estimate(data, p, config, spec):
    reqs = data.draw(requests(p))
    selected = data.draw(selections(len(reqs)))
    batch = make_batch(reqs, p, "EAGLE" if spec else None)
    before = fallbacks()
    with speculative(*config, p) if spec else contextlib.nullcontext():
        expected = outcome(ORIGINAL["estimate"], Unpatched(batch, ORIGINAL["spec_v2"]), selected)
        assert outcome(batch.new_tokens_required_next_decode, selected) == expected
        if spec:
            assert outcome(batch._new_tokens_required_next_decode_spec_v2, reqs, p) == \
                outcome(ORIGINAL["spec_v2"], batch, reqs, p)
    # (a real BeamGroup's num_member_rows is a property: Python code, which the
    # drop-in's pure kernels leave to upstream's statement)
    if expected[0] == "ok" and not any(r.beam_group is not None for r in reqs):
        assert fallbacks() == before, "kvest declined a real batch"


@pytest.mark.skipif(not HAS["alloc_lens"], reason="no page_aligned_decode_alloc_lens caller")
@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(data=st.data(), p=PAGES, reserve=st.integers(0, 600))
def test_page_aligned_decode_alloc_lens(data, p, reserve):
    reqs = data.draw(requests(p))
    cur, nxt, needed = eagle.page_aligned_decode_alloc_lens(reqs, reserve=reserve, page_size=p)
    cur_l, nxt_l, needed_l = ORIGINAL["alloc_lens"](reqs, reserve=reserve, page_size=p)
    if len(reqs) < KINDS["alloc_lens_function"].lists_below:
        # (a few requests: upstream's lists, from the kernel's rows)
        assert (cur, nxt) == (cur_l, nxt_l) and {type(v) for v in cur + nxt} <= {int}
    else:
        assert isinstance(cur, np.ndarray) and cur.dtype == np.int32
    assert needed == needed_l
    # What the caller does with them: the same int32 tensors.
    for ours, theirs in ((cur, cur_l), (nxt, nxt_l)):
        assert torch.equal(torch.tensor(ours, dtype=torch.int32, device="cpu"),
                           torch.tensor(theirs, dtype=torch.int32, device="cpu"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    seq=st.lists(st.integers(0, 2**40) | st.integers(2**63 - 300, 2**63 - 1), max_size=64),
    extra=st.lists(st.integers(0, 300), max_size=64),
    p=PAGES | st.sampled_from([0, -3]),
    dtype=st.sampled_from([torch.int64, torch.int32, torch.int16, torch.float32]),
    decode=st.booleans(),
    prefix_none=st.booleans(),
)
def test_get_num_new_pages(seq, extra, p, dtype, decode, prefix_none):
    if dtype.is_floating_point:
        seq = [s % 2**20 for s in seq]
    else:
        seq = [min(s, torch.iinfo(dtype).max) for s in seq]
    n = min(len(seq), len(extra))
    seq_t = torch.tensor(seq[:n], dtype=dtype)
    prefix_t = None if prefix_none else torch.tensor(
        [max(s - e, 0) for s, e in zip(seq[:n], extra[:n], strict=False)], dtype=dtype)
    expected = outcome(ORIGINAL["get_num_new_pages"], seq_lens=seq_t, page_size=p,
                       prefix_lens=prefix_t, decode=decode)
    got = outcome(paged.get_num_new_pages, seq_lens=seq_t, page_size=p, prefix_lens=prefix_t,
                  decode=decode)
    assert got == expected
    if expected[0] == "ok":
        assert type(got[1]) is int


def _scheduler_like_process(queue) -> None:  # runs in a spawned child
    """What SGLang's run_scheduler_process does first: load_plugins()."""
    import logging

    import sglang.srt.managers.schedule_batch as child_sb
    from sglang.srt.plugins import load_plugins as child_load_plugins

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kvest.sglang").addHandler(handler)
    logging.getLogger("kvest.sglang").setLevel(logging.INFO)
    child_load_plugins()
    import kvest.sglang

    estimate = child_sb.ScheduleBatch.__dict__["new_tokens_required_next_decode"]
    state = kvest.sglang.status()["hotspots"].get("new_tokens_required_next_decode", {})
    queue.put((getattr(estimate, "__wrapped__", None) is not None, records,
               kvest.sglang.status()["mode"], state.get("state")))


@pytest.mark.parametrize("off", [False, True], ids=["on", "KVEST_SGLANG=0"])
def test_spawned_process_runs_on_kvest(off, monkeypatch):
    """SGLang spawns its schedulers; installed kvest reaches them with no launcher change."""
    import multiprocessing

    if off:
        monkeypatch.setenv("KVEST_SGLANG", "0")
    context = multiprocessing.get_context("spawn")  # as SGLang's engine forces
    queue = context.Queue()
    process = context.Process(target=_scheduler_like_process, args=(queue,))
    process.start()
    replaced, records, mode, state = queue.get(timeout=300)
    process.join(timeout=60)
    assert process.exitcode == 0
    assert replaced is not off
    if off:
        assert mode == "off" and len(records) == 1
        assert "mode off (KVEST_SGLANG='0' turns kvest off)" in records[0]
    else:  # the status line waits for the first call, when logging is configured
        assert mode == "on" and state == "replaced" and records == []


def _shadow_process(queue, seed) -> None:  # runs in a spawned child, KVEST_SGLANG=shadow
    """Random batches on real requests with kvest beside upstream."""
    import random

    from sglang.srt.plugins import load_plugins as child_load_plugins

    import kvest.sglang

    child_load_plugins()
    rng = random.Random(seed)
    for _ in range(200):
        p = rng.choice([1, 16, 64, 256, rng.randint(1, 256)])
        reqs = []
        for _ in range(rng.randint(0, 40)):
            c = rng.randint(0, 2**21) if rng.random() < 0.5 else rng.randint(0, 4 * p)
            reqs.append(make_req(c, c + rng.randint(0, 3 * p + 160)))
        n = len(reqs)
        selected = [rng.randint(-n, n - 1) for _ in range(rng.randint(0, n))] if n else None
        make_batch(reqs, p, None).new_tokens_required_next_decode(selected)
        steps, topk, draft = rng.choice(CONFIGS)
        with speculative(steps, topk, draft, p):
            make_batch(reqs, p, "EAGLE").new_tokens_required_next_decode(selected)
            sizing.page_aligned_decode_alloc_lens(reqs, reserve=rng.randint(0, 600), page_size=p)
        seq = torch.tensor([rng.randint(1, 2**21) for _ in reqs], dtype=torch.int64)
        paged.get_num_new_pages(seq, p, seq - 1, rng.random() < 0.5)
    queue.put(kvest.sglang.status())


def test_shadow_mode_on_real_requests(monkeypatch):
    """KVEST_SGLANG=shadow in a scheduler-like process: kvest runs beside
    upstream on every call and finds no mismatch on the real classes."""
    import multiprocessing

    monkeypatch.setenv("KVEST_SGLANG", "shadow")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_shadow_process, args=(queue, 0))
    process.start()
    report = queue.get(timeout=600)
    process.join(timeout=60)
    assert process.exitcode == 0
    assert report["mode"] == "shadow"
    spots = report["hotspots"]
    for name in ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2",
                 "page_aligned_decode_alloc_lens", "get_num_new_pages"):
        assert spots[name]["state"] == "shadow", (name, spots[name])
        shadow = spots[name]["shadow"]
        # (the spec-v2 method, called only inside the estimate, compared there too)
        assert shadow["compared"] > 0, (name, spots[name])
        assert shadow["mismatches"] == 0, (name, shadow["first_mismatch"])
    # The writers are compared statement by statement, upstream's writes once
    # (their decode loop: tests/test_sglang_shadow_real.py); the batch-index
    # loops are upstream's in every mode, its code being faster.
    for name in ("alloc_for_decode_default", "alloc_for_spec_decode", "append_beam_tail"):
        assert spots[name]["state"] == "shadow", (name, spots[name])
    for name in ("prepare_for_decode", "eagle_prepare_for_decode"):
        assert spots[name]["state"] == "skipped", (name, spots[name])


# ------------------------------------------------------------------ a decode loop in shadow mode
# The loops of kvest._bench.sglang_world (real Req, ScheduleBatch, pools and
# allocator, no speculation and EAGLE, a retraction) in three processes started
# alike after SGLang's own load_plugins(): KVEST_SGLANG=0, on and shadow.  Shadow
# mode compares every hot spot mode on replaces, writers included, with no
# mismatch, and leaves every step as upstream does (upstream's writes, once).

# (the world's own loop main, with the shadow counters added to what it prints)
_LOOPS = """
import json, sys
from kvest._bench import sglang_world as w
w.sg()
from sglang.srt.plugins import load_plugins
load_plugins()
import kvest.sglang
loops = [w.decode_loop(*case) for case in w.LOOP_CASES]
report = kvest.sglang.status()
sys.stdout.write(json.dumps({"mode": report["mode"], "loops": loops, "hotspots": {
    k: {"state": v["state"], "calls": v["calls"], **v["shadow"]}
    for k, v in report["hotspots"].items()}}))
"""


def _run_loops(mode: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore::UserWarning", KVEST_SGLANG=mode)
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LOOPS], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def shadow_runs() -> dict[str, dict]:
    return {mode: _run_loops(mode) for mode in ("0", "on", "shadow")}


def test_shadow_compares_what_mode_on_replaces(shadow_runs):
    on, shadow = shadow_runs["on"]["hotspots"], shadow_runs["shadow"]["hotspots"]
    assert shadow_runs["shadow"]["mode"] == "shadow"
    replaced = {name for name, spot in on.items() if spot["state"] == "replaced"}
    assert {"alloc_for_decode_default", "alloc_for_spec_decode", "append_beam_tail",
            "_new_tokens_required_next_decode_spec_v2"} <= replaced, on
    assert {name for name, spot in shadow.items() if spot["state"] == "shadow"} == replaced
    for name in replaced:
        assert shadow[name]["compared"] > 0, (name, shadow[name])
        assert shadow[name]["mismatches"] == 0, (name, shadow[name]["first_mismatch"])


def test_shadow_leaves_every_step_as_upstream_does(shadow_runs):
    """Upstream's writes, once: every number and every request's state after
    every step is the same as with kvest off."""
    assert shadow_runs["shadow"]["loops"] == shadow_runs["0"]["loops"]
