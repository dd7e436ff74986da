"""Differential checking (both implementations, each against the oracle in
tests/oracle.py) and shared input generators for the test suite."""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import oracle
from hypothesis import strategies as st

import kvest
from kvest import reference

INT64_MAX = 2**63 - 1
PAGE_SIZES = [1, 2, 3, 7, 16, 32, 64, 96, 100, 128, 256, 300]


def outcome(fn: Any, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    """What a call did: ("ok", value) or ("raise", exception type, message)."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return "raise", type(exc), str(exc)
    if isinstance(value, kvest.AllocPlan):
        value = (value.cur.tolist(), value.nxt.tolist(), value.num_tokens, value.num_pages)
    return "ok", value


def expected(name: str, args: tuple, kwargs: dict) -> tuple[str, Any] | None:
    """The oracle's answer: ("ok", value), ("raise", exception type), or None
    where the oracle says it does not model the input (:class:`oracle.Unmodelled`).

    A public function missing from the oracle is a KeyError, and any other
    exception out of the oracle propagates: both fail the test, so that no
    call is ever checked against the twin alone by accident."""
    fn = oracle.FUNCTIONS[name]
    try:
        value = fn(*args, **kwargs)
    except oracle.Unmodelled:
        return None
    except (ValueError, IndexError, OverflowError) as exc:
        return "raise", type(exc)
    return "ok", value


def _fingerprint(obj: Any, depth: int = 0) -> Any:
    """A comparable picture of an argument's contents (arrays, containers, requests)."""
    if depth > 4:
        return None
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, (memoryview, array.array)):
        return (type(obj).__name__, bytes(obj))
    if isinstance(obj, (list, tuple)):
        return tuple(_fingerprint(x, depth + 1) for x in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return (type(obj).__name__, tuple(
            (k, _fingerprint(v, depth + 1)) for k, v in sorted(vars(obj).items())))
    slots = getattr(type(obj), "__slots__", None)
    if slots:
        return tuple(_fingerprint(getattr(obj, s, None), depth + 1) for s in slots)
    return obj


def check_same(name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """Call kvest.<name> and reference.<name>; check them against each other
    and, where it models the input, against the oracle (tests/oracle.py).

    The two implementations must agree exactly: the same value and type of
    value, or the same exception type with the same message.  Where the oracle
    models the input, the value (or exception type) must be the oracle's: so
    under KVEST_PURE_PYTHON=1, where kvest.<name> is reference.<name>, the
    expected values still come from outside kvest.  Neither call may modify its
    arguments (``out`` buffers excepted).  Returns ("ok", value) or
    ("raise", exception type).
    """
    snaps = [_fingerprint(a) for a in args]
    fast = outcome(getattr(kvest, name), args, kwargs)
    assert [_fingerprint(a) for a in args] == snaps, f"kvest.{name} modified an argument"
    slow = outcome(getattr(reference, name), args, kwargs)
    assert [_fingerprint(a) for a in args] == snaps, f"reference.{name} modified an argument"
    assert fast == slow, f"{name}: kvest gave {fast}, reference gave {slow}"
    if fast[0] == "ok" and not isinstance(fast[1], tuple):
        assert type(fast[1]) is int, f"{name} returned {type(fast[1])}, not int"
    want = expected(name, args, kwargs)
    if want is not None:
        assert fast[:2] == want, f"{name}: kvest and reference gave {fast}, the oracle {want}"
    return fast[0], fast[1]


def check_exact(name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """:func:`check_same` for input the oracle must model (valid types)."""
    assert expected(name, args, kwargs) is not None, f"the oracle does not model {args}"
    return check_same(name, *args, **kwargs)


# ------------------------------------------------------------------ strategies

EDGE_VALUES = [0, 1, 2**21, 2**29 - 1, 2**29, 2**31 - 1, 2**31, 2**32 + 1, 2**62, INT64_MAX]


def length_values(page_size: int | None = None, negative: bool = False) -> st.SearchStrategy[int]:
    """Lengths as a scheduler sees them, plus edges around pages and int64."""
    parts = [st.integers(0, 2**21), st.integers(0, 300), st.sampled_from(EDGE_VALUES)]
    if page_size is not None:
        parts.append(st.integers(0, 50).flatmap(
            lambda k: st.sampled_from([k * page_size - 1, k * page_size, k * page_size + 1])
        ).filter(lambda v: v >= 0))
    if negative:
        parts.append(st.integers(-(2**63), -1))
    return st.one_of(*parts)


LAYOUTS = [
    "int64", "int32", "list", "tuple", "strided", "uint16", "bigendian", "array", "memoryview",
]


def as_layout(values: list[int], layout: str) -> Any:
    """``values`` in one of the containers kvest accepts (int64 if it cannot)."""
    fits32 = all(-(2**31) <= v < 2**31 for v in values)
    if layout == "list":
        return list(values)
    if layout == "tuple":
        return tuple(values)
    if layout == "int32" and fits32:
        return np.array(values, dtype=np.int32)
    if layout == "uint16" and all(0 <= v < 2**16 for v in values):
        return np.array(values, dtype=np.uint16)
    if layout == "bigendian":
        return np.array(values, dtype=">i8")
    if layout == "strided":
        wide = np.zeros(2 * len(values), dtype=np.int64)
        wide[::2] = values
        return wide[::2]
    if layout == "array":
        return array.array("q", values)
    if layout == "memoryview":
        return memoryview(np.array(values, dtype=np.int64))
    return np.array(values, dtype=np.int64)


@st.composite
def length_arrays(draw: st.DrawFn, n: int, page_size: int | None = None,
                  negative: bool = False) -> Any:
    values = draw(st.lists(length_values(page_size, negative), min_size=n, max_size=n))
    return as_layout(values, draw(st.sampled_from(LAYOUTS)))


@st.composite
def indices_for(draw: st.DrawFn, n: int) -> Any:
    """None, or row numbers with list semantics: negatives, repeats, rarely out of range."""
    if draw(st.booleans()):
        return None
    lo, hi = (-n, n - 1) if n else (0, 0)
    rows = st.integers(lo, hi) if n else st.nothing()
    if draw(st.integers(0, 20)) == 0:
        rows = st.integers(-n - 3, n + 3)
    picked = draw(st.lists(rows, max_size=2 * n + 2)) if n else []
    return as_layout(picked, draw(st.sampled_from(["list", "int64", "int32"])))


page_sizes = st.one_of(st.sampled_from(PAGE_SIZES), st.integers(1, 4096))
reserves = st.one_of(st.integers(0, 1000), st.sampled_from([0, 2, 16, 2**29 - 1, 2**29, 2**40]))
