# cython: language_level=3, boundscheck=True, wraparound=False, binding=False
"""The SGLang glue's compiled half: what a rewritten SGLang function calls on
every decode step.  In Python the glue's own call, checks and counting cost
more than upstream's loop over a few requests; here, a builtin method's call,
which CPython specialises (binding=False), as it does not a cyfunction's.  Each
glue answers as its twin in kvest.sglang.glue, and counts as
kvest.sglang.monitor.Spot says; the kernels are kvest._reqs' (its .pxd)."""

cimport cython
cimport numpy as cnp
from cpython.dict cimport PyDict_GetItem  # (borrowed, or NULL; raises nothing)
from cpython.list cimport PyList_GET_SIZE
from cpython.sequence cimport PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport INT64_MAX, int64_t, uint64_t

from kvest._reqs cimport (
    BEAM_GROUPS,
    DECODE,
    PLAN,
    SPEC_V2,
    Job,
    Kind,
    _glue_job,
    _own_attr,
    _walk_all,
)

import builtins as _builtins

cnp.import_array()


cdef extern from "fence.h":
    enum:
        KV_PRIVATE
    bint kv_tag_valid(PyTypeObject *t)
    unsigned int kv_tag(PyTypeObject *t)


cdef str _REQS = "reqs"
cdef str _CEIL_DIV = "ceil_div"


cdef extern from "Python.h":
    PyObject *PyFunction_GetCode(object f)  # borrowed


def _small_list(obj, Py_ssize_t below):
    """Whether ``obj`` is an exact list of fewer than ``below`` items (the SGLang
    rewrite's size check: one call, no Python code)."""
    return type(obj) is list and PyList_GET_SIZE(obj) < below


def _small_reqs(owner, Py_ssize_t below):
    """Whether ``owner.reqs`` is the instance's own value (reading it runs no
    Python code, so reading it again gives the same object) and an exact list
    of fewer than ``below`` requests."""
    reqs = _own_attr(owner, _REQS, None)
    return type(reqs) is list and PyList_GET_SIZE(reqs) < below


def _exact_ints(values):
    """Whether ``values`` is an exact list or tuple of exact ints: iterating it
    and using its items as list indices runs no Python code (the selection's
    rule: kvest.sglang.glue's ``_plain_indices``)."""
    cdef Py_ssize_t i, n
    cdef PyObject **items
    if type(values) is not list and type(values) is not tuple:
        return False
    n = PySequence_Fast_GET_SIZE(values)
    items = PySequence_Fast_ITEMS(values)
    for i in range(n):
        if <PyTypeObject *>(items[i].ob_type) is not <PyTypeObject *>int:
            return False
    return True


def _type_version(cls):
    """``cls``'s version tag (after a lookup, which gives it one where it can
    have one), or 0 where it has none or the build keeps to the public API:
    what the SGLang glue keys what it worked out for a class by.  CPython
    changes the tag whenever the class or a base changes (fence.h)."""
    if not isinstance(cls, type):
        raise TypeError("cls: a type")
    if not KV_PRIVATE:
        return 0
    cdef PyTypeObject *t = <PyTypeObject *>cls
    getattr(cls, "__getattribute__")  # a lookup: assigns a tag where it can
    return kv_tag(t) if kv_tag_valid(t) else 0


cdef enum:
    _UPSTREAM = 0  # a call's outcome (kvest.sglang.monitor.UPSTREAM, KERNEL, FALLBACK)
    _KERNEL = 1
    _FALLBACK = 2


cdef class _Tally:
    """A hot spot's counters (kvest.sglang.monitor.Spot reads them): each call
    counted once, when its outcome is final -- by the rewritten function as
    it ends (:meth:`count`, with the outcome it kept in a local of its own),
    or by a whole function's glue at its one decision.  They only grow, and
    each is one C increment under the GIL: no count is lost between threads,
    and none is ever taken back."""

    cdef readonly long long kernel, fallbacks, upstream

    @cython.always_allow_keywords(False)  # METH_O: the quickest call there is
    def count(self, int seen):
        """One call ended: ``seen`` 1 (a kernel answered, none declined), 2 (a
        kernel declined) or 0 (neither: upstream's on purpose, or no compiled
        statement reached)."""
        if seen == _KERNEL:
            self.kernel += 1
        elif seen == _UPSTREAM:
            self.upstream += 1
        else:
            self.fallbacks += 1

    @property
    def calls(self):
        return self.kernel + self.fallbacks + self.upstream


cdef class _Glue:
    """What every compiled glue holds: the DECLINED marker, the monitor's
    state with its first-call hook, the builtin the statement must still
    read.  A statement's glue counts nothing (the rewritten function counts
    each call once, as it ends).  Nothing a call reads is kept here but the
    last job made ready: each walk has its own reader state, so two threads
    on one glue share nothing that a call changes."""

    cdef object declined, state, first_call, builtin
    # failed(error, args): told of every exception the kernel raised (glue.py's
    # _hooked: kvest.sglang.monitor.kernel_failed counts those no decline)
    cdef public object failed
    cdef bint announced  # the status line is out: no need to look again
    cdef Job job  # the last (page size, reserve)'s, made ready (_glue_job) once
    cdef int64_t job_p, job_r  # job_p 0 (as a new object's fields are): none kept yet

    def __init__(self, declined, state, first_call, builtin):
        self.declined = declined
        self.state = state
        self.first_call = first_call
        self.builtin = builtin

    cdef inline int _announce(self) except -1:
        if not self.announced:
            if not self.state.announced:
                self.first_call()
            self.announced = True
        return 0

    cdef inline int _job(self, Job *job, Kind kind, int64_t p, int64_t r,
                         object layout) except -1:
        """job made ready for (p, r): the kept one copied where they match the
        last call's, else made whole in job before it is kept (the layout's
        rule is Python's, and another thread may use this glue meanwhile)."""
        if p == self.job_p and r == self.job_r:
            job[0] = self.job
        else:
            _glue_job(job, kind, p, r, layout)
            self.job, self.job_p, self.job_r = job[0], p, r
        return 0

    cdef inline bint _walked(self, Job *job, object reqs) except -1:
        """Whether the kernel walked reqs (else upstream's statement raises its own)."""
        try:
            _walk_all(job, reqs)
        except Exception as error:
            self._failed(error, (reqs,))
            return False
        return True

    cdef int _failed(self, object error, tuple args) except -1:
        if self.failed is not None:
            self.failed(error, args)
        return 0


cdef class _DecodeCountGlue(_Glue):
    """``n = sum(1 for r in requests if <C> % page_size == 0)``: the Python
    twin is kvest.sglang.glue.make_decode_count's ``decode_count``."""

    cdef object layout

    def __init__(self, declined, state, first_call, builtin, layout):
        _Glue.__init__(self, declined, state, first_call, builtin)
        self.layout = layout

    def run(self, requests, page_size, sum_):
        cdef Job job
        cdef int64_t p
        cdef int overflow = 0
        self._announce()
        if (sum_ is self.builtin and (type(requests) is list or type(requests) is tuple)
                and type(page_size) is int):
            p = PyLong_AsLongLongAndOverflow(page_size, &overflow)
            if overflow == 0 and p >= 1:
                self._job(&job, DECODE, p, 0, self.layout)
                # (the kernel answers in tokens, which must fit int64)
                if self._walked(&job, requests) and job.count <= <uint64_t>(INT64_MAX // p):
                    return job.count
        return self.declined


cdef class _BeamTailGlue(_Glue):
    """SGLang's ``append_beam_tail`` loop with no request in a beam group: the
    Python twin is kvest.sglang.glue.make_beam_tail_loop's ``beam_tail_loop``.
    ``owner.reqs`` is read only where reading it runs no code (its instance
    dict's entry, or a slot), so that upstream's loop, if it runs, reads the
    same list."""

    def __init__(self, declined, state, first_call, builtin):
        _Glue.__init__(self, declined, state, first_call, builtin)
        _glue_job(&self.job, BEAM_GROUPS, 1, 0, None)

    def run(self, owner, enumerate_):
        cdef Job job
        self._announce()
        if enumerate_ is self.builtin:
            reqs = _own_attr(owner, _REQS, None)
            if type(reqs) is list:
                job = self.job
                if self._walked(&job, reqs) and job.count == 0:
                    return None
        return self.declined


cdef class _SpecV2TotalGlue(_Glue):
    """``for r in requests: total += ceil_align(max(A, C + R), p) -
    ceil_align(A, p)``, R being ``factor`` times the reserve read: the Python
    twin is kvest.sglang.glue.make_spec_v2_total's ``spec_v2_total``.  The
    helpers must still be the functions kvest proved the pattern with, their
    code unreplaced (an autoreload keeps a function's identity)."""

    cdef object layout, ceil_align, ceil_div, align_code, div_code
    cdef int64_t factor
    cdef dict home

    def __init__(self, declined, state, first_call, builtin, layout, factor, ceil_align,
                 ceil_div):
        _Glue.__init__(self, declined, state, first_call, builtin)
        self.layout, self.factor = layout, factor
        self.ceil_align, self.ceil_div = ceil_align, ceil_div
        self.home = ceil_align.__globals__
        self.align_code, self.div_code = ceil_align.__code__, ceil_div.__code__

    def run(self, total, requests, page_size, reserve, max_, ceil_align_):
        cdef Job job
        cdef int64_t p, r
        cdef int overflow = 0
        self._announce()
        # (the helpers' checks in C: a dict lookup and two fields, no method call)
        if (max_ is self.builtin and ceil_align_ is self.ceil_align
                and PyDict_GetItem(self.home, _CEIL_DIV) == <PyObject *>self.ceil_div
                and PyFunction_GetCode(self.ceil_align) == <PyObject *>self.align_code
                and PyFunction_GetCode(self.ceil_div) == <PyObject *>self.div_code
                and type(total) is int and (type(requests) is list or type(requests) is tuple)
                and type(page_size) is int and type(reserve) is int):
            p = PyLong_AsLongLongAndOverflow(page_size, &overflow)
            r = PyLong_AsLongLongAndOverflow(reserve, &overflow) if overflow == 0 else -1
            # (factor times the reserve in int64, as upstream's ints hold it)
            if overflow == 0 and p >= 1 and 0 <= r <= INT64_MAX // self.factor:
                self._job(&job, SPEC_V2, p, self.factor * r, self.layout)
                if self._walked(&job, requests):
                    return total + job.tokens
        return self.declined


cdef enum:
    _LISTS_MAX = 64  # the most requests answered as lists (their rows sit on the C stack)


def _globals_resolve(dict namespace, tuple names, tuple expected, missing):
    """Whether each of ``names``, looked up as a function of ``namespace``
    looks up a global (that dict, then its ``__builtins__``), is the object at
    the same place in ``expected`` (``missing``: found in neither):
    kvest.sglang.glue's ``resolves`` in C (a whole function kvest replaced
    reads these names on every call)."""
    cdef Py_ssize_t i
    cdef object home = namespace.get("__builtins__", _builtins)
    cdef dict table = home if type(home) is dict else vars(home)
    for i in range(len(names)):
        value = namespace.get(names[i], missing)
        if value is missing:
            value = table.get(names[i], missing)
        if value is not expected[i]:
            return False
    return True


cdef class _AllocLensGlue(_Glue):
    """``page_aligned_decode_alloc_lens`` for its int32 callers, the whole
    function: ``(cur, nxt, tokens)`` as int32 arrays, or below
    ``lists_below`` requests as upstream's lists; ``declined`` (counted) where
    upstream's function must answer.  It counts the call itself, once, at
    its one decision.  The Python twin is kvest.sglang.glue.make_alloc_lens_int32's
    function."""

    cdef _Tally tally
    cdef dict namespace
    cdef tuple names, expected
    cdef object layout, missing
    cdef Py_ssize_t lists_below

    def __init__(self, _Tally tally, declined, state, first_call, dict namespace, tuple names,
                 tuple expected, missing, layout, Py_ssize_t lists_below):
        _Glue.__init__(self, declined, state, first_call, None)
        self.tally = tally
        if not 0 <= lists_below <= _LISTS_MAX:
            raise ValueError(f"lists_below: 0 to {_LISTS_MAX}")
        self.namespace, self.names, self.expected = namespace, names, expected
        self.missing = missing
        self.layout, self.lists_below = layout, lists_below

    cdef bint _ready(self, Job *job, object reqs, object reserve, object page_size) except -1:
        """Whether the call is one the kernel takes (a list or tuple, exact ints
        ``page_size >= 1`` and ``reserve >= 0``, the function's global names
        as proven), with job made ready for it."""
        cdef int64_t p, r
        cdef int overflow = 0
        if not ((type(reqs) is list or type(reqs) is tuple) and type(reserve) is int
                and type(page_size) is int
                and _globals_resolve(self.namespace, self.names, self.expected, self.missing)):
            return False
        p = PyLong_AsLongLongAndOverflow(page_size, &overflow)
        if overflow or p < 1:
            return False
        r = PyLong_AsLongLongAndOverflow(reserve, &overflow)
        if overflow or r < 0:
            return False
        self._job(job, PLAN, p, r, self.layout)
        return True

    def run(self, reqs, reserve, page_size):
        cdef Job job
        cdef int64_t cur[_LISTS_MAX]
        cdef int64_t nxt[_LISTS_MAX]
        cdef Py_ssize_t m, i
        cdef cnp.npy_intp dims
        self._announce()
        try:
            if self._ready(&job, reqs, reserve, page_size):
                m = dims = len(reqs)
                job.rows = m
                if m < self.lists_below:
                    job.cur, job.nxt = &cur[0], &nxt[0]
                    _walk_all(&job, reqs)
                    if job.row == m:
                        answer = ([cur[i] for i in range(m)], [nxt[i] for i in range(m)],
                                  job.tokens)
                        self.tally.kernel += 1
                        return answer
                else:
                    cur_out = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT32, 0)
                    nxt_out = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT32, 0)
                    job.cur = cnp.PyArray_DATA(<cnp.ndarray>cur_out)
                    job.nxt = cnp.PyArray_DATA(<cnp.ndarray>nxt_out)
                    job.cur32 = job.nxt32 = True
                    _walk_all(&job, reqs)
                    if job.row == m:
                        self.tally.kernel += 1
                        return cur_out, nxt_out, job.tokens
        except Exception as error:  # upstream's function raises its own exception
            self._failed(error, (reqs, page_size, reserve))
        self.tally.fallbacks += 1
        return self.declined
