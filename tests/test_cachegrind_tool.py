"""tools/cachegrind_hotspots.py counts what it says it counts.

On the batches the tool builds, kvest's side of every hot spot must answer as
upstream's side does and leave the requests as upstream's leaves them -- and
never hand back to upstream's statement: a decline would count upstream's
code as kvest's.  Runs without valgrind, on SGLang 0.5.23 where the tests
have it (CI's foreground downloads every release's wheel).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from sglang_releases import fallbacks, releases

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "cachegrind_hotspots", ROOT / "tools" / "cachegrind_hotspots.py")
assert _spec is not None and _spec.loader is not None
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

TREES = [t for t in releases() if t.version == tool.VERSION]
if not TREES:
    pytest.skip(f"sglang {tool.VERSION} is not available here", allow_module_level=True)
SIZES = [1, 5, 300]  # 300: the kernels' address-order check and, for the selection, the sort


def _state(reqs):
    return [(r.kv.kv_committed_len, r.kv.kv_allocated_len, r.decode_batch_idx, r.beam_group)
            for r in reqs]


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _outcomes(side: str) -> tuple[dict, int]:
    tree = TREES[0]
    out = {}
    before = fallbacks()  # (the process's counters: other tests' calls are in them)
    with tool.hot_spots(side, list(tool.SPOTS), SIZES, str(tree.root), tree.version) as (
            calls, arguments):
        for name, fn in calls.items():
            for n in SIZES:
                args, kwargs = arguments(name, n)
                result = fn(*args, **kwargs)
                reqs = arguments("num_beam_member_rows", n)[0][0]
                if isinstance(result, list) and result and hasattr(result[0], "kv"):
                    result = _state(result)  # the selected requests, by their state
                out[name, n] = (_plain(result), _state(reqs))
        declined = fallbacks() - before
    return out, declined


def test_kvest_answers_as_upstream_and_never_declines():
    upstream, _ = _outcomes("upstream")
    kvest, declined = _outcomes("kvest")
    assert kvest == upstream
    assert declined == 0


def test_every_hot_spot_has_its_passes_said():
    assert set(tool.PASSES) == set(tool.SPOTS)


def test_crossover_reads_the_smallest_size_below():
    dumps = {"upstream": {}, "kvest": {}}
    for n, (up, kv) in {1: (10, 20), 2: (20, 19), 4: (40, 41), 8: (80, 60)}.items():
        for side, value in (("upstream", up), ("kvest", kv)):
            dumps[side][f"x|{n}|warm|call"] = {"Ir": value + 5, "D1": 0, "LL": 0}
            dumps[side][f"x|{n}|warm|empty"] = {"Ir": 5, "D1": 0, "LL": 0}
    label, row = tool.crossover(dumps, "x")
    assert label == "2 (not at 4)"
    assert row[8] == (80, 60)
