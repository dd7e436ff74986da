/*
 * Reading kv_committed_len / kv_allocated_len from request objects with the
 * fewest lookups, exactly as the reference rule reads them:
 *
 *     try:    value = getattr(req, attr)
 *     except AttributeError:
 *         try:    value = getattr(req.kv, attr)
 *         except AttributeError: raise AttributeError("reqs[i] has neither ...")
 *
 * How an attribute name is looked up depends on the instance's type, so it is
 * worked out once per type (a kv_layout) and trusted for as long as the type's
 * version tag holds (CPython clears the tag whenever the type or a base
 * changes).  For each name the layout says how to read it:
 *
 *   KV_READ_DICT    the type's getattro is the generic one and its MRO defines
 *                   nothing under the name: generic getattr would look in the
 *                   instance __dict__ only, so the value is a dict probe;
 *   KV_READ_MEMBER  the MRO defines the name as a member descriptor of an
 *                   object slot (a __slots__ entry, e.g. a slots=True
 *                   dataclass field): the value sits at the descriptor's
 *                   offset in the instance (an unset slot reads as missing,
 *                   or as None for T_OBJECT, as the descriptor itself does);
 *   KV_READ_GENERIC anything else (a property or other descriptor, a custom
 *                   __getattr__/__getattribute__): PyObject_GetAttr.
 *
 * Only public CPython structures are read (PyTypeObject, PyMemberDescrObject,
 * PyMemberDef) plus two long-exported lookups (_PyType_Lookup, which the
 * interpreter's own attribute cache is built on, and _PyObject_GetDictPtr);
 * they exist with the same meaning on 3.10 to 3.13.  On 3.11+ the dict probe
 * makes an instance's lazily built __dict__ real, as reading req.__dict__
 * would; requests with many attributes (SGLang's) already have one.
 */
#ifndef KVEST_REQATTR_H
#define KVEST_REQATTR_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#ifdef Py_RELATIVE_OFFSET
#define KV_MEMBER_UNUSABLE (PY_AUDIT_READ | Py_RELATIVE_OFFSET)
#else
#define KV_MEMBER_UNUSABLE PY_AUDIT_READ
#endif

enum { KV_READ_DICT = 0, KV_READ_MEMBER = 1, KV_READ_GENERIC = 2 };
/* The three names read: indices into kv_cache.names and kv_layout.read. */
enum { KV_COMMITTED = 0, KV_ALLOCATED = 1, KV_NESTED = 2, KV_NUM_NAMES = 3 };

typedef struct {
    int how;
    int none_if_unset; /* T_OBJECT: an unset slot reads as None */
    Py_ssize_t offset;
} kv_reader;

typedef struct {
    PyTypeObject *type; /* borrowed: trusted only while the version tag matches */
    unsigned int version;
    kv_reader read[KV_NUM_NAMES];
} kv_layout;

/* Request types and the types under req.kv: a batch rarely mixes more. */
#define KV_CACHE_SLOTS 4

typedef struct {
    PyObject *names[KV_NUM_NAMES]; /* borrowed interned strings */
    kv_layout slots[KV_CACHE_SLOTS];
    int next; /* the slot the next new type takes */
} kv_cache;

static inline void kv_cache_init(kv_cache *c, PyObject *committed, PyObject *allocated,
                                 PyObject *nested)
{
    memset(c, 0, sizeof(*c));
    c->names[KV_COMMITTED] = committed;
    c->names[KV_ALLOCATED] = allocated;
    c->names[KV_NESTED] = nested;
}

static void kv_reader_init(kv_reader *r, PyTypeObject *t, PyObject *name)
{
    r->how = KV_READ_GENERIC;
    r->none_if_unset = 0;
    r->offset = 0;
    if (t->tp_getattro != PyObject_GenericGetAttr)
        return;
    PyObject *descr = _PyType_Lookup(t, name); /* borrowed; never sets an error */
    if (descr == NULL) {
        r->how = KV_READ_DICT;
        return;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDescrObject *md = (PyMemberDescrObject *)descr;
        PyMemberDef *m = md->d_member;
        /* The subtype check guards against a descriptor copied from an
         * unrelated class, which generic getattr would refuse (TypeError). */
        if ((m->type == T_OBJECT_EX || m->type == T_OBJECT)
            && !(m->flags & KV_MEMBER_UNUSABLE)
            && PyType_IsSubtype(t, md->d_common.d_type)) {
            r->how = KV_READ_MEMBER;
            r->none_if_unset = m->type == T_OBJECT;
            r->offset = m->offset;
        }
    }
}

static inline int kv_layout_current(const kv_layout *l, PyTypeObject *t)
{
    return l->type == t && (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)
           && t->tp_version_tag == l->version;
}

static const kv_layout *kv_layout_resolve(kv_cache *c, PyTypeObject *t)
{
    kv_layout *l = NULL;
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (c->slots[i].type == t) l = &c->slots[i]; /* a stale entry: redo it */
    if (l == NULL) {
        l = &c->slots[c->next];
        c->next = (c->next + 1) % KV_CACHE_SLOTS;
    }
    for (int k = 0; k < KV_NUM_NAMES; k++)
        kv_reader_init(&l->read[k], t, c->names[k]);
    l->type = t;
    /* The lookups assign a version tag if the type can have one; without one
     * the entry is never current and the type is resolved again each time. */
    l->version = (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? t->tp_version_tag : 0;
    if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) l->type = NULL;
    return l;
}

static inline const kv_layout *kv_layout_for(kv_cache *c, PyTypeObject *t)
{
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (kv_layout_current(&c->slots[i], t)) return &c->slots[i];
    return kv_layout_resolve(c, t);
}

/* obj.<name> as generic getattr gives it.  Returns 1 with a new reference in
 * *value, 0 when the attribute is missing (getattr would raise
 * AttributeError; nothing is set), -1 with an exception set. */
static inline int kv_read(PyObject *obj, PyObject *name, const kv_reader *r, PyObject **value)
{
    PyObject *v;
    if (r->how == KV_READ_MEMBER) {
        v = *(PyObject **)((char *)obj + r->offset);
        if (v == NULL) {
            if (!r->none_if_unset) return 0;
            v = Py_None;
        }
        Py_INCREF(v);
        *value = v;
        return 1;
    }
    if (r->how == KV_READ_DICT) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL) {
            PyObject *dict = *dictptr;
            if (dict == NULL) return 0;
            /* The probe can run a colliding key's __eq__: hold the dict. */
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, name);
            Py_XINCREF(v);
            Py_DECREF(dict);
            if (v == NULL) return PyErr_Occurred() ? -1 : 0;
            *value = v;
            return 1;
        }
        /* No instance dict to read: the generic lookup says what is missing. */
    }
    v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return 1;
}

static inline int kv_read_name(kv_cache *c, PyObject *obj, int which, PyObject **value,
                               int *pure)
{
    const kv_reader *r = &kv_layout_for(c, Py_TYPE(obj))->read[which];
    if (pure) *pure = r->how != KV_READ_GENERIC;
    return kv_read(obj, c->names[which], r, value);
}

/* Outcome of reading one length of one request. */
enum { KV_LEN_ERROR = -1, KV_LEN_MISSING = 0, KV_LEN_OK = 1, KV_LEN_VALUE = 2 };

/* req.<which>, flat or under req.kv, as the reference rule reads it.
 * KV_LEN_OK: *length holds it (an exact int in [0, 2^63)).  KV_LEN_VALUE: *value
 * holds a new reference to a value the Python input rule must judge (not an
 * exact int, or negative, or too large).  KV_LEN_MISSING: neither exists.
 * *kv carries req.kv from one read of a request to the next (a new reference
 * or NULL): it is kept only while no Python code has run (no generic lookup),
 * so that reading req.kv again would give the same object; the caller clears
 * it before running Python code of its own and after the request. */
static inline int kv_req_length(kv_cache *c, PyObject *req, int which, PyObject **kv,
                                int64_t *length, PyObject **value)
{
    PyObject *v, *nested, *owned = NULL;
    int pure, found = kv_read_name(c, req, which, &v, &pure);
    if (!pure) Py_CLEAR(*kv);
    if (found < 0) return KV_LEN_ERROR;
    if (!found) {
        nested = *kv;
        if (nested == NULL) {
            found = kv_read_name(c, req, KV_NESTED, &owned, &pure);
            if (found < 0) return KV_LEN_ERROR;
            if (!found) return KV_LEN_MISSING;
            nested = owned;
            if (pure) { *kv = owned; owned = NULL; } /* *kv takes the reference */
        }
        found = kv_read_name(c, nested, which, &v, &pure);
        Py_XDECREF(owned);
        if (!pure) Py_CLEAR(*kv);
        if (found < 0) return KV_LEN_ERROR;
        if (!found) return KV_LEN_MISSING;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow == 0 && x >= 0) {
            Py_DECREF(v);
            *length = (int64_t)x;
            return KV_LEN_OK;
        }
    }
    *value = v;
    return KV_LEN_VALUE;
}

#endif
