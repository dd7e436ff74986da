"""Edges of the SGLang glue, in both builds: scalars the int32 alloc lens was
not proven for give upstream's outcome; code run in the middle of the max
loop that rebinds ``max`` sees upstream's loop; a second ``patch()`` where
kvest already runs leaves ``status()`` telling what runs.

On stand-in modules built from the newest release at hand.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sglang_releases import check_required, nested_releases, releases
from sglang_standins import request_class

import kvest
import kvest.sglang
from kvest.sglang import glue, parity
from kvest.sglang.upstream import standin_tree

check_required(releases())
NESTED = nested_releases()
if not NESTED:
    pytest.skip("no sglang release 0.5.19+ available", allow_module_level=True)
NEWEST = NESTED[-1]
CALLER = "sglang.srt.speculative.eagle_utils"
SIZING = "sglang.srt.mem_cache.allocation_sizing"


class Big(int):
    pass


# Scalars the kernel was not proven for (not exact ints in its range), and
# the edges of the ones it was.
SCALARS = [np.int64(4), np.int32(16), True, False, 0, -1, Big(16), 2**63, 4.0, 1, 16]


def _outcome(fn, *args, **kwargs):
    """An answer as upstream's lists (element types kept) or the exception."""
    try:
        answer = fn(*args, **kwargs)
    except Exception as exc:
        return ("raise", type(exc), str(exc))
    return ("answer", [(type(x), x.tolist() if isinstance(x, np.ndarray) else x,
                        [type(v) for v in x] if isinstance(x, list) else None)
                       for x in answer])


def _same(expected, got):
    """kvest's int32 arrays stand for upstream's lists of exact ints only."""
    if expected == got:
        return True
    if expected[0] != "answer" or got[0] != "answer":
        return False
    for (etype, evalue, eitems), (gtype, gvalue, _) in zip(expected[1], got[1], strict=True):
        if gtype is np.ndarray:
            if not (etype is list and set(eitems) <= {int} and evalue == gvalue):
                return False
        elif (etype, evalue, eitems) != (gtype, gvalue, _):
            return False
    return True


@pytest.mark.parametrize("n", [0, 1, 9])
def test_the_alloc_lens_scalars_give_upstreams_outcome(n):
    """``reserve`` and ``page_size`` as NumPy ints, bools, 0, -1, an int
    subclass, a float, out of int64: the same answer (element types included)
    or the same exception as upstream's function, for the int32 callers' form
    and the loop's."""
    with standin_tree(NEWEST) as tree:
        if not tree.has("alloc_lens"):
            pytest.skip(f"sglang {tree.version} has no page_aligned_decode_alloc_lens")
        make = request_class(tree.layout())
        reqs = [make(16 * (i % 3) + i % 2, 16 * (i % 3) + 5) for i in range(n)]
        places = [tree.modules[CALLER], tree.modules[SIZING]]
        cases = [(r, p) for r in SCALARS for p in SCALARS]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (NumPy's division by zero, upstream's)
            expected = [[_outcome(m.page_aligned_decode_alloc_lens, reqs, reserve=r,
                                  page_size=p) for m in places] for r, p in cases]
            with kvest.sglang.patch():
                assert all(hasattr(m.page_aligned_decode_alloc_lens, "__kvest_original__")
                           for m in places)
                got = [[_outcome(m.page_aligned_decode_alloc_lens, reqs, reserve=r,
                                 page_size=p) for m in places] for r, p in cases]
    bad = [(case, e, g) for case, es, gs in zip(cases, expected, got, strict=True)
           for e, g in zip(es, gs, strict=True) if not _same(e, g)]
    assert not bad, bad[:3]


class Rebinds:
    """A value whose comparison rebinds the module's ``max`` (to one that keeps
    the current length): upstream's loop uses the new ``max`` from its next
    pass on."""

    def __init__(self, value, namespace):
        self.value, self.namespace = value, namespace

    def __gt__(self, other):
        _keeps_current(self.namespace)
        return True

    def __repr__(self):
        return f"Rebinds({self.value})"


def _keeps_current(namespace):
    namespace["max"] = lambda current, value: current


def _rebinding_kv(req, namespace):
    """req, its ``kv`` now a property that rebinds the module's ``max`` (to
    one that keeps the current length) each time it is read."""

    class RebindingKv(type(req)):
        @property
        def kv(self):
            _keeps_current(namespace)
            return self.__dict__["held_kv"]

    req.__dict__["held_kv"] = req.__dict__.pop("kv")
    req.__class__ = RebindingKv
    return req


def _max_world(namespace, make, via):
    """Four requests and values, the second pair rebinding ``max`` ``via`` a
    value's ``__gt__`` or the request's ``kv`` property."""
    reqs = [make(c, c) for c in (5, 16, 31, 40)]
    values = [8, 20, 64, 80]
    if via == "value":
        values[1] = Rebinds(20, namespace)
    else:
        reqs[1] = _rebinding_kv(reqs[1], namespace)
    return reqs, values


@pytest.mark.parametrize("via", ["value", "request"])
def test_code_that_rebinds_max_mid_loop_sees_upstreams_loop(via):
    """``alloc_for_spec_decode``'s max loop, where the second pass runs code
    that rebinds the module's ``max`` (a value's ``__gt__``, or the request's
    ``kv`` property): the requests end as upstream's loop leaves them (its
    later passes use the new ``max``)."""
    with standin_tree(NEWEST) as tree:
        analysis, found = parity.found_statement(tree, "alloc_for_spec_decode",
                                                 "max_allocated_loop")
        alone, swapped, params = parity.statement_pair(analysis, found,
                                                       "alloc_for_spec_decode")
        namespace = alone.__globals__
        make = request_class(tree.layout())
        ends = []
        for fn in (alone, swapped):
            assert "max" not in namespace
            reqs, values = _max_world(namespace, make, via)
            args = {found.name("reqs"): reqs, found.name("values"): values}
            try:
                fn(*[args[p] for p in params])
                ends.append([(r.kv.kv_committed_len, repr(r.kv.kv_allocated_len))
                             for r in reqs])
            finally:
                namespace.pop("max", None)  # (reading a rebinding kv rebinds it again)
    assert ends[1] == ends[0]
    assert [a for _, a in ends[0]][2:] == ["31", "40"]  # (upstream kept them: the new max)


@pytest.mark.parametrize("values", [
    [1, 2, 3], (1, 2), [], [1, True], [1, Big(2)], [1, 2.0], iter([1]), None, [1, object()]])
def test_exact_ints_twins_agree(values):
    from kvest.sglang import glue as g

    assert g.exact_ints(values) is g._exact_ints_rule(values)
    assert g.exact_ints(values) is (type(values) in (list, tuple)
                                    and all(type(v) is int for v in values))


@pytest.mark.parametrize("first,second", [(False, True), (True, False), (False, False)])
def test_a_second_patch_leaves_status_telling_what_runs(first, second):
    """``patch()`` where kvest already runs changes nothing: the functions, the
    mode and each hot spot's state stay those of what runs; its handle undoes
    nothing, the first one's still does."""
    with standin_tree(NEWEST) as tree:
        cls = tree.batch_class
        original = vars(cls)["new_tokens_required_next_decode"]
        handle = kvest.sglang.patch(shadow=first)
        running = vars(cls)["new_tokens_required_next_decode"]
        before = kvest.sglang.status()
        try:
            with pytest.warns(RuntimeWarning, match="already runs in this process"):
                again = kvest.sglang.patch(shadow=second)
            assert again.replaced == []
            after = kvest.sglang.status()
            assert after["mode"] == before["mode"] == ("shadow" if first else "on")
            assert after["reason"] == before["reason"]
            assert {k: s["state"] for k, s in after["hotspots"].items()} == \
                {k: s["state"] for k, s in before["hotspots"].items()}
            assert after["hotspots"]["new_tokens_required_next_decode"]["state"] == \
                ("shadow" if first else "replaced")
            again.undo()
            assert vars(cls)["new_tokens_required_next_decode"] is running
            assert kvest.sglang.status()["mode"] == before["mode"]
        finally:
            handle.undo()
        assert vars(cls)["new_tokens_required_next_decode"] is original
        # undone: a new patch plans again
        with kvest.sglang.patch(shadow=second):
            assert kvest.sglang.status()["mode"] == ("shadow" if second else "on")


def test_handed_and_declined_are_apart():
    assert glue.HANDED is not glue.DECLINED
    assert repr(glue.HANDED) == "kvest.sglang.glue.HANDED"
