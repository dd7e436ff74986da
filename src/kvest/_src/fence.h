/*
 * The fence: every use kvest makes of CPython's private API, in one block,
 * each a small primitive the request core (reqroute.h) builds on.  Tested on
 * CPython 3.10 to 3.13 (docs/development.md lists each use and what for).
 *
 * KV_PRIVATE (1 on 3.10 to 3.13 GIL builds) takes the block; it is 0 on any
 * Python newer than 3.13, on a free-threaded build, and in a build that asks
 * for the public API alone (KVEST_PUBLIC_API_ONLY=1 at build time, setup.py),
 * which CI builds and tests too: then each primitive is written with the
 * public API, what is worked out for a type lasts one call that runs no
 * Python code (pure mode, the one place routes are taken there), and no
 * dict entry or int is read where CPython keeps it.
 *
 * KV_SHORTCUTS (0 without a GIL: a slot or dict read behind the
 * interpreter's back would race) is the one other switch: without it every
 * access is the generic call, and nothing here is used.
 */
#ifndef KVEST_FENCE_H
#define KVEST_FENCE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The versions, named once: nothing else compares PY_VERSION_HEX. */
#define KV_PY311 (PY_VERSION_HEX >= 0x030B0000)
#define KV_PY312 (PY_VERSION_HEX >= 0x030C0000)
#define KV_PY313 (PY_VERSION_HEX >= 0x030D0000)
#define KV_PY314 (PY_VERSION_HEX >= 0x030E0000) /* newer than any tested: the public API */

/* The one free-threading switch: nothing else tests Py_GIL_DISABLED. */
#ifdef Py_GIL_DISABLED
#define KV_SHORTCUTS 0
#else
#define KV_SHORTCUTS 1
#endif
#if KV_PY314 && !defined(KVEST_PUBLIC_API_ONLY)
#define KVEST_PUBLIC_API_ONLY 1
#endif
#if defined(KVEST_PUBLIC_API_ONLY) || !KV_SHORTCUTS
#define KV_PRIVATE 0
#else
#define KV_PRIVATE 1
#endif

#if KV_PRIVATE || !KV_PY312
#include <structmember.h> /* the member types' names before 3.12 */
#endif
#if KV_PY312
#define KV_T_OBJECT_EX Py_T_OBJECT_EX
#define KV_READONLY Py_READONLY
#define KV_AUDIT_READ Py_AUDIT_READ
#else
#define KV_T_OBJECT_EX T_OBJECT_EX
#define KV_READONLY READONLY
#define KV_AUDIT_READ PY_AUDIT_READ
#endif

/* The per-request reads, inlined into the walk whatever the compiler's
 * budget says (tools/instructions.py counts them). */
#if defined(__GNUC__) || defined(__clang__)
#define KV_HOT static inline __attribute__((always_inline))
#else
#define KV_HOT static inline
#endif

enum { KV_ROUTE_GENERIC = 0, KV_ROUTE_DICT = 1, KV_ROUTE_MEMBER = 2 };

typedef struct {
    unsigned char get, set;      /* KV_ROUTE_* */
    unsigned char none_if_unset; /* T_OBJECT: an unset slot reads as None */
    Py_ssize_t offset;           /* KV_ROUTE_MEMBER */
} kv_route;

/* ------------------------------------------------------------ collections */

typedef struct {
    int held;  /* collections held off by this call */
    int saved; /* the collector's state before (PyGC_Disable's answer) */
    PyObject *dict; /* behind the fence: the instance dict last looked up (borrowed) */
} kv_gc;

static inline void kv_gc_init(kv_gc *g)
{
    g->held = 0;
    g->saved = 0;
    g->dict = NULL;
}

KV_HOT void kv_gc_hold(kv_gc *g)
{
    if (!g->held) {
        g->saved = PyGC_Disable();
        g->held = 1;
    }
}

/* Before code of the caller's runs, and when the call ends. */
static inline void kv_gc_let(kv_gc *g)
{
    if (g->held) {
        g->held = 0;
        if (g->saved) PyGC_Enable();
    }
}

/* A class's own dict (a new reference, or NULL): on 3.12+ the interpreter's
 * own types keep theirs apart from tp_dict. */
static inline PyObject *kv_class_dict(PyObject *base)
{
#if KV_PY312
    return PyType_GetDict((PyTypeObject *)base);
#else
    return Py_XNewRef(((PyTypeObject *)base)->tp_dict);
#endif
}

/* Whether descr, what t's MRO defines under name, is a member descriptor of
 * an object slot under that very name, of a class t derives from: then *r is
 * the slot's route (its offset, and get and set where the descriptor lets
 * them through), as the descriptor's own __get__/__set__ go.  The subtype
 * check: a descriptor copied from an unrelated class makes the generic code
 * raise TypeError.  The name check: a descriptor copied under another name
 * reads another slot than its name says.  Behind the fence T_OBJECT (an
 * unset slot reading None; deprecated) is not taken. */
static inline void kv_member_route(kv_route *r, PyObject *descr, PyTypeObject *t,
                                   PyObject *name, int get_generic, int set_generic)
{
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) return;
    PyMemberDescrObject *md = (PyMemberDescrObject *)descr;
    PyMemberDef *m = md->d_member;
#ifdef Py_RELATIVE_OFFSET
    int unusable = m->flags & Py_RELATIVE_OFFSET;
#else
    int unusable = 0;
#endif
#if KV_PRIVATE
    int object_type = m->type == KV_T_OBJECT_EX || m->type == T_OBJECT;
#else
    int object_type = m->type == KV_T_OBJECT_EX;
#endif
    if (!object_type || unusable || md->d_common.d_name != name
        || !PyType_IsSubtype(t, md->d_common.d_type))
        return;
    r->offset = m->offset;
    r->none_if_unset = m->type != KV_T_OBJECT_EX;
    if (get_generic && !(m->flags & KV_AUDIT_READ)) r->get = KV_ROUTE_MEMBER;
    if (set_generic && !(m->flags & KV_READONLY)) r->set = KV_ROUTE_MEMBER;
}

/* The primitives: kv_tag_valid and kv_tag (a type's version tag, changed or
 * cleared by CPython whenever the type or a base changes), kv_type_lookup,
 * kv_dictptr and kv_dict_of, kv_slot_ptr, kv_slot_at and kv_slot_get,
 * kv_small_int, and kv_dict_at: dict's value for name where name sits at
 * hint `pos` (borrowed), else NULL -- "ask the lookup".  A dict is read there
 * only where it says its keys are all exact str (3.11 to 3.13: its keys'
 * kind), for CPython's lookup may meet another key first and answer by that
 * key's own __eq__; a combined table's entry is read where the dict keeps it
 * (Include/internal/pycore_dict.h's layout, only its fields read), once
 * kv_dict_entries_check() found that read to agree with PyDict_Next. */
static int kv_dict_entries_ok; /* set once kv_dict_entries_check() agrees */
static int kv_managed_dict_ok; /* set once kv_managed_dict_check() agrees */

/* ============================================================= the fence */
#if KV_PRIVATE

static inline int kv_tag_valid(PyTypeObject *t)
{
#if KV_PY313
    return t->tp_version_tag != 0;
#else
    return (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag != 0;
#endif
}

/* The tag to key what was worked out for t by. */
static inline unsigned int kv_tag(PyTypeObject *t)
{
    return t->tp_version_tag;
}

/* What the MRO of t defines under name (borrowed), or NULL; *unknown is set
 * when that could not be told. */
static inline PyObject *kv_type_lookup(PyTypeObject *t, PyObject *name, int *unknown)
{
    (void)unknown;
    return _PyType_Lookup(t, name); /* sets no error */
}

/* Where obj keeps its instance dict (building it on 3.11+: collections are
 * held off), or NULL when it has none; the place lasts as long as obj. */
#define KV_DICT_CACHED 1
KV_HOT PyObject **kv_dictptr(kv_gc *g, PyObject *obj)
{
    kv_gc_hold(g);
    return _PyObject_GetDictPtr(obj);
}

/* obj's instance dict (borrowed) or NULL: a built managed dict read where
 * _PyObject_GetDictPtr finds it (pycore_object.h: three words before obj; 3.12
 * tags inline values there with bit 0), nothing held off; else kv_dictptr's. */
KV_HOT PyObject *kv_managed_dict(PyObject *obj)
{
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (Py_TYPE(obj)->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
        uintptr_t d = ((uintptr_t *)obj)[-3];
        if (d != 0 && !(d & 1)) return (PyObject *)d;
    }
#else
    (void)obj;
#endif
    return NULL;
}

KV_HOT PyObject *kv_dict_of(kv_gc *g, PyObject *obj)
{
    PyObject *d = kv_managed_dict_ok ? kv_managed_dict(obj) : NULL, **dictptr;
    if (d != NULL) return d;
    dictptr = kv_dictptr(g, obj);
    return dictptr != NULL ? *dictptr : NULL;
}

/* At import: whether the managed-dict read finds the dict CPython's own
 * lookup finds, on an instance of `probe` (a class of kvest's: a managed
 * dict on 3.11+) before its dict is built (nothing) and after (that dict).
 * kv_dict_of reads it there only after 1. */
static inline int kv_managed_dict_check(PyObject *probe)
{
#ifdef Py_TPFLAGS_MANAGED_DICT
    PyObject *obj = PyObject_CallNoArgs(probe), *dict;
    if (obj == NULL) return -1;
    int agree = (Py_TYPE(obj)->tp_flags & Py_TPFLAGS_MANAGED_DICT)
                && kv_managed_dict(obj) == NULL;
    dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) {
        Py_DECREF(obj);
        return -1;
    }
    PyObject **dictptr = _PyObject_GetDictPtr(obj);
    kv_managed_dict_ok = agree && kv_managed_dict(obj) == dict && dictptr != NULL
                         && *dictptr == dict;
    Py_DECREF(dict);
    Py_DECREF(obj);
#else
    (void)probe;
#endif
    return 0;
}

/* Where obj's object slot at offset lies, for the member descriptor's own
 * set (the writers). */
KV_HOT PyObject **kv_slot_ptr(PyObject *obj, Py_ssize_t offset)
{
    return (PyObject **)((char *)obj + offset);
}

/* The object slot at offset in obj (borrowed; NULL: unset), as the member
 * descriptor's own get reads it. */
KV_HOT PyObject *kv_slot_at(PyObject *obj, Py_ssize_t offset)
{
    return *kv_slot_ptr(obj, offset);
}

/* obj's slot at r (a member route): a borrowed reference, or NULL (nothing
 * set) when it is unset. */
KV_HOT PyObject *kv_slot_get(const kv_route *r, PyObject *obj, PyObject *name)
{
    (void)name;
    PyObject *v = kv_slot_at(obj, r->offset);
    return v != NULL ? v : (r->none_if_unset ? Py_None : NULL);
}

/* Whether v (an exact int) is a one-digit int (below 2^30 in magnitude), with
 * its value in *x, read where the int keeps it: no call.  0 tells nothing (the
 * caller then asks PyLong_AsLongLongAndOverflow). */
KV_HOT int kv_small_int(PyObject *v, long long *x)
{
#if KV_PY312
    if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
        *x = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
        return 1;
    }
#elif KV_PY311
    Py_ssize_t size = Py_SIZE(v);
    if (size >= -1 && size <= 1) {
        *x = size * (long long)((PyLongObject *)v)->ob_digit[0];
        return 1;
    }
#else
    (void)v, (void)x;
#endif
    return 0;
}

#if KV_PY311 && !KV_PY314
#define KV_DICT_ENTRIES 1
typedef struct {
    Py_ssize_t refcnt;
    uint8_t log2_size, log2_index_bytes, kind;
    uint32_t version;
    Py_ssize_t usable, nentries;
    char indices[];
} kv_dict_keys;
enum { KV_KEYS_GENERAL = 0, KV_KEYS_STR = 1, KV_KEYS_SPLIT = 2 }; /* DictKeysKind */
typedef struct {
    Py_hash_t hash;
    PyObject *key, *value;
} kv_dict_entry; /* kind 0: keys of any type */
typedef struct {
    PyObject *key, *value;
} kv_dict_str_entry; /* kinds 1 and 2: exact str keys only */

/* The entry at pos of a combined table of either kind, or NULL with *known 0
 * where the table is not one: what the import check holds against
 * PyDict_Next. */
KV_HOT PyObject *kv_dict_entry_at(PyObject *dict, Py_ssize_t pos, PyObject *name,
                                  int *known)
{
    PyDictObject *d = (PyDictObject *)dict;
    kv_dict_keys *k = (kv_dict_keys *)d->ma_keys;
    *known = 0;
    if (d->ma_values != NULL || pos >= k->nentries || k->kind > KV_KEYS_STR) return NULL;
    *known = 1;
    char *entries = k->indices + ((size_t)1 << k->log2_index_bytes);
    if (k->kind == KV_KEYS_STR) {
        kv_dict_str_entry *e = (kv_dict_str_entry *)entries + pos;
        return e->key == name ? e->value : NULL;
    }
    kv_dict_entry *e = (kv_dict_entry *)entries + pos;
    return e->key == name ? e->value : NULL;
}

KV_HOT PyObject *kv_dict_at(PyObject *dict, Py_ssize_t pos, PyObject *name)
{
    PyDictObject *d = (PyDictObject *)dict;
    kv_dict_keys *k = (kv_dict_keys *)d->ma_keys;
    PyObject *key, *v;
    if (pos < 0 || !kv_dict_entries_ok) return NULL;
    if (k->kind == KV_KEYS_STR && d->ma_values == NULL) { /* combined, str keys */
        if (pos >= k->nentries) return NULL;
        kv_dict_str_entry *e =
            (kv_dict_str_entry *)(k->indices + ((size_t)1 << k->log2_index_bytes)) + pos;
        return e->key == name ? e->value : NULL;
    }
    if (k->kind == KV_KEYS_SPLIT && PyDict_Next(dict, &pos, &key, &v) && key == name)
        return v; /* shared keys: str only */
    return NULL;
}

/* At import: whether the entry read agrees with PyDict_Next at every position
 * of dicts of each kind (str keys, other keys, deleted entries, one- and
 * two-byte indices), for a name that is there and one that is not.  Returns
 * 0, or -1 with an exception set; the entry read is used only after 1. */
static inline int kv_dict_entries_check(void)
{
    int agree = 1;
    for (int round = 0; round < 4 && agree; round++) {
        PyObject *dict = PyDict_New(), *absent = PyUnicode_InternFromString("kvest-absent");
        if (dict == NULL || absent == NULL) {
            Py_XDECREF(dict);
            Py_XDECREF(absent);
            return -1;
        }
        int n = round < 2 ? 12 : 400, ok = 1;
        for (int i = 0; i < n && ok; i++) {
            PyObject *key = round % 2 ? PyLong_FromLong(i) : PyUnicode_FromFormat("k%d", i);
            if (key != NULL && round % 2 == 0) PyUnicode_InternInPlace(&key);
            ok = key != NULL && PyDict_SetItem(dict, key, key) == 0;
            if (ok && i % 5 == 3) ok = PyDict_DelItem(dict, key) == 0;
            Py_XDECREF(key);
        }
        if (!ok) {
            Py_DECREF(dict);
            Py_DECREF(absent);
            return -1;
        }
        kv_dict_keys *k = (kv_dict_keys *)((PyDictObject *)dict)->ma_keys;
        for (Py_ssize_t pos = 0; pos < k->nentries + 2 && agree; pos++) {
            Py_ssize_t at = pos;
            PyObject *key = NULL, *v = NULL, *got;
            int known, has = PyDict_Next(dict, &at, &key, &v) && at == pos + 1;
            got = kv_dict_entry_at(dict, pos, has ? key : absent, &known);
            if (pos < k->nentries)
                agree = known && got == (has ? v : NULL);
            agree = agree && kv_dict_entry_at(dict, pos, absent, &known) == NULL;
        }
        Py_DECREF(dict);
        Py_DECREF(absent);
    }
    kv_dict_entries_ok = agree;
    return 0;
}
#endif

#else /* ====================================== behind the fence: public API */

static inline int kv_tag_valid(PyTypeObject *t)
{
    (void)t;
    return 1; /* per call only: see above */
}

static inline unsigned int kv_tag(PyTypeObject *t)
{
    (void)t;
    return 0;
}

/* What the MRO of t defines under name (borrowed), or NULL; *unknown is set
 * when that could not be told. */
static inline PyObject *kv_type_lookup(PyTypeObject *t, PyObject *name, int *unknown)
{
    PyObject *mro = t->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro)) {
        *unknown = 1;
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyObject *base = PyTuple_GET_ITEM(mro, i), *dict, *v;
        if (!PyType_Check(base)) {
            *unknown = 1;
            return NULL;
        }
        dict = kv_class_dict(base);
        if (dict == NULL) continue;
        v = PyDict_GetItemWithError(dict, name); /* borrowed: the type holds its dict */
        Py_DECREF(dict);
        if (v != NULL) return v;
        if (PyErr_Occurred()) {
            PyErr_Clear();
            *unknown = 1;
            return NULL;
        }
    }
    return NULL;
}

/* Where obj keeps its instance dict, as PyObject_GenericGetDict gives it
 * (which obj keeps), or NULL: the place handed back is the call's own, good
 * only until the next lookup (KV_DICT_CACHED is 0: the callers look up again
 * before each use). */
#define KV_DICT_CACHED 0
KV_HOT PyObject **kv_dictptr(kv_gc *g, PyObject *obj)
{
    kv_gc_hold(g);
    PyObject *d = PyObject_GenericGetDict(obj, NULL);
    if (d == NULL) {
        PyErr_Clear(); /* no instance dict: the generic lookup says what is missing */
        return NULL;
    }
    g->dict = d;
    Py_DECREF(d); /* obj holds it, and no code runs before its use */
    return &g->dict;
}

/* obj's instance dict (borrowed) or NULL, as kv_dictptr finds it. */
KV_HOT PyObject *kv_dict_of(kv_gc *g, PyObject *obj)
{
    PyObject **dictptr = kv_dictptr(g, obj);
    return dictptr != NULL ? *dictptr : NULL;
}

/* obj's slot at r: PyObject_GetAttr reads it, which the route proves is the
 * member descriptor's own get (no code of the caller's). */
KV_HOT PyObject *kv_slot_get(const kv_route *r, PyObject *obj, PyObject *name)
{
    (void)r;
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear(); /* AttributeError: the slot is unset */
        return NULL;
    }
    Py_DECREF(v); /* the slot holds it */
    return v;
}

KV_HOT int kv_small_int(PyObject *v, long long *x)
{
    (void)v, (void)x;
    return 0;
}

static inline int kv_managed_dict_check(PyObject *probe)
{
    (void)probe;
    return 0;
}

#endif /* ======================================================== the fence */

#ifndef KV_DICT_ENTRIES
#define KV_DICT_ENTRIES 0
KV_HOT PyObject *kv_dict_at(PyObject *dict, Py_ssize_t pos, PyObject *name)
{
    (void)dict, (void)pos, (void)name;
    return NULL;
}

static inline int kv_dict_entries_check(void)
{
    return 0;
}
#endif


#endif
