/*
 * Reading kv_committed_len / kv_allocated_len from request objects with the
 * fewest lookups, exactly as the reference rule reads them:
 *
 *     try:    value = getattr(req, attr)
 *     except AttributeError:
 *         try:    value = getattr(req.kv, attr)
 *         except AttributeError: raise AttributeError("reqs[i] has neither ...")
 *
 * How a name is read is worked out once per type (a kv_layout, one route per
 * name: reqroute.h) and trusted while the type's version tag holds: a slot at
 * a member descriptor's offset, an instance-dict probe, or the generic lookup.
 *
 * Modes (kv_ctx.pure):
 *   KV_PURE_OFF    the reads above, Python code and all;
 *   KV_PURE_STRICT never run code of the caller's: a read that would (a
 *                  generic route, a dict holding a key that is not plain)
 *                  gives KV_IMPURE instead; a dict read that misses the
 *                  learned position scans the dict (kv_dict_scan);
 *   KV_PURE_QUICK  the same, and a dict read that misses the learned
 *                  position gives KV_IMPURE rather than scan (the
 *                  address-ordered walk, which then walks in order).
 */
#ifndef KVEST_REQATTR_H
#define KVEST_REQATTR_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "reqroute.h"

/* The names read: indices into kv_cache.names and kv_layout.read. */
enum { KV_COMMITTED = 0, KV_ALLOCATED = 1, KV_NESTED = 2, KV_BEAM = 3, KV_ROWS = 4,
       KV_NUM_NAMES = 5 };
enum { KV_PURE_OFF = 0, KV_PURE_STRICT = 1, KV_PURE_QUICK = 2 };

/* What a call knows of one type: each name's route and hint (reqroute.h's
 * kv_known, the memo's entries; a NULL name: not asked for yet), all under
 * the tag `version`. */
typedef struct {
    PyTypeObject *type; /* borrowed: trusted only while the version tag matches */
    PyTypeObject *of;   /* the type itself (type is NULL where it has no tag) */
    unsigned int version;
    kv_known read[KV_NUM_NAMES];
} kv_layout;

/* Request types and the types under req.kv: a batch rarely mixes more. */
#define KV_CACHE_SLOTS 4

/* A reading call's context: the call's own (kv_ctx, reqroute.h), the names
 * read, and what it knows of the types it met. */
typedef struct {
    kv_ctx cx;
    PyObject *names[KV_NUM_NAMES]; /* borrowed interned strings */
    kv_layout slots[KV_CACHE_SLOTS];
    int next; /* the slot the next new type takes */
} kv_cache;

static inline void kv_cache_init(kv_cache *c, PyObject *committed, PyObject *allocated,
                                 PyObject *nested, PyObject *beam, PyObject *rows, int pure)
{
    for (int i = 0; i < KV_CACHE_SLOTS; i++) c->slots[i].type = NULL; /* (kv_layout_resolve) */
    c->next = 0;
    kv_ctx_init(&c->cx, pure);
    c->names[KV_COMMITTED] = committed;
    c->names[KV_ALLOCATED] = allocated;
    c->names[KV_NESTED] = nested;
    c->names[KV_BEAM] = beam;
    c->names[KV_ROWS] = rows;
}

/* Collections held off from here (the address-ordered walk), until let. */
static inline void kv_cache_hold(kv_cache *c)
{
    kv_gc_hold(&c->cx.gc);
}

/* Before the caller's code runs, and when the call ends (reqroute.h). */
static inline void kv_cache_let(kv_cache *c)
{
    kv_gc_let(&c->cx.gc);
}

/* t's layout made anew: in l (t's stale one), or (NULL) in the next slot. */
static kv_layout *kv_layout_resolve(kv_cache *c, kv_layout *l, PyTypeObject *t)
{
    if (l == NULL) {
        l = &c->slots[c->next];
        c->next = (c->next + 1) % KV_CACHE_SLOTS;
    }
    /* Each name is resolved when first asked for (kv_layout_read), under t's
     * tag now; without one the entry is never current, and is taken again. */
    for (int k = 0; k < KV_NUM_NAMES; k++) l->read[k].name = NULL;
    l->of = t;
    l->type = kv_tag_valid(t) ? t : NULL;
    l->version = l->type ? kv_tag(t) : 0;
    return l;
}

/* What l knows of names[which], resolved when first asked for. */
KV_HOT kv_known *kv_layout_read(kv_cache *c, kv_layout *l, int which)
{
    kv_known *k = &l->read[which];
    if (k->name == NULL) kv_resolve(k, l->of, c->names[which], c->cx.pure);
    return k;
}

KV_HOT kv_layout *kv_layout_for(kv_cache *c, PyTypeObject *t)
{
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (c->slots[i].type == t) {
            if (kv_route_current(t, c->slots[i].version, t)) return &c->slots[i];
            return kv_layout_resolve(c, &c->slots[i], t);
        }
    return kv_layout_resolve(c, NULL, t);
}

/* obj.<name> (name: c->names[which]) when reading it runs no Python code and
 * searches nothing: a slot, or the instance dict's entry at the learned hint.
 * Returns a borrowed reference, or NULL (nothing set) when the answer needs
 * more than that: an unset slot without a default, a dict without the name at
 * the hint, any other kind of lookup.  *dictslot as in kv_read. */
KV_HOT PyObject *kv_read_fast(kv_cache *c, kv_layout *l, int which, PyObject *obj,
                                     PyObject ***dictslot)
{
#if KV_SHORTCUTS
    kv_known *r = kv_layout_read(c, l, which);
    if (r->route.get == KV_ROUTE_MEMBER) return kv_slot_get(&r->route, obj, c->names[which]);
    if (r->route.get == KV_ROUTE_DICT && r->hint >= 0) {
        if (!KV_DICT_CACHED || *dictslot == NULL) *dictslot = kv_dictptr(&c->cx.gc, obj);
        if (*dictslot != NULL && **dictslot != NULL)
            return kv_dict_at(**dictslot, r->hint, c->names[which]); /* reqroute.h */
    }
#else
    (void)c, (void)l, (void)which, (void)obj, (void)dictslot;
#endif
    return NULL;
}

/* obj.<name> (name: c->names[which]) as generic getattr gives it, read the
 * way l (obj's type's layout) says.  Returns 1 with a new reference in
 * *value, 0 when the attribute is missing (getattr would raise
 * AttributeError; nothing is set), -1 with an exception set, KV_IMPURE (pure
 * modes only, nothing set) when the read would need code of the caller's.
 * *dictslot caches where obj keeps its instance dict (NULL: not looked up
 * yet).  *ran is set to 1 when the read may have run Python code (a generic
 * lookup, or a dict search, which compares colliding keys with their own
 * __eq__): whatever was read before may have changed since. */
static int kv_read_slow(kv_cache *c, kv_layout *l, int which, PyObject *obj,
                        PyObject **value, PyObject ***dictslot, int *ran)
{
    kv_known *r = kv_layout_read(c, l, which);
    PyObject *v, *name = c->names[which];
#if KV_SHORTCUTS
    if (r->route.get == KV_ROUTE_MEMBER) return 0; /* an unset slot */
    if (r->route.get == KV_ROUTE_DICT) {
        if (!KV_DICT_CACHED || *dictslot == NULL) *dictslot = kv_dictptr(&c->cx.gc, obj);
        if (*dictslot != NULL) {
            PyObject *dict = **dictslot;
            if (dict == NULL) return 0;
            if (c->cx.pure) {
                Py_ssize_t at;
                int found;
                /* The quick mode gives up rather than search. */
                if (c->cx.pure == KV_PURE_QUICK) return KV_IMPURE;
                found = kv_dict_scan(dict, name, &v, &at);
                if (found != 1) return found;
                kv_learned(&l->read[which], at); /* l's hint, and the memo's */
                *value = Py_NewRef(v);
                return 1;
            }
            /* The probe can run a colliding key's __eq__: hold the dict. */
            *ran = 1;
            kv_cache_let(c);
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, name);
            Py_XINCREF(v);
            if (v != NULL) kv_learn(&c->cx, &l->read[which], dict);
            kv_release(&c->cx.gc, dict);
            if (v == NULL) {
                /* A colliding key's __eq__ that raised: getattr raises it, and
                 * an AttributeError says "not there", as the generic read's. */
                if (!PyErr_Occurred()) return 0;
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
                PyErr_Clear();
                return 0;
            }
            *value = v;
            return 1;
        }
        /* No instance dict to read: the generic lookup raises AttributeError
         * and runs nothing else (the route is generic getattr's). */
        if (c->cx.pure) return 0;
    }
#else
    (void)r;
#endif
    if (c->cx.pure) return KV_IMPURE;
    *ran = 1;
    kv_cache_let(c);
    v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return 1;
}

/* kv_read_slow after the fast read (a slot, the dict entry at its hint): the
 * usual case inline, the rest out of line. */
KV_HOT int kv_read(kv_cache *c, kv_layout *l, int which, PyObject *obj,
                          PyObject **value, PyObject ***dictslot, int *ran)
{
    PyObject *v = kv_read_fast(c, l, which, obj, dictslot);
    if (v != NULL) {
        Py_INCREF(v);
        *value = v;
        return 1;
    }
    return kv_read_slow(c, l, which, obj, value, dictslot, ran);
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
    int failed_in_kv;    /* KV_LEN_ERROR: the read that failed was req.kv's or its length's */
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
enum { KV_LEN_IMPURE = -2, KV_LEN_ERROR = -1, KV_LEN_MISSING = 0, KV_LEN_OK = 1,
       KV_LEN_VALUE = 2 };

/* Whether v is an exact int in [0, 2^63), with its value in *length. */
KV_HOT int kv_exact_length(PyObject *v, int64_t *length)
{
    if (!PyLong_CheckExact(v)) return 0;
    long long small;
    if (kv_small_int(v, &small)) { /* reqroute.h */
        if (small < 0) return 0;
        *length = (int64_t)small;
        return 1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || x < 0) return 0;
    *length = (int64_t)x;
    return 1;
}

/* req.<which> read where `at` says.  KV_LEN_OK: *length holds it (an exact
 * int in [0, 2^63)).  KV_LEN_VALUE: *value holds a new reference to a value
 * the Python input rule must judge (not an exact int, or negative, or too
 * large).  KV_LEN_MISSING: not there.  KV_LEN_IMPURE (pure modes): reading it
 * would run code of the caller's.  req.kv is kept in st->kv between the
 * reads of one request only while no Python code can have run (no generic
 * lookup, no dict search that compares keys), so that reading it again would
 * give the same object. */
KV_HOT int kv_req_length(kv_cache *c, PyObject *req, int which, int at,
                                kv_req_state *st, int64_t *length, PyObject **value)
{
    PyObject *v = NULL, *nested, *owned = NULL, **kvslot = NULL;
    kv_layout *l;
    int found = 0, ran = 0;
    st->failed_in_kv = at == KV_AT_NESTED;
    if (at != KV_AT_NESTED) {
        l = kv_layout_for(c, Py_TYPE(req));
        found = kv_read(c, l, which, req, &v, &st->dictslot, &ran);
        if (ran) kv_req_forget(st);
        if (found < 0) return found == KV_IMPURE ? KV_LEN_IMPURE : KV_LEN_ERROR;
        if (!found && at == KV_AT_FLAT) return KV_LEN_MISSING;
    }
    if (!found) {
        st->failed_in_kv = 1;
        nested = st->kv;
        if (nested == NULL) {
            l = kv_layout_for(c, Py_TYPE(req));
            ran = 0;
            found = kv_read(c, l, KV_NESTED, req, &owned, &st->dictslot, &ran);
            if (found < 0) return found == KV_IMPURE ? KV_LEN_IMPURE : KV_LEN_ERROR;
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
        kv_release(&c->cx.gc, owned);
        if (ran) kv_req_forget(st);
        if (found < 0) return found == KV_IMPURE ? KV_LEN_IMPURE : KV_LEN_ERROR;
        if (!found) return KV_LEN_MISSING;
    }
    if (kv_exact_length(v, length)) {
        Py_DECREF(v);
        return KV_LEN_OK;
    }
    *value = v;
    return KV_LEN_VALUE;
}

/* ------------------------------------------------------------------ runs */

/* A scheduler's batch is requests of one class, each keeping its lengths in
 * the same place.  A run reads a stretch of them by loads alone (a slot, or
 * the instance dict's entry at its hint), the per-type work (the routes, whose
 * tags hold while no code runs, and none runs here; the hint; req.kv's type)
 * done once, from its first request.  What is left per request is the chain
 * of loads and a type compare at each link, short enough for the core to have
 * the next requests' loads in flight.  A request that differs in any way ends
 * the run, untouched: the caller reads it the usual way. */

/* Where a run finds one value: a slot at an offset (of req, or of req.kv),
 * or req's instance-dict entry at a hint. */
typedef struct {
    int nested; /* in req.kv, else in req itself */
    int route;  /* KV_ROUTE_MEMBER or KV_ROUTE_DICT */
    Py_ssize_t where; /* the slot's offset, or the hint */
    PyObject *name;   /* borrowed: the cache's name */
} kv_run_src;

typedef struct {
    PyTypeObject *req_type;
    PyTypeObject *kv_type; /* NULL: no length is nested */
    int req_dict;          /* a read needs req's instance dict */
    int both;
    int beam;              /* the value read is req.beam_group, counted if not None */
    int nested_slots;      /* SGLang 0.5.19+: req.kv in the dict, the lengths its slots */
    kv_run_src kv, len[2];
} kv_run;

/* src made from reader r, where a run can read that way: a set slot (an unset
 * one ends the run), or req's dict at a known hint. */
static int kv_run_src_from(kv_run_src *src, const kv_known *r, PyObject *name, int nested)
{
    src->nested = nested;
    src->name = name;
    src->route = r->route.get;
    if (r->route.get == KV_ROUTE_MEMBER && !r->route.none_if_unset) {
        src->where = r->route.offset;
        return 1;
    }
    src->where = r->hint;
    return r->route.get == KV_ROUTE_DICT && r->hint >= 0 && !nested;
}

/* The run that starts at request `first`, reading its committed length (or,
 * `beam`, its beam_group) and, `both`, its allocated one: 1 with *run set,
 * or 0 when it cannot start there (the caller then reads it the usual way). */
static int kv_run_begin(kv_cache *c, kv_run *run, PyObject *first, int at_committed,
                        int at_allocated, int both, int beam)
{
#if KV_PRIVATE
    PyTypeObject *rt = Py_TYPE(first);
    int need_kv = at_committed == KV_AT_NESTED || (both && at_allocated == KV_AT_NESTED);
    int at[2] = {at_committed, at_allocated};
    kv_layout *l;
    for (int k = 0; k < 1 + both; k++)
        if (at[k] != KV_AT_FLAT && at[k] != KV_AT_NESTED) return 0;
    run->req_type = rt;
    run->kv_type = NULL;
    run->both = both;
    run->beam = beam;
    if (need_kv) {
        PyObject **dictslot = NULL, *kv;
        l = kv_layout_for(c, rt);
        if (!kv_run_src_from(&run->kv, kv_layout_read(c, l, KV_NESTED), c->names[KV_NESTED], 0))
            return 0;
        kv = kv_read_fast(c, l, KV_NESTED, first, &dictslot);
        if (kv == NULL) return 0;
        run->kv_type = Py_TYPE(kv);
    }
    /* Each layout looked up again: a lookup may take another's cache slot. */
    for (int k = 0; k < 1 + both; k++) {
        int which = k ? KV_ALLOCATED : beam ? KV_BEAM : KV_COMMITTED;
        int nested = at[k] == KV_AT_NESTED;
        l = kv_layout_for(c, nested ? run->kv_type : rt);
        if (!kv_run_src_from(&run->len[k], kv_layout_read(c, l, which), c->names[which], nested))
            return 0;
    }
    /* Both types' tags were current when their layouts were looked up, and no
     * Python code runs from there to the run's end: the routes hold for it. */
    run->req_dict = (need_kv && run->kv.route == KV_ROUTE_DICT)
                    || (!run->len[0].nested && run->len[0].route == KV_ROUTE_DICT)
                    || (both && !run->len[1].nested && run->len[1].route == KV_ROUTE_DICT);
    run->nested_slots = need_kv && run->kv.route == KV_ROUTE_DICT;
    for (int k = 0; k < 1 + both; k++)
        run->nested_slots &= run->len[k].nested && run->len[k].route == KV_ROUTE_MEMBER;
    return 1;
#else
    (void)c, (void)run, (void)first, (void)at_committed, (void)at_allocated, (void)both;
    (void)beam;
    return 0;
#endif
}

#if KV_PRIVATE
/* The value src points at in owner (or in dict), borrowed, or NULL. */
KV_HOT PyObject *kv_run_get(const kv_run_src *src, PyObject *owner, PyObject *dict)
{
    if (src->route == KV_ROUTE_MEMBER) return kv_slot_at(owner, src->where);
    return kv_dict_at(dict, src->where, src->name);
}

/* One request's value in a run: an exact length in [0, 2^63), or (beam)
 * whether req.beam_group is not None.  0 when the run ends there. */
KV_HOT int kv_run_value(int beam, PyObject *v, int64_t *out)
{
    if (v == NULL) return 0;
    if (beam) {
        *out = v != Py_None;
        return 1;
    }
    return kv_exact_length(v, out);
}

/* The run's one loop.  `usual` is a constant at each call, so the compiler
 * makes two loops of this body: the usual shape (no rows, req.kv at a dict
 * hint, the lengths slots of req.kv: SGLang 0.5.19 on) with its tests
 * folded away, and every other shape.  The run's fields are copied to locals
 * first: the stores to committed[] could otherwise alias them. */
KV_HOT Py_ssize_t kv_run_loop(kv_gc *g, const kv_run *run, PyObject *const *items,
                              Py_ssize_t start, Py_ssize_t end, int64_t *committed,
                              int64_t *allocated, const int usual)
{
    PyTypeObject *const rt = run->req_type, *const kt = run->kv_type;
    const kv_run_src kvs = run->kv, c = run->len[0], a = run->len[1];
    const int req_dict = usual || run->req_dict, both = run->both, beam = !usual && run->beam;
    Py_ssize_t i;
    for (i = start; i < end; i++) {
        PyObject *req = items[i], *dict = NULL, *kv = NULL, *v;
        if (Py_TYPE(req) != rt) break;
        if (req_dict) {
            if ((dict = kv_dict_of(g, req)) == NULL) break;
        }
        if (usual || kt != NULL) {
            kv = usual ? kv_dict_at(dict, kvs.where, kvs.name) : kv_run_get(&kvs, req, dict);
            if (kv == NULL || Py_TYPE(kv) != kt) break;
        }
        v = usual ? kv_slot_at(kv, c.where) : kv_run_get(&c, c.nested ? kv : req, dict);
        if (!kv_run_value(beam, v, &committed[i - start])) break;
        if (both) {
            v = usual ? kv_slot_at(kv, a.where)
                      : kv_run_get(&a, a.nested ? kv : req, dict);
            if (!kv_run_value(0, v, &allocated[i - start])) break;
        }
    }
    return i - start;
}
#endif

/* The values of items[start, end) into committed[] and allocated[] from
 * index 0, for as long as each request reads the way the run's first did.
 * Returns how many it read.  Runs no Python code and takes no reference;
 * collections are held off from any dict it builds (the caller lets them
 * run again before code of its own). */
static Py_ssize_t kv_run_read(kv_cache *c, const kv_run *run, PyObject *const *items,
                              Py_ssize_t start, Py_ssize_t end, int64_t *committed,
                              int64_t *allocated)
{
#if KV_PRIVATE
    if (run->nested_slots)
        return kv_run_loop(&c->cx.gc, run, items, start, end, committed, allocated, 1);
    return kv_run_loop(&c->cx.gc, run, items, start, end, committed, allocated, 0);
#else
    (void)c, (void)run, (void)items, (void)start, (void)end, (void)committed, (void)allocated;
    return 0;
#endif
}

#endif
