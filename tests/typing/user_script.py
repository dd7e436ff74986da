"""A small user script, type-checked in CI (mypy --strict and basedpyright).

It is what a scheduler author writes against kvest's public API: every public
name used through ``kvest.*``, the results' types asserted with
``assert_type``.  It also runs (tests/test_typing.py), so the types it claims
are the ones it gets.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

import kvest
from kvest import AllocPlan

if TYPE_CHECKING or sys.version_info >= (3, 11):
    from typing import assert_type
else:  # Python 3.10 runs the script too: there assert_type is only checked statically

    def assert_type(value: Any, typ: Any, /) -> Any:
        return value


@dataclass
class Req:
    """A request with SGLang 0.5.11's flat lengths."""

    kv_committed_len: int
    kv_allocated_len: int
    beam_group: object = None  # not a beam-search request


def main() -> None:
    committed = np.array([16, 17, 32, 100], dtype=np.int64)
    allocated = committed + 3
    page_size = 16
    reserve = kvest.alloc_reserve_per_decode(3, 1, 4, page_size)
    assert_type(reserve, int)
    assert_type(kvest.alloc_len_per_decode(3, 1, 4, page_size), int)
    assert_type(kvest.spec_v2_new_tokens(committed, allocated, page_size, reserve), int)
    assert_type(kvest.spec_v2_new_tokens([1, 2], [3, 4], page_size, reserve, [0]), int)
    assert_type(kvest.decode_new_tokens([16, 17, 32], page_size), int)
    assert_type(kvest.num_new_pages(committed + 1, page_size, committed), int)
    assert_type(kvest.num_new_pages(committed + 1, page_size, decode=True), int)
    assert_type(kvest.spec_v1_new_tokens(4, page_size, 3, 1, 4), int)
    plan = kvest.decode_alloc_plan(committed, allocated, page_size, reserve)
    assert_type(plan, AllocPlan)
    assert_type(plan.num_tokens, int)
    assert_type(plan.num_pages, int)

    reqs = [Req(int(c), int(a)) for c, a in zip(committed, allocated, strict=True)]
    assert_type(kvest.spec_v2_new_tokens_from_reqs(reqs, page_size, reserve, layout="flat"), int)
    assert_type(kvest.decode_new_tokens_from_reqs(reqs, page_size, [0, 2]), int)
    plan2 = kvest.decode_alloc_plan_from_reqs(reqs, page_size, reserve, dtype=np.int32)
    assert_type(plan2, kvest.AllocPlan)
    kvest.beam_member_rows_from_reqs(reqs)
    assert_type(kvest.beam_groups_from_reqs(reqs, [0]), int)
    assert_type(kvest.IMPLEMENTATION, str)
    assert_type(kvest.show_config(), dict[str, object])
    print("typing script ran:", plan.num_tokens, plan2.num_tokens)


if __name__ == "__main__":
    main()
