/*
 * Writing to request objects exactly as a Python statement does, with the
 * fewest lookups:
 *
 *     obj.<name> += delta                    (kw_add_path)
 *     obj.<name> = max(obj.<name>, value)    (kw_max_path; obj re-read for the store)
 *
 * where obj is req.<path[0]>...<path[-2]>, read afresh for each statement.
 *
 * Every attribute read is getattr(obj, name) and every write setattr(obj,
 * name, value): each one goes the route CPython's generic getattr/setattr
 * would take, and takes a shortcut only when that route is proven:
 *
 *   KW_DICT    the type's getattro (for reads) or setattro (for writes) is the
 *              generic one and no class in the MRO defines the name: the
 *              value lives in the instance __dict__, so a dict probe or
 *              PyDict_SetItem is exactly what the generic code does;
 *   KW_MEMBER  the MRO defines the name as a member descriptor of an object
 *              slot (a __slots__ entry, a slots=True dataclass field): the
 *              value sits at the descriptor's offset, read or replaced there
 *              exactly as the descriptor's __get__/__set__ do;
 *   KW_GENERIC anything else (a property or any other descriptor, a custom
 *              __getattr__/__getattribute__/__setattr__, a read-only member,
 *              a str subclass as the name): PyObject_GetAttr/PyObject_SetAttr.
 *
 * A miss on a shortcut (no instance dict, the name not in it, an unset slot)
 * falls back to the generic call, which then raises what Python raises.  The
 * route is worked out once per path step and type, and trusted only while the
 * type's version tag is the one it was worked out under (CPython changes the
 * tag whenever the type or a base changes); it is checked right before every
 * read and every write, so Python code run in between (an __add__, a
 * property) can never leave a stale route in use.  Without a GIL a slot or
 * dict written behind the interpreter's back would race: there every access
 * is generic.
 *
 * Only public CPython structures are read (PyTypeObject, PyMemberDescrObject,
 * PyMemberDef) plus two long-exported lookups (_PyType_Lookup, which the
 * generic getattr itself uses, and _PyObject_GetDictPtr), as in reqattr.h.
 */
#ifndef KVEST_REQWRITE_H
#define KVEST_REQWRITE_H

#include <Python.h>
#include <limits.h>
#include <string.h>
#include <structmember.h>

#include "typetag.h"

#ifdef Py_RELATIVE_OFFSET
#define KW_MEMBER_UNUSABLE Py_RELATIVE_OFFSET
#else
#define KW_MEMBER_UNUSABLE 0
#endif

enum { KW_GENERIC = 0, KW_DICT = 1, KW_MEMBER = 2 };

/* One attribute name of one path, with the route last worked out for it. */
typedef struct {
    PyObject *name;     /* borrowed: the caller's normalised paths hold it */
    PyTypeObject *type; /* borrowed, compared only; NULL: nothing worked out */
    unsigned int version;
    unsigned char get, set; /* KW_* */
    unsigned char none_if_unset; /* T_OBJECT: an unset slot reads as None */
    Py_ssize_t offset;  /* KW_MEMBER */
    /* KW_DICT: where the name sat in the last instance dict that had it (a
     * PyDict_Next position), or -1.  Only a guess: a probe there counts only
     * if the key found is the name itself. */
    Py_ssize_t hint;
} kw_step;

/* Instances of one class build their __dict__ in the same order, so a name
 * sits at the same position in each: hints outlive a call here, keyed by
 * type, version tag and name (compared, never dereferenced).  A stale one
 * costs a search, never a wrong value.  (Without a GIL every access is
 * generic, and this table is never used.) */
#define KW_HINT_SLOTS 16
typedef struct {
    PyTypeObject *type;
    unsigned int version;
    PyObject *name;
    Py_ssize_t hint;
} kw_hint_entry;
static kw_hint_entry kw_hints[KW_HINT_SLOTS];
static int kw_hints_next;
/* Dict scans one call may still make to find a hint (each reads the whole dict). */
static int kw_learn_budget;

/* Whether a str is interned (the paths' names are, so that dict probes find
 * keys by identity and writes keep the keys the generic setattr would). */
static inline int kw_interned(PyObject *s)
{
    return PyUnicode_CHECK_INTERNED(s) != 0;
}

static inline void kw_step_init(kw_step *s, PyObject *name)
{
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->hint = -1;
}

static void kw_resolve(kw_step *s, PyTypeObject *t)
{
    s->type = NULL;
    s->get = s->set = KW_GENERIC;
    s->none_if_unset = 0;
    s->offset = 0;
    s->hint = -1;
#ifndef Py_GIL_DISABLED
    /* A str subclass may hash and compare its own way: only the generic
     * lookups know what it means. */
    if (!PyUnicode_CheckExact(s->name)) return;
    int get_generic = t->tp_getattro == PyObject_GenericGetAttr;
    int set_generic = t->tp_setattro == PyObject_GenericSetAttr;
    if (get_generic || set_generic) {
        PyObject *descr = _PyType_Lookup(t, s->name); /* borrowed; sets no error */
        if (descr == NULL) {
            if (get_generic) s->get = KW_DICT;
            if (set_generic) s->set = KW_DICT;
        } else if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDescrObject *md = (PyMemberDescrObject *)descr;
            PyMemberDef *m = md->d_member;
            /* The subtype check: a descriptor copied from an unrelated class
             * makes the generic code raise TypeError. */
            if ((m->type == T_OBJECT_EX || m->type == T_OBJECT)
                && !(m->flags & KW_MEMBER_UNUSABLE)
                && PyType_IsSubtype(t, md->d_common.d_type)) {
                s->offset = m->offset;
                s->none_if_unset = m->type == T_OBJECT;
                if (get_generic && !(m->flags & PY_AUDIT_READ)) s->get = KW_MEMBER;
                if (set_generic && !(m->flags & READONLY)) s->set = KW_MEMBER;
            }
        }
    }
    /* The lookup assigns a version tag if the type can have one; without one
     * the route is worked out again before each use. */
    if (kv_tag_valid(t)) {
        s->type = t;
        s->version = t->tp_version_tag;
        for (int i = 0; i < KW_HINT_SLOTS; i++)
            if (kw_hints[i].type == t && kw_hints[i].version == s->version
                && kw_hints[i].name == s->name)
                s->hint = kw_hints[i].hint;
    }
#endif
}

/* Records where s->name sits in dict (which holds it) as s's hint. */
static void kw_learn(kw_step *s, PyObject *dict)
{
#ifndef Py_GIL_DISABLED
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    kw_learn_budget--;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (key != s->name) continue;
        s->hint = pos - 1;
        if (s->type == NULL) return;
        kw_hint_entry *e = NULL;
        for (int i = 0; i < KW_HINT_SLOTS; i++)
            if (kw_hints[i].type == s->type && kw_hints[i].version == s->version
                && kw_hints[i].name == s->name)
                e = &kw_hints[i];
        if (e == NULL) {
            e = &kw_hints[kw_hints_next];
            kw_hints_next = (kw_hints_next + 1) % KW_HINT_SLOTS;
        }
        e->type = s->type;
        e->version = s->version;
        e->name = s->name;
        e->hint = s->hint;
        return;
    }
#else
    (void)s;
    (void)dict;
#endif
}

static inline void kw_route(kw_step *s, PyTypeObject *t)
{
    if (!(s->type == t && kv_tag_valid(t) && t->tp_version_tag == s->version))
        kw_resolve(s, t);
}

/* dict's value for s->name when it sits at s's hint (borrowed), else NULL.
 * Keys are unique: the name found at the hint is the dict's entry for it.
 * PyDict_Next reads without running any code. */
static inline PyObject *kw_at_hint(const kw_step *s, PyObject *dict)
{
    PyObject *key, *v;
    Py_ssize_t pos = s->hint;
    if (pos >= 0 && PyDict_Next(dict, &pos, &key, &v) && key == s->name) return v;
    return NULL;
}

/* getattr(obj, s->name): a new reference, or NULL with the exception set.
 * *pure is cleared unless the read ran no Python code at all (a slot, or
 * the dict entry found at the hint), so that reading it again would give the
 * same object. */
static inline PyObject *kw_get(kw_step *s, PyObject *obj, int *pure)
{
    kw_route(s, Py_TYPE(obj));
    if (s->get == KW_MEMBER) {
        PyObject *v = *(PyObject **)((char *)obj + s->offset);
        if (v != NULL) return Py_NewRef(v);
        if (s->none_if_unset) return Py_NewRef(Py_None);
    } else if (s->get == KW_DICT) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *dict = *dictptr, *v = kw_at_hint(s, dict);
            if (v != NULL) return Py_NewRef(v);
            *pure = 0;
            /* The probe can run a colliding key's __eq__: hold the dict. */
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, s->name); /* borrowed */
            Py_XINCREF(v);
            if (v != NULL && kw_learn_budget > 0) kw_learn(s, dict);
            Py_DECREF(dict);
            if (v != NULL || PyErr_Occurred()) return v;
        }
    }
    *pure = 0;
    return PyObject_GetAttr(obj, s->name);
}

/* setattr(obj, s->name, value): 0, or -1 with the exception set.  *pure is
 * cleared unless the write ran no Python code (a slot whose old value was
 * NULL or an exact int, whose release runs nothing). */
static inline int kw_set(kw_step *s, PyObject *obj, PyObject *value, int *pure)
{
    kw_route(s, Py_TYPE(obj));
    if (s->set == KW_MEMBER) {
        /* What the member descriptor's __set__ does (PyMember_SetOne). */
        PyObject **slot = (PyObject **)((char *)obj + s->offset);
        PyObject *old = *slot;
        if (old != NULL && !PyLong_CheckExact(old)) *pure = 0;
        *slot = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    *pure = 0;
    if (s->set == KW_DICT) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL && *dictptr != NULL) {
            PyObject *dict = Py_NewRef(*dictptr);
            int rc = PyDict_SetItem(dict, s->name, value);
            Py_DECREF(dict);
            return rc;
        }
    }
    return PyObject_SetAttr(obj, s->name, value);
}

/* req.<steps[0]>...<steps[n-2]>: the object holding the path's last name (a
 * new reference), or NULL with the exception set. */
static inline PyObject *kw_owner(kw_step *steps, Py_ssize_t n, PyObject *req, int *pure)
{
    PyObject *obj = Py_NewRef(req);
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        PyObject *next = kw_get(&steps[i], obj, pure);
        Py_DECREF(obj);
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

/* operator.iadd(v, delta), as `x.a += delta` computes it; *pure cleared
 * when Python's operator ran (which may run any code).  The sum is always a
 * new int (or a shared small one), made while v is still held, as CPython's
 * own `+=` makes it: no int object is ever changed. */
static inline PyObject *kw_iadd(PyObject *v, const kw_delta *dl, int *pure)
{
    if (dl->fast && PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        long long d = dl->d;
        if (!overflow && !(d > 0 && x > LLONG_MAX - d) && !(d < 0 && x < LLONG_MIN - d))
            return PyLong_FromLongLong(x + d);
    }
    *pure = 0;
    return PyNumber_InPlaceAdd(v, dl->delta);
}

/* `req.<path> += delta` for one path of n steps: 0, or -1 with the exception
 * set.  *owner is the object holding the last name: taken as given when
 * reuse is set (the previous path had the same names up to there, and no
 * Python code has run since it was read, so reading them again would give
 * it), read afresh otherwise.  On return *owner holds it (a new reference,
 * or NULL) and *pure says whether no Python code has run since it was read. */
static inline int kw_add_path(kw_step *steps, Py_ssize_t n, PyObject *req, const kw_delta *dl,
                              PyObject **owner, int reuse, int *pure)
{
    if (!(reuse && *owner != NULL && *pure)) {
        Py_CLEAR(*owner);
        *pure = 1;
        *owner = kw_owner(steps, n, req, pure);
        if (*owner == NULL) return -1;
    }
    PyObject *obj = *owner;
    PyObject *v = kw_get(&steps[n - 1], obj, pure);
    if (v == NULL) return -1;
    PyObject *sum = kw_iadd(v, dl, pure);
    Py_DECREF(v);
    if (sum == NULL) return -1;
    int rc = kw_set(&steps[n - 1], obj, sum, pure);
    Py_DECREF(sum);
    return rc;
}

/* builtins.max(cur, v) (a new reference): v if v > cur is true, else cur. */
static inline PyObject *kw_max(PyObject *cur, PyObject *v, int *pure)
{
    if (PyLong_CheckExact(cur) && PyLong_CheckExact(v)) {
        int o1 = 0, o2 = 0;
        long long a = PyLong_AsLongLongAndOverflow(cur, &o1);
        long long b = PyLong_AsLongLongAndOverflow(v, &o2);
        if (!o1 && !o2) return Py_NewRef(b > a ? v : cur);
    }
    *pure = 0;
    int gt = PyObject_RichCompareBool(v, cur, Py_GT);
    if (gt < 0) return NULL;
    return Py_NewRef(gt ? v : cur);
}

/* `req.<path> = max(req.<path>, v)`: the right side first, then req's path
 * to the owner read again for the store -- unless no Python code ran since
 * it was read, when reading it again would give the same object.  0, or -1
 * with the exception set. */
static inline int kw_max_path(kw_step *steps, Py_ssize_t n, PyObject *req, PyObject *v)
{
    int pure = 1;
    PyObject *obj = kw_owner(steps, n, req, &pure);
    if (obj == NULL) return -1;
    PyObject *cur = kw_get(&steps[n - 1], obj, &pure);
    if (cur == NULL) {
        Py_DECREF(obj);
        return -1;
    }
    PyObject *m = kw_max(cur, v, &pure);
    Py_DECREF(cur); /* an exact int when pure: its release runs nothing */
    if (m == NULL) {
        Py_DECREF(obj);
        return -1;
    }
    if (!pure) {
        Py_DECREF(obj);
        obj = kw_owner(steps, n, req, &pure);
        if (obj == NULL) {
            Py_DECREF(m);
            return -1;
        }
    }
    int rc = kw_set(&steps[n - 1], obj, m, &pure);
    Py_DECREF(m);
    Py_DECREF(obj);
    return rc;
}

/* The next item of a loop over seq, as a for loop (or zip) takes it: an exact
 * list or tuple is indexed, its size read every time as its iterator does;
 * anything else goes through `it`, its iterator.  1 with a new reference in
 * *item, 0 when exhausted, -1 with the exception set. */
static inline int kw_next(PyObject *seq, PyObject *it, Py_ssize_t *pos, PyObject **item)
{
    if (it == NULL) {
        int is_list = PyList_CheckExact(seq);
        Py_ssize_t size = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
        if (*pos >= size) return 0;
        /* A reference of our own: the caller's code may drop the list's. */
        *item = Py_NewRef(is_list ? PyList_GET_ITEM(seq, *pos) : PyTuple_GET_ITEM(seq, *pos));
        (*pos)++;
        return 1;
    }
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

/* for req in reqs: for each path: req.<path> += delta.
 * steps holds the paths' steps one after another; path k ends at ends[k]. */
/* Whether path k names the same owner as path k - 1: the same names (interned:
 * compared by identity) up to its last. */
static int kw_same_owner(const kw_step *steps, const Py_ssize_t *ends, Py_ssize_t k)
{
    Py_ssize_t start = k > 1 ? ends[k - 2] : 0, mid = ends[k - 1];
    Py_ssize_t n_prev = mid - start, n = ends[k] - mid;
    if (n != n_prev || n < 2) return 0;
    for (Py_ssize_t i = 0; i + 1 < n; i++)
        if (steps[start + i].name != steps[mid + i].name) return 0;
    return 1;
}

static int kw_add_all(PyObject *reqs, kw_step *steps, const Py_ssize_t *ends,
                      Py_ssize_t npaths, PyObject *delta, unsigned char *reuse)
{
    kw_delta dl;
    PyObject *it, *req, *owner = NULL;
    Py_ssize_t pos = 0;
    int got, rc = 0, pure = 0;
    kw_delta_init(&dl, delta);
#ifndef Py_GIL_DISABLED
    kw_learn_budget = 4;
#endif
    for (Py_ssize_t k = 0; k < npaths; k++)
        reuse[k] = k > 0 && kw_same_owner(steps, ends, k);
    if (kw_iter(reqs, &it) < 0) return -1;
    while ((got = kw_next(reqs, it, &pos, &req)) > 0) {
        Py_ssize_t start = 0;
        for (Py_ssize_t k = 0; k < npaths && rc == 0; k++) {
            rc = kw_add_path(steps + start, ends[k] - start, req, &dl, &owner, reuse[k], &pure);
            start = ends[k];
        }
        Py_CLEAR(owner);
        Py_DECREF(req);
        if (rc < 0) break;
    }
    Py_XDECREF(it);
    return (rc < 0 || got < 0) ? -1 : 0;
}

/* for req, v in zip(reqs, values, strict=strict): req.<path> = max(req.<path>, v)
 * with zip's own order of calls and its own errors. */
static int kw_max_all(PyObject *reqs, PyObject *values, kw_step *steps, Py_ssize_t n,
                      int strict)
{
    PyObject *it_reqs, *it_values, *req, *v;
    Py_ssize_t pos_reqs = 0, pos_values = 0;
    int got, rc = 0;
#ifndef Py_GIL_DISABLED
    kw_learn_budget = 4;
#endif
    if (kw_iter(reqs, &it_reqs) < 0) return -1;
    if (kw_iter(values, &it_values) < 0) {
        Py_XDECREF(it_reqs);
        return -1;
    }
    for (;;) {
        got = kw_next(reqs, it_reqs, &pos_reqs, &req);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0) {
            if (!strict) break;
            got = kw_next(values, it_values, &pos_values, &v);
            if (got > 0) {
                Py_DECREF(v);
                PyErr_SetString(PyExc_ValueError,
                                "zip() argument 2 is longer than argument 1");
            }
            rc = got == 0 ? 0 : -1;
            break;
        }
        got = kw_next(values, it_values, &pos_values, &v);
        if (got <= 0) {
            Py_DECREF(req);
            if (got == 0 && strict)
                PyErr_SetString(PyExc_ValueError,
                                "zip() argument 2 is shorter than argument 1");
            rc = (got < 0 || strict) ? -1 : 0;
            break;
        }
        rc = kw_max_path(steps, n, req, v);
        Py_DECREF(req);
        Py_DECREF(v);
        if (rc < 0) break;
    }
    Py_XDECREF(it_reqs);
    Py_XDECREF(it_values);
    return rc;
}

#endif
