"""Input rules of SPEC.md: accepted containers, no copies, bad inputs, no mutation."""

from __future__ import annotations

import array
import re

import numpy as np
import pytest
from helpers import check_same

import kvest
from kvest import reference

BIG = 2**63 - 1
OK_C = [5, 16, 31]
OK_A = [8, 16, 32]


class ArrayOnly:
    """Exposes only __array__ (like a PyTorch CPU tensor, without PyTorch)."""

    def __init__(self, values, dtype=np.int64):
        self._arr = np.asarray(values, dtype=dtype)

    def __array__(self, dtype=None, copy=None):
        return self._arr if dtype is None else self._arr.astype(dtype)


class DLPackOnly:
    """Exposes only the DLPack protocol."""

    def __init__(self, values, dtype=np.int64):
        self._arr = np.asarray(values, dtype=dtype)

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


CONTAINERS = {
    "list": list,
    "tuple": tuple,
    "range-like": lambda v: range(v[0], v[0] + 1) if len(v) == 1 else list(v),
    "int64": lambda v: np.array(v, np.int64),
    "int32": lambda v: np.array(v, np.int32),
    "int8": lambda v: np.array(v, np.int8),
    "uint8": lambda v: np.array(v, np.uint8),
    "uint32": lambda v: np.array(v, np.uint32),
    "uint64": lambda v: np.array(v, np.uint64),
    "longlong": lambda v: np.array(v, np.longlong),
    "big-endian": lambda v: np.array(v, ">i8"),
    "strided": lambda v: np.repeat(np.array(v, np.int64), 2)[::2],
    "reversed": lambda v: np.array(v[::-1], np.int64)[::-1],
    "read-only": lambda v: _readonly(np.array(v, np.int64)),
    "array.array": lambda v: array.array("q", v),
    "array.array-i": lambda v: array.array("i", v),
    "memoryview": lambda v: memoryview(np.array(v, np.int64)),
    "__array__": ArrayOnly,
    "__dlpack__": DLPackOnly,
    "numpy-scalars": lambda v: [np.int32(x) for x in v],
}


def _readonly(arr):
    arr.flags.writeable = False
    return arr


@pytest.mark.parametrize("make", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_accepted_containers(make):
    """Every container gives the reference's answer on plain lists; none is modified."""
    expected = reference.spec_v2_new_tokens(OK_C, OK_A, 16, 6)
    assert check_same("spec_v2_new_tokens", make(OK_C), make(OK_A), 16, 6) == ("ok", expected)
    assert check_same("decode_new_tokens", make(OK_C), 16) == (
        "ok", reference.decode_new_tokens(OK_C, 16))
    assert check_same("num_new_pages", make(OK_C), 16, make(OK_A)) == (
        "ok", reference.num_new_pages(OK_C, 16, OK_A))
    assert check_same("spec_v2_new_tokens", OK_C, OK_A, 16, 6, indices=make([2, 0])) == (
        "ok", reference.spec_v2_new_tokens(OK_C, OK_A, 16, 6, indices=[2, 0]))
    assert check_same("decode_alloc_plan", make(OK_C), make(OK_A), 16, 6)[0] == "ok"
    empty = make([])
    assert check_same("decode_new_tokens", empty, 16) == ("ok", 0)


@pytest.mark.skipif(kvest.IMPLEMENTATION != "cython", reason="the compiled fast path")
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_contiguous_native_arrays_are_read_in_place(monkeypatch, dtype):
    """Contiguous int32/int64 arrays never reach the converting code path."""
    from kvest import _kernels

    def refuse(obj, name):
        raise AssertionError(f"{name} was converted")

    monkeypatch.setattr(_kernels, "as_lengths", refuse)
    c, a = np.array(OK_C, dtype), np.array(OK_A, dtype)
    assert kvest.spec_v2_new_tokens(c, a, 16, 6) == 32
    assert kvest.decode_new_tokens(c, 16) == 16
    assert kvest.num_new_pages(c, 16, a) == 0
    assert kvest.decode_alloc_plan(c, a, 16, 6).num_pages == 2


def test_torch_tensors_if_installed():
    torch = pytest.importorskip("torch")
    c = torch.tensor(OK_C, dtype=torch.int64)
    a = torch.tensor(OK_A, dtype=torch.int32)
    assert kvest.spec_v2_new_tokens(c, a, 16, 6) == 32
    with pytest.raises(TypeError):
        kvest.decode_new_tokens(torch.tensor([1.0]), 16)


def test_kvest_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, kvest, numpy as np; kvest.spec_v2_new_tokens([1], [1], 16, 2);"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# (function, args, kwargs, exception, message fragment)
BAD_INPUTS = [
    ("spec_v2_new_tokens", ([1.0], [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (np.array([1.5]), [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", ([1], np.array([True]), 16, 2), {}, TypeError, "allocated"),
    ("spec_v2_new_tokens", ([True], [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (["1"], [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", ("12", [1, 2], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (b"12", [1, 2], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (np.array([1], dtype=object), [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", ([None], [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (None, [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (5, [1], 16, 2), {}, TypeError, "committed"),
    ("spec_v2_new_tokens", (np.array(5), [1], 16, 2), {}, ValueError, "1-D"),
    ("spec_v2_new_tokens", (np.ones((2, 2), int), [1, 1], 16, 2), {}, ValueError, "1-D"),
    ("spec_v2_new_tokens", ([[1], [2]], [1, 1], 16, 2), {}, ValueError, "1-D"),
    ("spec_v2_new_tokens", ([1, 2], [1], 16, 2), {}, ValueError, "same length"),
    ("spec_v2_new_tokens", ([1, -2], [1, 1], 16, 2), {}, ValueError, "committed[1]"),
    ("spec_v2_new_tokens", ([1, 2], [1, -1], 16, 2), {}, ValueError, "allocated[1]"),
    ("spec_v2_new_tokens", ([1], [1], 0, 2), {}, ValueError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], -16, 2), {}, ValueError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], 16, -1), {}, ValueError, "reserve"),
    ("spec_v2_new_tokens", ([1], [1], 16.0, 2), {}, TypeError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], True, 2), {}, TypeError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], "16", 2), {}, TypeError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], 2**64, 2), {}, OverflowError, "page_size"),
    ("spec_v2_new_tokens", ([2**63], [1], 16, 2), {}, OverflowError, "committed[0]"),
    ("spec_v2_new_tokens", ([1], [-(2**63) - 1], 16, 2), {}, OverflowError, "allocated[0]"),
    ("spec_v2_new_tokens", (np.array([2**63], np.uint64), [1], 16, 2), {}, OverflowError, ""),
    ("spec_v2_new_tokens", ([BIG], [0], 16, 0), {}, OverflowError, ""),
    ("spec_v2_new_tokens", ([BIG], [0], 1, 1), {}, OverflowError, ""),
    ("spec_v2_new_tokens", ([2**62] * 2, [0, 0], 1, 0), {}, OverflowError, ""),
    ("spec_v2_new_tokens", ([1, 2], [1, 2], 16, 2), {"indices": [2]}, IndexError, "indices[0]"),
    ("spec_v2_new_tokens", ([1, 2], [1, 2], 16, 2), {"indices": [0, -3]}, IndexError, "indices"),
    ("spec_v2_new_tokens", ([1, 2], [1, 2], 16, 2), {"indices": [0.5]}, TypeError, "indices"),
    ("spec_v2_new_tokens", ([1, 2], [1, 2], 16, 2), {"indices": [[0]]}, ValueError, "indices"),
    ("spec_v2_new_tokens", ([], [], 16, 2), {"indices": [0]}, IndexError, "indices"),
    ("decode_new_tokens", ([1.0], 16), {}, TypeError, "committed"),
    ("decode_new_tokens", ([-1], 16), {}, ValueError, "committed[0]"),
    ("decode_new_tokens", ([0], 0), {}, ValueError, "page_size"),
    ("decode_new_tokens", ([0, 0], 2**62 + 1), {}, OverflowError, ""),
    ("num_new_pages", ([1], 16), {}, ValueError, "prefix_lens"),
    ("num_new_pages", ([1], 16, [1, 2]), {}, ValueError, "same length"),
    ("num_new_pages", ([1], 16, [-1]), {}, ValueError, "prefix_lens[0]"),
    ("num_new_pages", ([1.5], 16), {"decode": True}, TypeError, "seq_lens"),
    ("spec_v1_new_tokens", (-1, 16, 3, 1, 4), {}, ValueError, "num_requests"),
    ("spec_v1_new_tokens", (1, 16, -3, 1, 4), {}, ValueError, "num_steps"),
    ("spec_v1_new_tokens", (1, 16, 3, 1.0, 4), {}, TypeError, "topk"),
    ("spec_v1_new_tokens", (2**62, 16, 3, 1, 4), {}, OverflowError, ""),
    ("alloc_len_per_decode", (3, 1, 4, 0), {}, ValueError, "page_size"),
    ("alloc_len_per_decode", (2**62, 4, 8, 16), {}, OverflowError, ""),
    ("alloc_reserve_per_decode", (2**62, 1, 8, 1), {}, OverflowError, ""),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": [np.zeros(1), np.zeros(1)]}, TypeError, "out"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": (np.zeros(1), np.zeros(1))}, TypeError,
     "out[0]"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": (np.zeros(2, int), np.zeros(2, int))},
     ValueError, "out[0]"),
    ("decode_alloc_plan", ([1], [1], 16, 2),
     {"out": (np.zeros(1, int), _readonly(np.zeros(1, int)))}, ValueError, "out[1]"),
    ("decode_alloc_plan", ([1], [2**31], 16, 2),
     {"out": (np.zeros(1, np.int32), np.zeros(1, np.int32))}, OverflowError, "out[0]"),
    ("decode_alloc_plan", ([2**31], [1], 16, 2),
     {"out": (np.zeros(1, np.int32), np.zeros(1, np.int32))}, OverflowError, "out[1]"),
    ("decode_alloc_plan", ([1, -1], [1, 1], 16, 2), {}, ValueError, "committed[1]"),
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "exc", "fragment"), BAD_INPUTS,
    ids=[f"{i}-{case[0]}-{case[3].__name__}" for i, case in enumerate(BAD_INPUTS)],
)
@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
def test_bad_inputs(impl, name, args, kwargs, exc, fragment):
    with pytest.raises(exc, match=re.escape(fragment) if fragment else None):
        getattr(impl, name)(*args, **kwargs)
    check_same(name, *args, **kwargs)
