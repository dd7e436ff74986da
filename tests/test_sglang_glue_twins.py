"""The compiled glue (``kvest.sglang._glue._DecodeCountGlue``, ``_SpecV2TotalGlue``,
``_BeamTailGlue``, ``_AllocLensGlue``) is its Python twin's equal: on every
input the same answer or the same decline, and the same counters (``kernel``,
``fallbacks``: a statement's glue answers or says DECLINED alike, and the
rewritten function counts that; a whole function's glue counts itself) -- so
the pure-Python build and the compiled one tell an operator the same story.

The twins are made as the plan makes them (``kvest.sglang.glue.make_*``): the
compiled one where kvest's kernel is the compiled kernel, the Python one where
it is another function (here the same kernel behind a wrapper)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from sglang_standins import OWNERS, Own

import kvest
from kvest.sglang import glue, monitor
from kvest.sglang.patterns import by_kind
from kvest.sglang.registry import KINDS

if kvest.IMPLEMENTATION != "cython":
    pytest.skip("the compiled glue is the compiled build's", allow_module_level=True)
from kvest.sglang import _glue


@dataclasses.dataclass(slots=True)
class Kv:
    kv_committed_len: object = 0
    kv_allocated_len: object = 0


class Req:
    def __init__(self, committed, allocated=None, group=None):
        self.kv = Kv(committed, committed + 1 if allocated is None else allocated)
        self.beam_group = group


class Sneaky(Req):
    """A length read through a property: code of the caller's (pure mode refuses it)."""

    @property
    def beam_group(self):
        return None

    @beam_group.setter
    def beam_group(self, value):
        pass


class Big(int):
    pass


def ceil_div(a, b):
    return -(-a // b)


def ceil_align(a, b):
    return ceil_div(a, b) * b


CHECKED = {"ceil_align": ceil_align, "ceil_div": ceil_div}


def _twins(kind, monkeypatch):
    """(compiled, python) glue of ``kind``, each counting into a spot of its own."""
    pattern = by_kind(kind)[0]
    maker = getattr(glue, f"make_{kind}")
    compiled = maker(pattern, f"twins {kind} compiled", CHECKED)
    real = KINDS[kind].function.resolve()  # the registry's kernel of the kind
    name = real.__name__
    monkeypatch.setattr(kvest, name, lambda *a, **k: real(*a, **k))
    python = maker(pattern, f"twins {kind} python", CHECKED)
    monkeypatch.undo()
    assert isinstance(getattr(compiled, "__self__", None), _glue._Glue)
    assert isinstance(python, types.FunctionType)
    return compiled, python


def _outcome(answer):
    """How the rewritten function counts a statement's glue answer."""
    if answer is glue.DECLINED:
        return monitor.FALLBACK
    return monitor.UPSTREAM if answer is glue.HANDED else monitor.KERNEL


def _same(kind, monkeypatch, calls):
    """Each call's answer from both twins: the same answer, or the same marker
    (so the rewritten function counts the same outcome); the outcomes seen."""
    compiled, python = _twins(kind, monkeypatch)
    monitor.STATE.announced = True
    seen = []
    for args in calls:
        answers = [fn(*args) for fn in (compiled, python)]
        assert answers[0] is glue.DECLINED or type(answers[0]) is type(answers[1]), args
        assert answers[0] == answers[1] or answers[0] is answers[1] is glue.DECLINED, args
        assert _outcome(answers[0]) == _outcome(answers[1]), args
        seen.append(_outcome(answers[0]))
    return seen


def test_the_decode_count_twins_agree(monkeypatch):
    reqs = [Req(c) for c in (0, 1, 15, 16, 17, 32, 1000, 2**40)]
    calls = [
        (reqs, 16, sum), (tuple(reqs), 16, sum), ([], 16, sum), (reqs, 1, sum),
        (reqs[:1], 16, sum), (reqs, 0, sum), (reqs, -3, sum), (reqs, 2**63, sum),
        (reqs, 2**62, sum), (reqs, True, sum), (reqs, 16.0, sum), (reqs, Big(16), sum),
        (reqs, 16, lambda xs: 0), (iter(reqs), 16, sum), ("abc", 16, sum),
        ([Req(-1)], 16, sum), ([Req(Big(3))], 16, sum), ([Req(3.0)], 16, sum),
        ([object()], 16, sum), ([Req(2**63)], 16, sum), ([*reqs, None], 16, sum),
    ]
    seen = _same("decode_count", monkeypatch, calls)
    assert {monitor.KERNEL, monitor.FALLBACK} <= set(seen)


def _other_ceil_align(a, b):
    return ceil_align(a, b)


def test_the_spec_v2_twins_agree(monkeypatch):
    reqs = [Req(c, a) for c, a in ((0, 0), (1, 16), (15, 16), (16, 16), (17, 40), (5, 3),
                                   (1000, 1004), (2**40, 2**40 + 3))]
    calls = []
    for total in (0, 7, -3, 2**70, 1.5, True):
        for page, reserve in ((16, 4), (1, 0), (16, 0), (0, 4), (-1, 4), (16, -1),
                              (2**63, 4), (16, 2**62), (16, 2**63), (True, 4), (16, 4.0)):
            calls.append((total, reqs, page, reserve, max, ceil_align))
    for bad in ((0, tuple(reqs), 16, 4, max, ceil_align), (0, [], 16, 4, max, ceil_align),
                (0, reqs, 16, 4, min, ceil_align), (0, reqs, 16, 4, max, _other_ceil_align),
                (0, iter(reqs), 16, 4, max, ceil_align), (0, [Req(-1, 3)], 16, 4, max, ceil_align),
                (0, [Req(3, Big(4))], 16, 4, max, ceil_align),
                (0, [*reqs, object()], 16, 4, max, ceil_align),
                (0, [Req(2**62, 2**62)], 16, 2**62, max, ceil_align)):
        calls.append(bad)
    seen = _same("spec_v2_total", monkeypatch, calls)
    assert {monitor.KERNEL, monitor.FALLBACK} <= set(seen)
    # A helper of the module rebound, or its code replaced in place: both decline.
    compiled, python = _twins("spec_v2_total", monkeypatch)
    monkeypatch.setitem(globals(), "ceil_div", lambda a, b: 0)
    assert compiled(0, reqs, 16, 4, max, ceil_align) is glue.DECLINED
    assert python(0, reqs, 16, 4, max, ceil_align) is glue.DECLINED


def test_the_beam_tail_twins_agree(monkeypatch):
    plain, grouped = [Req(1), Req(2)], [Req(1), Req(2, group=object())]
    calls = []
    for make in OWNERS:
        for reqs in (plain, grouped, [], tuple(plain), [Sneaky(1)], [object()], None):
            calls.append((make(reqs), enumerate))
    calls.append((Own(plain), lambda xs: iter(())))
    seen = _same("beam_tail_loop", monkeypatch, calls)
    assert {monitor.KERNEL, monitor.FALLBACK} <= set(seen)


def _upstream_lens(reqs, *, reserve, page_size):
    """Stands in for upstream's function (the twins must call it where they decline)."""
    return ("upstream", type(reqs).__name__, reserve, page_size)


def _plain_answer(answer):
    if isinstance(answer, tuple) and answer and hasattr(answer[0], "dtype"):
        return ("arrays", str(answer[0].dtype), answer[0].tolist(), answer[1].tolist(),
                answer[2])
    return answer


def test_the_alloc_lens_twins_agree(monkeypatch):
    """The int32 callers' whole function: kvest's int32 arrays, upstream's
    lists below ``lists_below``, or upstream's own function -- the same from
    both twins, counted the same, a shadowed builtin included."""
    pattern = by_kind("alloc_lens_function")[0]
    real = kvest.decode_alloc_plan_from_reqs
    compiled = glue.make_alloc_lens_int32(_upstream_lens, pattern, "twins alloc lens compiled")
    monkeypatch.setattr(kvest, "decode_alloc_plan_from_reqs", lambda *a, **k: real(*a, **k))
    python = glue.make_alloc_lens_int32(_upstream_lens, pattern, "twins alloc lens python")
    monkeypatch.undo()
    assert "run" in compiled.__code__.co_freevars and "run" not in python.__code__.co_freevars
    spots = [monitor.spot(f"twins alloc lens {side}") for side in ("compiled", "python")]
    monitor.STATE.announced = True
    lengths = [(0, 0), (1, 16), (15, 16), (16, 16), (17, 40), (5, 3), (1000, 1004)]
    cases = []
    for n in (0, 1, 7, 8, 20):
        reqs = [Req(*lengths[i % len(lengths)]) for i in range(n)]
        cases += [(reqs, 4, 16), (tuple(reqs), 4, 16), (reqs, 0, 1), (reqs, -1, 16),
                  (reqs, 4, 0), (reqs, 2**63, 16), (reqs, 4, True), (reqs, 4.0, 16),
                  (reqs, np.int64(4), 16), (reqs, 4, np.int64(16)), (reqs, True, 16),
                  (reqs, Big(4), 16), (reqs, 4, Big(16)), (reqs, 4, -1), (reqs, False, 1)]
    cases += [([Req(-1, 3)], 4, 16), ([Req(3, Big(4))], 4, 16), ([Req(2**40, 2**40)], 4, 16),
              ([Req(2**40, 2**40)] * 9, 4, 16), ([object()], 4, 16), (iter([Req(1)]), 4, 16)]

    def run_all():
        for reqs, reserve, page in cases:
            got = [_plain_answer(fn(reqs, reserve=reserve, page_size=page))
                   for fn in (compiled, python)]
            assert got[0] == got[1], (len(reqs) if hasattr(reqs, "__len__") else reqs,
                                      reserve, page, got)
            counts = [(s.calls, s.kernel, s.fallbacks) for s in spots]
            assert counts[0] == counts[1]

    run_all()
    assert spots[0].kernel > 0 and spots[0].fallbacks > 0
    monkeypatch.setitem(globals(), "max", lambda *a: 0)  # upstream's `max` is no longer the builtin
    before = spots[0].kernel
    run_all()
    assert spots[0].kernel == before
