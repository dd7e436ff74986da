# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Free-threading: the module keeps no state; every call reads its requests
# through the C API (which keeps them alive) into locals, so no lock is needed.
# cython: freethreading_compatible=True
"""Compiled request-object kernels: the same names, signatures and exceptions
as kvest.reference._reqs, their pure-Python twin.

A scheduler holds request objects, not arrays: these read each request's
``kv_committed_len`` / ``kv_allocated_len`` (flat, or under ``req.kv``) in one
compiled pass.
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport INT64_MAX, int64_t, uint64_t

from kvest._common cimport (
    KV_FAST_LIMIT,
    _ceil_div,
    _count,
    _fast_range,
    _times_page,
    kv_cdiv,
    kv_divisor,
    kv_divisor_init,
)

from kvest._inputs import as_reqs, req_length
from kvest._names import REQ_FUNCTIONS

__all__ = list(REQ_FUNCTIONS)


cdef object _MISSING = object()


cdef inline int64_t _as_length(object v, object req, Py_ssize_t pos, str attr) except? -1:
    """An exact int in range as int64; anything else goes to the shared input
    rule, which converts it (NumPy integers) or raises its exception."""
    cdef int overflow = 0
    cdef long long x
    if type(v) is int:
        x = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow == 0 and x >= 0:
            return x
    return req_length(req, pos, attr)


cdef inline int64_t _committed(object req, Py_ssize_t pos) except? -1:
    """req.kv_committed_len, flat or under req.kv."""
    # getattr with a default takes CPython's no-exception lookup: a missing
    # flat attribute costs a dict probe, not a raised AttributeError.
    v = getattr(req, "kv_committed_len", _MISSING)
    if v is _MISSING:
        v = getattr(getattr(req, "kv", None), "kv_committed_len", _MISSING)
    return _as_length(v, req, pos, "kv_committed_len")


cdef inline int _both(object req, Py_ssize_t pos, int64_t *c, int64_t *a) except -1:
    """req's committed and allocated lengths, reading req.kv once if nested."""
    vc = getattr(req, "kv_committed_len", _MISSING)
    va = getattr(req, "kv_allocated_len", _MISSING)
    if vc is _MISSING or va is _MISSING:
        kv = getattr(req, "kv", None)
        if vc is _MISSING:
            vc = getattr(kv, "kv_committed_len", _MISSING)
        if va is _MISSING:
            va = getattr(kv, "kv_allocated_len", _MISSING)
    c[0] = _as_length(vc, req, pos, "kv_committed_len")
    a[0] = _as_length(va, req, pos, "kv_allocated_len")
    return 0


cdef inline void _row_overflow(Py_ssize_t pos) except *:
    raise OverflowError(f"reqs[{pos}]: an intermediate value or the running total "
                        "does not fit in int64")


def spec_v2_new_tokens_from_reqs(reqs, page_size, reserve):
    """:func:`spec_v2_new_tokens` read straight from request objects.

    Each request gives ``kv_committed_len`` and ``kv_allocated_len``, either
    flat on the request or nested under ``req.kv``.
    """
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef int64_t r = _count(reserve, "reserve", 0)
    cdef int64_t c = 0, a = 0, need, tokens, total = 0
    cdef int64_t max_pages = INT64_MAX // p
    cdef Py_ssize_t pos = 0
    cdef kv_divisor d
    cdef bint fast = _fast_range(0, p, r)
    kv_divisor_init(&d, p)
    for req in reqs:
        _both(req, pos, &c, &a)
        if fast and <uint64_t>(c | a) < KV_FAST_LIMIT:
            # Division by shift or multiply (see loops.h), exact in this range.
            need = c + r if c + r > a else a
            tokens = (<int64_t>kv_cdiv(need, &d) - <int64_t>kv_cdiv(a, &d)) * p
        else:
            if c > INT64_MAX - r:
                _row_overflow(pos)
            need = _ceil_div(c + r if c + r > a else a, p)
            if need > max_pages:
                _row_overflow(pos)
            tokens = (need - _ceil_div(a, p)) * p
        # Checked on both paths: an earlier huge row can bring the total near
        # the int64 limit, and a small row can then push it over.
        if total > INT64_MAX - tokens:
            _row_overflow(pos)
        total += tokens
        pos += 1
    return total


def decode_new_tokens_from_reqs(reqs, page_size):
    """:func:`decode_new_tokens` read straight from request objects."""
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef uint64_t pages = 0
    cdef Py_ssize_t pos = 0
    for req in reqs:
        pages += _committed(req, pos) % p == 0
        pos += 1
    return _times_page(pages, p, "decode_new_tokens_from_reqs")
