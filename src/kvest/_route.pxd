# cython: language_level=3
# The route core's declarations (src/kvest/_src/reqroute.h) that the request
# modules (_reqs, _writes) share.  Each module includes the header, so each
# has its own copy of its static state: each runs kv_dict_entries_check().

from cpython.object cimport PyObject


cdef extern from "reqroute.h":
    ctypedef struct kv_gc:
        pass
    void kv_gc_init(kv_gc *g)
    void kv_gc_let(kv_gc *g)
    PyObject *kv_plain_attr(PyObject *obj, PyObject *name, kv_gc *g)
    int kv_dict_entries_check() except -1
    int kv_dict_entries_ok
    enum:
        KV_DICT_ENTRIES
