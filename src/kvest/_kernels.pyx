# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Free-threading: the module keeps no mutable state but the CPU variant, an int
# chosen at import (set_cpu_variant is a test hook); every call works on its own
# locals and only reads its input buffers, so no lock is needed.
# cython: freethreading_compatible=True
"""Compiled array kernels: the same names, signatures and exceptions as
kvest.reference._kernels, their pure-Python twin.

Each array function takes one of two paths.  The fast path hands raw pointers
to the vectorized C loops (src/kvest/_src/loops.c, runtime CPU dispatch) with the GIL
released; it is exact inside the "fast range" (page size, reserve and every
length read below 2^29), which the loops verify as they go.  Anything outside
it -- a negative length, an enormous value -- takes the checked path: scalar
loops that test every intermediate against int64 and raise as the reference
does.
"""

cimport numpy as cnp
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint64_t

from kvest._common cimport (
    KV_FAST_LIMIT,
    KV_NUM_VARIANTS,
    _ceil_align,
    _ceil_div,
    _count,
    _fast_range,
    _fits_add,
    _fits_mul,
    _times_page,
    kv_add_total,
    kv_best_variant,
    kv_current_variant,
    kv_divisor,
    kv_divisor_init,
    kv_extend_pages,
    kv_mod_count,
    kv_mod_row,
    kv_plan_row,
    kv_select_variant,
    kv_spec_v2_pages,
    kv_spec_v2_row,
    kv_variant_name,
    kv_variant_supported,
)

import os

import numpy as np

from kvest._errors import int64_overflow, plan_overflow, spec_v2_overflow
from kvest._inputs import (
    as_flag,
    as_indices,
    as_lengths,
    as_out,
    check_same_length,
    first_negative,
    out_pair,
)
from kvest._names import ARRAY_FUNCTIONS
from kvest._types import AllocPlan

__all__ = list(ARRAY_FUNCTIONS)

cnp.import_array()


cdef enum:
    # Releasing and retaking the GIL costs about as much as 1,000 rows of the
    # fast loops: below this many rows, keep it.
    RELEASE_GIL_ROWS = 2048


cdef enum Loop:
    SPEC_V2_PAGES
    MOD_COUNT
    EXTEND_PAGES


cdef struct FastCall:
    # One call of a vectorized loop (loops.h): its inputs, every member given at
    # each call site (the divisor and the OR of the lengths read are _fast's).
    Loop loop
    const void *x  # committed / seq_lens
    const void *y  # allocated / prefix_lens (unused by MOD_COUNT)
    int width
    int64_t n
    uint64_t arg  # the reserve (SPEC_V2_PAGES) or the wanted residue (MOD_COUNT)
    const int64_t *idx
    int64_t m


cdef inline uint64_t _loop(const FastCall *f, const kv_divisor *d,
                           uint64_t *bits) noexcept nogil:
    if f.loop == SPEC_V2_PAGES:
        return kv_spec_v2_pages(f.x, f.y, f.width, f.n, d, f.arg, f.idx, f.m, bits)
    if f.loop == MOD_COUNT:
        return kv_mod_count(f.x, f.width, f.n, d, f.arg, f.idx, f.m, bits)
    return kv_extend_pages(f.x, f.y, f.width, f.n, d, bits)


cdef inline bint _fast(const FastCall *f, int64_t p, int64_t reserve,
                       uint64_t *result) noexcept:
    """The fast path of every array function: the vectorized loop when p, the
    reserve and the row count allow it, the GIL released for large batches.
    True when *result is exact (every length read was in the fast range)."""
    cdef kv_divisor d
    cdef uint64_t bits = 0
    if not _fast_range(f.n, p, reserve):
        return False
    kv_divisor_init(&d, p)
    if f.m >= RELEASE_GIL_ROWS:
        with nogil:
            result[0] = _loop(f, &d, &bits)
    else:
        result[0] = _loop(f, &d, &bits)
    return bits < KV_FAST_LIMIT


ctypedef fused length_t:
    int32_t
    int64_t

ctypedef fused out_t:
    int32_t
    int64_t


# ---------------------------------------------------------------- CPU variants

def cpu_variants():
    """Names of the loop variants this build holds that this CPU can run."""
    return [kv_variant_name(v).decode() for v in range(KV_NUM_VARIANTS)
            if kv_variant_supported(v)]


def cpu_variant():
    """Name of the loop variant in use."""
    return kv_variant_name(kv_current_variant()).decode()


def set_cpu_variant(name):
    """Run the loops compiled for ``name`` (``baseline``, ``avx2``, ``avx512``).

    Raises ``ValueError`` if the name is unknown or the CPU cannot run it.
    Meant for tests and benchmarks: set it before calls start, not during.
    """
    for v in range(KV_NUM_VARIANTS):
        if kv_variant_name(v).decode() == name:
            if kv_select_variant(v) != 0:
                raise ValueError(f"this CPU cannot run the {name!r} kernels; "
                                 f"it supports {cpu_variants()}")
            return
    raise ValueError(f"unknown CPU variant {name!r}; choose from "
                     f"{[kv_variant_name(v).decode() for v in range(KV_NUM_VARIANTS)]}")


kv_select_variant(kv_best_variant())
if os.environ.get("KVEST_CPU", "").strip():
    # Read as people write it (any case); a variant this CPU cannot run, or an
    # unknown name, warns and keeps the best one: never a failed import.
    try:
        set_cpu_variant(os.environ["KVEST_CPU"].strip().lower())
    except ValueError as exc:
        import warnings
        warnings.warn(f"KVEST_CPU ignored: {exc}", RuntimeWarning, stacklevel=2)


# ------------------------------------------------------------ argument parsing

cdef inline bint _readable(object obj) noexcept:
    """A plain 1-D contiguous aligned native int32/int64 ndarray, judged by its C
    fields: what a subclass says of itself (dtype, flags) is never asked."""
    return (cnp.PyArray_CheckExact(obj) and cnp.PyArray_NDIM(<cnp.ndarray>obj) == 1
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>obj)  # also: native byte order
            and cnp.PyArray_ISSIGNED(<cnp.ndarray>obj)
            and cnp.PyArray_ITEMSIZE(<cnp.ndarray>obj) >= 4)


cdef inline cnp.ndarray _lengths(object obj, str name):
    """obj as a contiguous native int32/int64 array; such arrays pass as they are.

    Only a plain ndarray takes the shortcut: a subclass (a masked array, whose
    data holds values its caller masked out) goes through the input rules.
    """
    if _readable(obj):
        return <cnp.ndarray>obj
    arr = as_lengths(obj, name)
    if not _readable(arr):  # never trusted blindly: the pointer arithmetic depends on it
        raise TypeError(f"{name}: internal error, the input rule gave {type(arr).__name__}")
    return <cnp.ndarray>arr


cdef inline bint _flag(object value, str name) except -1:
    """A flag argument: True or False (Python or NumPy bool), nothing else."""
    if value is True:
        return True
    if value is False:
        return False
    return as_flag(value, name)


cdef inline cnp.ndarray _snapshot(cnp.ndarray arr):
    """kvest's own copy of arr, for the checked paths: they read the values
    several times (sign checks, the loop, the overflow report), and another
    thread may write the caller's array between the reads.  The fast loops
    need none: they check each value in the same pass that uses it."""
    return cnp.PyArray_NewCopy(arr, cnp.NPY_CORDER)


cdef inline const void *_data(cnp.ndarray arr) noexcept:
    return <const void *>cnp.PyArray_DATA(arr)


cdef inline int64_t _len(cnp.ndarray arr) noexcept:
    return cnp.PyArray_DIMS(arr)[0]


cdef inline int _width(cnp.ndarray arr) noexcept:
    return <int>cnp.PyArray_ITEMSIZE(arr)


cdef inline int64_t _row(const int64_t *idx, int64_t j, int64_t n) noexcept nogil:
    if idx == NULL:
        return j
    return idx[j] + n if idx[j] < 0 else idx[j]


# ------------------------------------------------------ checked (scalar) loops
# Taken when the fast range does not hold.  Each returns 0, or the 1-based
# position (among the rows visited) where an int64 value would overflow.

cdef int64_t _spec_v2_checked(const length_t *c, const length_t *a, int64_t n,
                              const int64_t *idx, int64_t m, int64_t p, int64_t r,
                              int64_t *result) noexcept nogil:
    # The status of a failure: the row, and in *result the total before it.
    cdef int64_t j, i, tokens, total = 0
    for j in range(m):
        i = _row(idx, j, n)
        if kv_spec_v2_row(c[i], a[i], p, r, &tokens) or kv_add_total(&total, tokens):
            result[0] = total
            return j + 1
    result[0] = total
    return 0


cdef uint64_t _mod_count_checked(const length_t *c, int64_t n, const int64_t *idx,
                                 int64_t m, int64_t p, int64_t want) noexcept nogil:
    cdef int64_t j
    cdef uint64_t count = 0
    for j in range(m):
        count += kv_mod_row(c[_row(idx, j, n)], p, want)
    return count


cdef int _extend_checked(const length_t *s, const length_t *pre, int64_t n, int64_t p,
                         int64_t *result) noexcept nogil:
    # A two-word (128-bit) accumulator: the terms can be negative, so a running
    # int64 sum could overflow on the way to a result that fits.
    cdef int64_t i, term, hi = 0
    cdef uint64_t lo = 0, old
    for i in range(n):
        term = _ceil_div(s[i], p) - _ceil_div(pre[i], p)
        old = lo
        lo += <uint64_t>term
        hi += (lo < old) - (term < 0)
    if (hi == 0 and lo <= <uint64_t>INT64_MAX) or (hi == -1 and lo > <uint64_t>INT64_MAX):
        result[0] = <int64_t>lo
        return 0
    return 1


# ------------------------------------------------------------------- estimators

def spec_v2_new_tokens(committed, allocated, page_size, reserve, indices=None):
    """KV slots the next spec-v2 (overlap) decode step allocates.

    ``sum(ceil_align(max(A[i], C[i] + R), p) - ceil_align(A[i], p))`` over the
    selected rows ``i``, with ``C = committed``, ``A = allocated``,
    ``p = page_size`` and ``R = reserve``.
    """
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef int64_t r = _count(reserve, "reserve", 0)
    cdef cnp.ndarray c = _lengths(committed, "committed")
    cdef cnp.ndarray a = _lengths(allocated, "allocated")
    cdef int64_t n = _len(c), m = n, bad, total = 0
    cdef const int64_t *idx = NULL
    cdef cnp.ndarray sel = None
    cdef uint64_t pages
    if _len(a) != n:
        check_same_length(c, "committed", a, "allocated")
    if _width(c) != _width(a):
        c, a = c.astype(np.int64), a.astype(np.int64)
    if indices is not None:
        sel = as_indices(indices, n)
        idx = <const int64_t *>_data(sel)
        m = _len(sel)
    cdef const void *cp = _data(c)
    cdef const void *ap = _data(a)
    cdef int w = _width(c)
    cdef FastCall f = FastCall(loop=SPEC_V2_PAGES, x=cp, y=ap, width=w, n=n, arg=r, idx=idx, m=m)
    if _fast(&f, p, r, &pages):
        return _times_page(pages, p, "spec_v2_new_tokens")
    c, a = _snapshot(c), _snapshot(a)
    cp, ap = _data(c), _data(a)
    first_negative(c, "committed", sel)
    first_negative(a, "allocated", sel)
    with nogil:
        if w == 4:
            bad = _spec_v2_checked(<const int32_t *>cp, <const int32_t *>ap, n, idx, m, p, r,
                                   &total)
        else:
            bad = _spec_v2_checked(<const int64_t *>cp, <const int64_t *>ap, n, idx, m, p, r,
                                   &total)
    if bad:
        i = _row(idx, bad - 1, n)
        raise spec_v2_overflow(i, int(c[i]), int(a[i]), p, r, total)
    return total


def _ceil_div_int(x, p):
    return -(-x // p)


cdef object _mod_count(object lengths, str name, int64_t p, int64_t want, object indices):
    """Rows whose length is want modulo p (want 0: decode tokens, 1: decode pages)."""
    cdef cnp.ndarray c = _lengths(lengths, name)
    cdef int64_t n = _len(c), m = n
    cdef const int64_t *idx = NULL
    cdef cnp.ndarray sel = None
    cdef uint64_t count
    if indices is not None:
        sel = as_indices(indices, n)
        idx = <const int64_t *>_data(sel)
        m = _len(sel)
    cdef const void *cp = _data(c)
    cdef int w = _width(c)
    cdef FastCall f = FastCall(loop=MOD_COUNT, x=cp, y=NULL, width=w, n=n, arg=<uint64_t>want,
                               idx=idx, m=m)
    if _fast(&f, p, 0, &count):
        return count
    c = _snapshot(c)
    cp = _data(c)
    first_negative(c, name, sel)
    with nogil:
        if w == 4:
            count = _mod_count_checked(<const int32_t *>cp, n, idx, m, p, want)
        else:
            count = _mod_count_checked(<const int64_t *>cp, n, idx, m, p, want)
    return count


def decode_new_tokens(committed, page_size, indices=None):
    """KV slots the next plain decode step allocates.

    ``p * count(C[i] mod p == 0)`` over the selected rows: a request needs a
    fresh page exactly when its committed length sits on a page boundary.
    """
    cdef int64_t p = _count(page_size, "page_size", 1)
    return _times_page(_mod_count(committed, "committed", p, 0, indices), p,
                       "decode_new_tokens")


def num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False):
    """Pages (not tokens) an extend or decode allocation takes.

    Extend: ``sum(ceil_div(S[i], p) - ceil_div(P[i], p))``.  ``decode=True``:
    ``count(S[i] mod p == 1)``, where ``S`` already includes the new token;
    like SGLang's decode special case this is 0 when ``p == 1``.
    """
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef bint decoding = _flag(decode, "decode")
    cdef cnp.ndarray s, pre
    cdef int64_t n, total
    cdef uint64_t pages
    if decoding:
        # SGLang's get_num_new_pages never reads prefix_lens when decoding:
        # neither does kvest (no coercion, no length or sign check).
        return _mod_count(seq_lens, "seq_lens", p, 1, None)
    if prefix_lens is None:
        raise ValueError("num_new_pages needs prefix_lens unless decode=True")
    s = _lengths(seq_lens, "seq_lens")
    n = _len(s)
    pre = _lengths(prefix_lens, "prefix_lens")
    if _len(pre) != n:
        check_same_length(s, "seq_lens", pre, "prefix_lens")
    if _width(s) != _width(pre):
        s, pre = s.astype(np.int64), pre.astype(np.int64)
    cdef const void *sp = _data(s)
    cdef const void *pp = _data(pre)
    cdef int w = _width(s)
    cdef FastCall f = FastCall(loop=EXTEND_PAGES, x=sp, y=pp, width=w, n=n, arg=0, idx=NULL, m=n)
    if _fast(&f, p, 0, &pages):
        return <int64_t>pages
    s, pre = _snapshot(s), _snapshot(pre)
    sp, pp = _data(s), _data(pre)
    first_negative(s, "seq_lens")
    first_negative(pre, "prefix_lens")
    with nogil:
        if w == 4:
            bad = _extend_checked(<const int32_t *>sp, <const int32_t *>pp, n, p, &total)
        else:
            bad = _extend_checked(<const int64_t *>sp, <const int64_t *>pp, n, p, &total)
    if bad:
        exact = sum(_ceil_div_int(x, p) - _ceil_div_int(y, p)
                    for x, y in zip(s.tolist(), pre.tolist()))
        raise int64_overflow("num_new_pages", exact)
    return total


def spec_v1_new_tokens(num_requests, page_size, num_steps, topk, num_draft_tokens):
    """Upper bound on KV slots a spec-v1 (EAGLE) decode step allocates.

    With ``s = num_steps or 1``, ``k = topk or 1``, ``T = num_draft_tokens``:
    ``L = ceil_align(s + p, p)`` and ``T' = ceil_align(T, p)`` when ``p > 1`` and
    ``k > 1``; ``L = ceil_align(s, p)``, ``T' = ceil_align(T, p)`` when ``p > 1``
    and ``k == 1``; ``L = s``, ``T' = T`` when ``p == 1``.  Returns
    ``num_requests * max(L * k, T')``.  ``None`` counts as unset (0).
    """
    cdef int64_t n = _count(num_requests, "num_requests", 0)
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef int64_t s = _optional(num_steps, "num_steps") or 1
    cdef int64_t k = _optional(topk, "topk") or 1
    cdef int64_t t = _optional(num_draft_tokens, "num_draft_tokens")
    cdef int64_t length = s
    if p > 1:
        if k > 1:
            length = _fits_add(s, p, "num_steps + page_size")
        length = _ceil_align(length, p, "L")
        t = _ceil_align(t, p, "ceil_align(num_draft_tokens)")
    length = _fits_mul(length, k, "L * topk")
    return _fits_mul(n, length if length > t else t, "spec_v1_new_tokens")


cdef inline int64_t _optional(object value, str name) except -1:
    return 0 if value is None else _count(value, name, 0)


def alloc_len_per_decode(num_steps, topk, num_draft_tokens, page_size, *,
                         speculative=True, has_draft_kv=True):
    """KV length one request may allocate in one decode step.

    ``1`` without speculation; ``max(s * k, T)`` when ``p == 1``, ``k == 1`` or
    the draft model keeps no KV (``has_draft_kv=False``); otherwise (tree
    drafts on pages) ``max(ceil_div(p - 1 + s, p) * p * k, T)``, with ``s``,
    ``k``, ``T`` as in :func:`spec_v1_new_tokens`.
    """
    cdef int64_t s = _optional(num_steps, "num_steps") or 1
    cdef int64_t k = _optional(topk, "topk") or 1
    cdef int64_t t = _optional(num_draft_tokens, "num_draft_tokens")
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef bint spec = _flag(speculative, "speculative")
    cdef bint draft_kv = _flag(has_draft_kv, "has_draft_kv")
    cdef int64_t span
    if not spec:
        return 1
    if p == 1 or k == 1 or not draft_kv:
        span = _fits_mul(s, k, "num_steps * topk")
    else:
        span = _ceil_div(_fits_add(p - 1, s, "page_size - 1 + num_steps"), p)
        span = _fits_mul(_fits_mul(span, p, "pages * page_size"), k, "pages * page_size * topk")
    return span if span > t else t


def alloc_reserve_per_decode(num_steps, topk, num_draft_tokens, page_size, *,
                             speculative=True, has_draft_kv=True):
    """The reserve ``R``: ``2 * alloc_len_per_decode(...)``."""
    cdef int64_t one = alloc_len_per_decode(num_steps, topk, num_draft_tokens, page_size,
                                            speculative=speculative, has_draft_kv=has_draft_kv)
    return _fits_mul(one, 2, "alloc_reserve_per_decode")


# ------------------------------------------------------------ allocation plan

cdef enum:
    PLAN_OK = 0
    PLAN_NEGATIVE = 1
    PLAN_OVERFLOW = 2
    PLAN_CUR_RANGE = 3
    PLAN_NXT_RANGE = 4


cdef int _plan(const length_t *c, const length_t *a, int64_t n, int64_t p, int64_t r,
               bint aligned, out_t *cur, out_t *nxt, int64_t *sums, int64_t *row) noexcept nogil:
    # Reads row i of both inputs before writing row i of the outputs, so an out
    # buffer may alias an input.
    cdef int64_t i, ci, ai, need, tokens = 0, pages = 0
    cdef int64_t limit = INT32_MAX if out_t is int32_t else INT64_MAX
    for i in range(n):
        row[0] = i
        ci = c[i]
        ai = a[i]
        # A failure's status: the code, its row, and (sums[0]) the total before it.
        if ci < 0 or ai < 0:
            sums[0] = tokens
            return PLAN_NEGATIVE
        if kv_plan_row(ci, ai, p, r, aligned, &need):
            sums[0] = tokens
            return PLAN_OVERFLOW
        if ai > limit:
            sums[0] = tokens
            return PLAN_CUR_RANGE
        if need > limit:
            sums[0] = tokens
            return PLAN_NXT_RANGE
        cur[i] = <out_t>ai
        nxt[i] = <out_t>need
        if kv_add_total(&tokens, need - ai):
            sums[0] = tokens
            return PLAN_OVERFLOW
        pages += _ceil_div(need, p) - _ceil_div(ai, p)  # <= tokens: cannot overflow
    sums[0] = tokens
    sums[1] = pages
    return PLAN_OK


cdef int _plan_into(const length_t *c, const length_t *a, int64_t n, int64_t p, int64_t r,
                    bint aligned, cnp.ndarray cur, cnp.ndarray nxt, int64_t *sums,
                    int64_t *row) noexcept:
    # cur and nxt have the same width (the caller sees to it).
    cdef void *cp = cnp.PyArray_DATA(cur)
    cdef void *np_ = cnp.PyArray_DATA(nxt)
    cdef bint narrow = _width(cur) == 4
    cdef int code
    with nogil:
        if narrow:
            code = _plan(c, a, n, p, r, aligned, <int32_t *>cp, <int32_t *>np_, sums, row)
        else:
            code = _plan(c, a, n, p, r, aligned, <int64_t *>cp, <int64_t *>np_, sums, row)
    return code


def decode_alloc_plan(committed, allocated, page_size, reserve, *, page_aligned=True,
                      out=None):
    """The spec-v2 decode allocation itself, in one pass.

    Per request ``cur = A[i]`` and ``nxt = max(A[i], ceil_align(C[i] + R, p))``
    (``page_aligned``) or ``nxt = max(A[i], C[i] + R)``; returns both arrays,
    ``num_tokens = sum(nxt - cur)`` and
    ``num_pages = sum(ceil_div(nxt, p) - ceil_div(cur, p))``.  ``out=(cur, nxt)``
    fills preallocated buffers instead: NumPy arrays or CPU tensors, both int32
    or both int64, separate from each other and from the inputs (their contents
    are unspecified if the call raises); the plan then holds those objects.
    ``num_pages * p`` always equals :func:`spec_v2_new_tokens` on the same inputs.
    """
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef int64_t r = _count(reserve, "reserve", 0)
    cdef bint aligned = _flag(page_aligned, "page_aligned")
    cdef cnp.ndarray c = _lengths(committed, "committed")
    cdef cnp.ndarray a = _lengths(allocated, "allocated")
    cdef int64_t n = _len(c), row = 0
    cdef int64_t sums[2]
    sums[0] = sums[1] = 0  # read only after PLAN_OK; set so the compiler can tell
    cdef int code
    cdef cnp.ndarray cur_buf, nxt_buf
    if _len(a) != n:
        check_same_length(c, "committed", a, "allocated")
    if out is not None and type(out) is not tuple:
        out = out_pair(out)  # read once: the plan returns the objects it wrote
    if out is None:
        cur_buf, nxt_buf = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    elif _plain_out(out, n, committed, allocated, c, a):
        cur_buf, nxt_buf = out
    else:
        # Both buffers have one dtype; neither overlaps the other or an input
        # (what the caller passed, or what kvest reads in its place).
        cur_buf, nxt_buf = as_out(out, n, ("committed", committed), ("allocated", allocated),
                                  ("committed", c), ("allocated", a))
    if _width(c) != _width(a):
        c, a = c.astype(np.int64), a.astype(np.int64)
    if _width(c) == 4:
        code = _plan_into(<const int32_t *>_data(c), <const int32_t *>_data(a), n, p, r,
                          aligned, cur_buf, nxt_buf, sums, &row)
    else:
        code = _plan_into(<const int64_t *>_data(c), <const int64_t *>_data(a), n, p, r,
                          aligned, cur_buf, nxt_buf, sums, &row)
    if code != PLAN_OK:
        # Again over kvest's own copy, which no other thread writes: the
        # report below reads the same values as the loop that failed.
        c, a = _snapshot(c), _snapshot(a)
        if _width(c) == 4:
            code = _plan_into(<const int32_t *>_data(c), <const int32_t *>_data(a), n, p, r,
                              aligned, cur_buf, nxt_buf, sums, &row)
        else:
            code = _plan_into(<const int64_t *>_data(c), <const int64_t *>_data(a), n, p, r,
                              aligned, cur_buf, nxt_buf, sums, &row)
    if code != PLAN_OK:
        # A negative length anywhere is reported first, as the reference does.
        first_negative(c, "committed")
        first_negative(a, "allocated")
        raise plan_overflow(row, int(c[row]), int(a[row]), p, r, aligned, cur_buf.dtype,
                            sums[0])
    if out is None:
        return AllocPlan(cur_buf, nxt_buf, sums[0], sums[1])
    # The caller's own objects (arrays or tensors), now filled.
    return AllocPlan(out[0], out[1], sums[0], sums[1])


cdef inline bint _plain_buffer(object buf, int64_t n) noexcept:
    """An out buffer as_out takes as it is: a plain ndarray of n native int32 or
    int64, C-contiguous, aligned and writable."""
    if not cnp.PyArray_CheckExact(buf):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>buf
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_DIMS(arr)[0] == n
            and cnp.PyArray_ISCARRAY(arr) and cnp.PyArray_ISSIGNED(arr)
            and cnp.PyArray_ITEMSIZE(arr) >= 4)


cdef inline bint _apart(cnp.ndarray x, cnp.ndarray y) noexcept:
    """Two C-contiguous arrays whose bytes do not overlap."""
    cdef char *x0 = <char *>cnp.PyArray_DATA(x)
    cdef char *y0 = <char *>cnp.PyArray_DATA(y)
    return (x0 + cnp.PyArray_NBYTES(x) <= y0 or y0 + cnp.PyArray_NBYTES(y) <= x0
            or cnp.PyArray_NBYTES(x) == 0 or cnp.PyArray_NBYTES(y) == 0)


cdef bint _plain_out(object out, int64_t n, object committed, object allocated,
                     cnp.ndarray c, cnp.ndarray a) except -1:
    """True when out=(cur, nxt) passes every check of as_out by pointer
    arithmetic alone: the common case, a few nanoseconds instead of a few
    microseconds.  False sends the call through as_out, which decides (and
    words the error)."""
    if not (type(out) is tuple and len(<tuple>out) == 2):
        return False
    cur, nxt = <tuple>out
    if not (_plain_buffer(cur, n) and _plain_buffer(nxt, n)):
        return False
    if cnp.PyArray_TYPE(<cnp.ndarray>cur) != cnp.PyArray_TYPE(<cnp.ndarray>nxt):
        return False
    if not _apart(cur, nxt):
        return False
    for arr in (c, a, committed, allocated):
        if cnp.PyArray_Check(arr):
            # The caller's own array: only a contiguous one has a byte range.
            if not cnp.PyArray_ISCONTIGUOUS(<cnp.ndarray>arr):
                return False
            if not (_apart(cur, arr) and _apart(nxt, arr)):
                return False
    return True
