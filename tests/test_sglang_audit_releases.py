"""The audit driver across releases: what it meets that differs by release is
read once from the release's own classes (``audit_run.features``), each way.

Stand-ins here (no SGLang needed) give the driver a class with or without each
feature; the installed release (where there is one) is checked against its own
source, and the driver's CPU stand-ins for the paged allocator's Triton kernels
(releases up to 0.5.21 have no CPU path) against the release's own naive path
and against the Triton kernels themselves, run by Triton's CPU interpreter.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from array import array
from types import SimpleNamespace

import pytest

from kvest.sglang import audit_run as ar


class Params:
    def __init__(self, max_new_tokens):
        self.max_new_tokens = max_new_tokens


class ReqBase:
    def __init__(self, rid=None, text=None, ids=None, params=None):
        self.output_ids = array("q")


class ListReq(ReqBase):  # before 0.5.13: token ids in lists
    def __init__(self, *args):
        self.output_ids = []


OLD_SPEC = SimpleNamespace()  # before 0.5.15: no spec_prepare_for_decode
NEW_SPEC = SimpleNamespace(spec_prepare_for_decode=print)


class OldReq(ReqBase):  # 0.5.15-0.5.21: the extend is a Range
    def set_extend_range(self, start, end):
        self.extend_range = (start, end)


class OldestReq(ListReq):  # 0.5.11-0.5.14: init_next_round_input sets the whole extend
    def set_extend_input_len(self, n):
        self.extend_input_len = n


class NewReq(ReqBase):  # 0.5.22+: prefix_len and extend_end attributes
    pass


def release_old(req, tree_cache, is_insert=True):
    pass


def release_new(req, tree_cache, *, checkpoint):
    pass


class OldCache:
    def inc_lock_ref(self, node):
        pass


class NewCache(OldCache):
    def lock(self, node):
        return ("lock", node)


class OldBatch:  # before 0.5.19: the retract loop is given the server args
    def retract_decode(self, server_args):
        pass


class NewBatch:
    def retract_decode(self):
        pass


def test_features_each_way():
    old = ar.features(OldReq, SimpleNamespace(release_kv_cache=release_old),
                      SimpleNamespace(alloc_extend_naive=None), OldCache, OldBatch, OLD_SPEC,
                      Params)
    new = ar.features(NewReq, SimpleNamespace(release_kv_cache=release_new),
                      SimpleNamespace(alloc_extend_naive=None, alloc_decode_naive=None),
                      NewCache, NewBatch, NEW_SPEC, Params)
    assert old._replace(token_ids=None) == ar.Features(
        extend=ar.Extend.RANGE, release_flag="is_insert", paged_cpu=False, tree_lock=False,
        retract_args=True, draft_prepares=True, token_ids=None)
    assert new._replace(token_ids=None) == ar.Features(
        extend=ar.Extend.END, release_flag="checkpoint", paged_cpu=True, tree_lock=True,
        retract_args=False, draft_prepares=False, token_ids=None)
    assert old.token_ids([1, 2]) == array("q", [1, 2])
    oldest = ar.features(OldestReq, SimpleNamespace(release_kv_cache=release_old),
                         SimpleNamespace(alloc_extend_naive=None), OldCache, OldBatch, None,
                         Params)
    assert oldest.extend is ar.Extend.INPUT_LEN and oldest.draft_prepares
    assert oldest.token_ids is list


def test_a_release_kv_cache_with_neither_keyword_is_not_guessed():
    with pytest.raises(StopIteration):
        ar.features(NewReq, SimpleNamespace(release_kv_cache=lambda req, cache: None),
                    SimpleNamespace(), NewCache, NewBatch, NEW_SPEC, Params)


def _req(cls, fill, prefix):
    req = cls()
    req.full_untruncated_fill_ids = list(range(fill))
    req.prefix_indices = list(range(prefix))
    req.prefix_len = prefix
    return req


@pytest.mark.parametrize("extend", list(ar.Extend))
def test_the_extend_is_set_the_way_the_release_has_it(monkeypatch, extend):
    s = SimpleNamespace(has=ar.Features(extend, "checkpoint", True, True, False, False, list))
    monkeypatch.setattr(ar, "sg", lambda: s)
    req = _req({ar.Extend.RANGE: OldReq, ar.Extend.INPUT_LEN: OldestReq,
                ar.Extend.END: NewReq}[extend], 40, 13)
    assert ar._extend_all(req) == (13, 40)
    assert hasattr(req, "extend_range") == (extend is ar.Extend.RANGE)
    assert hasattr(req, "extend_end") == (extend is ar.Extend.END)
    if extend is ar.Extend.RANGE:
        assert req.extend_range == (13, 40)
    elif extend is ar.Extend.END:
        assert req.extend_end == 40
    else:  # left as init_next_round_input set it
        assert not hasattr(req, "extend_input_len")


def test_admission_takes_the_tree_lock_where_the_release_has_one(monkeypatch):
    s = SimpleNamespace(has=ar.Features(ar.Extend.END, "checkpoint", True, True, False, False,
                                        list))
    monkeypatch.setattr(ar, "sg", lambda: s)
    world = object.__new__(ar.World)
    world.cache = NewCache()
    req = SimpleNamespace(last_node="node")
    world._lock_prefix(req)
    assert req.lock == ("lock", "node")


def test_a_kernel_launch_calls_the_function_whatever_the_grid():
    calls = []
    launch = ar._Launch(lambda *a: calls.append(a))
    launch[(3,)](1, 2)
    assert calls == [(1, 2)]


# ---------------------------------------------------------------- the installed release

try:
    import sglang.srt.managers.schedule_batch as sb
    import torch
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.allocator import paged
    from sglang.srt.mem_cache.radix_cache import RadixCache
except Exception:  # not a real SGLang environment
    sb = None

real = pytest.mark.skipif(sb is None, reason="no SGLang scheduler here")


@real
def test_the_installed_release_is_read_as_its_source_says():
    has = ar.sg().has
    req_source = inspect.getsource(sb.Req)
    assert (has.extend is ar.Extend.RANGE) == ("def set_extend_range" in req_source)
    assert (has.extend is ar.Extend.INPUT_LEN) == ("def set_extend_input_len" in req_source)
    assert (has.extend is ar.Extend.END) == ("self.extend_end" in req_source)
    release = inspect.getsource(common.release_kv_cache)
    assert f"{has.release_flag}: bool" in release.splitlines()[0]
    assert has.paged_cpu == ("def alloc_decode_naive" in inspect.getsource(paged))
    assert has.tree_lock == any("def lock(" in inspect.getsource(c)
                                for c in RadixCache.__mro__ if c is not object)
    retract = inspect.getsource(sb.ScheduleBatch.retract_decode)
    assert has.retract_args == ("server_args" in retract.split(")", 1)[0])


@real
def test_the_installed_release_without_set_extend_range_reads_as_newer(monkeypatch):
    if not hasattr(sb.Req, "set_extend_range"):
        monkeypatch.setattr(sb.Req, "set_extend_range", lambda self, a, b: None,
                            raising=False)
        assert ar.features(sb.Req, common, paged, RadixCache, sb.ScheduleBatch, None,
                           ar.sg().SamplingParams).extend is ar.Extend.RANGE
    else:
        monkeypatch.delattr(sb.Req, "set_extend_range")
        assert ar.features(sb.Req, common, paged, RadixCache, sb.ScheduleBatch, None,
                           ar.sg().SamplingParams).extend is not ar.Extend.RANGE


def _cases(seed, n=200, sizes=(1, 7, 16)):
    """Random batches for the allocator kernels: (prefix, seq, last_loc of the
    prefix's last token, free pages, page, last_loc of token seq - 2)."""
    import random

    rng = random.Random(seed)
    made = 0
    while made < n:
        page = rng.choice(sizes)
        bs = rng.randint(1, 6)
        seq = [rng.randint(1, 90) for _ in range(bs)]
        prefix = [rng.randint(0, s - 1) for s in seq]
        pages = rng.sample(range(50, 400), 60)
        last = [(rng.randrange(1, 40) * page - 1 if p % page == 0 else
                 rng.randrange(1, 40) * page + p % page - 1) for p in prefix]
        decode_last = [rng.randrange(1, 40) * page + (s - 2) % page for s in seq]
        need = sum(-(-s // page) - -(-p // page) for p, s in zip(prefix, seq, strict=True))
        if need > len(pages):  # a short pool: the allocator discards what the kernel wrote
            continue
        made += 1
        yield prefix, seq, last, pages, page, decode_last


def _t(values):
    return torch.tensor(values, dtype=torch.int64)


@real
def test_the_decode_standin_is_the_releases_own_decode_path():
    naive = getattr(paged, "alloc_decode_naive", None)
    if naive is None:
        pytest.skip(f"sglang {ar.sg().version} has no alloc_decode_naive")
    for _, seq, _, pages, page, last in _cases(1):
        seq_t, last_t = _t(seq), _t(last)
        mine = torch.empty(len(seq), dtype=torch.int64)
        theirs = torch.empty(len(seq), dtype=torch.int64)
        ar.alloc_decode_cpu(seq_t, last_t, _t(pages), mine, 8, page)
        new_pages = int(((seq_t + page - 1) // page - (seq_t + page - 2) // page).sum())
        naive(seq_t, last_t, _t(pages), theirs, page, new_pages)
        assert mine.tolist() == theirs.tolist(), (seq, last, page)


KERNELS = textwrap.dedent("""
    import json, sys, torch
    from sglang.kernels.ops.memory.allocator import alloc_decode_kernel, alloc_extend_kernel
    from kvest.sglang import audit_run as ar
    cases = json.loads(sys.stdin.read())
    bad = []
    t = lambda v: torch.tensor(v, dtype=torch.int64)
    for prefix, seq, last, pages, page, dlast in cases:
        bs, up = len(seq), 1 << (len(seq) - 1).bit_length()
        n = sum(s - p for p, s in zip(prefix, seq))
        a, b = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        alloc_extend_kernel[(bs,)](t(prefix), t(seq), t(last), t(pages), a, up, page)
        ar.alloc_extend_cpu(t(prefix), t(seq), t(last), t(pages), b, up, page)
        if a.tolist() != b.tolist():
            bad.append(("extend", prefix, seq, last, page))
        a, b = torch.empty(bs, dtype=torch.int64), torch.empty(bs, dtype=torch.int64)
        alloc_decode_kernel[(bs,)](t(seq), t(dlast), t(pages), a, up, page)
        ar.alloc_decode_cpu(t(seq), t(dlast), t(pages), b, up, page)
        if a.tolist() != b.tolist():
            bad.append(("decode", seq, dlast, page))
    print(json.dumps({"cases": len(cases), "bad": bad[:3], "nbad": len(bad)}))
""")


@real
def test_the_kernel_standins_compute_what_the_triton_kernels_compute():
    """The kernels themselves, run on the CPU by Triton's interpreter."""
    import importlib.util
    import json

    if importlib.util.find_spec("triton") is None or importlib.util.find_spec(
            "sglang.kernels.ops.memory.allocator") is None:
        pytest.skip("no Triton allocator kernels in this release")
    # page sizes the extend kernel compiles for (tl.arange over a page: a power of two)
    cases = list(_cases(2, 60, sizes=(1, 4, 16)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", KERNELS], input=json.dumps(cases),
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["cases"] == len(cases) and answer["nbad"] == 0, answer


@real
def test_prefix_sharing_with_eviction_is_driven_clean():
    """The prefix locked for the request's life: eviction then never takes a
    running request's prefix (0.5.15-0.5.21 asserted 'parent does not have
    child key' when the driver did not take the lock)."""
    from kvest.sglang import audit

    ar.sg()
    audit.install(every=1)
    try:
        for config in ("token p=1 spec=none plain sharing seed=0",
                       "paged p=16 spec=EAGLE(3,1,4) plain sharing seed=16"):
            result = ar.run(ar.Config.parse(config), 120)
            assert result.outcome is ar.Outcome.DRIVEN, (config, result.ended)
            assert result.skipped is None and not result.bad, config
            assert result.exercised["evictions"] > 0 and result.exercised["prefix_hits"] > 0
    finally:
        audit.uninstall()
        audit.reset()
