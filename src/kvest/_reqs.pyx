# Bounds checks on: a request's property can shrink the list being read, so
# every index into a caller's container is checked (the C reads check by hand).
# cython: language_level=3, boundscheck=True, wraparound=False, cdivision=True
# cython: initializedcheck=False
# Free-threading: not claimed.  The readers take a borrowed reference to a
# container's item or a slot's value and then increment it, which another
# thread's write could free in between; on a free-threaded build importing
# this module turns the GIL back on (no freethreading_compatible directive).
"""Compiled request-object kernels: the same names, signatures and exceptions
as kvest.reference._reqs, their pure-Python twin.

A scheduler holds request objects, not arrays: these read each request's
``kv_committed_len`` / ``kv_allocated_len`` (flat, or under ``req.kv``) in one
compiled pass.  How each name is read is worked out once per request type and
call (src/_src/reqattr.h): an instance-dict probe, a slot read at a member
descriptor's offset, or the generic lookup; the row arithmetic is the shared
row formulas (src/_src/rows.h).
"""

cimport numpy as cnp
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_REFCNT, Py_XDECREF, Py_XINCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport INT32_MAX, INT64_MAX, INT64_MIN, int32_t, int64_t, uint64_t

from kvest._common cimport (
    KV_FAST_LIMIT,
    _count,
    _fast_range,
    _times_page,
    kv_add_total,
    kv_ceil_div,
    kv_divisor_init,
    kv_chunk_fast,
    kv_mod_row,
    kv_mod_row_fast,
    kv_plan_row,
    kv_plan_row_fast,
    kv_spec_v2_row,
    kv_spec_v2_row_fast,
)
import numpy as np

from sys import intern

from kvest._errors import (
    impure_argument,
    impure_request,
    plan_reqs_overflow,
    spec_v2_reqs_overflow,
)
from kvest._inputs import (
    as_flag,
    as_plan_out,
    as_req_layout,
    as_reqs,
    beam_attr,
    beam_rows_value,
    plan_grew_error,
    plan_shrank_error,
    pure_args,
    pure_reqs,
    pure_values,
    req_length_value,
    req_read_error,
    req_rows,
    reqs_iter,
    reqs_list,
    reqs_read_error,
)
from kvest._names import REQ_FUNCTIONS
from kvest._types import AllocPlan

__all__ = list(REQ_FUNCTIONS)

cnp.import_array()


# The route core (src/kvest/_src/reqroute.h): compiled here alone, readers and
# writers both, so that its one memo exists once.
cdef extern from "reqroute.h":
    ctypedef struct kv_gc:
        pass
    void kv_gc_init(kv_gc *g)
    void kv_gc_let(kv_gc *g)
    PyObject *kv_plain_attr(PyObject *obj, PyObject *name, kv_gc *g)
    int kv_dict_entries_check() except -1
    int kv_managed_dict_check(object probe) except -1
    int kv_dict_entries_ok, kv_managed_dict_ok
    enum:
        KV_DICT_ENTRIES


cdef extern from "reqattr.h":
    ctypedef struct kv_ctx:
        int pure
    ctypedef struct kv_cache:
        kv_ctx cx
    ctypedef struct kv_req_state:
        bint failed_in_kv
    enum:
        KV_COMMITTED
        KV_ALLOCATED
        KV_BEAM
        KV_ROWS
        KV_AT_EITHER
        KV_AT_FLAT
        KV_AT_NESTED
        KV_IMPURE
        KV_LEN_IMPURE
        KV_LEN_ERROR
        KV_LEN_MISSING
        KV_LEN_OK
        KV_LEN_VALUE
        KV_PURE_OFF
        KV_PURE_STRICT
        KV_PURE_QUICK
    void kv_cache_init(kv_cache *c, PyObject *committed, PyObject *allocated,
                       PyObject *nested, PyObject *beam, PyObject *rows, int pure)
    void kv_cache_let(kv_cache *c)
    void kv_cache_hold(kv_cache *c)
    int kv_get(kv_cache *c, PyObject *obj, int which, PyObject **value, int *pure)
    void kv_req_begin(kv_req_state *st)
    void kv_req_forget(kv_req_state *st)
    int kv_req_length(kv_cache *c, PyObject *req, int which, int at, kv_req_state *st,
                      int64_t *length, PyObject **value)
    ctypedef struct kv_run:
        int both
    bint kv_run_begin(kv_cache *c, kv_run *run, PyObject *first, int at_committed,
                      int at_allocated, bint both, bint beam)
    Py_ssize_t kv_run_read(kv_cache *c, const kv_run *run, PyObject **items,
                           Py_ssize_t start, Py_ssize_t end, int64_t *committed,
                           int64_t *allocated)


cdef extern from "fence.h":
    enum:
        KV_PRIVATE

# Whether this build keeps to CPython's public API (the fence, fence.h): on
# any Python newer than 3.13, or built with KVEST_PUBLIC_API_ONLY=1 (CI checks it).
_PUBLIC_API_ONLY = not KV_PRIVATE


# Whether instance-dict entries are read where CPython keeps them (3.11 to
# 3.13, found at import to agree with PyDict_Next; reqroute.h), for the tests.
# The fence's self-checks (fence.h): a private read is used only once it
# agrees with what CPython's own calls give; the probe is a class defined in
# Python (its instances keep a managed dict on 3.11+).
kv_dict_entries_check()
kv_managed_dict_check(type("_FenceProbe", (), {}))
_DICT_ENTRIES = bool(KV_DICT_ENTRIES and kv_dict_entries_ok)
_MANAGED_DICT = bool(kv_managed_dict_ok)  # the managed-dict read agreed (3.11+)
# The order policies (address order, backward) pay only where a request is
# read by loads alone, dict entries included (docs/benchmarks.md measures
# them there): elsewhere a batch is read in order.
cdef bint _ORDERS = _DICT_ENTRIES  # (a GIL build: another thread cannot write the batch)


cdef extern from "addrorder.h":
    enum:
        KV_ORDER_MIN
        KV_BACKWARD_MIN
    bint kv_mostly_near(PyObject **items, Py_ssize_t m)
    int kv_address_order(PyObject **items, Py_ssize_t m, PyObject **out)


cdef extern from "Python.h":
    PyObject **PySequence_Fast_ITEMS(object o)


# Interned: the per-type lookups and dict probes compare these by identity first.
cdef str _COMMITTED = "kv_committed_len"
cdef str _ALLOCATED = "kv_allocated_len"
cdef str _NESTED = "kv"
cdef str _BEAM = "beam_group"
cdef str _ROWS = "num_member_rows"


# ----------------------------------------------------------- reading lengths

# What a row gives back when the job's pure mode is KV_PURE_QUICK (the
# address-ordered walk) and the request needs more than a pure read: nothing
# raised, nothing but the job changed; the caller walks in order instead.
cdef enum:
    GAVE_UP = 1
    QUICK_MISS = -2  # a length's stand-in for GAVE_UP (lengths are >= 0)


cdef int _raised() except -1:
    """Raise the exception a C lookup left set (Cython raises it on -1)."""
    return -1


cdef int64_t _length_slow(int status, kv_cache *cache, object req, Py_ssize_t pos, int which,
                          int at, kv_req_state *st, PyObject *value, bint exact) except -1:
    """The rare outcomes: an error, a missing attribute, a value the Python rule judges,
    a read pure mode refuses."""
    cdef str attr = _COMMITTED if which == KV_COMMITTED else _ALLOCATED
    cdef int pure = cache.cx.pure
    if pure == KV_PURE_QUICK:
        if status == KV_LEN_VALUE:
            Py_DECREF(<object>value)  # an exact int (pure reads): its release runs nothing
        return QUICK_MISS
    # Python code may run from here: a held req.kv may no longer be current,
    # and collections run again (the caller's code runs with its own state).
    kv_req_forget(st)
    kv_cache_let(cache)
    if status == KV_LEN_IMPURE:
        raise impure_request(pos)
    if status == KV_LEN_ERROR:
        try:
            _raised()
        except (AttributeError, MemoryError):
            raise
        except Exception as exc:  # a property or __getattr__ of the caller's that fails
            # (worded as the shared rule words it, from the read that failed:
            # read again, a read may not fail the same way)
            raise req_read_error(exc, pos, f"{'.kv.' if st.failed_in_kv else '.'}{attr}") \
                from exc
    if status == KV_LEN_MISSING:
        if at == KV_AT_EITHER:
            raise AttributeError(f"reqs[{pos}] has neither .{attr} nor .kv.{attr}")
        raise AttributeError(f"reqs[{pos}] has no .{'kv.' if at == KV_AT_NESTED else ''}{attr}")
    v = <object>value
    Py_DECREF(v)  # v now holds the reference the lookup returned
    if pure and not (type(v) is int and INT64_MIN <= v <= INT64_MAX):  # judged: negative
        raise impure_request(pos)
    return req_length_value(v, pos, attr, exact)


# ------------------------------------------------------------- one request

cdef int _overflow(Job *job, Py_ssize_t pos, int64_t c, int64_t a) except -1:
    """Raise what the row at reqs[pos] overflowed: the status (the row's values and
    the total before it) goes to the shared error layer, which words it."""
    if job.pure == KV_PURE_QUICK:
        return GAVE_UP
    if job.kind == SPEC_V2:
        raise spec_v2_reqs_overflow(pos, c, a, job.p, job.r, job.tokens)
    raise plan_reqs_overflow(pos, job.row, c, a, job.p, job.r, job.aligned,
                             INT32_MAX if job.cur32 else INT64_MAX, job.tokens)


cdef inline void _cache_init(kv_cache *cache, int pure) noexcept:
    kv_cache_init(cache, <PyObject *>_COMMITTED, <PyObject *>_ALLOCATED, <PyObject *>_NESTED,
                  <PyObject *>_BEAM, <PyObject *>_ROWS, pure)


cdef int _beam_add(Job *job, object value) except -1:
    """total += value, exactly as ``sum()`` adds: C while every term is an int64 int."""
    cdef int overflow = 0
    cdef long long x
    if job.beam_total == NULL and type(value) is int:
        x = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and not (x > 0 and job.tokens > INT64_MAX - x) and not (
                x < 0 and job.tokens < INT64_MIN - x):
            job.tokens += x
            return 0
    total = job.tokens if job.beam_total == NULL else <object>job.beam_total
    total = total + value
    Py_XDECREF(job.beam_total)
    Py_INCREF(total)
    job.beam_total = <PyObject *>total
    return 0


cdef int _beam_read(Job *job, kv_cache *cache, object obj, int which, Py_ssize_t pos,
                    PyObject **out, int *pure) except -1:
    """``obj.beam_group`` (or ``.num_member_rows``) as a new reference in *out; *pure:
    no Python code ran.  GAVE_UP (quick mode) with nothing set."""
    cdef int found = kv_get(cache, <PyObject *>obj, which, out, pure)
    if found == KV_IMPURE:
        if job.pure == KV_PURE_QUICK:
            return GAVE_UP
        kv_cache_let(cache)
        raise impure_request(pos)
    if found < 0:
        kv_cache_let(cache)
        return -1  # as upstream's code: the caller's own exception, unchanged
    if not found:
        if job.pure == KV_PURE_QUICK:
            return GAVE_UP
        kv_cache_let(cache)
        raise AttributeError(f"reqs[{pos}] has no .beam_group"
                             f"{'.num_member_rows' if which == KV_ROWS else ''}")
    return 0


cdef int _beam_row(Job *job, kv_cache *cache, object req, Py_ssize_t pos) except -1:
    """``if req.beam_group is not None: total += req.beam_group.num_member_rows``."""
    cdef PyObject *raw = NULL
    cdef int pure = 0
    if _beam_read(job, cache, req, KV_BEAM, pos, &raw, &pure) == GAVE_UP:
        return GAVE_UP
    group = <object>raw
    Py_DECREF(group)  # group holds the reference the read returned
    if group is None:
        return 0
    if job.pure == KV_PURE_QUICK:
        return GAVE_UP  # a group's rows are a Python attribute read and sum
    if job.pure:
        # beam_group read once: reading it again would give the same object
        _beam_read(job, cache, group, KV_ROWS, pos, &raw, &pure)
        rows = <object>raw
        Py_DECREF(rows)
        if not (type(rows) is int and INT64_MIN <= rows <= INT64_MAX):
            kv_cache_let(cache)
            raise impure_request(pos)
        return _beam_add(job, rows)  # exact ints: no code of the caller's
    kv_cache_let(cache)
    if not pure:
        # read twice, as the upstream expression does
        group = beam_attr(req, "beam_group", pos, ".beam_group")
    rows = beam_attr(group, "num_member_rows", pos, ".beam_group.num_member_rows")
    if job.exact and type(rows) is not int:
        beam_rows_value(rows, pos, True)
    return _beam_add(job, rows)


cdef int _beam_group_row(Job *job, kv_cache *cache, object req, Py_ssize_t pos) except -1:
    """``if req.beam_group is not None: count += 1``."""
    cdef PyObject *raw = NULL
    cdef int pure = 0
    if _beam_read(job, cache, req, KV_BEAM, pos, &raw, &pure) == GAVE_UP:
        return GAVE_UP
    if raw != <PyObject *>None:
        job.count += 1
    if not pure:
        kv_cache_let(cache)  # the release may run a finalizer of the caller's
    Py_DECREF(<object>raw)  # the reference the read returned (the cast took one more)
    return 0


cdef inline void _decode_add(Job *job, int64_t c) noexcept:
    """The decode count's row: whether C sits on a page boundary."""
    if job.fast and <uint64_t>c < KV_FAST_LIMIT:
        job.count += kv_mod_row_fast(c, &job.d, 0)
    else:
        job.count += kv_mod_row(c, job.p, 0)


cdef inline bint _spec_v2_add(Job *job, int64_t c, int64_t a) noexcept:
    """The spec-v2 estimate's row added to the total: whether it overflowed."""
    cdef int64_t tokens = 0
    if job.fast and <uint64_t>(c | a) < KV_FAST_LIMIT:
        tokens = <int64_t>kv_spec_v2_row_fast(c, a, job.r, &job.d) * job.p
    elif kv_spec_v2_row(c, a, job.p, job.r, &tokens):
        return True
    # Checked on both paths: a huge earlier row can bring the total near the
    # int64 limit, and a small row can then push it over.
    return kv_add_total(&job.tokens, tokens) != 0


cdef inline int _row_let(Job *job, kv_cache *cache, object req, Py_ssize_t pos) except -1:
    """:func:`_row` for a request the walk holds, then collections let run where
    the walk's reference is the last (a property may have dropped every
    other): the walk lets go of it next, and its release is the caller's
    code."""
    _row(job, cache, req, pos)
    if Py_REFCNT(req) == 1:
        kv_cache_let(cache)
    return 0


cdef int _row(Job *job, kv_cache *cache, object req, Py_ssize_t pos) except -1:
    """One request's row, read by the reference rule (a request no run took):
    0, or GAVE_UP (quick mode only: nothing raised, nothing but the job
    changed)."""
    cdef kv_req_state st
    cdef int64_t c = 0, a = 0
    cdef PyObject *value = NULL
    cdef int status
    if job.kind == BEAM:
        return _beam_row(job, cache, req, pos)
    if job.kind == BEAM_GROUPS:
        return _beam_group_row(job, cache, req, pos)
    kv_req_begin(&st)
    # _length's two steps written out here: the C read inline in the walk.
    status = kv_req_length(cache, <PyObject *>req, KV_COMMITTED, job.at_committed, &st,
                           &c, &value)
    if status != KV_LEN_OK:
        c = _length_slow(status, cache, req, pos, KV_COMMITTED, job.at_committed, &st,
                         value, job.exact)
    if c == QUICK_MISS:
        kv_req_forget(&st)
        return GAVE_UP
    if job.kind != DECODE:
        status = kv_req_length(cache, <PyObject *>req, KV_ALLOCATED, job.at_allocated,
                               &st, &a, &value)
        if status != KV_LEN_OK:
            a = _length_slow(status, cache, req, pos, KV_ALLOCATED, job.at_allocated,
                             &st, value, job.exact)
    kv_req_forget(&st)
    if a == QUICK_MISS:
        return GAVE_UP
    if job.kind == DECODE:
        _decode_add(job, c)
        return 0
    if job.kind == SPEC_V2:
        if _spec_v2_add(job, c, a):
            return _overflow(job, pos, c, a)
        return 0
    return _plan_add(job, c, a, pos)


cdef inline int _plan_add(Job *job, int64_t c, int64_t a, Py_ssize_t pos) except -1:
    """The plan's row for reqs[pos]: checked whole, then cur and nxt written and
    the totals added -- a row that overflows writes nothing, as the twin's."""
    cdef int64_t nxt
    cdef uint64_t nxt_fast, pages
    cdef Py_ssize_t at = job.rows - 1 - job.row if job.backward else job.row
    if job.row >= job.rows:  # whatever the walk: the buffers are sized once
        raise plan_grew_error(job.rows)
    if job.fast and <uint64_t>(c | a) < KV_FAST_LIMIT:
        pages = kv_plan_row_fast(c, a, job.r, job.aligned, &job.d, &nxt_fast)
        nxt = <int64_t>nxt_fast
    else:
        if kv_plan_row(c, a, job.p, job.r, job.aligned, &nxt):
            return _overflow(job, pos, c, a)
        pages = kv_ceil_div(nxt, job.p) - kv_ceil_div(a, job.p)
    if ((job.cur32 and a > INT32_MAX) or (job.nxt32 and nxt > INT32_MAX)
            or job.tokens > INT64_MAX - (nxt - a)):
        return _overflow(job, pos, c, a)
    if job.cur32:
        (<int32_t *>job.cur)[at] = <int32_t>a
    else:
        (<int64_t *>job.cur)[at] = a
    if job.nxt32:
        (<int32_t *>job.nxt)[at] = <int32_t>nxt
    else:
        (<int64_t *>job.nxt)[at] = nxt
    job.tokens += nxt - a
    job.pages += pages  # pages <= tokens: cannot overflow
    job.row += 1
    return 0


cdef enum:
    # A run's lengths are read a chunk at a time, then added up: the reads of
    # one chunk wait on no arithmetic.
    RUN_CHUNK = 64
    # After a run that took no request, the walk reads this many the usual way
    # before it tries another (a batch of another kind pays one try a stretch).
    RUN_RETRY = 32


cdef inline bint _chunk_add(Job *job, const int64_t *cs, const int64_t *al,
                            Py_ssize_t k) noexcept:
    """A chunk of an estimate's rows added at once (rows.h) where every row is
    in the fast range and the total does not overflow: then True; else False
    with nothing changed (the rows are then added one by one, which finds the
    row that is out of range)."""
    cdef uint64_t bits = 0, n
    if not job.fast or not (job.kind == DECODE or job.kind == SPEC_V2):
        return False
    n = kv_chunk_fast(cs, NULL if job.kind == DECODE else al, k, job.r, &job.d, &bits)
    if bits >= KV_FAST_LIMIT:
        return False
    if job.kind == DECODE:
        job.count += n
        return True
    return kv_add_total(&job.tokens, <int64_t>n * job.p) == 0


# Rows read by runs so far (for the tests: kvest._reqs._runs).
cdef Py_ssize_t _run_rows = 0


def _runs():
    """How many rows runs have read (reqattr.h) since the module was loaded."""
    return _run_rows


cdef Py_ssize_t _run(Job *job, kv_cache *cache, PyObject **items, const int64_t *names,
                     Py_ssize_t start, Py_ssize_t end) except -1:
    """items[start:end) (held: nothing frees them meanwhile) for as long as they
    form a run (reqattr.h: requests that read like the first, by loads alone),
    added as :func:`_row` adds them: the walk's one fast read, a single request
    being a run of one.  names[j] (NULL: j) is the position a message names.
    Returns the first item it did not take, for the caller's :func:`_row`;
    QUICK_MISS when one gave up (quick mode: its row overflowed)."""
    global _run_rows
    cdef kv_run run
    cdef int64_t cs[RUN_CHUNK]
    cdef int64_t al[RUN_CHUNK]
    cdef Py_ssize_t i, k, stop, pos
    if job.kind == PLAN:
        end = min(end, start + (job.rows - job.row))  # the plan's own check past that
    if start >= end or job.kind == BEAM or not kv_run_begin(
            cache, &run, items[start],
            KV_AT_FLAT if job.kind == BEAM_GROUPS else job.at_committed, job.at_allocated,
            job.kind == SPEC_V2 or job.kind == PLAN, job.kind == BEAM_GROUPS):
        return start
    while start < end:
        stop = min(end, start + RUN_CHUNK)
        k = kv_run_read(cache, &run, items, start, stop, cs, al)
        if _chunk_add(job, cs, al, k):
            i = k  # added whole, by the array loops
        else:
            i = 0
        for i in range(i, k):
            pos = names[start + i] if names != NULL else start + i
            if job.kind == DECODE:
                _decode_add(job, cs[i])
            elif job.kind == BEAM_GROUPS:
                job.count += cs[i]  # whether req.beam_group is not None
            elif job.kind == SPEC_V2:
                if _spec_v2_add(job, cs[i], al[i]) and _overflow(job, pos, cs[i], al[i]):
                    return QUICK_MISS
            elif _plan_add(job, cs[i], al[i], pos):
                return QUICK_MISS
        start += k
        _run_rows += k
        if start < stop:
            break
    return start


cdef inline Py_ssize_t _first_run(Job *job, Py_ssize_t m) noexcept:
    """Where a walk of m rows first tries a run: 0, or never (PY_SSIZE_T_MAX)
    where no run can start (the beam rows' sum, a length either place)."""
    if m < 1 or job.kind == BEAM:
        return PY_SSIZE_T_MAX
    if job.kind != BEAM_GROUPS and (job.at_committed == KV_AT_EITHER or (
            job.kind != DECODE and job.at_allocated == KV_AT_EITHER)):
        return PY_SSIZE_T_MAX
    return 0


cdef inline Py_ssize_t _size(object reqs) noexcept:
    """The size of an exact list or tuple, now."""
    return PyList_GET_SIZE(reqs) if type(reqs) is list else PyTuple_GET_SIZE(reqs)


cdef inline Py_ssize_t _run_from(Job *job, kv_cache *cache, object reqs, Py_ssize_t end,
                                 Py_ssize_t *at) except -1:
    """:func:`_run` from *at over a list or tuple as it is now (a run reads no
    further than its size), *at moved to where it stopped.  Returns the row
    from which the walk tries a run again."""
    cdef Py_ssize_t start = at[0]
    at[0] = _run(job, cache, PySequence_Fast_ITEMS(reqs), NULL, start, min(end, _size(reqs)))
    return at[0] + 1 if at[0] > start else start + RUN_RETRY


cdef int _walk_items(Job *job, kv_cache *cache, PyObject **items, const int64_t *names,
                     Py_ssize_t m) except -1:
    """items[0..m) (held by the caller for the walk), in order: runs where they
    can be, the reference rule's read elsewhere; names[j] (NULL: j) is the
    position a message names.  0, or GAVE_UP (quick mode) at the first item
    that gave up."""
    cdef Py_ssize_t j = 0, start, retry = _first_run(job, m)
    while j < m:
        if j >= retry:
            start = j
            j = _run(job, cache, items, names, j, m)
            if j == QUICK_MISS:
                return GAVE_UP
            retry = j + 1 if j > start else j + RUN_RETRY
            if j == m:
                break
        if _row(job, cache, <object>items[j], names[j] if names != NULL else j) == GAVE_UP:
            return GAVE_UP
        j += 1
    return 0


# ------------------------------------------------------- in address order

# From how many requests a walk goes in address order, and how many walks did
# and gave up (for the tests: kvest._reqs._address_order).  Module state, but
# only a GIL build (_ORDERS) touches it, and only under the GIL.
# The walk's tuning constants are addrorder.h's (KV_ORDER_*), this one's default too.
cdef Py_ssize_t _order_min = KV_ORDER_MIN
cdef Py_ssize_t _order_walks = 0, _order_gave_up = 0
# From how many requests a whole batch is walked backward, and how many walks did.
cdef Py_ssize_t _backward_min = KV_BACKWARD_MIN, _backward_done = 0


def _address_order(min_requests=None):
    """``(walks in address order, walks that gave up and went in order, the
    least batch that tries)``; ``min_requests`` sets that least batch
    (tests use it to reach the reordered walk with small batches)."""
    global _order_min
    if min_requests is not None:
        _order_min = max(<Py_ssize_t>min_requests, 2)
    return _order_walks, _order_gave_up, _order_min


def _backward_walks(min_requests=None):
    """``(walks from the last request to the first, the least batch that
    tries)``; ``min_requests`` sets that least batch (tests use it to reach
    the walk with small batches)."""
    global _backward_min
    if min_requests is not None:
        _backward_min = max(<Py_ssize_t>min_requests, 2)
    return _backward_done, _backward_min


cdef inline bint _may_reorder(Job *job, Py_ssize_t m) noexcept:
    """Whether a walk of m rows of this job may go in address order at all."""
    return _ORDERS and m >= _order_min and job.kind != PLAN


cdef int _by_address(Job *job, PyObject **items, Py_ssize_t m) except -1:
    """The walk over items (borrowed; no code has run since they were read) in
    address order (addrorder.h says why), where the answer cannot tell the
    order (a count or an int64 sum), by :func:`_quick_walk`.  1 when it did:
    job holds the answer.  0 otherwise (too small a batch, or one lying near
    in order already; a request the quick reads cannot take; an overflow): job
    as it was, nothing else changed, and the caller walks in order."""
    global _order_walks, _order_gave_up
    cdef Py_ssize_t j
    cdef PyObject **order
    cdef bint done
    if not _may_reorder(job, m) or kv_mostly_near(items, m):
        return 0
    order = <PyObject **>PyMem_Malloc(m * sizeof(PyObject *))
    if order == NULL or kv_address_order(items, m, order) < 0:
        PyMem_Free(order)
        return 0
    for j in range(m):
        Py_XINCREF(order[j])
    try:
        done = _quick_walk(job, order, m)
    finally:
        for j in range(m):
            Py_XDECREF(order[j])
        PyMem_Free(order)
    if done:
        _order_walks += 1
    else:
        _order_gave_up += 1
    return done


cdef int _backward(Job *job, object reqs) except -1:
    """The walk over a whole list or tuple from its last request to its first
    (addrorder.h says why), by :func:`_quick_walk`: an estimate's count or sum,
    or the plan's rows, each written where it belongs (into kvest's own arrays
    only: a walk that gives up leaves rows no forward walk would).  1 and 0 as
    :func:`_by_address` says."""
    global _backward_done
    cdef Py_ssize_t j, m = _size(reqs)
    cdef PyObject **items = PySequence_Fast_ITEMS(reqs)
    cdef PyObject **order
    cdef bint done
    # Only where a run could start (the kinds runs read; a length either place
    # makes the quick reads give up at the first request keeping it in req.kv).
    if not (_ORDERS and m >= _backward_min and _first_run(job, m) == 0
            and (job.kind != PLAN or (job.rows - job.row == m and job.own_out))):
        return 0
    # Borrowed: reqs holds them, and nothing runs that could change it (the
    # quick reads run no code, and collections are held off).
    order = <PyObject **>PyMem_Malloc(m * sizeof(PyObject *))
    if order == NULL:
        return 0
    for j in range(m):
        order[j] = items[m - 1 - j]
    job.backward = True
    try:
        done = _quick_walk(job, order, m)
    finally:
        job.backward = False
        PyMem_Free(order)
    _backward_done += done
    return done


cdef bint _quick_walk(Job *job, PyObject **order, Py_ssize_t m) except -1:
    """order[0..m) (held for the walk) read in quick pure mode (a slot, or a
    dict's entry at its learned place: no code of the caller's) into a copy of
    job, which job becomes if every request was read; job as it was if not."""
    cdef Job trial
    cdef kv_cache cache
    cdef bint done
    trial = job[0]
    trial.pure = KV_PURE_QUICK
    _cache_init(&cache, KV_PURE_QUICK)
    # No collection while the walk reads (reqroute.h): a finalizer could change
    # what the walk has yet to read, in an order the loop it stands for never
    # reads.  The quick reads run no Python code, so the hold lasts the walk.
    kv_cache_hold(&cache)
    try:
        done = _walk_items(&trial, &cache, order, NULL, m) == 0
    finally:
        kv_cache_let(&cache)
    if done:
        trial.pure = job.pure
        job[0] = trial
    return done


# ----------------------------------------------------------- the requests

cdef int64_t *_exact_rows(object indices, Py_ssize_t n, Py_ssize_t *m) except? NULL:
    """indices as row numbers if it is a list or tuple of in-range exact ints.

    Returns a PyMem_Malloc'd array (the caller frees it), or NULL when indices
    is anything else -- including a bad entry, which the shared input rule
    then reports with its own exception.
    """
    cdef Py_ssize_t k, size
    cdef bint is_list = type(indices) is list
    cdef PyObject *item
    cdef long long i
    cdef int overflow
    if not is_list and type(indices) is not tuple:
        return NULL
    size = PyList_GET_SIZE(indices) if is_list else PyTuple_GET_SIZE(indices)
    cdef int64_t *rows = <int64_t *>PyMem_Malloc(max(size, 1) * sizeof(int64_t))
    if rows == NULL:
        raise MemoryError()
    for k in range(size):
        item = PyList_GET_ITEM(indices, k) if is_list else PyTuple_GET_ITEM(indices, k)
        overflow = 0
        if type(<object>item) is not int:
            PyMem_Free(rows)
            return NULL
        i = PyLong_AsLongLongAndOverflow(<object>item, &overflow)
        if overflow or i < -n or i >= n:
            PyMem_Free(rows)
            return NULL
        rows[k] = i + n if i < 0 else i
    m[0] = size
    return rows


cdef int _walk_all(Job *job, object reqs) except -1:
    cdef kv_cache call_cache
    cdef kv_cache *cache = &call_cache  # the call's own: never shared with another thread
    cdef Py_ssize_t pos = 0, retry
    if not (type(reqs) is list or type(reqs) is tuple):
        return _walk_iter(job, reqs)
    if _ORDERS and _size(reqs) >= min(_order_min, _backward_min) and (  # (cheap first)
            _by_address(job, PySequence_Fast_ITEMS(reqs), _size(reqs)) or _backward(job, reqs)):
        return 0
    _cache_init(cache, job.pure)
    retry = _first_run(job, _size(reqs))
    # Each request is held by a reference of our own while it is read: a
    # property of one request may drop the container's reference to it (runs
    # hold none: they run no Python code).
    try:
        # The size (and a list's items) read every step, as their iterators do.
        while pos < _size(reqs):
            if pos >= retry:
                retry = _run_from(job, cache, reqs, _size(reqs), &pos)
                if pos >= _size(reqs):
                    break
            if job.kind == PLAN and job.row == job.rows:  # (a property grew the list)
                raise plan_grew_error(job.rows)  # before the request is read, as the twin
            req = <object>PySequence_Fast_ITEMS(reqs)[pos]  # a reference of our own
            _row_let(job, cache, req, pos)
            req = None  # (after _row_let: its release is the caller's code)
            pos += 1
    finally:
        kv_cache_let(cache)
    if job.kind == PLAN and job.row < job.rows:  # a property shrank it: rows stay unread
        raise plan_shrank_error(job.rows, job.row)
    return 0


cdef int _walk_iter(Job *job, object reqs) except -1:
    """:func:`_walk_all` over any other iterable, by its own iterator."""
    cdef kv_cache cache
    cdef Py_ssize_t pos = 0
    _cache_init(&cache, job.pure)
    it = reqs_iter(reqs)
    try:
        while True:
            kv_cache_let(&cache)  # the iterator is the caller's code
            try:
                req = next(it)
            except StopIteration:
                break
            except MemoryError:
                raise
            except Exception as exc:
                raise reqs_read_error(exc, pos) from exc
            _row_let(job, &cache, req, pos)
            req = None  # (after _row_let: its release is the caller's code)
            pos += 1
    finally:
        kv_cache_let(&cache)
    return 0


cdef object _item(object reqs, Py_ssize_t pos):
    """reqs[pos], the generic lookup (bounds checked whatever reqs is; the
    caller's code for a container that is not a list or tuple)."""
    try:
        return reqs[<object>pos]
    except MemoryError:
        raise
    except Exception as exc:
        raise reqs_read_error(exc, pos) from exc


cdef int _walk_rows(Job *job, object reqs, const int64_t *rows, Py_ssize_t m) except -1:
    """The requests at rows, taken whole before any is read, as [reqs[i] for i
    in indices] takes them: what a request's code does to reqs later changes
    nothing selected.  From a list or tuple they are taken as they are (rows
    lie in [0, len(reqs)), checked when selected, or the generic lookup
    raises what it raises); from anything else by its own lookup."""
    cdef kv_cache cache
    cdef Py_ssize_t j, k, n
    cdef PyObject **items
    cdef PyObject **held = NULL
    cdef list picked
    if type(reqs) is list or type(reqs) is tuple:
        held = <PyObject **>PyMem_Malloc(max(m, 1) * sizeof(PyObject *))
        if held == NULL:
            raise MemoryError()
        items, n = PySequence_Fast_ITEMS(reqs), _size(reqs)
        for j in range(m):
            if not 0 <= rows[j] < n:  # (code of the caller's ran since the check)
                for k in range(j):
                    Py_XDECREF(held[k])
                PyMem_Free(held)
                _item(reqs, rows[j])  # raises what the lookup raises
                raise IndexError(f"reqs[{rows[j]}]: out of range")
            held[j] = items[rows[j]]
            Py_XINCREF(held[j])
        items = held
    else:
        picked = [_item(reqs, rows[j]) for j in range(m)]
        items = PySequence_Fast_ITEMS(picked)
    try:
        if not _by_address(job, items, m):
            _cache_init(&cache, job.pure)
            try:
                _walk_items(job, &cache, items, rows, m)
            finally:
                kv_cache_let(&cache)
    finally:
        if held != NULL:
            for j in range(m):
                Py_XDECREF(held[j])
            PyMem_Free(held)
    return 0


cdef int _walk(Job *job, object reqs, object indices) except -1:
    """The job's rows over reqs, or over the requests indices selects."""
    cdef _Rows sel
    if indices is None:
        return _walk_all(job, reqs)
    sel = _select(reqs, indices)
    return _walk_rows(job, reqs, sel.rows, sel.m)


cdef class _Rows:
    """The selected rows of one call: a checked list/tuple fast, else the shared rule."""
    cdef int64_t *rows
    cdef Py_ssize_t m
    cdef object array  # keeps the checked int64 array alive

    def __dealloc__(self):
        if self.rows != NULL and self.array is None:
            PyMem_Free(self.rows)


cdef _Rows _select(object reqs, object indices):
    cdef _Rows sel = _Rows.__new__(_Rows)
    cdef Py_ssize_t n = -1
    cdef cnp.ndarray arr
    if type(reqs) is list:
        n = PyList_GET_SIZE(reqs)
    elif type(reqs) is tuple:
        n = PyTuple_GET_SIZE(reqs)
    if n >= 0:
        sel.rows = _exact_rows(indices, n, &sel.m)
        if sel.rows != NULL:
            return sel
    # Rows in [0, n) for the n they were checked against, in kvest's own array.
    _, arr = req_rows(reqs, indices)
    if not (cnp.PyArray_CheckExact(arr) and cnp.PyArray_TYPE(arr) == cnp.NPY_INT64
            and cnp.PyArray_ISCARRAY_RO(arr) and cnp.PyArray_NDIM(arr) == 1):
        raise TypeError("indices: internal error, the checked rows are not an int64 array")
    sel.array = arr
    sel.rows = <int64_t *>cnp.PyArray_DATA(arr)
    sel.m = cnp.PyArray_DIMS(arr)[0]
    return sel


cdef dict _AT = {"either": KV_AT_EITHER, "flat": KV_AT_FLAT, "nested": KV_AT_NESTED}


cdef str _FLAT = "flat"
cdef str _MIXED = "mixed"
cdef str _NESTED_LAYOUT = "nested"


cdef inline bint _usual(object reqs, object indices, object layout, object flag) noexcept:
    """Pure mode's usual call, told in C: the shared rule's checks
    (``pure_reqs``, ``pure_args``) would find nothing to refuse."""
    return ((type(reqs) is list or type(reqs) is tuple) and indices is None
            and (layout is None or type(layout) is str) and (flag is True or flag is False))


cdef int _pure_mode(object pure) except -1:
    """``pure=``: KV_PURE_STRICT or KV_PURE_OFF (a flag, as the others are)."""
    if pure is False:
        return KV_PURE_OFF
    if pure is True:
        return KV_PURE_STRICT
    return KV_PURE_STRICT if as_flag(pure, "pure") else KV_PURE_OFF


cdef int _glue_job(Job *job, Kind kind, int64_t p, int64_t r, object layout) except -1:
    return _job_init(job, kind, p, r, layout, True, KV_PURE_STRICT)


cdef object _own_attr(object obj, str name, object missing):
    cdef kv_gc g
    kv_gc_init(&g)
    cdef PyObject *found = kv_plain_attr(<PyObject *>obj, <PyObject *>name, &g)
    value = <object>found if found != NULL else missing  # a reference of our own
    kv_gc_let(&g)
    return value


cdef int _job_init(Job *job, Kind kind, int64_t p, int64_t r, object layout,
                   object exact_ints, int pure) except -1:
    # The usual values by identity (string constants are interned); anything
    # else through the shared rule, which also raises for a bad value.
    if layout is None:
        job.at_committed = job.at_allocated = KV_AT_EITHER
    elif layout is _NESTED_LAYOUT:
        job.at_committed = job.at_allocated = KV_AT_NESTED
    elif layout is _FLAT:
        job.at_committed = job.at_allocated = KV_AT_FLAT
    elif layout is _MIXED:
        job.at_committed, job.at_allocated = KV_AT_FLAT, KV_AT_NESTED
    else:
        at_committed, at_allocated = as_req_layout(layout)
        job.at_committed = _AT[at_committed]
        job.at_allocated = _AT[at_allocated]
    if exact_ints is False:
        job.exact = False
    elif exact_ints is True:
        job.exact = True
    else:
        job.exact = as_flag(exact_ints, "exact_ints")
    job.kind = kind
    job.pure = pure
    job.p = p
    job.r = r
    job.fast = _fast_range(0, p, r)
    job.aligned = True
    job.tokens = job.pages = 0
    job.count = 0
    job.row = job.rows = 0
    job.backward = False
    job.own_out = True
    job.cur = job.nxt = NULL
    job.cur32 = job.nxt32 = False
    job.beam_total = NULL
    kv_divisor_init(&job.d, p)
    return 0


# ------------------------------------------------------------- estimators

def spec_v2_new_tokens_from_reqs(reqs, page_size, reserve, indices=None, *, layout=None,
                                 exact_ints=False, pure=False):
    """:func:`spec_v2_new_tokens` read straight from request objects.

    Each request gives ``kv_committed_len`` and ``kv_allocated_len``, either
    flat on the request or nested under ``req.kv``.  ``indices`` selects
    requests with Python list semantics (``reqs`` must then be a sequence).
    ``layout`` (``"flat"``, ``"mixed"``, ``"nested"``) reads each length
    only where that SGLang layout keeps it, skipping the search the default
    (``None``: ``req.<name>``, else ``req.kv.<name>``) makes.
    ``exact_ints=True`` refuses (``TypeError``) any length whose type is not
    exactly ``int``, where the default reads it through ``operator.index``.
    ``pure=True`` runs no Python code of the caller's: an argument or request
    that would need some raises :class:`kvest.ImpureRequest` instead.
    """
    cdef int pm = _pure_mode(pure)
    if pm and not (_usual(reqs, indices, layout, exact_ints) and type(page_size) is int
                   and type(reserve) is int):
        pure_reqs(reqs)
        pure_args(indices, layout, ((exact_ints, "exact_ints"),),
                  ((page_size, "page_size"), (reserve, "reserve")))
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef Job job
    _job_init(&job, SPEC_V2, _count(page_size, "page_size", 1), _count(reserve, "reserve", 0),
              layout, exact_ints, pm)
    _walk(&job, reqs, indices)
    return job.tokens


def decode_new_tokens_from_reqs(reqs, page_size, indices=None, *, layout=None,
                                exact_ints=False, pure=False):
    """:func:`decode_new_tokens` read straight from request objects."""
    cdef int pm = _pure_mode(pure)
    if pm and not (_usual(reqs, indices, layout, exact_ints) and type(page_size) is int):
        pure_reqs(reqs)
        pure_args(indices, layout, ((exact_ints, "exact_ints"),), ((page_size, "page_size"),))
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef Job job
    _job_init(&job, DECODE, _count(page_size, "page_size", 1), 0, layout, exact_ints, pm)
    _walk(&job, reqs, indices)
    return _times_page(job.count, job.p, "decode_new_tokens_from_reqs")


def decode_alloc_plan_from_reqs(reqs, page_size, reserve, indices=None, *, page_aligned=True,
                                out=None, dtype=None, layout=None, exact_ints=False,
                                pure=False):
    """:func:`decode_alloc_plan` read straight from request objects, in one pass.

    Per selected request ``cur = A`` and ``nxt = max(A, ceil_align(C + R, p))``
    (``page_aligned``) or ``nxt = max(A, C + R)``.  ``cur`` and ``nxt`` are new
    arrays of ``dtype`` (int32 or int64; default int64), or ``out=(cur, nxt)``.
    A value its array's dtype cannot hold raises ``OverflowError`` naming
    ``out[0]`` (cur) or ``out[1]`` (nxt).
    """
    cdef int pm = _pure_mode(pure)
    if pm and not (_usual(reqs, indices, layout, exact_ints) and type(page_size) is int
                   and type(reserve) is int and (page_aligned is True or page_aligned is False)
                   and out is None and (dtype is None or dtype is np.int32 or dtype is np.int64)):
        pure_reqs(reqs)
        pure_args(indices, layout, ((page_aligned, "page_aligned"), (exact_ints, "exact_ints")),
                  ((page_size, "page_size"), (reserve, "reserve")), out, dtype)
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef Job job
    cdef _Rows sel = None
    cdef Py_ssize_t m
    cdef int64_t p = _count(page_size, "page_size", 1)
    cdef int64_t r = _count(reserve, "reserve", 0)
    # A flag is True or False, checked before layout as the signature orders them.
    cdef bint aligned = (page_aligned if page_aligned is True or page_aligned is False
                         else as_flag(page_aligned, "page_aligned"))
    _job_init(&job, PLAN, p, r, layout, exact_ints, pm)
    job.aligned = aligned
    if indices is None:
        if type(reqs) is not list and type(reqs) is not tuple:
            reqs = reqs_list(reqs)  # the plan's length must be known before the first row
        m = len(reqs)
    else:
        sel = _select(reqs, indices)
        m = sel.m
    cdef cnp.npy_intp dims = m
    cdef int kind
    if out is None and (dtype is None or dtype is np.int64 or dtype is np.int32):
        # The usual request, without the shared rule's checks (there is nothing to check).
        kind = cnp.NPY_INT32 if dtype is np.int32 else cnp.NPY_INT64
        cur_out = cnp.PyArray_EMPTY(1, &dims, kind, 0)
        nxt_out = cnp.PyArray_EMPTY(1, &dims, kind, 0)
    else:
        cur_out, nxt_out = as_plan_out(out, m, dtype)
    cdef cnp.ndarray cur_buf = cur_out, nxt_buf = nxt_out
    if not (_plan_buffer(cur_buf, m) and _plan_buffer(nxt_buf, m)):
        raise TypeError("out: internal error, the checked buffers are not writable int arrays")
    job.rows = m
    job.own_out = out is None
    job.cur = cnp.PyArray_DATA(cur_buf)
    job.nxt = cnp.PyArray_DATA(nxt_buf)
    job.cur32 = cnp.PyArray_ITEMSIZE(cur_buf) == 4
    job.nxt32 = cnp.PyArray_ITEMSIZE(nxt_buf) == 4
    if sel is None:
        _walk_all(&job, reqs)
    else:
        _walk_rows(&job, reqs, sel.rows, sel.m)
    return AllocPlan(cur_out, nxt_out, job.tokens, job.pages)


cdef inline bint _plan_buffer(cnp.ndarray arr, Py_ssize_t m) noexcept:
    """What the plan writes through, judged by the array's C fields alone: plain,
    1-D, m rows, C-contiguous, aligned, writable, native int32 or int64."""
    return (cnp.PyArray_CheckExact(arr) and cnp.PyArray_NDIM(arr) == 1
            and cnp.PyArray_DIMS(arr)[0] == m and cnp.PyArray_ISCARRAY(arr)
            and cnp.PyArray_ISSIGNED(arr)
            and (cnp.PyArray_ITEMSIZE(arr) == 4 or cnp.PyArray_ITEMSIZE(arr) == 8))


def beam_member_rows_from_reqs(reqs, indices=None, *, exact_ints=False, pure=False):
    """SGLang's beam rows, ``sum(r.beam_group.num_member_rows for r in reqs if
    r.beam_group is not None)``, over the selected requests (``indices`` as in
    :func:`decode_new_tokens_from_reqs`).

    SGLang 0.5.19+ adds this to the no-speculation estimate.  The sum is
    Python's: whatever ``num_member_rows`` returns is added as ``sum()`` adds it
    (with ``exact_ints=True``, only a value whose type is ``int``).
    """
    cdef int pm = _pure_mode(pure)
    if pm and not _usual(reqs, indices, None, exact_ints):
        pure_reqs(reqs)
        pure_args(indices, None, ((exact_ints, "exact_ints"),))
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef Job job
    _job_init(&job, BEAM, 1, 0, None, exact_ints, pm)
    try:
        _walk(&job, reqs, indices)
        if job.beam_total != NULL:
            return <object>job.beam_total
        return job.tokens
    finally:
        Py_XDECREF(job.beam_total)


def beam_groups_from_reqs(reqs, indices=None, *, pure=False):
    """How many of the selected requests are in a beam group: ``sum(1 for r in
    reqs if r.beam_group is not None)`` (``indices`` as in
    :func:`decode_new_tokens_from_reqs`).

    Zero means SGLang's ``append_beam_tail`` has no member rows to append.
    """
    cdef int pm = _pure_mode(pure)
    if pm and not _usual(reqs, indices, None, False):
        pure_reqs(reqs)
        pure_args(indices)
    if type(reqs) is not list:  # a list is what schedulers pass: no call for it
        reqs = as_reqs(reqs)
    cdef Job job
    _job_init(&job, BEAM_GROUPS, 1, 0, None, False, pm)
    _walk(&job, reqs, indices)
    return job.count


# ================================================================ the writers
# Compiled request-object writers, served as kvest._writes (the same names,
# signatures and exceptions as kvest.reference._writes, their pure-Python
# twin).  They live in this module, beside the readers, so that the request
# core and its one memo (reqroute.h) are compiled once.
#
# Each function is a compiled copy of one per-request Python loop that writes
# to request objects (``req.kv.kv_allocated_len += 1``), with that loop's
# semantics to the letter: the same reads and writes in the same order through
# the same routes (properties, ``__setattr__``, descriptors, slots), Python's
# own operators for anything but int64-sized exact ints, and on an exception
# the same requests left written and the same exception raised.  The loops are
# in src/_src/reqwrite.h; this part checks the arguments and sets them up.

cdef extern from "reqwrite.h":
    ctypedef struct kv_known:
        pass
    ctypedef struct kv_ctx:
        pass
    void kv_ctx_init(kv_ctx *cx, int pure)
    void kv_ctx_end(kv_ctx *cx)
    bint kw_interned(PyObject *s)
    void kv_known_init(kv_known *s, PyObject *name)
    Py_ssize_t kw_check_add(kv_ctx *cx, PyObject *reqs, kv_known *steps, const Py_ssize_t *ends,
                            Py_ssize_t npaths)
    int kw_add_all(kv_ctx *cx, PyObject *reqs, kv_known *steps, const Py_ssize_t *ends,
                   Py_ssize_t npaths, PyObject *delta, unsigned char *reuse) except -1
    Py_ssize_t kw_check_max(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps,
                            Py_ssize_t n)
    int kw_max_all(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps, Py_ssize_t n,
                   int strict) except -1
    bint kw_max_all_quick(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps,
                          Py_ssize_t n)
    bint kw_small_ints(PyObject *seq)

# Steps (attribute names over all paths) and paths that fit on the stack.
cdef enum:
    SMALL_STEPS = 16
    SMALL_PATHS = 8


# ------------------------------------------------------------ the arguments
# The rules are the twin's (kvest.reference._writes), word for word; the
# compiled module never imports the twin, so they are written twice and the
# tests hold the two to the same messages.

cdef tuple _names(object path, str what):
    """One path as a tuple of attribute names (exact str names interned)."""
    if isinstance(path, str):
        parts = path.split(".")
        for part in parts:
            if not part:
                raise ValueError(f"{what} {path!r} has an empty name")
        return tuple([intern(part) for part in parts])
    if type(path) is tuple or type(path) is list:
        if len(path) == 0:
            raise ValueError(f"{what} is empty")
        names = []
        for i, name in enumerate(path):
            if not isinstance(name, str):
                raise TypeError(f"{what}[{i}] must be a str, not {type(name).__name__}")
            names.append(intern(name) if type(name) is str else name)
        return tuple(names)
    raise TypeError(f"{what} must be a str or a tuple of str, not {type(path).__name__}")


cdef bint _ready(object path) noexcept:
    """Whether path is already what _names makes of it (the usual constant)."""
    if type(path) is not tuple or len(<tuple>path) == 0:
        return False
    for name in <tuple>path:
        if type(name) is not str or not kw_interned(<PyObject *>name):
            return False
    return True


cdef tuple _paths(object paths):
    if type(paths) is tuple:
        for path in <tuple>paths:
            if not _ready(path):
                break
        else:
            return paths
    if isinstance(paths, str):
        return (_names(paths, "paths"),)
    if type(paths) is tuple or type(paths) is list:
        return tuple([_names(path, f"paths[{i}]") for i, path in enumerate(paths)])
    raise TypeError("paths must be a str, or a tuple or list of paths, "
                    f"not {type(paths).__name__}")


cdef bint _flag(object value, str name) except -1:
    if value is True or value is False:
        return value
    from numpy import bool_  # a dependency, already loaded by anything that has one
    if isinstance(value, bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, not {type(value).__name__}")


cdef int _pure_paths(tuple norm) except -1:
    """Pure mode: no path may read, on its way to its owner, a name some path
    writes (it would then read the int written there): ImpureRequest."""
    cdef list written = [path[len(path) - 1] for path in norm]
    for path in norm:
        for j in range(len(path) - 1):
            if any(path[j] is name for name in written):
                raise impure_argument("paths")
    return 0


cdef int _pure_delta(object delta) except -1:
    if type(delta) is not int or not -(2**63) <= delta < 2**63:
        raise impure_argument("delta")
    return 0


# ----------------------------------------------------------------- writers

def add_to_attrs(reqs, paths, delta, *, pure=False):
    """For each request in order, for each path in order: ``req.<path> += delta``.

    ``paths`` is a tuple or list of paths, or one path as a dotted string; a
    path is a dotted string (``"kv.kv_allocated_len"``) or a tuple/list of
    attribute names (``("kv", "kv_allocated_len")``; names are taken as they
    are, dots and all).  So ``("kv", "a")`` is two paths, ``req.kv`` and
    ``req.a``; one nested path is ``"kv.a"`` or ``(("kv", "a"),)``.
    ``req.<path>`` reads every name but the last afresh for each statement.
    So ``add_to_attrs(reqs, ("kv.kv_allocated_len", "kv.kv_committed_len"),
    d)`` is exactly::

        for req in reqs:
            req.kv.kv_allocated_len += d
            req.kv.kv_committed_len += d

    with Python's semantics throughout: ``+=`` is ``operator.iadd`` (ints of
    any size, int subclasses, NumPy ints and any ``__iadd__``/``__add__``/
    ``__radd__`` give Python's result), and every read and write takes the
    route ``getattr``/``setattr`` would (properties, ``__setattr__``,
    descriptors, slots).  If anything raises part-way through (a property,
    a missing attribute, an ``__add__``, the iteration), the requests are
    left exactly as that loop leaves them -- the same requests and paths
    already written -- and the same exception propagates.  A bad ``paths``
    raises ``TypeError``/``ValueError`` before any request is touched.

    ``pure=True`` runs no Python code of the caller's and never writes and
    then raises: every request is checked first (each owner read from a slot
    or an instance dict, each value an exact ``int`` in int64, ``delta`` too,
    each store a slot or a dict of exact-str keys), and the first that fails
    raises :class:`kvest.ImpureRequest` before anything is written.
    """
    cdef bint is_pure = _flag(pure, "pure")
    if is_pure:
        pure_reqs(reqs)
    cdef tuple norm = _paths(paths)
    cdef Py_ssize_t npaths = len(norm), total = 0, k, j, at = 0
    cdef tuple path
    for path in norm:
        total += len(path)
    cdef kv_known small[SMALL_STEPS]
    cdef Py_ssize_t small_ends[SMALL_PATHS]
    cdef unsigned char small_reuse[SMALL_PATHS]
    cdef kv_known *steps = small
    cdef Py_ssize_t *ends = small_ends
    cdef unsigned char *reuse = small_reuse
    if total > SMALL_STEPS or npaths > SMALL_PATHS:
        steps = <kv_known *>PyMem_Malloc(max(total, 1) * sizeof(kv_known))
        ends = <Py_ssize_t *>PyMem_Malloc(max(npaths, 1) * sizeof(Py_ssize_t))
        reuse = <unsigned char *>PyMem_Malloc(max(npaths, 1))
        if steps == NULL or ends == NULL or reuse == NULL:
            PyMem_Free(steps)
            PyMem_Free(ends)
            PyMem_Free(reuse)
            raise MemoryError()
    cdef kv_ctx cx
    cdef Py_ssize_t bad
    kv_ctx_init(&cx, is_pure)
    try:
        for k in range(npaths):
            path = norm[k]
            for j in range(len(path)):
                kv_known_init(&steps[at], <PyObject *>path[j])  # norm holds the names
                at += 1
            ends[k] = at
        if is_pure:
            _pure_delta(delta)
            _pure_paths(norm)
            bad = kw_check_add(&cx, <PyObject *>reqs, steps, ends, npaths)
            if bad >= 0:
                raise impure_request(bad, "written")
        kw_add_all(&cx, <PyObject *>reqs, steps, ends, npaths, <PyObject *>delta, reuse)
    finally:
        kv_ctx_end(&cx)  # collections as they were, whatever happened
        if steps != small:
            PyMem_Free(steps)
            PyMem_Free(ends)
            PyMem_Free(reuse)


def max_into_attr(reqs, path, values, *, strict=True, pure=False):
    """``for req, v in zip(reqs, values, strict=strict): req.<path> = max(req.<path>, v)``.

    ``path`` is one path: a dotted string or a tuple/list of attribute
    names, as in :func:`add_to_attrs`.  Python's order to the letter: the
    right side first (``req.<path>`` read, ``max`` called: ``v`` if ``v >
    current`` is true, else the current value itself), then the owner of the
    last name read again and the result stored; ``zip`` takes the next
    request, then the next value.  With ``strict`` (a bool), a length
    mismatch raises zip's own ``ValueError`` once the shorter runs out, the
    pairs before it already written.  On any exception part-way through the
    requests are left exactly as that loop leaves them and the same
    exception propagates.  A bad ``path`` or ``strict`` raises before any
    request is touched.

    ``pure=True``: as in :func:`add_to_attrs`, every pair is checked before
    anything is written (``values`` a list or tuple of exact ints in int64, of
    the same length as ``reqs`` under ``strict``), and
    :class:`kvest.ImpureRequest` raised for the first that fails.
    """
    cdef bint is_pure = _flag(pure, "pure")
    if is_pure:
        pure_reqs(reqs)
        if not ((type(values) is list or type(values) is tuple)
                and kw_small_ints(<PyObject *>values)):  # (the rule's usual case, in C)
            pure_values(values, "values")
    cdef tuple names = path if _ready(path) else _names(path, "path")
    cdef bint is_strict = _flag(strict, "strict")
    cdef kv_ctx cx
    cdef Py_ssize_t bad
    cdef Py_ssize_t n = len(names), j
    cdef kv_known small[SMALL_STEPS]
    cdef kv_known *steps = small
    if n > SMALL_STEPS:
        steps = <kv_known *>PyMem_Malloc(n * sizeof(kv_known))
        if steps == NULL:
            raise MemoryError()
    kv_ctx_init(&cx, is_pure)
    try:
        for j in range(n):
            kv_known_init(&steps[j], <PyObject *>names[j])  # names holds them
        if is_pure:
            if is_strict and len(reqs) != len(values):
                raise impure_argument("values")  # zip's ValueError after the pairs
            _pure_paths((names,))
            if kw_max_all_quick(&cx, <PyObject *>reqs, <PyObject *>values, steps, n):
                return None  # every pair checked and written in one pass
            bad = kw_check_max(&cx, <PyObject *>reqs, <PyObject *>values, steps, n)
            if bad >= 0:
                raise impure_request(bad, "written")
        kw_max_all(&cx, <PyObject *>reqs, <PyObject *>values, steps, n, is_strict)
    finally:
        kv_ctx_end(&cx)  # collections as they were, whatever happened
        if steps != small:
            PyMem_Free(steps)
