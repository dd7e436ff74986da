"""PyTorch CPU tensors in every role: lengths, indices, scalars, flags, out=.

Skipped when torch is not installed (kvest never imports it).  Kept apart from
tests/test_inputs.py so the sanitizer and valgrind runs, which take that file,
do not load torch.
"""

from __future__ import annotations

import re

import pytest
from helpers import check_same
from test_inputs import ARGUMENTS, JUNK, check_any

import kvest
from kvest import reference

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
def test_torch_holes_closed(impl):
    """Tensors the contract refuses: each a TypeError naming the argument."""
    cases = [
        ((torch.tensor([16, 17]), torch.tensor(True)), "page_size"),
        (([16, 17], torch.tensor(16)), "page_size"),
        (([16, 17], torch.tensor([16])), "page_size"),
        (([torch.tensor(True)], 16), "committed[0]"),
        (([torch.tensor(16)], 16), "committed[0]"),
        ((torch.tensor([True, False]), 16), "committed"),
        ((torch.tensor([16.0], requires_grad=True), 16), "requires grad"),
        ((torch.tensor([16.0]), 16), "committed"),
        ((torch.tensor([16], device="meta"), 16), "CPU"),
    ]
    for args, fragment in cases:
        with pytest.raises(TypeError, match=re.escape(fragment)):
            impl.decode_new_tokens(*args)
        check_same("decode_new_tokens", *args)
    with pytest.raises(TypeError, match="speculative"):
        impl.alloc_len_per_decode(3, 1, 4, 16, speculative=torch.tensor(True))


def test_torch_tensors_read_without_copy():
    c = torch.tensor([5, 16, 31, 0, 100], dtype=torch.int64)
    a = torch.tensor([8, 16, 32, 0, 96], dtype=torch.int32)
    assert check_same("spec_v2_new_tokens", c, a, 16, 6) == ("ok", 64)
    assert check_same("decode_new_tokens", c[1::2], 16) == ("ok", 32)  # strided view: 16, 0
    assert check_same("num_new_pages", c + 1, 16, decode=True) == ("ok", 2)


@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_out_takes_torch_cpu_tensors(impl, dtype):
    cur = torch.full((5,), -1, dtype=getattr(torch, dtype))
    nxt = torch.full((5,), -1, dtype=getattr(torch, dtype))
    plan = impl.decode_alloc_plan([5, 16, 31, 0, 100], [8, 16, 32, 0, 96], 16, 6,
                                  out=(cur, nxt))
    assert plan.cur is cur and plan.nxt is nxt
    assert nxt.tolist() == [16, 32, 48, 16, 112] and cur.tolist() == [8, 16, 32, 0, 96]
    assert (plan.num_tokens, plan.num_pages) == (72, 4)


@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
def test_out_tensor_holes(impl):
    c, a = [1, 2, 3], [1, 2, 3]
    base = torch.zeros(6, dtype=torch.int64)
    lengths = torch.tensor([1, 2, 3])
    cases = [
        ((base[:3], base[:3]), ValueError, "overlap"),
        ((base[:3], base[1:4]), ValueError, "overlap"),
        ((base[::2], base[3:]), ValueError, "C-contiguous"),
        ((torch.zeros(3), torch.zeros(3)), TypeError, "out[0]"),
        ((torch.zeros(3, dtype=torch.int32), base[3:]), TypeError, "same dtype"),
        ((torch.zeros(3, requires_grad=True), base[3:]), TypeError, "requires grad"),
    ]
    for out, exc, fragment in cases:
        with pytest.raises(exc, match=re.escape(fragment)):
            impl.decode_alloc_plan(c, a, 16, 2, out=out)
    with pytest.raises(ValueError, match="overlaps committed"):
        impl.decode_alloc_plan(lengths, a, 16, 2, out=(lengths, base[3:]))


TORCH_JUNK = [torch.tensor(16), torch.tensor([16]), torch.tensor([True, False]),
              torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([16, 17]),
              torch.tensor([16, 17], dtype=torch.int32)[::2], torch.zeros((2, 2), dtype=int)]


@pytest.mark.parametrize(("name", "args", "kwargs", "where"), ARGUMENTS,
                         ids=[f"{n}-{w}" for n, _, kw, w in ARGUMENTS])
def test_every_argument_takes_any_tensor(name, args, kwargs, where):
    check_any(name, args, kwargs, where, TORCH_JUNK)


def test_junk_list_has_no_tensors():
    assert not any(type(v).__module__.startswith("torch") for v in JUNK)
