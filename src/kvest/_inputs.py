"""Argument coercion and validation, shared by the kernels and the reference.

Everything kvest accepts goes through here (the compiled module skips it only
for plain, contiguous, aligned native int32/int64 NumPy arrays and plain
Python ints and bools, which need no conversion), so both implementations
accept the same inputs and raise the same exceptions with the same messages.
The order of checks is part of the contract, because the differential tests
compare which exception each implementation raises, and its message:

1. scalars (``page_size``, ``reserve``, ...) and flags (``decode``,
   ``page_aligned``, ...), in signature order;
2. each length argument is coerced (type, 1-D, int64 range), in order;
3. the length arguments must have equal lengths;
4. ``indices`` are coerced and bounds-checked (``out`` buffers, for
   :func:`decode_alloc_plan`, are checked here);
5. lengths must be non-negative (:func:`first_negative`), in argument order;
6. the computation itself may overflow int64 (row by row, in order).

The rules, in one place:

- a scalar is a Python int or an object with ``__index__`` (a NumPy integer);
  bool in any form, and any array or tensor (even 0-d or with one element), is
  a ``TypeError``;
- a flag is ``True``/``False`` (Python or NumPy bool), nothing else;
- a length argument is a 1-D sequence of integers: a NumPy array of an integer
  dtype (any byte order, contiguous or not; masked arrays are refused), a list,
  tuple or ``range`` of ints, ``array.array``, ``memoryview``, a PyTorch CPU
  tensor that does not need grad (read through its own ``.numpy()``, so kvest
  never imports torch), or any object exposing ``__array__`` / ``__dlpack__``;
- whatever goes wrong while reading an argument (an ``__array__`` or
  ``__dlpack__`` that raises, a sequence whose items cannot be read) is a
  ``TypeError`` naming the argument, never the foreign exception.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvest._errors import impure_argument, int64_overflow

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_NATIVE_INT = (np.dtype(np.int32), np.dtype(np.int64))


def _describe(obj: Any) -> str:
    return type(obj).__name__


def _has(obj: Any, attr: str, name: str) -> bool:
    """``hasattr(obj, attr)``, where an attribute lookup that fails with anything
    but AttributeError (a raising ``__getattr__``) is a TypeError naming ``name``."""
    try:
        return hasattr(obj, attr)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read: {_describe(exc)}: {exc}") from exc


def _is_array_like(obj: Any, name: str) -> bool:
    """An array or tensor (NumPy scalars excepted): never a scalar, never an item."""
    if isinstance(obj, np.generic):
        return False
    return isinstance(obj, np.ndarray) or _has(obj, "__array__", name) or _has(
        obj, "__dlpack__", name)


def _plain(arr: np.ndarray) -> np.ndarray:
    """An ndarray subclass as the plain ndarray over the same memory.

    A subclass may say anything about itself (its ``dtype``, ``flags``,
    ``astype``, ``view``): the base class's own view reads the C-level
    descriptor and flags, and nothing the subclass defines is called.
    """
    if type(arr) is np.ndarray:
        return arr
    return np.ndarray.view(arr, np.ndarray)


def as_count(value: Any, name: str, minimum: int = 0, *, optional: bool = False) -> int:
    """Return ``value`` as a Python int in ``[minimum, INT64_MAX]``.

    Accepts Python and NumPy integers (anything with ``__index__``) but not
    bool, and not arrays or tensors, even with one element; ``None`` maps to 0
    when ``optional`` (SGLang leaves unset speculative settings as ``None``).
    """
    if value is None and optional:
        return 0
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not bool")
    if _is_array_like(value, name):
        raise TypeError(
            f"{name} must be an integer, not {_describe(value)} "
            "(an array or tensor is not a scalar, even with one element)"
        )
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {_describe(value)}") from None
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(
            f"{name} could not be read as an integer: {_describe(exc)}: {exc}") from exc
    if isinstance(result, bool):  # an __index__ that returns a bool
        raise TypeError(f"{name} must be an integer, not bool")
    if result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    if result > INT64_MAX:
        raise OverflowError(f"{name} = {result} does not fit in int64")
    return result


def as_flag(value: Any, name: str) -> bool:
    """A flag: Python ``True``/``False`` or a NumPy bool scalar, nothing else.

    ``"yes"``, ``1`` or a one-element array are ``TypeError``: a flag given the
    wrong thing is a bug in the caller, not a truth value to guess.
    """
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, not {_describe(value)}")


def _missing_position(arr: np.ndarray) -> int | None:
    """Where a float or object array holds NaN, None or pandas.NA, if anywhere."""
    if arr.dtype.kind in "fc":
        bad = np.flatnonzero(np.isnan(arr))
        return int(bad[0]) if bad.size else None
    if arr.dtype.kind == "O":
        for pos, v in enumerate(arr.tolist()):
            if v is None or type(v).__name__ in ("NAType", "NaTType") or (
                    isinstance(v, float) and v != v):
                return pos
    return None


# The most rows kvest copies out of an argument it cannot read in place (a
# range, a strided or broadcast view, another dtype or byte order, indices):
# 2^32 rows, 32 GiB of int64.  A larger one is a ValueError naming it, before
# anything is allocated -- never a MemoryError, never NumPy's own complaint.
MAX_COPIED_ROWS = 2**32


def _copyable(n: int, name: str) -> None:
    if n > MAX_COPIED_ROWS:
        raise ValueError(
            f"{name} has {n} rows; kvest copies at most 2**32 rows of an argument it "
            "cannot read in place (a range, a strided or broadcast view, another dtype, "
            "indices)")


def _from_array(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {arr.ndim}-D with shape {arr.shape}")
    kind = arr.dtype.kind
    if kind not in "iu":
        missing = _missing_position(arr) if kind in "fcO" else None
        if missing is not None:
            raise TypeError(
                f"{name} holds a missing value (NaN, None or NA) at {name}[{missing}]; "
                "kvest needs integer lengths: fill or drop missing values first"
            )
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype in _NATIVE_INT:
        if arr.flags.c_contiguous and arr.flags.aligned:
            return arr.view(np.ndarray) if type(arr) is not np.ndarray else arr
        _copyable(arr.size, name)
        return np.array(arr, dtype=arr.dtype, order="C")
    _copyable(arr.size, name)
    if kind == "u" and arr.dtype.itemsize == 8:
        # Converted first, then checked: the values judged are the values kept,
        # even if another thread writes the caller's array meanwhile.
        wrapped = arr.astype(np.int64)
        big = np.flatnonzero(wrapped < 0)
        if big.size:
            pos = int(big[0])
            raise OverflowError(
                f"{name}[{pos}] = {int(wrapped[pos]) + 2**64} does not fit in int64")
        return wrapped
    # Narrower types, uint32, uint64 in range and byte-swapped arrays: the
    # smallest native type that holds every value of the dtype.
    narrow = arr.dtype.itemsize < 4 or (kind == "i" and arr.dtype.itemsize == 4)
    return arr.astype(np.int32 if narrow else np.int64)


def _range_length(r: range) -> int:
    # len(r) raises OverflowError past sys.maxsize: computed here instead.
    start, step = r.start, r.step
    return max(0, -((start - r.stop) // step) if step > 0 else -((r.stop - start) // -step))


def _range_int64(r: range, name: str) -> int:
    """The length of ``r``, after an OverflowError for its first value outside
    int64, if any (values are monotonic: found without reading them)."""
    start, step = r.start, r.step
    length = _range_length(r)
    if length == 0:
        return 0
    if not INT64_MIN <= start <= INT64_MAX:
        bad = 0
    elif step > 0:
        bad = (INT64_MAX - start) // step + 1
    else:
        bad = (start - INT64_MIN) // -step + 1
    if bad < length:
        raise OverflowError(f"{name}[{bad}] = {start + bad * step} does not fit in int64")
    return length


def _from_range(r: range, name: str) -> np.ndarray:
    """A ``range`` without reading it item by item: bounds checked exactly."""
    start, step = r.start, r.step
    length = _range_int64(r, name)
    if length == 0:
        return np.zeros(0, dtype=np.int64)
    _copyable(length, name)
    # Modular (unsigned) arithmetic is exact when every value fits the signed
    # type of the same width, which is checked here and above;
    # np.arange(start, stop, step) is not: it sizes its result in floating
    # point.  int32 where the values allow: half the bytes to write and read.
    last = start + (length - 1) * step
    narrow = min(start, last) >= -(2**31) and max(start, last) < 2**31
    unsigned, signed, bits = (np.uint32, np.int32, 32) if narrow else (np.uint64, np.int64, 64)
    values = np.arange(length, dtype=unsigned)
    if step != 1:
        values *= unsigned(step % 2**bits)
    if start:
        values += unsigned(start % 2**bits)
    return values.view(signed)


def _item(v: Any, pos: int, name: str) -> int:
    """Item ``pos`` of a sequence as a Python int in int64 range."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}[{pos}] must be an integer, not bool")
    item = f"{name}[{pos}]"
    if isinstance(v, (list, tuple)) or (
            _is_array_like(v, item) and _ndim(v, item) != 0):
        raise ValueError(f"{name} must be 1-D, but {name}[{pos}] is a {_describe(v)}")
    if _is_array_like(v, item):
        raise TypeError(
            f"{name}[{pos}] must be an integer, not a 0-d {_describe(v)}")
    try:
        iv = operator.index(v)
    except TypeError:
        raise TypeError(f"{name}[{pos}] must be an integer, not {_describe(v)}") from None
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(
            f"{name}[{pos}] could not be read as an integer: {_describe(exc)}: {exc}"
        ) from exc
    if isinstance(iv, bool):
        raise TypeError(f"{name}[{pos}] must be an integer, not bool")
    if not INT64_MIN <= iv <= INT64_MAX:
        raise OverflowError(f"{name}[{pos}] = {iv} does not fit in int64")
    return iv


def _ndim(v: Any, name: str) -> Any:
    try:
        return getattr(v, "ndim", 1)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read: {_describe(exc)}: {exc}") from exc


def _from_sequence(seq: Sequence[Any], name: str) -> np.ndarray:
    # One snapshot first: a sequence that changes while it is read (another
    # thread, an item's __index__) cannot make the count and values disagree.
    try:
        values = list(seq)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read: {_describe(exc)}: {exc}") from exc
    if not values:
        return np.zeros(0, dtype=np.int64)
    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass  # the loop below names the first value out of range
    return np.array([_item(v, pos, name) for pos, v in enumerate(values)], dtype=np.int64)


def _is_torch_tensor(obj: Any, name: str) -> bool:
    module = getattr(type(obj), "__module__", None)
    return (isinstance(module, str) and module.startswith("torch")
            and _has(obj, "numpy", name) and _has(obj, "requires_grad", name)
            and _has(obj, "device", name))


def _torch_numpy(tensor: Any, name: str) -> np.ndarray:
    """A CPU tensor's zero-copy NumPy view, through the tensor's own method.

    ``tensor.numpy()`` costs about a third of a DLPack exchange, and needs no
    import of torch here.
    """
    try:
        requires_grad, device = tensor.requires_grad, tensor.device
        device = getattr(device, "type", device)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read: {_describe(exc)}: {exc}") from exc
    if requires_grad:
        raise TypeError(
            f"{name} is a tensor that requires grad; kvest reads integer lengths "
            "(pass tensor.detach() of an integer tensor)"
        )
    if not (isinstance(device, str) and device == "cpu"):
        raise TypeError(f"{name} is a tensor on {device!s}; kvest reads CPU tensors only")
    try:
        arr = tensor.numpy()
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read as an array: {_describe(exc)}: {exc}") from exc
    return _ndarray(arr, name)


def _ndarray(arr: Any, name: str) -> np.ndarray:
    """What a conversion returned, as a plain ndarray: anything else is a TypeError."""
    if isinstance(arr, np.ma.MaskedArray):
        raise _masked(name)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} could not be read as an array: it gave {_describe(arr)}")
    return _plain(arr)


def _read_array(obj: Any, name: str) -> np.ndarray:
    """``obj`` as an ndarray: torch tensors, ``__array__``, buffers, ``__dlpack__``."""
    if _is_torch_tensor(obj, name):
        return _torch_numpy(obj, name)
    try:
        if _has(obj, "__array__", name) or _has_buffer(obj, name):
            arr = np.asarray(obj)
        else:
            arr = np.from_dlpack(obj)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"{name} could not be read as an array: {_describe(exc)}: {exc}") from exc
    return _ndarray(arr, name)


def _masked(name: str) -> TypeError:
    return TypeError(
        f"{name} is a masked array; kvest never reads values its caller masked out "
        "(pass .compressed() or .filled(value))"
    )


def as_lengths(obj: Any, name: str) -> np.ndarray:
    """Return ``obj`` as a plain, contiguous, aligned native int32 or int64 1-D array.

    Such arrays come back as they are (no copy); other integer dtypes,
    byte-swapped, misaligned and strided arrays are converted.  Negative values
    pass (see :func:`first_negative`): the caller checks them after all coercion.
    """
    if isinstance(obj, np.ndarray):
        if isinstance(obj, np.ma.MaskedArray):
            raise _masked(name)
        return _from_array(_plain(obj), name)
    if isinstance(obj, (list, tuple)):
        return _from_sequence(obj, name)
    if isinstance(obj, range):
        return _from_range(obj, name)
    if isinstance(obj, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be a 1-D sequence of integers, not {_describe(obj)}")
    if (isinstance(obj, memoryview) or _has(obj, "__array__", name) or _has_buffer(obj, name)
            or _has(obj, "__dlpack__", name)):
        return _from_array(_read_array(obj, name), name)
    if isinstance(obj, Sequence):
        return _from_sequence(obj, name)
    raise TypeError(f"{name} must be a 1-D sequence of integers, not {_describe(obj)}")


def _has_buffer(obj: Any, name: str) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    except MemoryError:
        raise
    except Exception as exc:  # a buffer that refuses to be read (a closed mmap)
        raise TypeError(f"{name} could not be read: {_describe(exc)}: {exc}") from exc
    return True


def check_same_length(
    first: Any, first_name: str, other: Any, other_name: str
) -> None:
    if len(first) != len(other):
        raise ValueError(
            f"{first_name} and {other_name} must have the same length, "
            f"got {len(first)} and {len(other)}"
        )


def _range_out_of_bounds(r: range, n: int) -> None:
    """IndexError for the first entry of ``r`` outside ``[-n, n)``, found without
    reading ``r`` (a range of in-bound indices has at most 2n entries)."""
    length = _range_length(r)
    if length == 0:
        return
    start, step = r.start, r.step
    if not -n <= start < n:
        bad = 0
    elif step > 0:
        bad = (n - start + step - 1) // step  # the first k with start + k*step >= n
    else:
        bad = (start + n) // -step + 1  # the first k with start + k*step < -n
    if bad < length:
        raise IndexError(f"indices[{bad}] = {start + bad * step} is out of range for {n} rows")


def as_indices(indices: Any, n: int) -> np.ndarray:
    """Coerce ``indices`` to int64 and check them with Python list semantics.

    The result is always kvest's own copy: the compiled kernels read it with
    the GIL released, after checking it here.
    """
    if isinstance(indices, range):
        _range_int64(indices, "indices")
        _range_out_of_bounds(indices, n)
    idx = as_lengths(indices, "indices")
    _copyable(idx.size, "indices")
    idx = idx.astype(np.int64, copy=True)
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
        raise int64_overflow(what, value)
    return value


def _out_buffer(buf: Any, name: str, n: int) -> np.ndarray:
    """One ``out`` buffer as the ndarray kvest writes through (zero-copy)."""
    if isinstance(buf, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain NumPy array or CPU tensor, not a masked array")
    if isinstance(buf, np.ndarray):
        # Its own flags and dtype, never what a subclass says they are.
        arr = _plain(buf)
    elif _is_torch_tensor(buf, name):
        arr = _torch_numpy(buf, name)
    elif _has(buf, "__dlpack__", name):
        try:
            arr = _ndarray(np.from_dlpack(buf), name)
        except MemoryError:
            raise
        except TypeError:
            raise
        except Exception as exc:
            raise TypeError(
                f"{name} could not be read through __dlpack__: {_describe(exc)}: {exc}"
            ) from exc
    else:
        raise TypeError(f"{name} must be a NumPy array or a CPU tensor, not {_describe(buf)}")
    if arr.dtype not in _NATIVE_INT:
        raise TypeError(f"{name} must have dtype int32 or int64, got {arr.dtype}")
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"{name} must be 1-D with {n} entries, got shape {arr.shape}")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        raise ValueError(f"{name} must be C-contiguous and aligned")
    if not arr.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return arr


def _overlap(x: np.ndarray, y: np.ndarray) -> bool:
    # Bounds first (constant time), then the exact test for strided arrays.
    return bool(np.may_share_memory(x, y)) and bool(np.shares_memory(x, y))


def out_pair(out: Any) -> Any:
    """``out`` read once as a plain tuple when it is a tuple subclass (whose items
    read again could be other objects than the ones checked and written)."""
    if not isinstance(out, tuple) or type(out) is tuple:
        return out
    try:
        return tuple(out)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"out could not be read: {_describe(exc)}: {exc}") from exc


def as_out(out: Any, n: int, *inputs: tuple[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Check ``out=(cur, nxt)`` buffers for :func:`decode_alloc_plan`, or make them.

    Each buffer is a NumPy array or a CPU tensor (written through a zero-copy
    view) of ``n`` native int32 or int64 values, C-contiguous and writable;
    both have the same dtype.  They may not overlap each other, nor any array
    in ``inputs`` (``(name, array)`` pairs: the arrays a call reads): kvest
    never writes to its inputs, and a plan written over what it still reads
    would be wrong.
    """
    if out is None:
        return np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError("out must be a tuple (cur, nxt) of two arrays")
    cur = _out_buffer(out[0], "out[0]", n)
    nxt = _out_buffer(out[1], "out[1]", n)
    if cur.dtype != nxt.dtype:
        raise TypeError(
            f"out[0] and out[1] must have the same dtype, got {cur.dtype} and {nxt.dtype}")
    if n and _overlap(cur, nxt):
        raise ValueError("out[0] and out[1] overlap in memory; pass two separate buffers")
    arrays: dict[int, tuple[str, np.ndarray]] = {}
    for input_name, arr in inputs:
        if isinstance(arr, np.ndarray):
            # The memory it spans, not what a subclass's __array_function__ says.
            arrays.setdefault(id(arr), (input_name, _plain(arr)))
    for name, buf in (("out[0]", cur), ("out[1]", nxt)):
        for input_name, arr in arrays.values():
            if n and _overlap(buf, arr):
                raise ValueError(
                    f"{name} overlaps {input_name} in memory; kvest never writes to its inputs")
    return cur, nxt


def as_reqs(reqs: Any) -> Any:
    """``reqs`` checked to be an iterable of request objects (returned as is)."""
    if isinstance(reqs, (str, bytes, bytearray)) or not _has(reqs, "__iter__", "reqs"):
        raise TypeError(
            f"reqs must be a sequence of request objects, not {_describe(reqs)}")
    return reqs


def reqs_iter(reqs: Any) -> Any:
    """``iter(reqs)``; an ``__iter__`` that fails is a TypeError naming reqs[0]."""
    try:
        return iter(reqs)
    except MemoryError:
        raise
    except Exception as exc:
        raise reqs_read_error(exc, 0) from exc


def reqs_list(reqs: Any) -> list[Any]:
    """``list(reqs)`` for a container that is not a list or tuple, read as the
    walks read it: a failure is a TypeError naming the position it failed at."""
    it = reqs_iter(reqs)
    out: list[Any] = []
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except MemoryError:
            raise
        except Exception as exc:
            raise reqs_read_error(exc, len(out)) from exc


# Read with getattr(), never the attribute syntax: CPython specialises that
# once warm (a cached dict position), and a specialised read can skip what a
# lookup runs (a colliding key's __eq__).  The twin reads as the lookup does.
KV = "kv"


def req_length(req: Any, pos: int, attr: str, exact: bool = False) -> int:
    """``req.<attr>`` (flat layout) or ``req.kv.<attr>`` (nested layout), checked.

    The input rule for request objects, shared by both implementations: an
    integer (``operator.index``, not bool, not an array or tensor) in
    ``[0, INT64_MAX]``, or with ``exact`` only a value whose type is ``int``;
    ``pos`` names the request in messages.
    """
    try:
        value = getattr(req, attr)
    except AttributeError:
        try:
            value = getattr(getattr(req, KV), attr)
        except AttributeError:
            raise AttributeError(f"reqs[{pos}] has neither .{attr} nor .kv.{attr}") from None
        except MemoryError:
            raise
        except Exception as exc:  # a property of the caller's that fails
            raise req_read_error(exc, pos, f".kv.{attr}") from exc
    except MemoryError:
        raise
    except Exception as exc:
        raise req_read_error(exc, pos, f".{attr}") from exc
    return req_length_value(value, pos, attr, exact)


def beam_attr(obj: Any, attr: str, pos: int, path: str) -> Any:
    """``obj.<attr>``, read for ``reqs[pos]<path>`` by the beam sum: missing is an
    AttributeError naming the position; any other failure is the caller's own
    exception, unchanged, as upstream's expression raises it."""
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise AttributeError(f"reqs[{pos}] has no {path}") from None


def reqs_read_error(exc: Exception, pos: int) -> TypeError:
    """The error for a ``reqs`` container that fails while giving request ``pos``
    (its iterator or ``__getitem__`` raised ``exc``)."""
    return TypeError(f"reqs could not be read at reqs[{pos}]: {_describe(exc)}: {exc}")


def req_read_error(exc: Exception, pos: int, path: str) -> TypeError:
    """The error for ``reqs[pos]<path>`` whose read raised ``exc`` (not AttributeError,
    which means "not there"): a property or ``__getattr__`` of the caller's that fails."""
    return TypeError(f"reqs[{pos}]{path} could not be read: {_describe(exc)}: {exc}")


def _not_exact(value: Any, what: str) -> TypeError:
    return TypeError(f"{what} must be an int, not {_describe(value)} (exact_ints=True)")


def req_length_value(value: Any, pos: int, attr: str, exact: bool = False) -> int:
    """The value read for ``reqs[pos].<attr>`` as a length: see :func:`req_length`."""
    what = f"reqs[{pos}].{attr}"
    if exact and type(value) is not int:
        raise _not_exact(value, what)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an integer, not bool")
    if _is_array_like(value, what):
        raise TypeError(f"{what} must be an integer, not {_describe(value)} "
                        "(an array or tensor is not a scalar, even with one element)")
    try:
        # operator.index, as Python's own arithmetic reads an int subclass:
        # by its value, never by an __index__ it overrides.
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {_describe(value)}") from None
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(
            f"{what} could not be read as an integer: {_describe(exc)}: {exc}") from exc
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not bool")
    if value < 0:
        raise ValueError(f"{what} = {value} is negative; lengths must be >= 0")
    if value > INT64_MAX:
        raise OverflowError(f"{what} = {value} does not fit in int64")
    return value


def beam_rows_value(value: Any, pos: int, exact: bool) -> Any:
    """``reqs[pos].beam_group.num_member_rows`` as the beam sum adds it: as it is
    (``sum()`` semantics), or with ``exact`` only a value whose type is ``int``."""
    if exact and type(value) is not int:
        raise _not_exact(value, f"reqs[{pos}].beam_group.num_member_rows")
    return value


def plan_grew_error(m: int) -> IndexError:
    """A list of requests that grew, while a plan sized for its ``m`` rows was filled."""
    return IndexError(f"reqs grew past the {m} rows the plan was sized for while it was read")


def plan_shrank_error(m: int, n: int) -> IndexError:
    """A list of requests that shrank while a plan sized for its ``m`` rows was
    filled, after ``n`` rows: the rows never reached are not returned unwritten."""
    return IndexError(f"reqs shrank while the plan sized for its {m} rows was filled: "
                      f"{n} rows were read")


def req_rows(reqs: Any, indices: Any) -> tuple[Any, np.ndarray | None]:
    """``reqs`` and the validated rows ``indices`` selects (``None``: every request).

    With ``indices``, ``reqs`` must be a sequence (``len`` and indexing); rows
    follow Python list semantics and are checked before any request is read.
    They come back as positions in ``[0, n)`` for the ``n`` they were checked
    against: reading ``indices`` may run code that changes ``reqs``, and a
    second ``len(reqs)`` would then turn a negative index into another row.
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
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"reqs could not be read: len(reqs) raised {_describe(exc)}: {exc}"
                        ) from exc
    idx = as_indices(indices, n)
    idx[idx < 0] += n
    return reqs, idx


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
        except MemoryError:
            raise
        except Exception:
            raise TypeError(f"dtype must be int32 or int64, not {_describe(dtype)}") from None
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
    if layout is not None and type(layout) is not str:
        layout = str.__str__(layout)  # its characters, never a subclass's __hash__ or __eq__
    try:
        return REQ_LAYOUTS[layout]
    except KeyError:
        raise ValueError(
            f"layout must be None, 'flat', 'mixed' or 'nested', got {str.__repr__(layout)}"
        ) from None


# ------------------------------------------------------------------ pure mode
# ``pure=True``: no code of the caller's may run.  Every argument that is not a
# request is judged here, before any request is read, for both implementations:
# a type whose reading is the interpreter's or NumPy's own passes (and is then
# judged by the usual rules, which run nothing of the caller's on it); anything
# else is ImpureRequest naming the argument.

def _numpy_scalar(value: Any) -> bool:
    return type(value).__module__ == "numpy" and isinstance(value, (np.integer, np.bool_))


def pure_reqs(reqs: Any) -> None:
    """Requests in pure mode: a list or tuple (iterating anything else may run code)."""
    if type(reqs) is not list and type(reqs) is not tuple:
        raise impure_argument("reqs")


def pure_scalar(value: Any, name: str) -> None:
    if type(value) is not int and type(value) is not bool and not _numpy_scalar(value):
        raise impure_argument(name)


def pure_values(values: Any, name: str) -> None:
    """A list or tuple whose items are exact ints in int64 (the writers' values)."""
    if type(values) is not list and type(values) is not tuple:
        raise impure_argument(name)
    for i, v in enumerate(values):
        if type(v) is not int or not INT64_MIN <= v <= INT64_MAX:
            raise impure_argument(f"{name}[{i}]")


def pure_args(indices: Any = None, layout: Any = None, flags: tuple = (),
              scalars: tuple = (), out: Any = None, dtype: Any = None) -> None:
    """The arguments other than ``reqs`` of a request-object function in pure mode."""
    for value, name in scalars:
        pure_scalar(value, name)
    if indices is not None:
        if type(indices) is list or type(indices) is tuple:
            for i, v in enumerate(indices):
                if type(v) is not int and type(v) is not bool and not _numpy_scalar(v):
                    raise impure_argument(f"indices[{i}]")
        elif type(indices) is not np.ndarray or indices.dtype.hasobject:
            raise impure_argument("indices")
    for value, name in flags:
        if value is not True and value is not False and type(value) is not np.bool_:
            raise impure_argument(name)
    if layout is not None and type(layout) is not str:
        raise impure_argument("layout")
    if out is not None and not (type(out) is tuple and len(out) == 2
                                and all(type(b) is np.ndarray for b in out)):
        raise impure_argument("out")
    # (compared by identity: `in` would call an object's own __eq__)
    if not (dtype is None or type(dtype) is str or any(dtype is d for d in _PURE_DTYPES)
            or any(type(dtype) is t for t in _PURE_DTYPE_TYPES)):
        raise impure_argument("dtype")


_PURE_DTYPES = (np.int32, np.int64, int)
_PURE_DTYPE_TYPES = tuple({type(np.dtype(np.int32)), type(np.dtype(np.int64)), np.dtype})
