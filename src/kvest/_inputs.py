"""Argument coercion and validation, shared by the kernels and the reference.

Everything kvest accepts goes through here (the compiled module skips it only
for contiguous native int32/int64 NumPy arrays, which need no conversion), so
both implementations accept the same inputs and raise the same exceptions with
the same messages.  The order of checks is part of the contract, because the
differential tests compare which exception each implementation raises:

1. scalars (``page_size``, ``reserve``, ...), in signature order;
2. each length argument is coerced (type, 1-D, int64 range), in order;
3. the length arguments must have equal lengths;
4. ``indices`` are coerced and bounds-checked;
5. lengths must be non-negative (:func:`first_negative`), in argument order;
6. the computation itself may overflow int64.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_NATIVE_INT = (np.dtype(np.int32), np.dtype(np.int64))


def _describe(obj: Any) -> str:
    return type(obj).__name__


def as_count(value: Any, name: str, minimum: int = 0, *, optional: bool = False) -> int:
    """Return ``value`` as a Python int in ``[minimum, INT64_MAX]``.

    Accepts Python and NumPy integers (anything with ``__index__``) but not
    ``bool``; ``None`` maps to 0 when ``optional`` (SGLang leaves unset
    speculative settings as ``None``).
    """
    if value is None and optional:
        return 0
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not bool")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {_describe(value)}") from None
    if result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    if result > INT64_MAX:
        raise OverflowError(f"{name} = {result} does not fit in int64")
    return result


def _from_array(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {arr.ndim}-D with shape {arr.shape}")
    kind = arr.dtype.kind
    if kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype in _NATIVE_INT:
        return np.ascontiguousarray(arr)
    if kind == "u" and arr.dtype.itemsize == 8:
        big = np.flatnonzero(arr > INT64_MAX)
        if big.size:
            pos = int(big[0])
            raise OverflowError(f"{name}[{pos}] = {int(arr[pos])} does not fit in int64")
    # Narrower types, uint32, uint64 in range and byte-swapped arrays: the
    # smallest native type that holds every value of the dtype.
    narrow = arr.dtype.itemsize < 4 or (kind == "i" and arr.dtype.itemsize == 4)
    return arr.astype(np.int32 if narrow else np.int64)


def _from_sequence(seq: Sequence[Any], name: str) -> np.ndarray:
    values = list(seq)
    if not values:
        return np.zeros(0, dtype=np.int64)
    for pos, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name}[{pos}] must be an integer, not bool")
        if isinstance(v, (list, tuple, np.ndarray)):
            raise ValueError(f"{name} must be 1-D, but {name}[{pos}] is a {_describe(v)}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise TypeError(f"{name}[{pos}] must be an integer, not {_describe(v)}") from None
        if not INT64_MIN <= iv <= INT64_MAX:
            raise OverflowError(f"{name}[{pos}] = {iv} does not fit in int64")
        values[pos] = iv
    return np.array(values, dtype=np.int64)


def as_lengths(obj: Any, name: str) -> np.ndarray:
    """Return ``obj`` as a contiguous native int32 or int64 1-D array.

    Contiguous int32/int64 arrays come back as they are (no copy); other integer
    dtypes, byte-swapped and strided arrays are converted.  Negative values pass
    (see :func:`first_negative`): the caller checks them after all coercion.
    """
    if isinstance(obj, np.ndarray):
        return _from_array(obj, name)
    if isinstance(obj, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be a 1-D sequence of integers, not {_describe(obj)}")
    if isinstance(obj, (list, tuple, range)):
        return _from_sequence(obj, name)
    if isinstance(obj, memoryview) or hasattr(obj, "__array__") or _has_buffer(obj):
        try:
            arr = np.asarray(obj)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} could not be read as an array: {exc}") from None
        return _from_array(arr, name)
    if hasattr(obj, "__dlpack__"):
        try:
            arr = np.from_dlpack(obj)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TypeError(f"{name} could not be read through __dlpack__: {exc}") from None
        return _from_array(arr, name)
    if isinstance(obj, Sequence):
        return _from_sequence(obj, name)
    raise TypeError(f"{name} must be a 1-D sequence of integers, not {_describe(obj)}")


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


def check_same_length(
    first: np.ndarray, first_name: str, other: np.ndarray, other_name: str
) -> None:
    if len(first) != len(other):
        raise ValueError(
            f"{first_name} and {other_name} must have the same length, "
            f"got {len(first)} and {len(other)}"
        )


def as_indices(indices: Any, n: int) -> np.ndarray:
    """Coerce ``indices`` to int64 and check them with Python list semantics."""
    idx = as_lengths(indices, "indices").astype(np.int64, copy=False)
    bad = np.flatnonzero((idx < -n) | (idx >= n))
    if bad.size:
        pos = int(bad[0])
        raise IndexError(f"indices[{pos}] = {int(idx[pos])} is out of range for {n} rows")
    return idx


def first_negative(arr: Any, name: str, rows: Any = None) -> None:
    """Raise ``ValueError`` naming the first negative length, if any.

    With ``rows`` (validated indices) only those rows are checked, in that order:
    a function given ``indices`` reads nothing else.
    """
    values = np.asarray(arr, dtype=np.int64)
    where = None
    if rows is not None:
        where = np.asarray(rows, dtype=np.int64) % max(len(values), 1)
        values = values[where]
    neg = np.flatnonzero(values < 0)
    if neg.size:
        pos = int(neg[0])
        row = pos if where is None else int(where[pos])
        raise ValueError(f"{name}[{row}] = {int(values[pos])} is negative; lengths must be >= 0")


def result_int64(value: int, what: str) -> int:
    """Return ``value`` if it fits in int64, else raise ``OverflowError``."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError(f"{what} = {value} does not fit in int64")
    return value


def as_out(out: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Check ``out=(cur, nxt)`` buffers for :func:`decode_alloc_plan`, or make them."""
    if out is None:
        return np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError("out must be a tuple (cur, nxt) of two NumPy arrays")
    for name, buf in zip(("out[0]", "out[1]"), out, strict=True):
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, not {_describe(buf)}")
        if buf.dtype not in _NATIVE_INT:
            raise TypeError(f"{name} must have dtype int32 or int64, got {buf.dtype}")
        if buf.ndim != 1 or len(buf) != n:
            raise ValueError(f"{name} must be 1-D with {n} entries, got shape {buf.shape}")
        if not buf.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if not buf.flags.writeable:
            raise ValueError(f"{name} is read-only")
    return out[0], out[1]


def req_length(req: Any, pos: int, attr: str) -> int:
    """``req.<attr>`` (flat layout) or ``req.kv.<attr>`` (nested layout), checked.

    The input rule for request objects, shared by both implementations: an
    integer (``__index__``, not bool) in ``[0, INT64_MAX]``; ``pos`` names the
    request in messages.
    """
    try:
        value = getattr(req, attr)
    except AttributeError:
        try:
            value = getattr(req.kv, attr)
        except AttributeError:
            raise AttributeError(f"reqs[{pos}] has neither .{attr} nor .kv.{attr}") from None
    return req_length_value(value, pos, attr)


def req_length_value(value: Any, pos: int, attr: str) -> int:
    """The value read for ``reqs[pos].<attr>`` as a length: see :func:`req_length`."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"reqs[{pos}].{attr} must be an integer, not bool")
    try:
        value = value.__index__()
    except (AttributeError, TypeError):
        raise TypeError(
            f"reqs[{pos}].{attr} must be an integer, not {type(value).__name__}"
        ) from None
    if value < 0:
        raise ValueError(f"reqs[{pos}].{attr} = {value} is negative; lengths must be >= 0")
    if value > INT64_MAX:
        raise OverflowError(f"reqs[{pos}].{attr} = {value} does not fit in int64")
    return value


def req_rows(reqs: Any, indices: Any) -> tuple[Any, np.ndarray | None]:
    """``reqs`` and the validated rows ``indices`` selects (``None``: every request).

    With ``indices``, ``reqs`` must be a sequence (``len`` and indexing); rows
    follow Python list semantics and are checked before any request is read.
    """
    if indices is None:
        return reqs, None
    try:
        n = len(reqs)
    except TypeError:
        raise TypeError(
            f"reqs must be a sequence (len and indexing) when indices is given, "
            f"not {_describe(reqs)}"
        ) from None
    return reqs, as_indices(indices, n)


_PLAN_DTYPES = {np.dtype(np.int32): np.int32, np.dtype(np.int64): np.int64}


def as_plan_out(out: Any, n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``out=(cur, nxt)`` buffers for a plan of ``n`` rows, or new ones of ``dtype``.

    ``dtype`` is int32 or int64 (``None``: int64); given with ``out``, both
    buffers must have it.
    """
    want = None
    if dtype is not None:
        try:
            want = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be int32 or int64, not {dtype!r}") from None
        if want not in _PLAN_DTYPES:
            raise TypeError(f"dtype must be int32 or int64, got {want}")
    if out is None:
        kind = np.int64 if want is None else _PLAN_DTYPES[want]
        return np.empty(n, dtype=kind), np.empty(n, dtype=kind)
    cur, nxt = as_out(out, n)
    if want is not None:
        for name, buf in (("out[0]", cur), ("out[1]", nxt)):
            if buf.dtype != want:
                raise TypeError(f"{name} has dtype {buf.dtype}, but dtype={want} was asked for")
    if np.may_share_memory(cur, nxt):  # contiguous buffers: bounds overlap = overlap
        raise ValueError("out[0] and out[1] must not share memory")
    return cur, nxt


# Where each length is read, by request layout: (committed, allocated), each
# "either" (req.<name>, else req.kv.<name>), "flat" or "nested".
REQ_LAYOUTS = {
    None: ("either", "either"),
    "flat": ("flat", "flat"),  # sglang 0.5.11-0.5.15
    "mixed": ("flat", "nested"),  # 0.5.16-0.5.18: allocated under req.kv
    "nested": ("nested", "nested"),  # 0.5.19+: both under req.kv
}


def as_req_layout(layout: Any) -> tuple[str, str]:
    """Where ``layout`` says each length is: see :data:`REQ_LAYOUTS`."""
    if layout is not None and not isinstance(layout, str):
        raise TypeError(f"layout must be None or a string, not {_describe(layout)}")
    try:
        return REQ_LAYOUTS[layout]
    except KeyError:
        raise ValueError(
            f"layout must be None, 'flat', 'mixed' or 'nested', got {layout!r}"
        ) from None
