/*
 * The request core, one for the readers (reqattr.h) and the writers
 * (reqwrite.h): how getattr(obj, name) and setattr(obj, name, value) go for
 * one type (a route), worked out once by the one resolver (kv_resolve), kept
 * in the one memo and trusted while the type's version tag holds; a call's
 * one context (kv_ctx).  Routes:
 *
 *   KV_ROUTE_DICT    generic getattro (reads) or setattro (writes), no class
 *                    in the MRO defines the name: the instance __dict__;
 *   KV_ROUTE_MEMBER  the MRO defines the name as a member descriptor of an
 *                    object slot under its own name: read or replaced at its
 *                    offset exactly as the descriptor's __get__/__set__ do
 *                    (unset: missing, or None for T_OBJECT);
 *   KV_ROUTE_GENERIC anything else: PyObject_GetAttr/PyObject_SetAttr.
 *
 * Collections.  On 3.11+ finding an instance dict may build it, and a
 * collection there could run a finalizer -- Python code -- amid C code that
 * holds borrowed pointers.  A call's kv_gc holds collections off from its
 * first dict lookup and lets them run again (the caller's state restored)
 * before anything that may run Python code, and when the call ends: the
 * caller's code always runs with its own collector state.
 *
 * CPython's private API is used only through fence.h's primitives.  Behind
 * the fence (KV_PRIVATE 0) routes last one call and are taken in pure mode
 * only: everything else takes the generic calls.
 */
#ifndef KVEST_REQROUTE_H
#define KVEST_REQROUTE_H

#include <Python.h>
#include <string.h>

#include "fence.h"

/* A read or write that would need code of the caller's, in pure mode: nothing set. */
#define KV_IMPURE (-2)


/* Whether a dict's lookup compares key, if it meets it, with no code of the
 * caller's: an exact str or an exact int (their own comparisons). */
static inline int kv_plain_key(PyObject *key)
{
    return PyUnicode_CheckExact(key) || PyLong_CheckExact(key);
}

/* Whether every key of dict is plain (kv_plain_key): then storing into it
 * compares keys with no code of the caller's. */
static int kv_dict_str_keys(PyObject *dict)
{
    Py_ssize_t pos = 0;
    PyObject *key, *v;
    while (PyDict_Next(dict, &pos, &key, &v))
        if (!kv_plain_key(key)) return 0;
    return 1;
}


/* Whether looking a name up in t's MRO compares no key with code of the
 * caller's (a class dict's key that hashes like the name, with an __eq__ of
 * its own, would run: once per lookup that fails, as CPython keeps no
 * failed lookup): every heap class's dict plain (kv_dict_str_keys); the
 * interpreter's own types cannot be given a key. */
static int kv_plain_mro(PyTypeObject *t)
{
    PyObject *mro = t->tp_mro;
    if (mro == NULL || !PyTuple_Check(mro)) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyObject *base = PyTuple_GET_ITEM(mro, i), *dict;
        int plain;
        if (!PyType_Check(base)) return 0;
        if (!(((PyTypeObject *)base)->tp_flags & Py_TPFLAGS_HEAPTYPE)) continue;
        dict = kv_class_dict(base);
        if (dict == NULL) continue;
        plain = kv_dict_str_keys(dict);
        Py_DECREF(dict); /* the type holds it */
        if (!plain) return 0;
    }
    return 1;
}


#if KV_SHORTCUTS
/* Whether t's __dict__ is the interpreter's own: the MRO's first __dict__ a
 * getset descriptor of that name, or none on a type without instance dicts. */
static int kv_plain_dict(PyTypeObject *t)
{
    static PyObject *dict_name;
    int unknown = 0;
    if (dict_name == NULL && (dict_name = PyUnicode_InternFromString("__dict__")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *d = kv_type_lookup(t, dict_name, &unknown); /* borrowed */
    if (unknown) return 0;
    if (d == NULL) return t->tp_dictoffset == 0;
    return Py_IS_TYPE(d, &PyGetSetDescr_Type)
           && PyUnicode_CompareWithASCIIString(((PyDescrObject *)d)->d_name, "__dict__") == 0;
}
#endif

/* The route of name (an exact, interned str, or anything else: generic) on t,
 * for a call in pure mode or not (behind the fence only pure mode takes
 * routes: nothing tells there whether a type changed while Python code ran).
 * Worked out here; kv_resolve below keeps it past the call. */
static void kv_route_work_out(kv_route *r, PyTypeObject *t, PyObject *name, int pure)
{
    r->get = r->set = KV_ROUTE_GENERIC;
    r->none_if_unset = 0;
    r->offset = 0;
#if KV_SHORTCUTS
    int unknown = 0;
    /* A str subclass may hash and compare its own way: only the generic
     * lookups know what it means. */
    if (!PyUnicode_CheckExact(name)) return;
#if !KV_PRIVATE
    if (!pure) return;
#else
    (void)pure;
#endif
    int get_generic = t->tp_getattro == PyObject_GenericGetAttr;
    int set_generic = t->tp_setattro == PyObject_GenericSetAttr;
    if (!get_generic && !set_generic) return;
    if (!kv_plain_mro(t)) return; /* before any lookup: a lookup may run a key's __eq__ */
    PyObject *descr = kv_type_lookup(t, name, &unknown); /* borrowed */
    if (unknown) return;
    if (descr == NULL) {
        /* The instance dict generic getattr reads is where _PyObject_GetDictPtr
         * looks; trusted only where the class's own __dict__ says the same
         * (what the twin can see): the interpreter's getset, or none at all
         * on a type whose instances have no dict. */
        if (!kv_plain_dict(t)) return;
        if (get_generic) r->get = KV_ROUTE_DICT;
        if (set_generic) r->set = KV_ROUTE_DICT;
    } else {
        kv_member_route(r, descr, t, name, get_generic, set_generic); /* fence.h */
    }
#else
    (void)t, (void)name, (void)pure;
#endif
}

/* Whether what was worked out for t under tag `version` still holds
 * (behind the fence: for the rest of the call, fence.h). */
KV_HOT int kv_route_current(PyTypeObject *known, unsigned int version, PyTypeObject *t)
{
    return known == t && kv_tag_valid(t) && kv_tag(t) == version;
}

/* What is known of one name on one type: its route, and (KV_ROUTE_DICT) where
 * the name sat in the last instance dict that had it, a PyDict_Next position
 * or -1.  A hint is only a guess: a probe there counts only if the key found
 * is the name itself (kv_dict_at), so a stale one costs a search, never a
 * wrong value.  Trusted while `type` holds tag `version`. */
typedef struct {
    PyTypeObject *type; /* compared, never dereferenced; NULL: nothing known */
    unsigned int version;
    PyObject *name; /* borrowed: the caller's interned name */
    kv_route route;
    Py_ssize_t hint;
} kv_known;

/* The memo: what is known, kept past a call, one entry per (type, version
 * tag, name), for the readers, the writers and kv_plain_attr alike: sets of
 * KV_MEMO_WAYS entries, a (type, name) always in the same set, each set
 * replacing its oldest entry.  A batch's few types and names never crowd one
 * another out.  Behind the fence none (a tag keys nothing past a call there,
 * fence.h). */
#if KV_PRIVATE
#define KV_MEMO 1
#define KV_MEMO_SETS 32
#define KV_MEMO_WAYS 4
static kv_known kv_memo[KV_MEMO_SETS][KV_MEMO_WAYS];
static unsigned char kv_memo_next[KV_MEMO_SETS];

KV_HOT unsigned int kv_memo_set(PyTypeObject *t, PyObject *name)
{
    uint64_t h = ((uint64_t)(uintptr_t)t ^ ((uint64_t)(uintptr_t)name << 1)) * 0x9E3779B97F4A7C15u;
    return (unsigned int)(h >> 59); /* the top 5 bits: KV_MEMO_SETS */
}

/* The entry for (t, name) under t's current tag, or NULL. */
KV_HOT kv_known *kv_memo_find(PyTypeObject *t, PyObject *name)
{
    kv_known *set = kv_memo[kv_memo_set(t, name)];
    for (int i = 0; i < KV_MEMO_WAYS; i++)
        if (set[i].name == name && kv_route_current(set[i].type, set[i].version, t))
            return &set[i];
    return NULL;
}

/* k kept in the memo: over its own entry, or the set's oldest.  An entry
 * holds its name, so that no other string can take the name's address while
 * the entry stands for it (a str's release runs no Python code). */
static void kv_memo_keep(const kv_known *k)
{
    kv_known *m = kv_memo_find(k->type, k->name);
    if (m == NULL) {
        unsigned int at = kv_memo_set(k->type, k->name);
        m = &kv_memo[at][kv_memo_next[at]];
        kv_memo_next[at] = (unsigned char)((kv_memo_next[at] + 1) % KV_MEMO_WAYS);
    }
    PyObject *old = m->name;
    *m = *k;
    Py_INCREF(m->name);
    Py_XDECREF(old);
}
#else
#define KV_MEMO 0
#endif

/* kv_resolve's memo miss: *k worked out, kept in the memo where t has a tag. */
static void kv_resolve_new(kv_known *k, PyTypeObject *t, PyObject *name, int pure)
{
    k->name = name;
    k->hint = -1;
    kv_route_work_out(&k->route, t, name, pure);
    /* The lookups assign a version tag if the type can have one; without one
     * nothing is trusted past this use, and the route is worked out again. */
    k->type = kv_tag_valid(t) ? t : NULL;
    k->version = k->type ? kv_tag(t) : 0;
#if KV_MEMO
    if (k->type) kv_memo_keep(k);
#endif
}

/* The one resolver: *k made what is known of name on t (the memo's entry,
 * inline: a call's usual case; or kv_resolve_new's). */
KV_HOT void kv_resolve(kv_known *k, PyTypeObject *t, PyObject *name, int pure)
{
#if KV_MEMO
    kv_known *m = kv_tag_valid(t) ? kv_memo_find(t, name) : NULL;
    if (m != NULL) *k = *m;
    else
#endif
        kv_resolve_new(k, t, name, pure);
}

/* k's name found at pos in an instance dict: k's hint, and the memo's. */
static void kv_learned(kv_known *k, Py_ssize_t pos)
{
    k->hint = pos;
#if KV_MEMO
    if (k->type) kv_memo_keep(k);
#endif
}



#if KV_DICT_ENTRIES
/* Where name sits in dict (which holds it under that very key), or -1. */
static Py_ssize_t kv_dict_position(PyObject *dict, PyObject *name)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value))
        if (key == name) return pos - 1;
    return -1;
}
#endif


/* o (NULL: nothing) let go, a reference of kvest's own to an object of the
 * caller's.  Where it is the last, the release may run a finalizer -- the
 * caller's code, which runs with the caller's collector state: collections
 * are let run first. */
static inline void kv_release(kv_gc *g, PyObject *o)
{
    if (o == NULL) return;
    if (Py_REFCNT(o) == 1) kv_gc_let(g);
    Py_DECREF(o);
}
#define KV_CLEAR(g, o) \
    do { \
        PyObject *kv_clear_tmp = (o); \
        (o) = NULL; \
        kv_release((g), kv_clear_tmp); \
    } while (0)

/* A call's own context, the readers' and the writers' alike: its collector
 * hold, its mode (pure: reads that run no code of the caller's), and the
 * dict searches it may still make to learn a hint.  Each call keeps one on
 * its stack and shares it with no other: so what the collector is when the
 * caller's code runs (and another thread can) is the caller's own state. */
typedef struct {
    kv_gc gc;
    int pure;
    int learn;
} kv_ctx;

static inline void kv_ctx_init(kv_ctx *cx, int pure)
{
    kv_gc_init(&cx->gc);
    cx->pure = pure;
    cx->learn = 4;
}

/* After a lookup found k's name in dict (which holds it): where it sits,
 * learned as k's hint, while the call's budget of searches lasts (where a
 * hint is read at all: kv_dict_at). */
static void kv_learn(kv_ctx *cx, kv_known *k, PyObject *dict)
{
#if KV_DICT_ENTRIES
    if (cx->learn <= 0) return;
    cx->learn--;
    Py_ssize_t pos = kv_dict_position(dict, k->name);
    if (pos >= 0) kv_learned(k, pos);
#else
    (void)cx, (void)k, (void)dict;
#endif
}


/* ------------------------------------------------------- pure dict reads */

/* dict's entry for name (an exact str) found without a lookup, so that no
 * key's __eq__ or __hash__ runs: a key that is name itself or an equal exact
 * str.  1 with the value (borrowed) and its PyDict_Next position in *at;
 * 0 when no key is; KV_IMPURE when any key is not plain (kv_plain_key): the
 * lookup may compare it with its own __eq__, found or not, and that may
 * answer. */
static int kv_dict_scan(PyObject *dict, PyObject *name, PyObject **value, Py_ssize_t *at)
{
    Py_ssize_t pos = 0, len = PyUnicode_GET_LENGTH(name), found = -1;
    PyObject *key, *v, *hit = NULL;
    while (PyDict_Next(dict, &pos, &key, &v)) {
        if (!kv_plain_key(key)) return KV_IMPURE;
        if (!PyUnicode_CheckExact(key)) continue;
        if (found < 0 && (key == name || (PyUnicode_GET_LENGTH(key) == len
                                          && PyUnicode_Compare(key, name) == 0))) {
            found = pos - 1;
            hit = v;
        }
    }
    if (found < 0) return 0;
    *value = hit;
    *at = found;
    return 1;
}

/* obj.<name> when reading it runs no Python code: the instance's own value
 * (a slot, or the instance dict's entry, found without comparing a key by
 * code of its own) on a type whose getattr is the generic one and whose MRO
 * defines nothing under name.  Borrowed, or NULL with nothing set (the read
 * would need more, or finds nothing).  g holds them off while a dict is built. */
static PyObject *kv_plain_attr(PyObject *obj, PyObject *name, kv_gc *g)
{
#if KV_SHORTCUTS
    kv_known k;
    kv_resolve(&k, Py_TYPE(obj), name, 1);
    if (k.route.get == KV_ROUTE_MEMBER) return kv_slot_get(&k.route, obj, name);
    if (k.route.get == KV_ROUTE_DICT) {
        PyObject *dict = kv_dict_of(g, obj), *v;
        Py_ssize_t at;
        if (dict == NULL) return NULL;
        v = kv_dict_at(dict, k.hint, name);
        if (v != NULL) return v;
        if (kv_dict_scan(dict, name, &v, &at) != 1) return NULL;
        kv_learned(&k, at);
        return v;
    }
#else
    (void)obj, (void)name, (void)g;
#endif
    return NULL;
}


#endif
