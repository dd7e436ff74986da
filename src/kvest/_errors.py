"""The error layer: a failed computation's status (what overflowed, where) made
into the exception and its message, for both implementations.

The compiled loops report only where they stopped (a row, and the running total
before it); the pure twin detects the same conditions with Python ints.  Both
then hand the row's values here, and this module decides which value of the
formula left int64 -- in the order the formula names its values -- and words
it.  The two implementations' messages therefore agree by construction, and
the cold path exists once.
"""

from __future__ import annotations

from typing import Any

INT64_MAX = 2**63 - 1


class ImpureRequest(Exception):
    """A request-object function called with ``pure=True`` met an argument or a
    request it cannot read (or write) without running Python code of the
    caller's: a property, ``__getattr__``, ``__index__``, an iterator, a dict
    key's own ``__eq__``, a value that is not an exact ``int`` in int64.  It is
    raised before anything was written; the message names the argument or the
    request (``reqs[3]``).  The caller then runs its own Python statement."""


def impure_request(pos: int, what: str = "read") -> ImpureRequest:
    """reqs[pos] cannot be read (or written) without running the caller's code."""
    return ImpureRequest(f"reqs[{pos}] cannot be {what} without running Python code")


def impure_argument(name: str) -> ImpureRequest:
    """An argument that cannot be read without running the caller's code."""
    return ImpureRequest(f"{name} cannot be read without running Python code")


def _ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


def int64_overflow(what: str, value: int) -> OverflowError:
    """``what`` (a value named in a formula, or a result) is outside int64."""
    return OverflowError(f"{what} = {value} does not fit in int64")


# ------------------------------------------------------------- spec v2, per row

def _spec_v2_status(c: int, a: int, p: int, r: int, total: int) -> tuple[str, int]:
    """Which value of ``ceil_align(max(A, C + R), p) - ceil_align(A, p)``, added to
    ``total``, leaves int64 first: ("need", C + R), ("top", ceil_align) or
    ("total", the running total)."""
    need = c + r
    if need > INT64_MAX:
        return "need", need
    top = _ceil_align(max(a, need), p)
    if top > INT64_MAX:
        return "top", top
    return "total", total + top - _ceil_align(a, p)


def spec_v2_overflow(i: int, c: int, a: int, p: int, r: int, total: int) -> OverflowError:
    """:func:`spec_v2_new_tokens` at row ``i`` (C, A; the total before the row)."""
    what, value = _spec_v2_status(c, a, p, r, total)
    if what == "need":
        return int64_overflow(f"committed[{i}] + reserve", value)
    if what == "top":
        return int64_overflow(
            f"ceil_align(max(allocated[{i}], committed[{i}] + reserve), page_size)", value)
    return OverflowError(
        f"spec_v2_new_tokens: the running total {value} at row {i} does not fit in int64")


def spec_v2_reqs_overflow(pos: int, c: int, a: int, p: int, r: int,
                          total: int) -> OverflowError:
    """:func:`spec_v2_new_tokens_from_reqs` at ``reqs[pos]``."""
    what, value = _spec_v2_status(c, a, p, r, total)
    if what == "need":
        return int64_overflow(f"reqs[{pos}]: committed + reserve", value)
    if what == "top":
        return int64_overflow(f"reqs[{pos}]: ceil_align", value)
    return int64_overflow("spec_v2_new_tokens_from_reqs", value)


# ------------------------------------------------------ allocation plan, per row

def _plan_status(c: int, a: int, p: int, r: int, aligned: bool, limit: int,
                 tokens: int) -> tuple[str, int]:
    """Which value of the plan's row leaves its range first: ("need", C + R),
    ("align", ceil_align(C + R, p)), ("cur", A) or ("nxt", nxt) outside the
    out buffers' dtype (``limit``), or ("tokens", the running total); ("", 0)
    when none does."""
    need = c + r
    if need > INT64_MAX:
        return "need", need
    if aligned:
        need = _ceil_align(need, p)
        if need > INT64_MAX:
            return "align", need
    nxt = max(a, need)
    if a > limit:
        return "cur", a
    if nxt > limit:
        return "nxt", nxt
    if tokens + nxt - a > INT64_MAX:
        return "tokens", tokens + nxt - a
    return "", 0


def plan_overflow(i: int, c: int, a: int, p: int, r: int, aligned: bool, dtype: Any,
                  tokens: int) -> OverflowError | None:
    """:func:`decode_alloc_plan` at row ``i`` (the token total before the row), or
    None when the row fits."""
    limit = _limit(dtype)
    what, value = _plan_status(c, a, p, r, aligned, limit, tokens)
    if what == "need":
        return int64_overflow(f"committed[{i}] + reserve", value)
    if what == "align":
        return int64_overflow(f"ceil_align(committed[{i}] + reserve, page_size)", value)
    if what in ("cur", "nxt"):
        out = 0 if what == "cur" else 1
        return OverflowError(f"out[{out}][{i}] = {value} does not fit in {_name(dtype)}")
    if what == "tokens":
        return OverflowError(
            f"num_tokens: the running total {value} at row {i} does not fit in int64")
    return None


def plan_reqs_overflow(pos: int, row: int, c: int, a: int, p: int, r: int, aligned: bool,
                       limit: int, tokens: int) -> OverflowError | None:
    """:func:`decode_alloc_plan_from_reqs` at ``reqs[pos]``, written to row ``row``
    of buffers whose dtype holds at most ``limit``; None when the row fits."""
    what, value = _plan_status(c, a, p, r, aligned, limit, tokens)
    if what == "need":
        return int64_overflow(f"reqs[{pos}]: committed + reserve", value)
    if what == "align":
        return int64_overflow(f"reqs[{pos}]: ceil_align", value)
    if what in ("cur", "nxt"):
        out = 0 if what == "cur" else 1
        return OverflowError(f"reqs[{pos}]: out[{out}][{row}] = {value} does not fit its dtype")
    if what == "tokens":
        return int64_overflow("num_tokens", value)
    return None


def _limit(dtype: Any) -> int:
    import numpy as np

    return int(np.iinfo(dtype).max)


def _name(dtype: Any) -> str:
    import numpy as np

    return str(np.dtype(dtype))
