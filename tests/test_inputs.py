"""Input rules of docs/contract.md: accepted containers, no copies, bad inputs, no mutation."""

from __future__ import annotations

import array
import re
from collections.abc import Sequence

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


def test_kvest_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, kvest, numpy as np; kvest.spec_v2_new_tokens([1], [1], 16, 2);"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


class RaisingArray:
    """__array__ that fails with an exception of its own."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("device lost")


class RaisingDLPack:
    def __dlpack__(self, **kwargs):
        raise RuntimeError("no capsule")

    def __dlpack_device__(self):
        return (1, 0)


class WithMissing:
    """What a nullable pandas Int64 column with NA gives NumPy: floats with NaN,
    or objects with None (pandas itself is tested when it is installed)."""

    def __init__(self, values, dtype):
        self._arr = np.array(values, dtype=dtype)

    def __array__(self, dtype=None, copy=None):
        return self._arr


class Index:
    """An integer through __index__ only."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class BrokenIndex:
    def __index__(self):
        raise RuntimeError("not today")


class BrokenSequence(Sequence):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        raise RuntimeError("storage went away")


class Subclass(np.ndarray):
    """An ndarray subclass that is not a masked array: read like its base."""


def _masked(values, mask):
    return np.ma.array(values, mask=mask)


def _shared(n, offset):
    """Two int64 views of one buffer, ``offset`` rows apart."""
    base = np.zeros(n + offset, np.int64)
    return base[:n], base[offset:offset + n]


STRUCTURED = np.zeros(2, dtype=[("c", np.int64), ("a", np.int64)])
SAME = np.zeros(3, np.int64)
C3 = np.array([1, 2, 3], np.int64)

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
    # Reported holes: one buffer twice, a masked array, bools, arrays
    # as scalars, flags that are not bools, reqs that are not a sequence, NA.
    ("decode_alloc_plan", (C3, C3, 16, 128), {"out": (SAME, SAME)}, ValueError, "overlap"),
    ("decode_new_tokens", (_masked([16, 32, 5], [0, 1, 0]), 16), {}, TypeError, "masked"),
    ("spec_v2_new_tokens", ([1], _masked([1], [0]), 16, 2), {}, TypeError, "allocated"),
    ("decode_new_tokens", ([16, 17], np.bool_(True)), {}, TypeError, "page_size"),
    ("decode_new_tokens", ([16, 17], np.array(True)), {}, TypeError, "page_size"),
    ("decode_new_tokens", ([np.bool_(True)], 16), {}, TypeError, "committed[0]"),
    ("decode_new_tokens", ([16, 17], np.array([16])), {}, TypeError, "page_size"),
    ("decode_new_tokens", ([16, 17], np.array(16)), {}, TypeError, "page_size"),
    ("spec_v2_new_tokens", ([1], [1], 16, np.array([2])), {}, TypeError, "reserve"),
    ("spec_v1_new_tokens", (np.array(3), 16, 3, 1, 4), {}, TypeError, "num_requests"),
    ("alloc_len_per_decode", (3, 1, 4, 16), {"speculative": "yes"}, TypeError, "speculative"),
    ("alloc_len_per_decode", (3, 1, 4, 16), {"speculative": 1}, TypeError, "speculative"),
    ("alloc_len_per_decode", (3, 1, 4, 16), {"has_draft_kv": None}, TypeError, "has_draft_kv"),
    ("alloc_reserve_per_decode", (3, 2, 4, 16), {"has_draft_kv": "no"}, TypeError,
     "has_draft_kv"),
    ("num_new_pages", ([17], 16), {"decode": "yes"}, TypeError, "decode"),
    ("num_new_pages", ([17], 16, [1]), {"decode": np.array([True])}, TypeError, "decode"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"page_aligned": 0}, TypeError, "page_aligned"),
    ("spec_v2_new_tokens_from_reqs", (None, 16, 6), {}, TypeError, "reqs"),
    ("spec_v2_new_tokens_from_reqs", (5, 16, 6), {}, TypeError, "reqs"),
    ("decode_new_tokens_from_reqs", (None, 16), {}, TypeError, "reqs"),
    ("decode_new_tokens_from_reqs", ("abc", 16), {}, TypeError, "reqs"),
    ("decode_new_tokens", (WithMissing([16.0, np.nan], float), 16), {}, TypeError, "missing"),
    ("decode_new_tokens", (WithMissing([16, None], object), 16), {}, TypeError, "committed[1]"),
    ("decode_new_tokens", (np.array([16.0, np.nan]), 16), {}, TypeError, "missing"),
    # Overflow: one wording per situation in both implementations (check_same
    # compares the messages).
    ("spec_v2_new_tokens", ([BIG], [BIG], 1, 1), {}, OverflowError, "committed[0] + reserve"),
    ("spec_v2_new_tokens", ([BIG], [0], 16, 0), {}, OverflowError, "ceil_align"),
    ("spec_v2_new_tokens", ([2**62] * 3, [0] * 3, 1, 0), {}, OverflowError, "running total"),
    ("spec_v2_new_tokens", ([2**62] * 3, [0] * 3, 1, 0), {"indices": [2, 0, 1]}, OverflowError,
     "at row 0"),
    ("num_new_pages", ([BIG] * 2, 1, [0, 0]), {}, OverflowError,
     f"num_new_pages = {2 * BIG}"),
    ("decode_alloc_plan", ([BIG], [0], 1, 1), {}, OverflowError, "committed[0] + reserve"),
    ("decode_alloc_plan", ([BIG], [0], 16, 0), {}, OverflowError, "ceil_align"),
    ("decode_alloc_plan", ([2**62] * 3, [0] * 3, 1, 0), {}, OverflowError, "running total"),
    ("decode_alloc_plan", ([1, 2**31], [2**31, 0], 16, 0),
     {"out": (np.zeros(2, np.int32), np.zeros(2, np.int32))}, OverflowError, "out[0][0]"),
    # The holes nobody listed.  out buffers: views of one base, an input, strided,
    # mixed or foreign dtypes, masked, not arrays.
    ("decode_alloc_plan", ([1, 2, 3], [1, 2, 3], 16, 2), {"out": _shared(3, 1)}, ValueError,
     "overlap"),
    ("decode_alloc_plan", ([1, 2, 3], [1, 2, 3], 16, 2), {"out": _shared(3, 2)}, ValueError,
     "overlap"),
    ("decode_alloc_plan", (C3, [1, 2, 3], 16, 2), {"out": (np.zeros(3, int), C3)}, ValueError,
     "out[1] overlaps committed"),
    ("decode_alloc_plan", ([1, 2, 3], C3, 16, 2), {"out": (C3, np.zeros(3, int))}, ValueError,
     "out[0] overlaps allocated"),
    ("decode_alloc_plan", (np.arange(6)[::2], [1, 2, 3], 16, 2),
     {"out": (np.zeros(3, int), np.zeros(3, int))}, None, None),
    ("decode_alloc_plan", ([1, 2, 3], [1, 2, 3], 16, 2),
     {"out": (np.zeros(6, int)[::2], np.zeros(3, int))}, ValueError, "C-contiguous"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": (np.zeros(1, np.int32), np.zeros(1, int))},
     TypeError, "same dtype"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": (np.zeros(1, ">i8"), np.zeros(1, ">i8"))},
     TypeError, "out[0]"),
    ("decode_alloc_plan", ([1], [1], 16, 2),
     {"out": (_masked([0], [0]), np.zeros(1, int))}, TypeError, "out[0]"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": ([0], [0])}, TypeError, "out[0]"),
    ("decode_alloc_plan", ([1], [1], 16, 2), {"out": (np.zeros(1, int),)}, TypeError, "out"),
    # masked, structured, bool and 0-d data; unsigned limits; __index__;
    # readers that raise; sequences that cannot be read.
    ("decode_new_tokens", (_masked([16, 32], [0, 0]), 16), {}, TypeError, "masked"),
    ("decode_new_tokens", (STRUCTURED, 16), {}, TypeError, "committed"),
    ("decode_new_tokens", ([16, np.array(5)], 16), {}, TypeError, "committed[1]"),
    ("decode_new_tokens", ([16, np.array([5])], 16), {}, ValueError, "1-D"),
    ("decode_new_tokens", ([0], 16), {"indices": np.array([True])}, TypeError, "indices"),
    ("decode_new_tokens", (np.array([2**64 - 1], np.uint64), 16), {}, OverflowError,
     "committed[0] = 18446744073709551615"),
    ("decode_new_tokens", ([0], 16), {"indices": np.array([2**63], np.uint64)}, OverflowError,
     "indices[0]"),
    ("decode_new_tokens", ([0], BrokenIndex()), {}, TypeError, "page_size"),
    ("decode_new_tokens", ([0, BrokenIndex()], 16), {}, TypeError, "committed[1]"),
    ("decode_new_tokens", (RaisingArray(), 16), {}, TypeError, "committed"),
    ("decode_new_tokens", (RaisingDLPack(), 16), {}, TypeError, "committed"),
    ("decode_new_tokens", (BrokenSequence(), 16), {}, TypeError, "committed"),
    ("decode_new_tokens", ((x for x in [1, 2]), 16), {}, TypeError, "committed"),
    ("decode_new_tokens", ({1, 2}, 16), {}, TypeError, "committed"),
    ("decode_new_tokens", (np.ones((1, 2), int).view(Subclass), 16), {}, ValueError, "1-D"),
    ("decode_new_tokens", (range(2**63 - 2, 2**63 + 2), 16), {}, OverflowError,
     f"committed[2] = {2**63}"),
    ("decode_new_tokens", ([0], 16), {"indices": range(-2, 1)}, IndexError, "indices[0] = -2"),
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "exc", "fragment"), BAD_INPUTS,
    ids=[f"{i}-{case[0]}-{getattr(case[3], '__name__', 'ok')}"
         for i, case in enumerate(BAD_INPUTS)],
)
@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
def test_bad_inputs(impl, name, args, kwargs, exc, fragment):
    if exc is None:  # a case on the edge that is accepted
        getattr(impl, name)(*args, **kwargs)
    else:
        with pytest.raises(exc, match=re.escape(fragment) if fragment else None):
            getattr(impl, name)(*args, **kwargs)
    check_same(name, *args, **kwargs)


# ------------------------------------------------------ accepted on the edge

class Growing(Sequence):
    """Says it has more items than it gives: a sequence changing as it is read."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        if i >= 3:
            raise IndexError(i)
        return 16 * i


class Appending:
    """An item whose __index__ grows the list being read."""

    def __init__(self, target):
        self.target = target

    def __index__(self):
        self.target.append(16)
        return 32


EDGE_ACCEPTED = {
    "uint64 at int64 max": (np.array([2**63 - 1, 16], np.uint64), [2**63 - 1, 16]),
    "uint32 max": (np.array([2**32 - 1, 0], np.uint32), [2**32 - 1, 0]),
    "uint8 max": (np.array([255, 0], np.uint8), [255, 0]),
    "int64 limits": (np.array([2**63 - 1, 0], np.int64), [2**63 - 1, 0]),
    "big-endian int32": (np.array([16, 17], ">i4"), [16, 17]),
    "misaligned": (np.frombuffer(bytes(1) + np.array([16, 5], np.int64).tobytes(), np.int64,
                                 offset=1), [16, 5]),
    "subclass": (np.array([16, 5]).view(Subclass), [16, 5]),
    "__index__ items": ([Index(16), Index(5)], [16, 5]),
    "numpy scalars": ([np.uint64(2**63 - 1), np.int8(-1) + 1], [2**63 - 1, 0]),
    "range": (range(0, 64, 16), [0, 16, 32, 48]),
    "empty range": (range(5, 0), []),
    "range at int64 max": (range(2**63 - 3, 2**63), [2**63 - 3, 2**63 - 2, 2**63 - 1]),
    "range at int64 min": (range(-(2**63), -(2**63) + 2), [-(2**63), -(2**63) + 1]),
}


@pytest.mark.parametrize(("lengths", "values"), EDGE_ACCEPTED.values(), ids=EDGE_ACCEPTED.keys())
def test_edge_containers_read_exactly(lengths, values):
    """Each gives what the same values in a list give, in both implementations."""
    for p in (1, 16, 2**63 - 1):
        assert check_same("decode_new_tokens", lengths, p) == check_same(
            "decode_new_tokens", values, p)
        assert check_same("num_new_pages", lengths, p, decode=True) == check_same(
            "num_new_pages", values, p, decode=True)
    assert check_same("spec_v2_new_tokens", lengths, lengths, 16, 0) == check_same(
        "spec_v2_new_tokens", values, values, 16, 0)


def test_scalars_through_index():
    assert check_same("decode_new_tokens", [16, 17], Index(16)) == ("ok", 16)
    assert check_same("spec_v2_new_tokens", [16], [16], np.int32(16), np.uint8(6)) == ("ok", 16)
    # p > 1, k = 2: L = ceil_align(1 + 16, 16) = 32; 2 * 32 * 2
    assert check_same("spec_v1_new_tokens", np.int64(2), 16, None, Index(2), 0) == ("ok", 128)


def test_sequences_changing_while_read():
    """One snapshot per argument: the count and the values always agree."""
    assert check_same("decode_new_tokens", Growing(), 16) == ("ok", 48)  # 0, 16, 32
    for impl in (kvest, reference):
        lengths = [16, 17]
        lengths.append(Appending(lengths))
        assert impl.decode_new_tokens(lengths, 16) == 32  # 16, 17, 32: not the appended 16


def test_range_is_not_read_item_by_item(monkeypatch):
    """A range becomes an array by arithmetic (about 1000x faster than a loop
    for range(10**6)); the item-by-item reader is never called."""
    from kvest import _inputs

    def refuse(seq, name):
        raise AssertionError(f"{name} was read item by item")

    monkeypatch.setattr(_inputs, "_from_sequence", refuse)
    n = 10**6
    expected = n // 16  # rows 0, 16, 32, ...
    assert kvest.decode_new_tokens(range(n), 16) == 16 * expected
    assert reference.decode_new_tokens(range(0, 160, 16), 16) == 160


def test_decode_pages_never_read_prefix_lens():
    """As SGLang's get_num_new_pages: with decode=True, prefix_lens is ignored."""
    for prefix in ([1, 2, 3], [-1], "not lengths", np.zeros((2, 2)), RaisingArray(), None):
        assert check_same("num_new_pages", [17], 16, prefix, decode=True) == ("ok", 1)


def test_flags_take_python_and_numpy_bools():
    for flag in (True, np.bool_(True)):
        assert check_same("alloc_len_per_decode", 3, 2, 6, 16, speculative=flag,
                          has_draft_kv=flag) == ("ok", 64)  # ceil_div(15 + 3, 16) * 16 * 2
        assert check_same("num_new_pages", [17], 16, decode=flag) == ("ok", 1)
        assert check_same("decode_alloc_plan", [5], [8], 16, 6, page_aligned=flag)[0] == "ok"
    assert check_same("alloc_len_per_decode", 3, 2, 6, 16, speculative=np.bool_(False)) == (
        "ok", 1)


@pytest.mark.parametrize("impl", [kvest, reference], ids=["kvest", "reference"])
def test_missing_values_from_pandas(impl):
    pd = pytest.importorskip("pandas")
    with pytest.raises(TypeError, match="missing"):
        impl.decode_new_tokens(pd.Series([16, None, 3], dtype="Int64"), 16)
    assert impl.decode_new_tokens(pd.Series([16, 32, 3]), 16) == 32


# ------------------------------------------------------------ request objects

class RaisingProperty:
    kv_allocated_len = 8

    @property
    def kv_committed_len(self):
        raise RuntimeError("lost the request")


class FloatProperty:
    kv_allocated_len = 8
    kv_committed_len = property(lambda self: 5.0)


class NestedRaising:
    class _Kv:
        kv_allocated_len = 8

        @property
        def kv_committed_len(self):
            raise KeyError("kv")

    kv = _Kv()


class MissingViaProperty:
    """A property raising AttributeError reads as missing, as getattr does."""

    kv_allocated_len = 8

    @property
    def kv_committed_len(self):
        raise AttributeError("not yet")


REQ_CASES = [
    (FloatProperty(), TypeError, "reqs[0].kv_committed_len must be an integer, not float"),
    (MissingViaProperty(), AttributeError, "reqs[0] has neither .kv_committed_len"),
    (RaisingProperty(), TypeError, "reqs[0].kv_committed_len could not be read"),
    (NestedRaising(), TypeError, "reqs[0].kv.kv_committed_len could not be read"),
]


@pytest.mark.parametrize(
    ("req", "exc", "fragment"),
    REQ_CASES,
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else None)
@pytest.mark.parametrize("name", ["spec_v2_new_tokens_from_reqs", "decode_new_tokens_from_reqs"])
def test_request_attributes_that_misbehave(name, req, exc, fragment):
    args = ([req], 16, 6) if name.startswith("spec_v2") else ([req], 16)
    for impl in (kvest, reference):
        with pytest.raises(exc, match=re.escape(fragment)):
            getattr(impl, name)(*args)
    check_same(name, *args)


# ------------------------------------- every argument of every function, junk

class _Req:
    def __init__(self, c, a):
        self.kv_committed_len, self.kv_allocated_len = c, a


def _junk() -> list:
    values = [
        None, 1.5, True, np.bool_(False), "16", b"16", np.array(16), np.array([16]),
        np.array(True), np.float64(16.0), -1, 2**64, -(2**64), np.uint64(2**64 - 1),
        Index(16), BrokenIndex(), [1.5], [None], [[1]], [True], [np.array(1)], {}, set(),
        object(), range(2), range(-3, 2), _masked([16, 1], [0, 1]), STRUCTURED,
        RaisingArray(), RaisingDLPack(), BrokenSequence(), WithMissing([1.0, np.nan], float),
        np.zeros((2, 2), int), np.array([16, 17], ">i8"), np.array([2**64 - 1, 0], np.uint64),
        [BIG, BIG], (np.zeros(2, int), np.zeros(2, int)), [_Req(1, 1)], [object()],
    ]
    return values


JUNK = _junk()
ALLOWED = (TypeError, ValueError, IndexError, OverflowError)

# (function, valid positional args, valid keyword args)
VALID_CALLS = [
    ("spec_v2_new_tokens", ([5, 16], [8, 16], 16, 6), {"indices": [1]}),
    ("decode_new_tokens", ([5, 16], 16), {"indices": [1]}),
    ("num_new_pages", ([5, 16], 16, [1, 2]), {"decode": False}),
    ("num_new_pages", ([5, 16], 16, [1, 2]), {"decode": True}),
    ("spec_v1_new_tokens", (2, 16, 3, 2, 6), {}),
    ("alloc_len_per_decode", (3, 2, 6, 16), {"speculative": True, "has_draft_kv": True}),
    ("alloc_reserve_per_decode", (3, 2, 6, 16), {"speculative": True, "has_draft_kv": True}),
    ("decode_alloc_plan", ([5, 16], [8, 16], 16, 6),
     {"page_aligned": True, "out": (np.zeros(2, int), np.zeros(2, int))}),
    ("spec_v2_new_tokens_from_reqs", ([_Req(5, 8), _Req(16, 16)], 16, 6), {}),
    ("decode_new_tokens_from_reqs", ([_Req(5, 8), _Req(16, 16)], 16), {}),
]
ARGUMENTS = [(name, args, kwargs, where) for name, args, kwargs in VALID_CALLS
             for where in [*range(len(args)), *kwargs]]


@pytest.mark.parametrize(("name", "args", "kwargs", "where"), ARGUMENTS,
                         ids=[f"{n}-{w}" for n, _, kw, w in ARGUMENTS])
def test_every_argument_takes_any_junk(name, args, kwargs, where):
    """Whatever goes in any one argument: the exact answer (the oracle's, where
    it models the input) or one of the four exceptions (AttributeError too for
    request objects), the same in both implementations, message included."""
    check_any(name, args, kwargs, where, JUNK)


def check_any(name: str, args: tuple, kwargs: dict, where: int | str, values: list) -> None:
    """Each of ``values`` in argument ``where`` of an otherwise valid call."""
    allowed = (*ALLOWED, AttributeError) if name.endswith("_from_reqs") else ALLOWED
    for junk in values:
        call_args, call_kwargs = list(args), dict(kwargs)
        if isinstance(where, int):
            call_args[where] = junk
        else:
            call_kwargs[where] = junk
        result = check_same(name, *call_args, **call_kwargs)
        if result[0] == "raise":
            assert issubclass(result[1], allowed), (name, where, junk, result)


class _GoodReq:
    kv_committed_len = 16
    kv_allocated_len = 16


def _broken_iterator():
    yield _GoodReq()
    raise RuntimeError("storage went away")


@pytest.mark.parametrize("name", ["spec_v2_new_tokens_from_reqs", "decode_new_tokens_from_reqs"])
@pytest.mark.parametrize(("make", "indices", "where"), [
    (BrokenSequence, None, 0),  # iterated: __getitem__(0) fails
    (BrokenSequence, [-1], 2),  # selected rows: reqs[2] fails
    (_broken_iterator, None, 1),  # a generator that fails after one request
], ids=["iterated", "indexed", "generator"])
def test_reqs_that_fail_while_read(name, make, indices, where):
    """A container that fails while giving a request: a TypeError naming reqs and
    the position, from both implementations, never the container's own exception."""
    for impl in (kvest, reference):
        args = (make(), 16, 6, indices) if name.startswith("spec_v2") else (make(), 16, indices)
        with pytest.raises(TypeError,
                           match=rf"reqs could not be read at reqs\[{where}\]: RuntimeError"):
            getattr(impl, name)(*args)
