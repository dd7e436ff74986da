"""The contract's formulas in plain Python ints: the tests' own oracle.

Nothing here comes from kvest (not even its input rules): every function is
written from the contract (docs/contract.md) with arbitrary-precision ints, so that
both implementations -- the compiled kernels and the pure-Python twin -- are
checked against something that is neither of them.

The oracle models what the contract says about valid input:

- the value, exactly;
- ``OverflowError`` when an input, or a value the formula names (``C + R``,
  ``ceil_align(...)``, a product, the result), lies outside int64;
- ``ValueError`` for a negative length, a page size below 1, a negative
  reserve or count, mismatched lengths; ``IndexError`` for an index out of
  range;
- for input that breaks several rules, the exception of the first rule
  broken, in the contract's order: scalars and flags in signature order, then
  each length argument's values (int64 range), equal lengths, indices,
  negative lengths, and last the arithmetic.

Anything else (wrong types, 2-D data, a request without the attribute, ...)
raises :class:`Unmodelled`: for such input the tests compare the two
implementations with each other only.  Any other exception out of the oracle
is a bug of the oracle's, and fails the test that met it; so does a public
function missing from :data:`FUNCTIONS`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class Unmodelled(Exception):
    """The oracle does not say what this input gives."""


# ------------------------------------------------------------- reading inputs

def _int(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not _has(value, "__index__"):
        raise Unmodelled(f"not an integer: {value!r}")
    if _has(value, "__array__") and not isinstance(value, np.generic):
        raise Unmodelled("an array is not a scalar")
    try:
        return int(operator.index(value))
    except Exception as exc:
        raise Unmodelled(f"__index__ raised {type(exc).__name__}") from None


def _read(convert: Callable[[Any], np.ndarray], obj: Any) -> np.ndarray:
    """convert(obj); an object that fails while read is not modelled."""
    try:
        return convert(obj)
    except Exception as exc:
        raise Unmodelled(f"reading the argument raised {type(exc).__name__}") from None


def ints(obj: Any) -> list[int]:
    """A valid length argument as a list of Python ints (range not checked)."""
    if isinstance(obj, (list, tuple, range)):
        items = list(obj)
    elif isinstance(obj, np.ndarray):
        if obj.ndim != 1 or obj.dtype.kind not in "iu" or isinstance(obj, np.ma.MaskedArray):
            raise Unmodelled("not a 1-D integer array")
        items = obj.tolist()
    elif isinstance(obj, memoryview) or _has(obj, "__array__"):
        return ints(_read(np.asarray, obj))
    elif _has(obj, "__dlpack__"):
        return ints(_read(np.from_dlpack, obj))
    elif _has(obj, "tolist"):  # array.array
        items = _read(lambda o: o.tolist(), obj)
    else:
        raise Unmodelled(f"not a length argument: {type(obj).__name__}")
    return [_int(v) for v in items]


def _in_int64(values: list[int]) -> list[int]:
    for v in values:
        if not INT64_MIN <= v <= INT64_MAX:
            raise OverflowError(v)
    return values


def _lengths(obj: Any) -> list[int]:
    return _in_int64(ints(obj))


def _scalar(value: Any, minimum: int, optional: bool = False) -> int:
    if value is None and optional:
        return 0
    v = _int(value)
    if v < minimum:
        raise ValueError(v)
    if v > INT64_MAX:
        raise OverflowError(v)
    return v


def _flag(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise Unmodelled("a flag that is not a bool")


def _fits(v: int) -> int:
    """A value the formula names: it must lie in int64."""
    if not INT64_MIN <= v <= INT64_MAX:
        raise OverflowError(v)
    return v


def _rows(indices: Any, n: int) -> list[int]:
    if indices is None:
        return list(range(n))
    rows = _lengths(indices)
    for i in rows:
        if not -n <= i < n:
            raise IndexError(i)
    return [i % n for i in rows]


def _nonnegative(values: list[int], rows: list[int] | None = None) -> None:
    for i in rows if rows is not None else range(len(values)):
        if values[i] < 0:
            raise ValueError(values[i])


def _same_length(x: list[int], y: list[int]) -> None:
    if len(x) != len(y):
        raise ValueError("lengths differ")


def ceil_div(x: int, p: int) -> int:
    return -(-x // p)


def ceil_align(x: int, p: int) -> int:
    return ceil_div(x, p) * p


# ------------------------------------------------------------------ formulas

def spec_v2_new_tokens(committed, allocated, page_size, reserve, indices=None):
    p, r = _scalar(page_size, 1), _scalar(reserve, 0)
    c, a = _lengths(committed), _lengths(allocated)
    _same_length(c, a)
    rows = _rows(indices, len(c))
    _nonnegative(c, rows)
    _nonnegative(a, rows)
    return _fits(sum(
        _fits(ceil_align(max(a[i], _fits(c[i] + r)), p)) - ceil_align(a[i], p) for i in rows))


def decode_new_tokens(committed, page_size, indices=None):
    p = _scalar(page_size, 1)
    c = _lengths(committed)
    rows = _rows(indices, len(c))
    _nonnegative(c, rows)
    return _fits(p * sum(1 for i in rows if c[i] % p == 0))


def num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False):
    p = _scalar(page_size, 1)
    if _flag(decode):
        # The decode special case never reads prefix_lens (SGLang's doesn't).
        s = _lengths(seq_lens)
        _nonnegative(s)
        return sum(1 for x in s if x % p == 1)
    if prefix_lens is None:
        raise ValueError("prefix_lens")
    s, pre = _lengths(seq_lens), _lengths(prefix_lens)
    _same_length(s, pre)
    _nonnegative(s)
    _nonnegative(pre)
    return _fits(sum(ceil_div(x, p) - ceil_div(y, p) for x, y in zip(s, pre, strict=True)))


def spec_v1_new_tokens(num_requests, page_size, num_steps, topk, num_draft_tokens):
    n, p = _scalar(num_requests, 0), _scalar(page_size, 1)
    s = _scalar(num_steps, 0, optional=True) or 1
    k = _scalar(topk, 0, optional=True) or 1
    t = _scalar(num_draft_tokens, 0, optional=True)
    if p > 1 and k > 1:
        length, t = _fits(ceil_align(_fits(s + p), p)), _fits(ceil_align(t, p))
    elif p > 1:
        length, t = _fits(ceil_align(s, p)), _fits(ceil_align(t, p))
    else:
        length = s
    return _fits(n * max(_fits(length * k), t))


def alloc_len_per_decode(num_steps, topk, num_draft_tokens, page_size, *,
                         speculative=True, has_draft_kv=True):
    s = _scalar(num_steps, 0, optional=True) or 1
    k = _scalar(topk, 0, optional=True) or 1
    t = _scalar(num_draft_tokens, 0, optional=True)
    p = _scalar(page_size, 1)
    speculative, has_draft_kv = _flag(speculative), _flag(has_draft_kv)
    if not speculative:
        return 1
    if p == 1 or k == 1 or not has_draft_kv:
        return max(_fits(s * k), t)
    return max(_fits(_fits(ceil_div(_fits(p - 1 + s), p) * p) * k), t)


def alloc_reserve_per_decode(*args, **kwargs):
    return _fits(2 * alloc_len_per_decode(*args, **kwargs))


def decode_alloc_plan(committed, allocated, page_size, reserve, *, page_aligned=True,
                      out=None):
    """(cur, nxt, num_tokens, num_pages), as lists and ints."""
    p, r = _scalar(page_size, 1), _scalar(reserve, 0)
    aligned = _flag(page_aligned)
    c, a = _lengths(committed), _lengths(allocated)
    _same_length(c, a)
    limit = INT64_MAX
    if out is not None:
        limit = _out_limit(out, len(c), (committed, allocated))
    _nonnegative(c)
    _nonnegative(a)
    cur = list(a)
    nxt = [max(a[i], _fits(ceil_align(_fits(c[i] + r), p)) if aligned else _fits(c[i] + r))
           for i in range(len(c))]
    for v in cur + nxt:
        if v > limit:
            raise OverflowError(v)
    tokens = _fits(sum(x - y for x, y in zip(nxt, cur, strict=True)))
    pages = sum(ceil_div(x, p) - ceil_div(y, p) for x, y in zip(nxt, cur, strict=True))
    return cur, nxt, tokens, pages


def _out_limit(out: Any, n: int, inputs: tuple[Any, ...]) -> int:
    """The largest value valid ``out`` buffers hold; anything else is Unmodelled."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise Unmodelled("out that is not a pair")
    views = [_read(lambda b: b.numpy(), buf) if type(buf).__module__.startswith("torch")
             else buf for buf in out]
    others = [x for x in inputs if isinstance(x, np.ndarray)]
    for pos, buf in enumerate(views):
        if not (type(buf) is np.ndarray and buf.ndim == 1 and len(buf) == n
                and buf.flags.c_contiguous and buf.flags.writeable):
            raise Unmodelled("out buffers the contract refuses")
        if n and any(np.shares_memory(buf, x) for x in [*others, *views[pos + 1:]]):
            raise Unmodelled("out buffers that share memory")
    dtypes = {buf.dtype for buf in views}
    if len(dtypes) != 1 or dtypes - {np.dtype(np.int32), np.dtype(np.int64)}:
        raise Unmodelled("out buffers of other dtypes")
    return int(np.iinfo(dtypes.pop()).max)


# ------------------------------------------------------------ request objects

# layout= -> where kv_committed_len and kv_allocated_len are read
LAYOUTS = {None: ("either", "either"), "flat": ("flat", "flat"),
           "mixed": ("flat", "nested"), "nested": ("nested", "nested")}


def _layout(layout: Any) -> tuple[str, str]:
    if layout is not None and not isinstance(layout, str):
        raise Unmodelled("a layout that is not a string")
    if layout is not None:
        layout = str.__str__(layout)  # its characters, never a subclass's __eq__
    if layout not in LAYOUTS:
        raise Unmodelled("an unknown layout")  # ValueError, in an order not modelled
    return LAYOUTS[layout]


def _attribute(obj: Any, attr: str) -> Any:
    """obj.<attr>; a read that fails in any way is not modelled."""
    try:
        return getattr(obj, attr)
    except Exception as exc:
        raise Unmodelled(f"reading .{attr} raised {type(exc).__name__}") from None


def _has(obj: Any, attr: str) -> bool:
    try:
        return hasattr(obj, attr)
    except Exception as exc:  # hasattr lets everything but AttributeError through
        raise Unmodelled(f"looking for .{attr} raised {type(exc).__name__}") from None


def _req_length(req: Any, attr: str, where: str = "either", exact: bool = False) -> int:
    if where == "either":
        if _has(req, attr):
            value = _attribute(req, attr)
        elif _has(req, "kv") and _has(_attribute(req, "kv"), attr):
            value = _attribute(req.kv, attr)
        else:
            raise Unmodelled("a request without the attribute")
    else:
        owner = req if where == "flat" else _attribute(req, "kv")
        if not _has(owner, attr):
            raise Unmodelled("a request without the attribute where the layout reads it")
        value = _attribute(owner, attr)
    if exact and type(value) is not int:
        raise Unmodelled("exact_ints=True and a length that is not exactly an int")
    v = _int(value)
    if v < 0:
        raise ValueError(v)
    return _fits(v)


def _reqs(reqs: Any) -> Any:
    if not isinstance(reqs, (list, tuple)):
        raise Unmodelled("reqs that are not a list or tuple")
    return reqs


def _selected(requests: Any, indices: Any) -> list[Any]:
    """The requests ``indices`` selects, as ``[requests[i] for i in indices]``
    reads them (len() and [], a subclass's own), or every request as ``for req
    in requests`` reads them (its own iterator)."""
    if indices is None:
        return list(requests)
    return [requests[i] for i in _rows(indices, len(requests))]


# The order of the checks: reqs, the scalars, layout, indices, then request by
# request (committed, allocated, the arithmetic).

def spec_v2_new_tokens_from_reqs(reqs, page_size, reserve, indices=None, *, layout=None,
                                 exact_ints=False):
    requests = _reqs(reqs)
    p, r = _scalar(page_size, 1), _scalar(reserve, 0)
    at_c, at_a = _layout(layout)
    exact = _flag(exact_ints)
    total = 0
    for req in _selected(requests, indices):
        # Requests are read one at a time, so the sum is checked as it runs:
        # its terms are never negative, a total past int64 stays past it.
        c = _req_length(req, "kv_committed_len", at_c, exact)
        a = _req_length(req, "kv_allocated_len", at_a, exact)
        total = _fits(total + _fits(ceil_align(max(a, _fits(c + r)), p)) - ceil_align(a, p))
    return total


def decode_new_tokens_from_reqs(reqs, page_size, indices=None, *, layout=None,
                                exact_ints=False):
    requests = _reqs(reqs)
    p = _scalar(page_size, 1)
    at_c, _ = _layout(layout)
    exact = _flag(exact_ints)
    return _fits(p * sum(1 for req in _selected(requests, indices)
                         if _req_length(req, "kv_committed_len", at_c, exact) % p == 0))


def _plan_limit(out: Any, dtype: Any, n: int) -> int:
    """The largest value the plan's arrays hold: int64 unless told otherwise."""
    if out is not None:
        if dtype is not None:
            raise Unmodelled("out= and dtype= together")
        return _out_limit(out, n, ())
    if dtype is None:
        return INT64_MAX
    try:
        kind = np.dtype(dtype)
    except Exception:
        raise Unmodelled("dtype that is not a dtype") from None
    if kind not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise Unmodelled("a dtype the plan refuses")
    return int(np.iinfo(kind).max)


def decode_alloc_plan_from_reqs(reqs, page_size, reserve, indices=None, *, page_aligned=True,
                                out=None, dtype=None, layout=None, exact_ints=False):
    """(cur, nxt, num_tokens, num_pages) over the selected requests, as lists and ints."""
    requests = _reqs(reqs)
    p, r = _scalar(page_size, 1), _scalar(reserve, 0)
    aligned = _flag(page_aligned)
    exact = _flag(exact_ints)
    at_c, at_a = _layout(layout)
    selected = _selected(requests, indices)
    limit = _plan_limit(out, dtype, len(selected))
    cur, nxt, tokens, pages = [], [], 0, 0
    for req in selected:
        c = _req_length(req, "kv_committed_len", at_c, exact)
        a = _req_length(req, "kv_allocated_len", at_a, exact)
        need = _fits(c + r)
        if aligned:
            need = _fits(ceil_align(need, p))
        for value in (a, max(a, need)):
            if value > limit:
                raise OverflowError(value)
        cur.append(a)
        nxt.append(max(a, need))
        tokens = _fits(tokens + nxt[-1] - a)
        pages += ceil_div(nxt[-1], p) - ceil_div(a, p)
    return cur, nxt, tokens, pages


def beam_member_rows_from_reqs(reqs, indices=None, *, exact_ints=False):
    """Σ req.beam_group.num_member_rows over the selected requests in a beam group
    (``exact_ints`` changes nothing here: only exact ints are modelled)."""
    _flag(exact_ints)
    total = 0
    for req in _selected(_reqs(reqs), indices):
        if not _has(req, "beam_group"):
            raise Unmodelled("a request without beam_group")
        group = _attribute(req, "beam_group")
        if group is not None:
            rows = _attribute(group, "num_member_rows")
            if type(rows) is not int:
                raise Unmodelled("num_member_rows that is not an int")  # added as sum() adds
            total += rows
    return total


def beam_groups_from_reqs(reqs, indices=None):
    """The number of selected requests whose beam_group is not None."""
    groups = 0
    for req in _selected(_reqs(reqs), indices):
        if not _has(req, "beam_group"):
            raise Unmodelled("a request without beam_group")
        groups += _attribute(req, "beam_group") is not None
    return groups


def _path(path: Any) -> tuple[str, ...]:
    return tuple(path.split(".")) if isinstance(path, str) else tuple(path)


def _paths(paths: Any) -> list[tuple[str, ...]]:
    if isinstance(paths, str):
        return [_path(paths)]
    return [_path(p) for p in paths]


def add_to_attrs(reqs, paths, delta):
    """The loop itself: ``req.<path> += delta`` for each request, each path."""
    chosen = _paths(paths)
    for req in reqs:
        for path in chosen:
            owner = req
            for name in path[:-1]:
                owner = getattr(owner, name)
            value = getattr(owner, path[-1])
            value += delta
            setattr(owner, path[-1], value)


def max_into_attr(reqs, path, values, *, strict=True):
    """The loop itself: ``req.<path> = max(req.<path>, v)`` over ``zip``."""
    names = _path(path)

    def owner_of(req: Any) -> Any:
        for name in names[:-1]:
            req = getattr(req, name)
        return req

    for req, value in zip(reqs, values, strict=strict):
        new = max(getattr(owner_of(req), names[-1]), value)
        setattr(owner_of(req), names[-1], new)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    fn.__name__: fn for fn in (
        add_to_attrs, max_into_attr,
        spec_v2_new_tokens, decode_new_tokens, num_new_pages, spec_v1_new_tokens,
        alloc_len_per_decode, alloc_reserve_per_decode, decode_alloc_plan,
        spec_v2_new_tokens_from_reqs, decode_new_tokens_from_reqs,
        decode_alloc_plan_from_reqs, beam_member_rows_from_reqs, beam_groups_from_reqs,
    )
}
