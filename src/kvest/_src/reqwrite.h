/*
 * Writing to request objects exactly as a Python statement does, with the
 * fewest lookups:
 *
 *     obj.<name> += delta                    (kw_add_path)
 *     obj.<name> = max(obj.<name>, value)    (kw_max_path; obj re-read for the store)
 *
 * where obj is req.<path[0]>...<path[-2]>, read afresh for each statement.
 * Every read and write goes the route CPython's generic getattr/setattr would
 * (reqroute.h), checked right before each use, so code run in between (an
 * __add__, a property) never leaves a stale route in use; a shortcut that
 * misses falls back to the generic call, which raises what Python raises.  No
 * int object is ever changed: a sum is a new int, as CPython's `+=` makes it.
 *
 * Pure mode (kv_ctx.pure, the writers' pure=True): every read is one that
 * runs no code of the caller's (a slot, an instance-dict entry found without
 * a lookup), and the whole batch is checked (kw_check_add / kw_check_max)
 * before anything is written: each owner read so, each value an exact int in
 * int64, each store a slot or a dict whose keys are all exact str.  Only then
 * do the writes run, and they run nothing of the caller's and raise nothing.
 * (max's usual case is checked as it is written, every store taken back at
 * the first pair that is not: kw_max_all_quick.)
 */
#ifndef KVEST_REQWRITE_H
#define KVEST_REQWRITE_H

#include <Python.h>
#include <limits.h>
#include <string.h>

#include "reqroute.h"

/* When the call ends, whatever happened: collections as they were. */
static inline void kv_ctx_end(kv_ctx *cx)
{
    kv_gc_let(&cx->gc);
}

/* Whether a str is interned (the paths' names are, so that dict probes find
 * keys by identity and writes keep the keys the generic setattr would). */
static inline int kw_interned(PyObject *s)
{
    return PyUnicode_CHECK_INTERNED(s) != 0;
}

/* One attribute name of one path, nothing known of it yet: the walk learns
 * what is known of it on each type it meets there (kv_route). */
static inline void kv_known_init(kv_known *s, PyObject *name)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->hint = -1;
}

static void kw_resolve(const kv_ctx *cx, kv_known *s, PyTypeObject *t)
{
    kv_resolve(s, t, s->name, cx->pure);
}

/* s's route made current for t: the check inline, each use; the resolve not. */
KV_HOT void kw_route(const kv_ctx *cx, kv_known *s, PyTypeObject *t)
{
    if (!kv_route_current(s->type, s->version, t)) kw_resolve(cx, s, t);
}

/* getattr(obj, s->name): a new reference, or NULL with the exception set --
 * or, in pure mode, NULL with nothing set when the read would need code of
 * the caller's (or would raise).  *pure is cleared unless the read ran no
 * Python code at all, so that reading it again would give the same object. */
static inline PyObject *kw_get(kv_ctx *cx, kv_known *s, PyObject *obj, int *pure)
{
    kw_route(cx, s, Py_TYPE(obj));
#if KV_SHORTCUTS
    if (s->route.get == KV_ROUTE_MEMBER) {
        PyObject *v = kv_slot_get(&s->route, obj, s->name);
        if (v != NULL) return Py_NewRef(v);
    } else if (s->route.get == KV_ROUTE_DICT) {
        PyObject **dictptr = kv_dictptr(&cx->gc, obj);
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *dict = *dictptr, *v = kv_dict_at(dict, s->hint, s->name);
            if (v != NULL) return Py_NewRef(v);
            if (cx->pure) {
                Py_ssize_t at;
                if (kv_dict_scan(dict, s->name, &v, &at) != 1) return NULL;
                kv_learned(s, at);
                return Py_NewRef(v);
            }
            *pure = 0;
            kv_gc_let(&cx->gc);
            /* The probe can run a colliding key's __eq__: hold the dict. */
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, s->name); /* borrowed */
            Py_XINCREF(v);
            if (v != NULL) kv_learn(cx, s, dict);
            kv_release(&cx->gc, dict);
            if (v != NULL || PyErr_Occurred()) return v;
        }
    }
#endif
    if (cx->pure) return NULL;
    *pure = 0;
    kv_gc_let(&cx->gc);
    return PyObject_GetAttr(obj, s->name);
}

/* setattr(obj, s->name, value): 0, or -1 with the exception set.  *pure is
 * cleared unless the write ran no Python code (a slot whose old value was
 * NULL or an exact int, whose release runs nothing). */
static inline int kw_set(kv_ctx *cx, kv_known *s, PyObject *obj, PyObject *value, int *pure)
{
    kw_route(cx, s, Py_TYPE(obj));
#if KV_SHORTCUTS
    if (s->route.set == KV_ROUTE_MEMBER) {
#if KV_PRIVATE
        /* What the member descriptor's __set__ does (PyMember_SetOne). */
        PyObject **slot = kv_slot_ptr(obj, s->route.offset);
        PyObject *old = *slot;
        if (old != NULL && !PyLong_CheckExact(old)) {
            *pure = 0;
            kv_gc_let(&cx->gc); /* its release may run a finalizer */
        }
        *slot = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
#else
        /* The member descriptor's own set: behind the fence, routes are taken
         * in pure mode only, whose check proved the old value an exact int. */
        return PyObject_SetAttr(obj, s->name, value);
#endif
    }
    if (!cx->pure) {
        /* The store compares keys (a colliding key's own __eq__) and
         * releases the old value (its finalizer): pure mode checked both. */
        *pure = 0;
        kv_gc_let(&cx->gc);
    }
    if (s->route.set == KV_ROUTE_DICT) {
        PyObject **dictptr = kv_dictptr(&cx->gc, obj);
        if (!cx->pure) kv_gc_let(&cx->gc);
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *dict = Py_NewRef(*dictptr);
            int rc = PyDict_SetItem(dict, s->name, value);
            kv_release(&cx->gc, dict);
            return rc;
        }
    }
#endif
    *pure = 0;
    kv_gc_let(&cx->gc);
    return PyObject_SetAttr(obj, s->name, value);
}

/* A pure-mode read that the check said would succeed, and did not. */
static PyObject *kw_unexpected(PyObject *v)
{
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_SystemError, "kvest: a request checked for pure mode changed");
    return v;
}

/* req.<steps[0]>...<steps[n-2]>: the object holding the path's last name (a
 * new reference), or NULL with the exception set (pure mode: maybe not). */
static inline PyObject *kw_owner(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                                 int *pure)
{
    PyObject *obj = Py_NewRef(req);
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        PyObject *next = kw_get(cx, &steps[i], obj, pure);
        kv_release(&cx->gc, obj);
        if (next == NULL) return NULL;
        obj = next;
    }
    return obj;
}

/* What one call adds: delta, and delta as a C integer when it is an exact int
 * that fits (then an exact int value that fits adds without Python code). */
typedef struct {
    PyObject *delta;
    int fast;
    long long d;
} kw_delta;

static inline void kw_delta_init(kw_delta *dl, PyObject *delta)
{
    int overflow = 0;
    dl->delta = delta;
    dl->d = 0;
    dl->fast = 0;
    if (PyLong_CheckExact(delta)) {
        /* An exact int only overflows here; it never raises. */
        long long d = PyLong_AsLongLongAndOverflow(delta, &overflow);
        if (!overflow) {
            dl->d = d;
            dl->fast = 1;
        }
    }
}

/* Whether v is an exact int in int64. */
static inline int kw_int64(PyObject *v)
{
    int overflow = 0;
    if (!PyLong_CheckExact(v)) return 0;
    (void)PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow;
}

/* operator.iadd(v, delta), as `x.a += delta` computes it; *pure cleared
 * when Python's operator ran (which may run any code).  The sum is always a
 * new int (or a shared small one), made while v is still held, as CPython's
 * own `+=` makes it: no int object is ever changed. */
static inline PyObject *kw_iadd(kv_ctx *cx, PyObject *v, const kw_delta *dl, int *pure)
{
    if (dl->fast && PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        long long d = dl->d;
        if (!overflow && !(d > 0 && x > LLONG_MAX - d) && !(d < 0 && x < LLONG_MIN - d)) {
            kv_gc_hold(&cx->gc); /* the new int's allocation collects nothing */
            return PyLong_FromLongLong(x + d);
        }
    }
    if (PyLong_CheckExact(v) && PyLong_CheckExact(dl->delta)) { /* int's own add: no code */
        kv_gc_hold(&cx->gc);
        return PyNumber_InPlaceAdd(v, dl->delta);
    }
    *pure = 0;
    kv_gc_let(&cx->gc);
    return PyNumber_InPlaceAdd(v, dl->delta);
}

/* Pure mode: whether `req.<path> op= ...` (n steps) reads and stores with no
 * code of the caller's and without raising: each owner read so, the value an
 * exact int in int64, the store a slot or a dict whose keys are all exact str
 * (its search then compares none with code of its own). */
static int kw_check_path(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req)
{
    int pure = 1, ok = 0;
    PyObject *obj = kw_owner(cx, steps, n, req, &pure), *v;
    if (obj == NULL) return 0;
    kv_known *s = &steps[n - 1];
    v = kw_get(cx, s, obj, &pure);
    if (v != NULL && kw_int64(v)) {
        /* kw_get left s's route current for obj's type. */
#if KV_SHORTCUTS
        if (s->route.set == KV_ROUTE_MEMBER && s->route.get == KV_ROUTE_MEMBER) {
            ok = 1;
        } else if (s->route.set == KV_ROUTE_DICT && s->route.get == KV_ROUTE_DICT) {
            PyObject **dictptr = kv_dictptr(&cx->gc, obj);
            ok = dictptr != NULL && *dictptr != NULL && kv_dict_str_keys(*dictptr);
        }
#endif
    }
    kv_release(&cx->gc, v);
    kv_release(&cx->gc, obj);
    return ok;
}

/* `req.<path> += delta` for one path of n steps: 0, or -1 with the exception
 * set.  *owner is the object holding the last name: taken as given when
 * reuse is set (the previous path had the same names up to there, and no
 * Python code has run since it was read, so reading them again would give
 * it), read afresh otherwise.  On return *owner holds it (a new reference,
 * or NULL) and *pure says whether no Python code has run since it was read. */
static inline int kw_add_path(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                              const kw_delta *dl, PyObject **owner, int reuse, int *pure)
{
    if (!(reuse && *owner != NULL && *pure)) {
        KV_CLEAR(&cx->gc, *owner);
        *pure = 1;
        *owner = kw_unexpected(kw_owner(cx, steps, n, req, pure));
        if (*owner == NULL) return -1;
    }
    PyObject *obj = *owner;
    PyObject *v = kw_unexpected(kw_get(cx, &steps[n - 1], obj, pure));
    if (v == NULL) return -1;
    PyObject *sum = kw_iadd(cx, v, dl, pure);
    kv_release(&cx->gc, v);
    if (sum == NULL) return -1;
    int rc = kw_set(cx, &steps[n - 1], obj, sum, pure);
    kv_release(&cx->gc, sum);
    return rc;
}

/* The quick paths' slot for the path's last name: req's path to its owner
 * read by shortcuts alone (a slot, or an instance-dict entry at its hint) on
 * each type's current route, the last name a slot read and written in place
 * (set, holding an exact int).  NULL when anything is otherwise (always
 * behind the fence, which takes no route outside pure mode).  Runs no Python
 * code and takes no reference.  *owner, when not NULL, is the owner already
 * read (the walk is skipped), and is set to it. */
KV_HOT PyObject **kw_quick_slot(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                                PyObject **owner)
{
#if KV_PRIVATE
    PyObject *obj = *owner != NULL ? *owner : req, **slot;
    for (Py_ssize_t i = 0; *owner == NULL && i + 1 < n; i++) {
        kv_known *s = &steps[i];
        PyObject *next = NULL;
        kw_route(cx, s, Py_TYPE(obj)); /* (works out no route by running code) */
        if (s->route.get == KV_ROUTE_MEMBER) {
            next = kv_slot_get(&s->route, obj, s->name);
        } else if (s->route.get == KV_ROUTE_DICT) {
            PyObject *dict = kv_dict_of(&cx->gc, obj); /* (a read: nothing allocated) */
            if (dict != NULL) next = kv_dict_at(dict, s->hint, s->name);
        }
        if (next == NULL) return NULL;
        obj = next;
    }
    kv_known *s = &steps[n - 1];
    kw_route(cx, s, Py_TYPE(obj));
    if (s->route.get != KV_ROUTE_MEMBER || s->route.set != KV_ROUTE_MEMBER) return NULL;
    slot = kv_slot_ptr(obj, s->route.offset);
    if (*slot == NULL || !PyLong_CheckExact(*slot)) return NULL;
    *owner = obj;
    return slot;
#else
    (void)cx, (void)steps, (void)n, (void)req, (void)owner;
    return NULL;
#endif
}

/* kw_add_path's common case, taking no reference and running no Python code:
 * each owner read by a shortcut (a slot, or an instance-dict entry at its
 * hint) on its type's current route, the last name a slot holding an exact
 * int, delta a C integer, the sum in int64.  Returns 1 when the store is done
 * (a new int in the slot, the old one released: an exact int, whose release
 * runs nothing), 0 with nothing changed (kw_add_path then runs). */
static inline int kw_add_path_quick(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                                    const kw_delta *dl, PyObject **owner)
{
    PyObject *obj = *owner, **slot, *old, *sum;
    if (!dl->fast) return 0;
    slot = kw_quick_slot(cx, steps, n, req, &obj);
    if (slot == NULL) return 0;
    old = *slot;
    int overflow = 0;
    long long x, d = dl->d;
    if (!kv_small_int(old, &x)) x = PyLong_AsLongLongAndOverflow(old, &overflow);
    if (overflow || (d > 0 && x > LLONG_MAX - d) || (d < 0 && x < LLONG_MIN - d)) return 0;
    kv_gc_hold(&cx->gc);
    sum = PyLong_FromLongLong(x + d);
    if (sum == NULL) { /* kw_add_path tries again, and raises what it raises */
        PyErr_Clear();
        return 0;
    }
    *slot = sum;
    Py_DECREF(old);
    *owner = obj;
    return 1;
}

/* builtins.max(cur, v) (a new reference): v if v > cur is true, else cur. */
static inline PyObject *kw_max(kv_ctx *cx, PyObject *cur, PyObject *v, int *pure)
{
    if (PyLong_CheckExact(cur) && PyLong_CheckExact(v)) {
        int o1 = 0, o2 = 0;
        long long a = PyLong_AsLongLongAndOverflow(cur, &o1);
        long long b = PyLong_AsLongLongAndOverflow(v, &o2);
        if (!o1 && !o2) return Py_NewRef(b > a ? v : cur);
    }
    *pure = 0;
    kv_gc_let(&cx->gc);
    int gt = PyObject_RichCompareBool(v, cur, Py_GT);
    if (gt < 0) return NULL;
    return Py_NewRef(gt ? v : cur);
}

/* A store kw_max_path_quick made, to be taken back: the slot, and the int it held. */
typedef struct { PyObject **slot, *old; } kw_kept;

/* kw_max_path's common case, taking no reference and running no Python code:
 * the slot as kw_add_path_quick finds it, its int and v one-digit exact ints
 * (compared without a call).  Returns 1 when the statement is done (v stored
 * where it is the greater, the old int released -- its release runs nothing
 * -- or, with `kept`, handed over there; else max() gave the slot's own int,
 * and storing it back changes nothing), 0 with nothing changed (kw_max_path
 * then runs). */
KV_HOT int kw_max_path_quick(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                             PyObject *v, kw_kept *kept)
{
    PyObject *owner = NULL, **slot, *cur;
    long long a, b;
    if (!PyLong_CheckExact(v) || !kv_small_int(v, &b)) return 0;
    slot = kw_quick_slot(cx, steps, n, req, &owner);
    if (slot == NULL || !kv_small_int(*slot, &a)) return 0;
    if (b > a) {
        cur = *slot;
        *slot = Py_NewRef(v);
        if (kept == NULL) kv_release(&cx->gc, cur);
        else *kept = (kw_kept){slot, cur};
    }
    return 1;
}

/* `req.<path> = max(req.<path>, v)`: the right side first, then req's path
 * to the owner read again for the store -- unless no Python code ran since
 * it was read, when reading it again would give the same object.  0, or -1
 * with the exception set. */
static inline int kw_max_path(kv_ctx *cx, kv_known *steps, Py_ssize_t n, PyObject *req,
                              PyObject *v)
{
    int pure = 1;
    PyObject *obj = kw_unexpected(kw_owner(cx, steps, n, req, &pure));
    if (obj == NULL) return -1;
    PyObject *cur = kw_unexpected(kw_get(cx, &steps[n - 1], obj, &pure));
    if (cur == NULL) {
        kv_release(&cx->gc, obj);
        return -1;
    }
    PyObject *m = kw_max(cx, cur, v, &pure);
    kv_release(&cx->gc, cur); /* an exact int when pure: its release runs nothing */
    if (m == NULL) {
        kv_release(&cx->gc, obj);
        return -1;
    }
    if (!pure) {
        kv_release(&cx->gc, obj);
        obj = kw_unexpected(kw_owner(cx, steps, n, req, &pure));
        if (obj == NULL) {
            kv_release(&cx->gc, m);
            return -1;
        }
    }
    int rc = kw_set(cx, &steps[n - 1], obj, m, &pure);
    kv_release(&cx->gc, m);
    kv_release(&cx->gc, obj);
    return rc;
}

/* seq[pos] of an exact list or tuple, pos below the size just read: a new
 * reference, or NULL (nothing set) when the list has shrunk since.  Without
 * a GIL another thread may shrink the list between the size and the read:
 * PyList_GetItemRef checks and takes the reference at once. */
static inline PyObject *kw_item(PyObject *seq, Py_ssize_t pos)
{
    if (PyList_CheckExact(seq)) {
#if !KV_SHORTCUTS
        PyObject *x = PyList_GetItemRef(seq, pos);
        if (x == NULL) PyErr_Clear(); /* an IndexError: the list shrank */
        return x;
#else
        return Py_NewRef(PyList_GET_ITEM(seq, pos));
#endif
    }
    return Py_NewRef(PyTuple_GET_ITEM(seq, pos));
}

/* The next item of a loop over seq, as a for loop (or zip) takes it: an exact
 * list or tuple is indexed, its size read every time as its iterator does;
 * anything else goes through `it`, its iterator.  1 with a new reference in
 * *item, 0 when exhausted, -1 with the exception set. */
static inline int kw_next(kv_ctx *cx, PyObject *seq, PyObject *it, Py_ssize_t *pos,
                          PyObject **item)
{
    if (it == NULL) {
        int is_list = PyList_CheckExact(seq);
        Py_ssize_t size = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
        if (*pos >= size) return 0;
        /* A reference of our own: the caller's code may drop the list's. */
        *item = kw_item(seq, *pos);
        if (*item == NULL) return 0; /* shrunk meanwhile: the iterator stops */
        (*pos)++;
        return 1;
    }
    kv_gc_let(&cx->gc); /* the iterator is the caller's code */
    PyObject *x = Py_TYPE(it)->tp_iternext(it);
    if (x != NULL) {
        *item = x;
        return 1;
    }
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_StopIteration)) return -1;
        PyErr_Clear();
    }
    return 0;
}

/* iter(seq), or NULL for an exact list or tuple (indexed by kw_next, which is
 * what their iterators do).  0, or -1 with the exception set. */
static inline int kw_iter(PyObject *seq, PyObject **it)
{
    *it = NULL;
    if (PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) return 0;
    *it = PyObject_GetIter(seq);
    return *it == NULL ? -1 : 0;
}

/* Whether path k names the same owner as path k - 1: the same names (interned:
 * compared by identity) up to its last. */
static int kw_same_owner(const kv_known *steps, const Py_ssize_t *ends, Py_ssize_t k)
{
    Py_ssize_t start = k > 1 ? ends[k - 2] : 0, mid = ends[k - 1];
    Py_ssize_t n_prev = mid - start, n = ends[k] - mid;
    if (n != n_prev || n < 2) return 0;
    for (Py_ssize_t i = 0; i + 1 < n; i++)
        if (steps[start + i].name != steps[mid + i].name) return 0;
    return 1;
}

/* Pure mode, before anything is written: the position of the first request
 * of reqs (an exact list or tuple) whose paths kw_check_path refuses, or -1
 * when every one passes. */
static Py_ssize_t kw_check_add(kv_ctx *cx, PyObject *reqs, kv_known *steps,
                               const Py_ssize_t *ends, Py_ssize_t npaths)
{
    int is_list = PyList_CheckExact(reqs);
    Py_ssize_t size = is_list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs);
    for (Py_ssize_t pos = 0; pos < size; pos++) {
        PyObject *req = kw_item(reqs, pos);
        Py_ssize_t start = 0;
        if (req == NULL) return pos;
        for (Py_ssize_t k = 0; k < npaths; k++) {
            if (!kw_check_path(cx, steps + start, ends[k] - start, req)) {
                kv_release(&cx->gc, req);
                return pos;
            }
            start = ends[k];
        }
        kv_release(&cx->gc, req);
    }
    (void)is_list;
    return -1;
}

/* for req in reqs: for each path: req.<path> += delta.
 * steps holds the paths' steps one after another; path k ends at ends[k]. */
static int kw_add_all(kv_ctx *cx, PyObject *reqs, kv_known *steps, const Py_ssize_t *ends,
                      Py_ssize_t npaths, PyObject *delta, unsigned char *reuse)
{
    kw_delta dl;
    PyObject *it, *req, *owner = NULL;
    Py_ssize_t pos = 0;
    int got, rc = 0, pure = 0;
    kw_delta_init(&dl, delta);
    for (Py_ssize_t k = 0; k < npaths; k++)
        reuse[k] = k > 0 && kw_same_owner(steps, ends, k);
    if (kw_iter(reqs, &it) < 0) return -1;
    while ((got = kw_next(cx, reqs, it, &pos, &req)) > 0) {
        Py_ssize_t start = 0;
        /* The owner a quick path wrote through (borrowed): the next path takes
         * it where its names are the same up to there (reuse), as nothing ran
         * since it was read. */
        PyObject *quick = NULL;
        for (Py_ssize_t k = 0; k < npaths && rc == 0; k++) {
            if (!reuse[k]) quick = NULL;
            if (kw_add_path_quick(cx, steps + start, ends[k] - start, req, &dl, &quick)) {
                KV_CLEAR(&cx->gc, owner); /* a later slow path reads its owner afresh */
            } else {
                quick = NULL;
                rc = kw_add_path(cx, steps + start, ends[k] - start, req, &dl, &owner,
                                 reuse[k], &pure);
            }
            start = ends[k];
        }
        KV_CLEAR(&cx->gc, owner);
        kv_release(&cx->gc, req);
        if (rc < 0) break;
    }
    kv_gc_let(&cx->gc);
    kv_release(&cx->gc, it);
    return (rc < 0 || got < 0) ? -1 : 0;
}

/* Pure mode, before anything is written: the position of the first pair of
 * reqs and values (exact lists or tuples, values exact ints in int64) whose
 * path kw_check_path refuses, or -1. */
static Py_ssize_t kw_check_max(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps,
                               Py_ssize_t n)
{
    int is_list = PyList_CheckExact(reqs);
    Py_ssize_t size = is_list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs);
    Py_ssize_t nv = PyList_CheckExact(values) ? PyList_GET_SIZE(values)
                                              : PyTuple_GET_SIZE(values);
    for (Py_ssize_t pos = 0; pos < size && pos < nv; pos++) {
        PyObject *req = kw_item(reqs, pos);
        int ok = req != NULL && kw_check_path(cx, steps, n, req);
        kv_release(&cx->gc, req);
        if (!ok) return pos;
    }
    return -1;
}

/* Whether seq (an exact list or tuple) holds one-digit exact ints alone. */
static int kw_small_ints(PyObject *seq)
{
    long long x;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
        if (!PyLong_CheckExact(PySequence_Fast_ITEMS(seq)[i])
            || !kv_small_int(PySequence_Fast_ITEMS(seq)[i], &x)) return 0;
    return 1;
}

/* Pure mode's usual case in one pass: every pair of reqs and values (exact
 * lists or tuples of one size) done by kw_max_path_quick, which runs no code,
 * the ints replaced kept till the end.  1 when every pair was; else 0 with each
 * store taken back, last first: each slot holds the very int it held. */
static int kw_max_all_quick(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps,
                            Py_ssize_t n)
{
    enum { KEPT_SMALL = 64 };
    kw_kept small[KEPT_SMALL], *kept = small;
    PyObject *const *r = PySequence_Fast_ITEMS(reqs), *const *v = PySequence_Fast_ITEMS(values);
    Py_ssize_t size = PySequence_Fast_GET_SIZE(reqs), done = 0, k = 0;
#if !KV_SHORTCUTS
    return 0; /* another thread may change the lists: items by reference only */
#endif
    if (size != PySequence_Fast_GET_SIZE(values)) return 0;
    if (size > KEPT_SMALL && (kept = PyMem_Malloc(size * sizeof(kw_kept))) == NULL) return 0;
    for (; done < size; done++) {
        kept[k].slot = NULL;
        if (!kw_max_path_quick(cx, steps, n, r[done], v[done], &kept[k])) break;
        k += kept[k].slot != NULL;
    }
    for (Py_ssize_t i = k - 1; i >= 0; i--) { /* (exact ints: their release runs nothing) */
        PyObject *drop = done < size ? *kept[i].slot : kept[i].old;
        if (done < size) *kept[i].slot = kept[i].old;
        Py_DECREF(drop);
    }
    if (kept != small) PyMem_Free(kept);
    return done == size;
}

/* for req, v in zip(reqs, values, strict=strict): req.<path> = max(req.<path>, v)
 * with zip's own order of calls and its own errors. */
static int kw_max_all(kv_ctx *cx, PyObject *reqs, PyObject *values, kv_known *steps,
                      Py_ssize_t n, int strict)
{
    PyObject *it_reqs, *it_values, *req, *v;
    Py_ssize_t pos_reqs = 0, pos_values = 0;
    int got, rc = 0;
    if (kw_iter(reqs, &it_reqs) < 0) return -1;
    if (kw_iter(values, &it_values) < 0) {
        kv_release(&cx->gc, it_reqs);
        return -1;
    }
    for (;;) {
        /* The usual pairs first, while both are exact lists or tuples: each
         * statement done by the quick path on borrowed items (it runs no
         * code, so nothing can drop them), as zip takes them. */
        if (it_reqs == NULL && it_values == NULL) {
            int reqs_list = PyList_CheckExact(reqs), values_list = PyList_CheckExact(values);
            while (pos_reqs < (reqs_list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs))
                   && pos_values < (values_list ? PyList_GET_SIZE(values)
                                                : PyTuple_GET_SIZE(values))) {
#if !KV_SHORTCUTS
                break; /* another thread may change the lists: items by reference only */
#endif
                req = reqs_list ? PyList_GET_ITEM(reqs, pos_reqs)
                                : PyTuple_GET_ITEM(reqs, pos_reqs);
                v = values_list ? PyList_GET_ITEM(values, pos_values)
                                : PyTuple_GET_ITEM(values, pos_values);
                if (!kw_max_path_quick(cx, steps, n, req, v, NULL)) break;
                pos_reqs++;
                pos_values++;
            }
        }
        got = kw_next(cx, reqs, it_reqs, &pos_reqs, &req);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0) {
            if (!strict) break;
            got = kw_next(cx, values, it_values, &pos_values, &v);
            if (got > 0) {
                kv_release(&cx->gc, v);
                PyErr_SetString(PyExc_ValueError,
                                "zip() argument 2 is longer than argument 1");
            }
            rc = got == 0 ? 0 : -1;
            break;
        }
        got = kw_next(cx, values, it_values, &pos_values, &v);
        if (got <= 0) {
            kv_release(&cx->gc, req);
            if (got == 0 && strict)
                PyErr_SetString(PyExc_ValueError,
                                "zip() argument 2 is shorter than argument 1");
            rc = (got < 0 || strict) ? -1 : 0;
            break;
        }
        if (!kw_max_path_quick(cx, steps, n, req, v, NULL))
            rc = kw_max_path(cx, steps, n, req, v);
        kv_release(&cx->gc, req);
        kv_release(&cx->gc, v);
        if (rc < 0) break;
    }
    kv_gc_let(&cx->gc);
    kv_release(&cx->gc, it_reqs);
    kv_release(&cx->gc, it_values);
    return rc;
}

#endif
