"""Exact everywhere: a real-allocator decode loop gives the same numbers with kvest on and off.

Two processes are started the same way, one with ``KVEST_SGLANG=0``; each
calls SGLang's own ``load_plugins()`` and runs the loops of
``kvest._bench.sglang_world.LOOP_CASES``: real ``Req``, ``ScheduleBatch``,
``ReqToTokenPool`` and ``PagedTokenToKVPoolAllocator(device="cpu")`` (its slot
search too), random lengths, page sizes 1 and 16, no speculation and EAGLE
(3, 1, 4), several steps through ``check_decode_mem()`` and
``prepare_for_decode()`` / ``eagle_prepare_for_decode()``, a ``retract_decode()``
with 3 retractions, and more steps.  Every number a step returns (the
estimate, whether it fits, the slots handed out, what was retracted) and
every request's state after each step (``kv_committed_len``,
``kv_allocated_len``, ``decode_batch_idx``, its ``req_to_token`` row, the
pool's free pages) must be the same.

Skipped where the real SGLang scheduler does not import, except under
``KVEST_REQUIRE_REAL_SGLANG=1`` (CI), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sglang_releases import real_sglang_missing

try:
    import sglang.srt.managers.schedule_batch
    import sglang.srt.mem_cache.allocator.paged  # noqa: F401
    import torch  # noqa: F401
except Exception as exc:  # not a real SGLang environment
    pytest.skip(real_sglang_missing(exc), allow_module_level=True)

from kvest._bench.sglang_world import LOOP_CASES


def _run(kvest_on: bool) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore::UserWarning")
    env.pop("KVEST_SGLANG", None)
    if not kvest_on:
        env["KVEST_SGLANG"] = "0"
    done = subprocess.run([sys.executable, "-m", "kvest._bench.sglang_world"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def loops() -> dict[str, dict]:
    return {"upstream": _run(False), "kvest": _run(True)}


def test_each_side_runs_what_it_should(loops):
    assert loops["upstream"]["mode"] == "off"
    kv = loops["kvest"]
    assert kv["mode"] == "on"
    for name in ("new_tokens_required_next_decode", "_new_tokens_required_next_decode_spec_v2",
                 "page_aligned_decode_alloc_lens", "get_num_new_pages",
                 "alloc_for_spec_decode", "append_beam_tail", "alloc_for_decode_default"):
        assert kv["hotspots"][name] == "replaced", (name, kv["hotspots"])
        # and the loops ran on its kernels (none declined every call)
        assert kv["kernel_calls"][name] > 0, (name, kv["kernel_calls"])
    # The batch-index loops and the selection lists are upstream's: faster than
    # kvest's (a dict store per request; the exact-int check of every index).
    for name in ("prepare_for_decode", "eagle_prepare_for_decode", "check_decode_mem",
                 "num_beam_member_rows"):
        assert kv["hotspots"][name] == "skipped", (name, kv["hotspots"])


@pytest.mark.parametrize("case", range(len(LOOP_CASES)),
                         ids=[f"{a or 'no-spec'}-p{p}-n{n}" for a, p, n, _ in LOOP_CASES])
def test_decode_loop_is_exact(loops, case):
    up = loops["upstream"]["loops"][case]["steps"]
    kv = loops["kvest"]["loops"][case]["steps"]
    assert len(up) == len(kv)
    for i, (a, b) in enumerate(zip(up, kv, strict=True)):
        for key in a:
            assert a[key] == b[key], f"step {i}: {key} differs"
    # The loop did what it is for: it retracted, and the requests moved on.
    retract = next(s["retract"] for s in up if "retract" in s)
    n = LOOP_CASES[case][2]
    assert len(retract[0]) + len(retract[2]) == min(3, n - 1)
    assert max(up[-1]["decode_batch_idx"]) >= 7
