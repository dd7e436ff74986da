# cython: language_level=3
# What kvest._reqs gives the SGLang glue's compiled half (kvest.sglang._glue):
# a job (one kernel's arguments and running answer), made ready and walked
# over a batch, and a request attribute read where reading it runs no code.

from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint64_t

from kvest._common cimport kv_divisor


cdef enum Kind:
    SPEC_V2
    DECODE
    PLAN
    BEAM
    BEAM_GROUPS


cdef struct Job:
    Kind kind
    int at_committed, at_allocated  # KV_AT_*: where each length is read
    int pure  # KV_PURE_*: the reads' mode
    int64_t p, r
    bint fast  # p and r in the fast range (each row checks its own lengths)
    bint aligned
    bint exact  # exact_ints: a length that is not exactly an int is a TypeError
    kv_divisor d
    int64_t tokens  # SPEC_V2, PLAN
    int64_t pages  # PLAN
    uint64_t count  # DECODE; BEAM_GROUPS: the requests with a beam group
    Py_ssize_t row  # PLAN: the output row being written
    Py_ssize_t rows  # PLAN: the rows cur and nxt hold; never written past
    bint backward  # PLAN: the rows are read last to first (row counts from the end)
    bint own_out  # PLAN: cur and nxt are kvest's own (a caller sees no row of a walk that gave up)
    void *cur
    void *nxt
    bint cur32, nxt32
    PyObject *beam_total  # BEAM: the total as a Python object once it is not an int64


# A job as the glue runs it: exact ints only, in pure mode.
cdef int _glue_job(Job *job, Kind kind, int64_t p, int64_t r, object layout) except -1
# The job's rows over every request of reqs (a list or tuple, or any iterable).
cdef int _walk_all(Job *job, object reqs) except -1
# obj.<name> where reading it runs no Python code (a slot, the instance dict's
# own entry), else `missing`.
cdef object _own_attr(object obj, str name, object missing)
