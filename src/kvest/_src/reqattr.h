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

#include "typetag.h"

#ifdef Py_RELATIVE_OFFSET
#define KV_MEMBER_UNUSABLE (PY_AUDIT_READ | Py_RELATIVE_OFFSET)
#else
#define KV_MEMBER_UNUSABLE PY_AUDIT_READ
#endif

enum { KV_READ_DICT = 0, KV_READ_MEMBER = 1, KV_READ_GENERIC = 2 };
/* The names read: indices into kv_cache.names and kv_layout.read. */
enum { KV_COMMITTED = 0, KV_ALLOCATED = 1, KV_NESTED = 2, KV_BEAM = 3, KV_NUM_NAMES = 4 };

typedef struct {
    int how;
    int none_if_unset; /* T_OBJECT: an unset slot reads as None */
    Py_ssize_t offset;
    /* KV_READ_DICT: where the name sat in the last instance dict that had it
     * (a PyDict_Next position), or -1.  Only a guess: a probe there counts
     * only if the key found is the name itself, else the dict is searched. */
    Py_ssize_t hint;
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
    int next;  /* the slot the next new type takes */
    int learn; /* dict scans this call may still make to find a hint */
} kv_cache;

/* Instances of one class usually build their __dict__ in the same order, so a
 * name sits at the same position in each: hints outlive a call here, keyed by
 * type and version tag (compared, never dereferenced).  They are guesses
 * checked on use, so a stale one costs a search, never a wrong value.  Without
 * a GIL the table would be shared mutable state: hints then live per call. */
#ifndef Py_GIL_DISABLED
#define KV_HINT_SLOTS 8
typedef struct {
    PyTypeObject *type;
    unsigned int version;
    Py_ssize_t hint[KV_NUM_NAMES];
} kv_hint_entry;
static kv_hint_entry kv_hints[KV_HINT_SLOTS];
static int kv_hints_next;
#endif

static inline void kv_cache_init(kv_cache *c, PyObject *committed, PyObject *allocated,
                                 PyObject *nested, PyObject *beam)
{
    memset(c, 0, sizeof(*c));
    c->learn = 4;
    c->names[KV_COMMITTED] = committed;
    c->names[KV_ALLOCATED] = allocated;
    c->names[KV_NESTED] = nested;
    c->names[KV_BEAM] = beam;
}

static void kv_reader_init(kv_reader *r, PyTypeObject *t, PyObject *name)
{
    r->how = KV_READ_GENERIC;
    r->none_if_unset = 0;
    r->offset = 0;
    r->hint = -1;
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
    return l->type == t && kv_tag_valid(t) && t->tp_version_tag == l->version;
}

static kv_layout *kv_layout_resolve(kv_cache *c, PyTypeObject *t)
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
    l->version = kv_tag_valid(t) ? t->tp_version_tag : 0;
    if (!kv_tag_valid(t)) l->type = NULL;
#ifndef Py_GIL_DISABLED
    for (int i = 0; l->type && i < KV_HINT_SLOTS; i++)
        if (kv_hints[i].type == t && kv_hints[i].version == l->version)
            for (int k = 0; k < KV_NUM_NAMES; k++) l->read[k].hint = kv_hints[i].hint[k];
#endif
    return l;
}

/* Records where `name` sits in `dict` (which holds it) as l's hint. */
static void kv_learn_hint(kv_cache *c, kv_layout *l, int which, PyObject *dict)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    c->learn--;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (key == c->names[which]) {
            l->read[which].hint = pos - 1;
#ifndef Py_GIL_DISABLED
            if (l->type == NULL) return;
            kv_hint_entry *e = NULL;
            for (int i = 0; i < KV_HINT_SLOTS; i++)
                if (kv_hints[i].type == l->type && kv_hints[i].version == l->version)
                    e = &kv_hints[i];
            if (e == NULL) {
                e = &kv_hints[kv_hints_next];
                kv_hints_next = (kv_hints_next + 1) % KV_HINT_SLOTS;
                e->type = l->type;
                e->version = l->version;
                for (int k = 0; k < KV_NUM_NAMES; k++) e->hint[k] = -1;
            }
            e->hint[which] = pos - 1;
#endif
            return;
        }
    }
}

static inline kv_layout *kv_layout_for(kv_cache *c, PyTypeObject *t)
{
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (kv_layout_current(&c->slots[i], t)) return &c->slots[i];
    return kv_layout_resolve(c, t);
}

/* obj.<name> (name: c->names[which]) when reading it runs no Python code and
 * searches nothing: a slot, or the instance dict's entry at the learned hint.
 * Returns a borrowed reference, or NULL (nothing set) when the answer needs
 * more than that: an unset slot without a default, a dict without the name at
 * the hint, any other kind of lookup.  *dictslot as in kv_read. */
static inline PyObject *kv_read_pure(kv_cache *c, kv_layout *l, int which, PyObject *obj,
                                     PyObject ***dictslot)
{
    kv_reader *r = &l->read[which];
    if (r->how == KV_READ_MEMBER) {
        PyObject *v = *(PyObject **)((char *)obj + r->offset);
        return v != NULL ? v : (r->none_if_unset ? Py_None : NULL);
    }
    if (r->how == KV_READ_DICT && r->hint >= 0) {
        if (*dictslot == NULL) *dictslot = _PyObject_GetDictPtr(obj);
        if (*dictslot != NULL && **dictslot != NULL) {
            PyObject *key, *v;
            Py_ssize_t pos = r->hint;
            /* Keys are unique: the name found at the hint is the dict's entry
             * for it.  PyDict_Next reads without running any code. */
            if (PyDict_Next(**dictslot, &pos, &key, &v) && key == c->names[which]) return v;
        }
    }
    return NULL;
}

/* obj.<name> (name: c->names[which]) as generic getattr gives it, read the
 * way l (obj's type's layout) says.  Returns 1 with a new reference in
 * *value, 0 when the attribute is missing (getattr would raise
 * AttributeError; nothing is set), -1 with an exception set.  *dictslot
 * caches where obj keeps its instance dict (NULL: not looked up yet).
 * *ran is set to 1 when the read may have run Python code (a generic
 * lookup, or a dict search, which compares colliding keys with their own
 * __eq__): whatever was read before may have changed since. */
static inline int kv_read(kv_cache *c, kv_layout *l, int which, PyObject *obj,
                          PyObject **value, PyObject ***dictslot, int *ran)
{
    kv_reader *r = &l->read[which];
    PyObject *v = kv_read_pure(c, l, which, obj, dictslot), *name = c->names[which];
    if (v != NULL) {
        Py_INCREF(v);
        *value = v;
        return 1;
    }
    if (r->how == KV_READ_MEMBER) return 0; /* an unset slot */
    if (r->how == KV_READ_DICT) {
        if (*dictslot == NULL) *dictslot = _PyObject_GetDictPtr(obj);
        if (*dictslot != NULL) {
            PyObject *dict = **dictslot;
            if (dict == NULL) return 0;
            /* The probe can run a colliding key's __eq__: hold the dict. */
            *ran = 1;
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, name);
            Py_XINCREF(v);
            if (v != NULL && c->learn > 0) kv_learn_hint(c, l, which, dict);
            Py_DECREF(dict);
            if (v == NULL) return PyErr_Occurred() ? -1 : 0;
            *value = v;
            return 1;
        }
        /* No instance dict to read: the generic lookup says what is missing. */
    }
    *ran = 1;
    v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return 1;
}

/* obj.<c->names[which]> as kv_read gives it; *pure says whether reading it ran
 * no Python code (so that reading it again would give the same object). */
static inline int kv_get(kv_cache *c, PyObject *obj, int which, PyObject **value, int *pure)
{
    kv_layout *l = kv_layout_for(c, Py_TYPE(obj));
    PyObject **dictslot = NULL;
    int ran = 0;
    int found = kv_read(c, l, which, obj, value, &dictslot, &ran);
    *pure = !ran;
    return found;
}

/* obj.<c->names[which]> as kv_read_pure gives it (borrowed, or NULL). */
static inline PyObject *kv_get_pure(kv_cache *c, PyObject *obj, int which)
{
    PyObject **dictslot = NULL;
    return kv_read_pure(c, kv_layout_for(c, Py_TYPE(obj)), which, obj, &dictslot);
}

/* Where a request's lengths are looked for. */
enum {
    KV_AT_EITHER = 0, /* req.<name>, else req.kv.<name> (the reference rule) */
    KV_AT_FLAT = 1,   /* req.<name> only */
    KV_AT_NESTED = 2, /* req.kv.<name> only */
};

/* What the reads of one request share. */
typedef struct {
    PyObject *kv;        /* req.kv (a new reference) while it is known current, or NULL */
    PyObject **dictslot; /* where req keeps its instance dict, once looked up */
} kv_req_state;

static inline void kv_req_begin(kv_req_state *st)
{
    st->kv = NULL;
    st->dictslot = NULL;
}

/* After the request, or before the caller runs Python code of its own: a held
 * req.kv is no longer known to be what reading it again would give. */
static inline void kv_req_forget(kv_req_state *st)
{
    Py_CLEAR(st->kv);
}

/* Outcome of reading one length of one request. */
enum { KV_LEN_ERROR = -1, KV_LEN_MISSING = 0, KV_LEN_OK = 1, KV_LEN_VALUE = 2 };

/* Whether v is an exact int in [0, 2^63), with its value in *length. */
static inline int kv_exact_length(PyObject *v, int64_t *length)
{
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || x < 0) return 0;
    *length = (int64_t)x;
    return 1;
}

/* req.<which> read where `at` says.  KV_LEN_OK: *length holds it (an exact
 * int in [0, 2^63)).  KV_LEN_VALUE: *value holds a new reference to a value
 * the Python input rule must judge (not an exact int, or negative, or too
 * large).  KV_LEN_MISSING: not there.  req.kv is kept in st->kv between the
 * reads of one request only while no Python code can have run (no generic
 * lookup, no dict search that compares keys), so that reading it again would
 * give the same object. */
static inline int kv_req_length(kv_cache *c, PyObject *req, int which, int at,
                                kv_req_state *st, int64_t *length, PyObject **value)
{
    PyObject *v = NULL, *nested, *owned = NULL, **kvslot = NULL;
    kv_layout *l;
    int found = 0, ran = 0;
    if (at != KV_AT_NESTED) {
        l = kv_layout_for(c, Py_TYPE(req));
        found = kv_read(c, l, which, req, &v, &st->dictslot, &ran);
        if (ran) kv_req_forget(st);
        if (found < 0) return KV_LEN_ERROR;
        if (!found && at == KV_AT_FLAT) return KV_LEN_MISSING;
    }
    if (!found) {
        nested = st->kv;
        if (nested == NULL) {
            l = kv_layout_for(c, Py_TYPE(req));
            ran = 0;
            found = kv_read(c, l, KV_NESTED, req, &owned, &st->dictslot, &ran);
            if (found < 0) return KV_LEN_ERROR;
            if (!found) return KV_LEN_MISSING;
            nested = owned;
            if (!ran) { /* st takes the reference */
                st->kv = owned;
                owned = NULL;
            }
        }
        l = kv_layout_for(c, Py_TYPE(nested));
        ran = 0;
        found = kv_read(c, l, which, nested, &v, &kvslot, &ran);
        Py_XDECREF(owned);
        if (ran) kv_req_forget(st);
        if (found < 0) return KV_LEN_ERROR;
        if (!found) return KV_LEN_MISSING;
    }
    if (kv_exact_length(v, length)) {
        Py_DECREF(v);
        return KV_LEN_OK;
    }
    *value = v;
    return KV_LEN_VALUE;
}

/* req.<which> read where `at` says, when that runs no Python code (see
 * kv_read_pure) and the value is an exact int in [0, 2^63): 1 with *length,
 * else 0 (nothing set, nothing changed but *kv and *dictslot): the caller
 * reads the request the full way.  KV_AT_EITHER takes req.<which> only:
 * a miss at the hint does not prove it missing.  *kv: req.kv
 * (a new reference) once read, for the caller to release after the request;
 * *dictslot as in kv_read. */
static inline int kv_req_length_pure(kv_cache *c, PyObject *req, int which, int at,
                                     PyObject **kv, PyObject ***dictslot, int64_t *length)
{
    PyObject *v, **kvslot = NULL;
    if (at != KV_AT_NESTED) {
        v = kv_read_pure(c, kv_layout_for(c, Py_TYPE(req)), which, req, dictslot);
    } else {
        if (*kv == NULL) {
            PyObject *nested = kv_read_pure(c, kv_layout_for(c, Py_TYPE(req)), KV_NESTED, req,
                                            dictslot);
            if (nested == NULL) return 0;
            /* Held: making its instance dict real below may collect garbage,
             * and a finalizer may rebind req.kv. */
            Py_INCREF(nested);
            *kv = nested;
        }
        v = kv_read_pure(c, kv_layout_for(c, Py_TYPE(*kv)), which, *kv, &kvslot);
    }
    if (v == NULL) return 0;
    /* v is borrowed: nothing runs between its read and this use. */
    return kv_exact_length(v, length);
}

#endif
