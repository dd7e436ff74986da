# cython: language_level=3, boundscheck=False, wraparound=False
# Free-threading: claimed.  Each call keeps its routes on its own stack, and
# without a GIL reqroute.h makes every access a generic one (owned references
# through PyObject_GetAttr/PyObject_SetAttr, no hint table, no slot or dict
# read behind the interpreter's back), and a list's items are taken with
# PyList_GetItemRef (kw_item), which checks the index and takes a reference of
# our own at once.  (The readers, _reqs.pyx, do not claim it.)
# cython: freethreading_compatible=True
"""Compiled request-object writers: the same names, signatures and exceptions
as kvest.reference._writes, their pure-Python twin.

Each function is a compiled copy of one per-request Python loop that writes to
request objects (``req.kv.kv_allocated_len += 1``), with that loop's semantics
to the letter: the same reads and writes in the same order through the same
routes (properties, ``__setattr__``, descriptors, slots), Python's own
operators for anything but int64-sized exact ints, and on an exception the
same requests left written and the same exception raised.  The loops are in
src/_src/reqwrite.h; this module checks the arguments and sets them up.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject

from kvest._route cimport KV_DICT_ENTRIES, kv_dict_entries_check, kv_dict_entries_ok

from sys import intern

from kvest._errors import impure_argument, impure_request
from kvest._inputs import pure_reqs, pure_values
from kvest._names import WRITE_FUNCTIONS

__all__ = list(WRITE_FUNCTIONS)


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

# The instance-dict entry read, as in kvest._reqs (reqroute.h).
kv_dict_entries_check()
_DICT_ENTRIES = bool(KV_DICT_ENTRIES and kv_dict_entries_ok)


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
