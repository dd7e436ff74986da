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
 * worked out once per type (a kv_layout, one kv_route per name: reqroute.h,
 * the core the writers share) and trusted for as long as the type's version
 * tag holds.  A read is a slot read at a member descriptor's offset, an
 * instance-dict probe, or the generic lookup.
 *
 * Modes (kv_cache.pure):
 *   KV_PURE_OFF    the reads above, Python code and all;
 *   KV_PURE_STRICT never run code of the caller's: a read that would (a
 *                  generic route, a dict whose keys are not all exact str
 *                  where the name is not found) gives KV_IMPURE instead, and
 *                  a dict read misses the learned position only for a scan
 *                  that compares no key with code of its own (reqroute.h);
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

enum { KV_READ_DICT = KV_ROUTE_DICT, KV_READ_MEMBER = KV_ROUTE_MEMBER,
       KV_READ_GENERIC = KV_ROUTE_GENERIC };
/* The names read: indices into kv_cache.names and kv_layout.read. */
enum { KV_COMMITTED = 0, KV_ALLOCATED = 1, KV_NESTED = 2, KV_BEAM = 3, KV_ROWS = 4,
       KV_NUM_NAMES = 5 };
enum { KV_PURE_OFF = 0, KV_PURE_STRICT = 1, KV_PURE_QUICK = 2 };

typedef struct {
    kv_route route; /* its get is a KV_READ_* */
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
    int pure;  /* KV_PURE_* */
    kv_gc gc;
} kv_cache;

static inline void kv_cache_init(kv_cache *c, PyObject *committed, PyObject *allocated,
                                 PyObject *nested, PyObject *beam, PyObject *rows, int pure)
{
    memset(c, 0, sizeof(*c));
    c->learn = 4;
    c->pure = pure;
    c->names[KV_COMMITTED] = committed;
    c->names[KV_ALLOCATED] = allocated;
    c->names[KV_NESTED] = nested;
    c->names[KV_BEAM] = beam;
    c->names[KV_ROWS] = rows;
    kv_gc_init(&c->gc);
}

/* A cache kept past the call (the SGLang glue's, one per statement), made
 * ready for the next: the layouts stay where a version tag keys them past a
 * call (the memo's rule below), all else starts again. */
static inline void kv_cache_renew(kv_cache *c, int pure)
{
#if KV_SHORTCUTS && KV_PRIVATE
    c->learn = 4;
    c->pure = pure;
    kv_gc_init(&c->gc);
#else
    kv_cache_init(c, c->names[KV_COMMITTED], c->names[KV_ALLOCATED], c->names[KV_NESTED],
                  c->names[KV_BEAM], c->names[KV_ROWS], pure);
#endif
}

/* Collections held off from here (the address-ordered walk), until let. */
static inline void kv_cache_hold(kv_cache *c)
{
    kv_gc_hold(&c->gc);
}

/* Before the caller's code runs, and when the call ends (reqroute.h). */
static inline void kv_cache_let(kv_cache *c)
{
    kv_gc_let(&c->gc);
}

static void kv_reader_init(kv_reader *r, PyTypeObject *t, PyObject *name, int pure)
{
    kv_route_resolve(&r->route, t, name, pure);
    r->hint = -1;
}

/* Layouts kept past a call, keyed as the call's own are (type, version tag)
 * and by the names read: a type's routes are worked out once per tag, not
 * once per call (a few hundred instructions per type, tools/instructions.py).
 * Behind the fence a tag keys nothing past a call (typetag.h): none kept. */
#if KV_SHORTCUTS && KV_PRIVATE
#define KV_LAYOUT_MEMO 8
typedef struct {
    kv_layout layout;
    PyObject *names[KV_NUM_NAMES];
} kv_layout_kept;
static kv_layout_kept kv_layouts_kept[KV_LAYOUT_MEMO];
static int kv_layouts_next;

static int kv_layout_recall(kv_cache *c, PyTypeObject *t, kv_layout *l)
{
    for (int i = 0; i < KV_LAYOUT_MEMO; i++) {
        kv_layout_kept *e = &kv_layouts_kept[i];
        if (kv_route_current(e->layout.type, e->layout.version, t)
            && memcmp(e->names, c->names, sizeof(e->names)) == 0) {
            *l = e->layout;
            for (int k = 0; k < KV_NUM_NAMES; k++) /* the hints learned since */
                if (l->read[k].route.get == KV_READ_DICT)
                    l->read[k].hint = kv_hint_find(t, l->version, c->names[k]);
            return 1;
        }
    }
    return 0;
}

static void kv_layout_keep(kv_cache *c, const kv_layout *l)
{
    kv_layout_kept *e = &kv_layouts_kept[kv_layouts_next];
    kv_layouts_next = (kv_layouts_next + 1) % KV_LAYOUT_MEMO;
    e->layout = *l;
    memcpy(e->names, c->names, sizeof(e->names));
}
#endif

static kv_layout *kv_layout_resolve(kv_cache *c, PyTypeObject *t)
{
    kv_layout *l = NULL;
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (c->slots[i].type == t) l = &c->slots[i]; /* a stale entry: redo it */
    if (l == NULL) {
        l = &c->slots[c->next];
        c->next = (c->next + 1) % KV_CACHE_SLOTS;
    }
#if KV_SHORTCUTS && KV_PRIVATE
    if (kv_layout_recall(c, t, l)) return l;
#endif
    for (int k = 0; k < KV_NUM_NAMES; k++)
        kv_reader_init(&l->read[k], t, c->names[k], c->pure);
    l->type = t;
    /* The lookups assign a version tag if the type can have one; without one
     * the entry is never current and the type is resolved again each time. */
    l->version = kv_tag_valid(t) ? kv_tag(t) : 0;
    if (!kv_tag_valid(t)) l->type = NULL;
    if (l->type)
        for (int k = 0; k < KV_NUM_NAMES; k++)
            if (l->read[k].route.get == KV_READ_DICT)
                l->read[k].hint = kv_hint_find(t, l->version, c->names[k]);
#if KV_SHORTCUTS && KV_PRIVATE
    if (l->type) kv_layout_keep(c, l);
#endif
    return l;
}

/* Records `pos` (where names[which] sits in a dict that holds it) as l's hint. */
static void kv_keep_hint(kv_cache *c, kv_layout *l, int which, Py_ssize_t pos)
{
    l->read[which].hint = pos;
    kv_hint_keep(l->type, l->version, c->names[which], pos);
}

/* Finds where names[which] sits in `dict` (which holds it) for l's hint. */
static void kv_learn_hint(kv_cache *c, kv_layout *l, int which, PyObject *dict)
{
    Py_ssize_t pos = kv_dict_position(dict, c->names[which]);
    c->learn--;
    if (pos >= 0) kv_keep_hint(c, l, which, pos);
}

KV_HOT kv_layout *kv_layout_for(kv_cache *c, PyTypeObject *t)
{
    for (int i = 0; i < KV_CACHE_SLOTS; i++)
        if (c->slots[i].type == t) {
            if (kv_route_current(t, c->slots[i].version, t)) return &c->slots[i];
            break;
        }
    return kv_layout_resolve(c, t);
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
    kv_reader *r = &l->read[which];
    if (r->route.get == KV_READ_MEMBER) return kv_slot_get(&r->route, obj, c->names[which]);
    if (r->route.get == KV_READ_DICT && r->hint >= 0) {
        if (!KV_DICT_CACHED || *dictslot == NULL) *dictslot = kv_dictptr(&c->gc, obj);
        if (*dictslot != NULL && **dictslot != NULL)
            return kv_dict_at(**dictslot, r->hint, c->names[which]); /* reqroute.h */
    }
#else
    (void)c;
    (void)l;
    (void)which;
    (void)obj;
    (void)dictslot;
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
    kv_reader *r = &l->read[which];
    PyObject *v, *name = c->names[which];
#if KV_SHORTCUTS
    if (r->route.get == KV_READ_MEMBER) return 0; /* an unset slot */
    if (r->route.get == KV_READ_DICT) {
        if (!KV_DICT_CACHED || *dictslot == NULL) *dictslot = kv_dictptr(&c->gc, obj);
        if (*dictslot != NULL) {
            PyObject *dict = **dictslot;
            if (dict == NULL) return 0;
            if (c->pure) {
                Py_ssize_t at;
                int found;
                /* The quick mode gives up rather than search -- but behind
                 * the fence nothing else learns where names sit. */
                if (c->pure == KV_PURE_QUICK && KV_PRIVATE) return KV_IMPURE;
                found = kv_dict_scan(dict, name, &v, &at);
                if (found != 1) return found;
                kv_keep_hint(c, l, which, at);
                *value = Py_NewRef(v);
                return 1;
            }
            /* The probe can run a colliding key's __eq__: hold the dict. */
            *ran = 1;
            kv_cache_let(c);
            Py_INCREF(dict);
            v = PyDict_GetItemWithError(dict, name);
            Py_XINCREF(v);
            if (v != NULL && c->learn > 0) kv_learn_hint(c, l, which, dict);
            Py_DECREF(dict);
            if (v == NULL) return PyErr_Occurred() ? -1 : 0;
            *value = v;
            return 1;
        }
        /* No instance dict to read: the generic lookup raises AttributeError
         * and runs nothing else (the route is generic getattr's). */
        if (c->pure) return 0;
    }
#else
    (void)r;
#endif
    if (c->pure) return KV_IMPURE;
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

/* Both reads of one request in the common case, taking no reference: req
 * (and req.kv where the lengths are nested) read by shortcuts alone
 * (kv_read_fast: a slot, or the instance dict's entry at the learned hint),
 * each length an exact int in [0, 2^63).  Returns 1 with *committed (and
 * *allocated where `both`) set; 0 when anything is otherwise, with nothing
 * changed: kv_req_length then reads from the start.  Nothing here runs Python
 * code or releases an object, so the borrowed pointers hold throughout (an
 * instance dict built on the way is built with collections held, as always). */
KV_HOT int kv_req_quick(kv_cache *c, PyObject *req, int at_committed, int at_allocated,
                        int both, int64_t *committed, int64_t *allocated)
{
    PyObject *obj = req, **dictslot = NULL, *v;
    kv_layout *l;
    if (both && at_committed != at_allocated) return 0;
    if (at_committed == KV_AT_NESTED) {
        l = kv_layout_for(c, Py_TYPE(req));
        obj = kv_read_fast(c, l, KV_NESTED, req, &dictslot);
        if (obj == NULL) return 0;
        dictslot = NULL;
    } else if (at_committed != KV_AT_FLAT) {
        return 0;
    }
    l = kv_layout_for(c, Py_TYPE(obj));
    v = kv_read_fast(c, l, KV_COMMITTED, obj, &dictslot);
    if (v == NULL || !kv_exact_length(v, committed)) return 0;
    if (both) {
        v = kv_read_fast(c, l, KV_ALLOCATED, obj, &dictslot);
        if (v == NULL || !kv_exact_length(v, allocated)) return 0;
    }
    return 1;
}

/* req.beam_group by shortcuts alone (as kv_req_quick reads): 1 with *grouped
 * set (whether it is not None), or 0 with nothing changed. */
KV_HOT int kv_group_quick(kv_cache *c, PyObject *req, int *grouped)
{
    PyObject **dictslot = NULL;
    PyObject *v = kv_read_fast(c, kv_layout_for(c, Py_TYPE(req)), KV_BEAM, req, &dictslot);
    if (v == NULL) return 0;
    *grouped = v != Py_None;
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
    if (at != KV_AT_NESTED) {
        l = kv_layout_for(c, Py_TYPE(req));
        found = kv_read(c, l, which, req, &v, &st->dictslot, &ran);
        if (ran) kv_req_forget(st);
        if (found < 0) return found == KV_IMPURE ? KV_LEN_IMPURE : KV_LEN_ERROR;
        if (!found && at == KV_AT_FLAT) return KV_LEN_MISSING;
    }
    if (!found) {
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
        Py_XDECREF(owned);
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
 * the same place.  A run reads a stretch of them as kv_req_quick would, but
 * with the per-type work done once, from its first request: the routes (the
 * version tags checked then hold while no Python code runs, and none runs
 * here), the dict hint, req.kv's type.  What is left per request is the
 * chain of loads itself and a type compare at each link; the loop is short
 * enough for the core to have the next requests' loads in flight meanwhile.
 * A request that differs in any way ends the run, untouched: the caller
 * reads it the usual way. */

/* Where a run finds one value: a slot at an offset (of req, or of req.kv),
 * or req's instance-dict entry at a hint. */
typedef struct {
    int nested; /* in req.kv, else in req itself */
    int route;  /* KV_READ_MEMBER or KV_READ_DICT */
    Py_ssize_t where; /* the slot's offset, or the hint */
    PyObject *name;   /* borrowed: the cache's name */
} kv_run_src;

typedef struct {
    PyTypeObject *req_type;
    PyTypeObject *kv_type; /* NULL: no length is nested */
    int req_dict;          /* a read needs req's instance dict */
    int both;
    int nested_slots;      /* SGLang 0.5.19+: req.kv in the dict, the lengths its slots */
    kv_run_src kv, len[2];
} kv_run;

/* src made from reader r, where a run can read that way: a set slot (an unset
 * one ends the run, as it ends the quick read), or req's dict at a known hint. */
static int kv_run_src_from(kv_run_src *src, const kv_reader *r, PyObject *name, int nested)
{
    src->nested = nested;
    src->name = name;
    src->route = r->route.get;
    if (r->route.get == KV_READ_MEMBER && !r->route.none_if_unset) {
        src->where = r->route.offset;
        return 1;
    }
    src->where = r->hint;
    return r->route.get == KV_READ_DICT && r->hint >= 0 && !nested;
}

/* The run that starts at request `first`: 1 with *run set, or 0 when the
 * quick read would not take it (the caller then reads it the usual way). */
static int kv_run_begin(kv_cache *c, kv_run *run, PyObject *first, int at_committed,
                        int at_allocated, int both)
{
#if KV_SHORTCUTS && KV_PRIVATE
    PyTypeObject *rt = Py_TYPE(first);
    int need_kv = at_committed == KV_AT_NESTED || (both && at_allocated == KV_AT_NESTED);
    int at[2] = {at_committed, at_allocated};
    kv_layout *l;
    for (int k = 0; k < 1 + both; k++)
        if (at[k] != KV_AT_FLAT && at[k] != KV_AT_NESTED) return 0;
    run->req_type = rt;
    run->kv_type = NULL;
    run->both = both;
    if (need_kv) {
        PyObject **dictslot = NULL, *kv;
        l = kv_layout_for(c, rt);
        if (!kv_run_src_from(&run->kv, &l->read[KV_NESTED], c->names[KV_NESTED], 0)) return 0;
        kv = kv_read_fast(c, l, KV_NESTED, first, &dictslot);
        if (kv == NULL) return 0;
        run->kv_type = Py_TYPE(kv);
    }
    /* Each layout looked up again: a lookup may take another's cache slot. */
    for (int k = 0; k < 1 + both; k++) {
        int which = k ? KV_ALLOCATED : KV_COMMITTED, nested = at[k] == KV_AT_NESTED;
        l = kv_layout_for(c, nested ? run->kv_type : rt);
        if (!kv_run_src_from(&run->len[k], &l->read[which], c->names[which], nested)) return 0;
    }
    /* Both types' tags were current when their layouts were looked up, and no
     * Python code runs from there to the run's end: the routes hold for it. */
    run->req_dict = (need_kv && run->kv.route == KV_READ_DICT)
                    || (!run->len[0].nested && run->len[0].route == KV_READ_DICT)
                    || (both && !run->len[1].nested && run->len[1].route == KV_READ_DICT);
    run->nested_slots = need_kv && run->kv.route == KV_READ_DICT;
    for (int k = 0; k < 1 + both; k++)
        run->nested_slots &= run->len[k].nested && run->len[k].route == KV_READ_MEMBER;
    return 1;
#else
    (void)c;
    (void)run;
    (void)first;
    (void)at_committed;
    (void)at_allocated;
    (void)both;
    return 0;
#endif
}

#if KV_SHORTCUTS && KV_PRIVATE
/* The value src points at in owner (or in dict), borrowed, or NULL. */
KV_HOT PyObject *kv_run_get(const kv_run_src *src, PyObject *owner, PyObject *dict)
{
    if (src->route == KV_READ_MEMBER) return *(PyObject **)((char *)owner + src->where);
    return kv_dict_at(dict, src->where, src->name);
}
#endif

#if KV_SHORTCUTS && KV_PRIVATE
/* kv_run_read's loop for a run's usual shape, the reads it stands for the
 * same: no rows, req.kv at a dict hint, the lengths slots of req.kv. */
static Py_ssize_t kv_run_read_nested(const kv_run *run, PyObject *const *items,
                                     Py_ssize_t start, Py_ssize_t end, int64_t *committed,
                                     int64_t *allocated)
{
    PyTypeObject *rt = run->req_type, *kt = run->kv_type;
    PyObject *name = run->kv.name;
    Py_ssize_t hint = run->kv.where, at_c = run->len[0].where, at_a = run->len[1].where, i;
    for (i = start; i < end; i++) {
        PyObject *req = items[i], **dictptr, *kv, *v;
        if (Py_TYPE(req) != rt) break;
        dictptr = _PyObject_GetDictPtr(req);
        if (dictptr == NULL || *dictptr == NULL) break;
        kv = kv_dict_at(*dictptr, hint, name);
        if (kv == NULL || Py_TYPE(kv) != kt) break;
        v = *(PyObject **)((char *)kv + at_c);
        if (v == NULL || !kv_exact_length(v, &committed[i - start])) break;
        if (run->both) {
            v = *(PyObject **)((char *)kv + at_a);
            if (v == NULL || !kv_exact_length(v, &allocated[i - start])) break;
        }
    }
    return i - start;
}
#endif

/* The lengths of rows [start, end) -- items[rows[i]] where rows is not NULL
 * (a row outside [0, size) ends the run), else items[i] -- into committed[]
 * and allocated[] from index 0, for as long as each request reads the way the
 * run's first did.  Returns how many it read.  Runs no Python code and takes
 * no reference; collections are held off from here (the caller lets them run
 * again before code of its own, as after the quick reads). */
static Py_ssize_t kv_run_read(kv_cache *c, const kv_run *run, PyObject *const *items,
                              const int64_t *rows, Py_ssize_t size, Py_ssize_t start,
                              Py_ssize_t end, int64_t *committed, int64_t *allocated)
{
    Py_ssize_t i = start;
#if KV_SHORTCUTS && KV_PRIVATE
    kv_gc_hold(&c->gc);
    if (rows == NULL && run->nested_slots)
        return kv_run_read_nested(run, items, start, end, committed, allocated);
    for (; i < end; i++) {
        PyObject *req, *dict = NULL, *kv = NULL, *v;
        if (rows != NULL) {
            if ((uint64_t)rows[i] >= (uint64_t)size) break;
            req = items[rows[i]];
        } else {
            req = items[i];
        }
        if (Py_TYPE(req) != run->req_type) break;
        if (run->req_dict) {
            PyObject **dictptr = _PyObject_GetDictPtr(req);
            if (dictptr == NULL || (dict = *dictptr) == NULL) break;
        }
        if (run->kv_type != NULL) {
            kv = kv_run_get(&run->kv, req, dict);
            if (kv == NULL || Py_TYPE(kv) != run->kv_type) break;
        }
        v = kv_run_get(&run->len[0], run->len[0].nested ? kv : req, dict);
        if (v == NULL || !kv_exact_length(v, &committed[i - start])) break;
        if (run->both) {
            v = kv_run_get(&run->len[1], run->len[1].nested ? kv : req, dict);
            if (v == NULL || !kv_exact_length(v, &allocated[i - start])) break;
        }
    }
#else
    (void)c;
    (void)run;
    (void)items;
    (void)rows;
    (void)size;
    (void)end;
    (void)committed;
    (void)allocated;
#endif
    return i - start;
}

#endif
