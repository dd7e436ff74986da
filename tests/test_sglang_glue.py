"""The drop-in under Python code that runs mid-call: every kernel runs in pure
mode, so a request whose read or write would run code of its own (a property,
``__setattr__``) is upstream's statement's alone -- each read and write made
once, as upstream makes them, never a write made twice.

On stand-in modules built from the newest release at hand with the nested
layout (0.5.19+), statements taken out alone (:mod:`kvest.sglang.parity`).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from sglang_releases import check_required, nested_releases, releases

import kvest
import kvest.sglang
from kvest.sglang import parity
from kvest.sglang.upstream import standin_tree

check_required(releases())
NESTED = nested_releases()
if not NESTED:
    pytest.skip("no sglang release 0.5.19+ available", allow_module_level=True)
NEWEST = NESTED[-1]


class Watched:
    """``req.kv`` whose lengths are properties: every read and write is logged,
    and each read of the committed length gives one more than the last."""

    def __init__(self, committed, allocated, log):
        self._c, self._a, self.log = committed, allocated, log

    @property
    def kv_committed_len(self):
        self.log.append(("read c", self._c))
        self._c += 1
        return self._c - 1

    @kv_committed_len.setter
    def kv_committed_len(self, value):
        self.log.append(("write c", value))
        self._c = value

    @property
    def kv_allocated_len(self):
        self.log.append(("read a", self._a))
        return self._a

    @kv_allocated_len.setter
    def kv_allocated_len(self, value):
        self.log.append(("write a", value))
        self._a = value


@dataclasses.dataclass
class Req:
    kv: object
    decode_batch_idx: int = 0
    beam_group: object = None


def _world(log):
    plain = [parity.NestedReq(c, c + 3) for c in (5, 16, 31)]
    for r in plain:
        r.decode_batch_idx = 0
    return [*plain[:2], Req(Watched(40, 41, log)), plain[2]]


def _targets():
    """Every statement of a kind kvest has glue for, in the release's hot spots
    (also where kvest leaves it to upstream's faster loop)."""
    from kvest.sglang.registry import HOTSPOTS, KINDS

    found = []
    with standin_tree(NEWEST) as tree, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for spot in HOTSPOTS.values():
            for kind in spot.kinds:
                if KINDS[kind].whole:
                    continue
                try:
                    analysis, statement = parity.found_statement(tree, spot.name, kind)
                except (KeyError, StopIteration, IndexError):
                    continue  # not in this release
                found.append((spot.name, analysis, statement))
    return found


@pytest.mark.parametrize("case", _targets(), ids=lambda c: f"{c[0]}:{c[2].pattern.id}")
def test_code_run_by_a_request_is_upstreams_alone(case):
    """Each swapped statement on a batch with one request whose lengths are
    properties: the same answer, the same reads and writes in the same order,
    and the same state afterwards as upstream's statement alone."""
    name, analysis, found = case
    with standin_tree(NEWEST) as tree:
        alone, swapped, params = parity.statement_pair(analysis, found, name)
        make = parity.request_maker(tree.layout())

        def args_for(log):
            world = parity.World(parity.random.Random(0), make, beams=False)  # twins
            world.reqs = _world(log)
            return [parity.ROLES.get(parity._role(found, p), lambda w: None)(world)
                    for p in params]

        upstream_log: list = []
        kvest_log: list = []
        upstream_args, kvest_args = args_for(upstream_log), args_for(kvest_log)
        expected = parity._seen(parity._outcome(alone, *upstream_args))
        got = parity._seen(parity._outcome(swapped, *kvest_args))
    assert got == expected
    assert kvest_log == upstream_log
    assert parity._state(kvest_args) == parity._state(upstream_args)


def test_a_property_that_raises_after_a_write_leaves_upstreams_state():
    """A writer never writes and then hands over: with a setter that raises on
    the third request, the first two are written once each, as by the loop."""

    class Failing(Watched):
        @property
        def kv_allocated_len(self):
            return self._a

        @kv_allocated_len.setter
        def kv_allocated_len(self, value):
            raise ArithmeticError("setter")

    def world():
        reqs = [parity.NestedReq(c, c) for c in (1, 2, 4)]
        for r in reqs:
            r.decode_batch_idx = 0
        return [*reqs[:2], Req(Failing(3, 3, [])), reqs[2]]

    cases = [c for c in _targets() if c[2].pattern.kind == "add_lengths_loop"]
    if not cases:
        pytest.skip("no adding loop in this release")
    name, analysis, found = cases[0]
    with standin_tree(NEWEST):
        alone, swapped, params = parity.statement_pair(analysis, found, name)
        assert params == (found.name("owner"), found.name("delta"))
        import types

        expected_world, got_world = world(), world()
        expected = parity._outcome(alone, types.SimpleNamespace(reqs=expected_world), 5)
        got = parity._outcome(swapped, types.SimpleNamespace(reqs=got_world), 5)
    assert got == expected and expected[0] == "raise"
    assert parity._state(got_world) == parity._state(expected_world)
    assert [r.kv.kv_allocated_len for r in got_world[:2]] == [6, 7]  # once each


def test_pure_mode_is_what_the_glue_asks_for():
    reqs = [Req(Watched(1, 2, []))]
    with pytest.raises(kvest.ImpureRequest):
        kvest.decode_new_tokens_from_reqs(reqs, 16, layout="nested", exact_ints=True, pure=True)
    assert reqs[0].kv.log == []  # nothing of the request's code ran
