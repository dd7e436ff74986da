# cython: language_level=3
# Declarations and inline helpers shared by the compiled modules (_kernels for
# arrays, _reqs for request objects): the C loops' interface and the scalar
# argument and integer-range helpers, written once and inlined into each.

from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdint cimport INT64_MAX, int64_t, uint64_t


cdef extern from "loops.h" nogil:
    ctypedef struct kv_divisor:
        uint64_t p
        int pow2
    uint64_t KV_FAST_LIMIT
    int64_t KV_FAST_MAX_ROWS
    int KV_NUM_VARIANTS
    void kv_divisor_init(kv_divisor *d, uint64_t p)
    uint64_t kv_cdiv(uint64_t x, const kv_divisor *d)
    uint64_t kv_spec_v2_pages(const void *c, const void *a, int itemsize, int64_t n,
                              const kv_divisor *d, uint64_t reserve,
                              const int64_t *idx, int64_t m, uint64_t *bits)
    uint64_t kv_mod_count(const void *c, int itemsize, int64_t n, const kv_divisor *d,
                          uint64_t want, const int64_t *idx, int64_t m, uint64_t *bits)
    uint64_t kv_extend_pages(const void *s, const void *pre, int itemsize, int64_t n,
                             const kv_divisor *d, uint64_t *bits)
    const char *kv_variant_name(int variant)
    int kv_variant_supported(int variant)
    int kv_best_variant()
    int kv_select_variant(int variant)
    int kv_current_variant()


# The row formulas, defined once (rows.h) for every compiled path.
cdef extern from "rows.h" nogil:
    int64_t kv_ceil_div(int64_t x, int64_t p)
    uint64_t kv_spec_v2_row_fast(uint64_t c, uint64_t a, uint64_t reserve, const kv_divisor *d)
    int kv_spec_v2_row(int64_t c, int64_t a, int64_t p, int64_t reserve, int64_t *tokens)
    int kv_add_total(int64_t *total, int64_t term)
    int kv_mod_row_fast(uint64_t c, const kv_divisor *d, uint64_t want)
    int kv_mod_row(int64_t c, int64_t p, int64_t want)
    uint64_t kv_chunk_fast(const int64_t *c, const int64_t *a, int64_t k, uint64_t reserve,
                           const kv_divisor *d, uint64_t *bits)
    int kv_plan_row(int64_t c, int64_t a, int64_t p, int64_t reserve, int aligned,
                    int64_t *nxt)
    uint64_t kv_plan_row_fast(uint64_t c, uint64_t a, uint64_t reserve, int aligned,
                              const kv_divisor *d, uint64_t *nxt)


cdef inline int64_t _count(object value, str name, int64_t minimum) except -1:
    """A scalar argument as int64 >= minimum (exact ints fast, the rest via as_count)."""
    cdef int overflow = 0
    cdef long long v
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow == 0 and v >= minimum:
            return v
    from kvest._inputs import as_count
    return as_count(value, name, minimum)


cdef inline int _overflow(str what, object value) except -1:
    """Raise the error layer's OverflowError for ``what = value`` (a cold path)."""
    from kvest._errors import int64_overflow
    raise int64_overflow(what, value)


cdef inline bint _fast_range(int64_t n, int64_t p, int64_t reserve) noexcept:
    return (n < KV_FAST_MAX_ROWS and <uint64_t>p < KV_FAST_LIMIT
            and <uint64_t>reserve < KV_FAST_LIMIT)


cdef inline object _times_page(uint64_t count, int64_t p, str what):
    if count > <uint64_t>(INT64_MAX // p):
        _overflow(what, <object>count * p)
    return <int64_t>(count * <uint64_t>p)


cdef inline int64_t _ceil_div(int64_t x, int64_t p) noexcept nogil:
    # x >= 0, p >= 1
    return kv_ceil_div(x, p)


cdef inline int64_t _fits_add(int64_t x, int64_t y, str what) except? -1:
    # x, y >= 0
    if x > INT64_MAX - y:
        _overflow(what, <object>x + y)
    return x + y


cdef inline int64_t _fits_mul(int64_t x, int64_t y, str what) except? -1:
    # x, y >= 0
    if y != 0 and x > INT64_MAX // y:
        _overflow(what, <object>x * y)
    return x * y


cdef inline int64_t _ceil_align(int64_t x, int64_t p, str what) except? -1:
    return _fits_mul(_ceil_div(x, p), p, what)
