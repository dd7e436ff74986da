/*
 * The hot loops of kvest, written once.  loops.c includes this file once per
 * (CPU target, length type) pair after defining:
 *
 *   KV_T       the element type of the length arrays (int32_t or int64_t)
 *   KV_NAME(x) the name of loop x for this pair, e.g. spec_v2_pow2_i64_avx2
 *
 * Every loop assumes the caller's "fast range" (see loops.h): page size and
 * reserve below KV_FAST_LIMIT, fewer than 2^32 rows.  Inside that range every
 * intermediate stays below 2^31, so the 32-bit magic-number division is exact
 * and no sum can wrap.  Each loop also returns the bitwise OR of every length
 * it read: the caller trusts the result only if that OR is below
 * KV_FAST_LIMIT, which at once rules out negative lengths (sign bit) and
 * lengths too large for the fast range.  Arithmetic is unsigned so that the
 * untrusted case wraps instead of invoking undefined behaviour.
 *
 * Loops come in pairs: "pow2" divides with a shift, "magic" with a multiply
 * by an invariant reciprocal (no hardware division, so it vectorizes), and
 * "gather" visits rows through a validated index array.  The scalar gather
 * loops take their row formula from rows.h, shared with every other compiled
 * path; the dense loops spell it out so that it vectorizes.
 */

/* ceil(x / p) for a power-of-two p = 1 << shift. */
#define KV_CDIV_POW2(x) (((x) + pm1) >> shift)
/* floor(x / p) for x < 2^31 through the magic multiplier (see loops.h).  Both
 * factors are explicitly 32-bit so the compiler emits a widening 32x32->64
 * multiply (vpmuludq), which AVX2 has, rather than a 64-bit one, which it lacks. */
#define KV_FDIV_MAGIC(x) (((uint64_t)(uint32_t)(x) * (uint64_t)magic) >> mshift)
#define KV_CDIV_MAGIC(x) KV_FDIV_MAGIC((x) + pm1)
/* Row i of an array read through the index array, negative counts from the end. */
#define KV_ROW(arr, k) (arr)[(k) < 0 ? (k) + n : (k)]

/* ---- spec v2: sum of max(0, ceil_div(C + R, p) - ceil_div(A, p)) pages ---- */

static uint64_t KV_NAME(spec_v2_pow2)(const void *c_, const void *a_,
                                      int64_t n, const kv_divisor *d, uint64_t reserve,
                                      uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_, *restrict a = (const KV_T *)a_;
    const uint64_t pm1 = d->pm1, shift = d->shift;
    uint64_t pages = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i], ai = (uint64_t)(int64_t)a[i];
        bits |= ci | ai;
        int64_t grow = (int64_t)(KV_CDIV_POW2(ci + reserve) - KV_CDIV_POW2(ai));
        pages += (uint64_t)(grow > 0 ? grow : 0);
    }
    *bits_out = bits;
    return pages;
}

#ifndef KV_CUSTOM_MAGIC /* the avx2 target brings its own (loops_avx2.h) */
static uint64_t KV_NAME(spec_v2_magic)(const void *c_, const void *a_,
                                       int64_t n, const kv_divisor *d, uint64_t reserve,
                                       uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_, *restrict a = (const KV_T *)a_;
    const uint64_t pm1 = d->pm1, mshift = d->mshift;
    const uint32_t magic = (uint32_t)d->magic;
    uint64_t pages = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i], ai = (uint64_t)(int64_t)a[i];
        bits |= ci | ai;
        int64_t grow = (int64_t)(KV_CDIV_MAGIC(ci + reserve) - KV_CDIV_MAGIC(ai));
        pages += (uint64_t)(grow > 0 ? grow : 0);
    }
    *bits_out = bits;
    return pages;
}
#endif

static uint64_t KV_NAME(spec_v2_gather)(const void *c_, const void *a_,
                                        int64_t n, const kv_divisor *d, uint64_t reserve,
                                        const int64_t *restrict idx, int64_t m,
                                        uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_, *restrict a = (const KV_T *)a_;
    uint64_t pages = 0, bits = 0;
    for (int64_t j = 0; j < m; j++) {
        int64_t k = idx[j];
        uint64_t ci = (uint64_t)(int64_t)KV_ROW(c, k), ai = (uint64_t)(int64_t)KV_ROW(a, k);
        bits |= ci | ai;
        pages += kv_spec_v2_row_fast(ci, ai, reserve, d);
    }
    *bits_out = bits;
    return pages;
}

/* ---- decode: count of rows with C mod p == want (0 for tokens, 1 for pages) ---- */

static uint64_t KV_NAME(mod_count_pow2)(const void *c_, int64_t n,
                                        const kv_divisor *d, uint64_t want,
                                        uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_;
    const uint64_t pm1 = d->pm1;
    uint64_t count = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i];
        bits |= ci;
        count += (ci & pm1) == want;
    }
    *bits_out = bits;
    return count;
}

#ifndef KV_CUSTOM_MAGIC /* the avx2 target brings its own (loops_avx2.h) */
static uint64_t KV_NAME(mod_count_magic)(const void *c_, int64_t n,
                                         const kv_divisor *d, uint64_t want,
                                         uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_;
    const uint64_t p = d->p, mshift = d->mshift;
    const uint32_t magic = (uint32_t)d->magic;
    uint64_t count = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i];
        bits |= ci;
        uint64_t q = KV_FDIV_MAGIC(ci);
        count += ci - (uint64_t)(uint32_t)q * (uint32_t)p == want;
    }
    *bits_out = bits;
    return count;
}
#endif

static uint64_t KV_NAME(mod_count_gather)(const void *c_, int64_t n,
                                          const kv_divisor *d, uint64_t want,
                                          const int64_t *restrict idx, int64_t m,
                                          uint64_t *bits_out)
{
    const KV_T *restrict c = (const KV_T *)c_;
    uint64_t count = 0, bits = 0;
    for (int64_t j = 0; j < m; j++) {
        int64_t k = idx[j];
        uint64_t ci = (uint64_t)(int64_t)KV_ROW(c, k);
        bits |= ci;
        count += kv_mod_row_fast(ci, d, want);
    }
    *bits_out = bits;
    return count;
}

/* ---- extend: sum of ceil_div(S, p) - ceil_div(P, p) pages (may be negative) ---- */

static uint64_t KV_NAME(extend_pages_pow2)(const void *s_, const void *pre_,
                                           int64_t n, const kv_divisor *d,
                                           uint64_t *bits_out)
{
    const KV_T *restrict s = (const KV_T *)s_, *restrict pre = (const KV_T *)pre_;
    const uint64_t pm1 = d->pm1, shift = d->shift;
    uint64_t pages = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t si = (uint64_t)(int64_t)s[i], pi = (uint64_t)(int64_t)pre[i];
        bits |= si | pi;
        pages += KV_CDIV_POW2(si) - KV_CDIV_POW2(pi);
    }
    *bits_out = bits;
    return pages; /* two's complement: the caller reads it as int64 */
}

#ifndef KV_CUSTOM_MAGIC /* the avx2 target brings its own (loops_avx2.h) */
static uint64_t KV_NAME(extend_pages_magic)(const void *s_, const void *pre_,
                                            int64_t n, const kv_divisor *d,
                                            uint64_t *bits_out)
{
    const KV_T *restrict s = (const KV_T *)s_, *restrict pre = (const KV_T *)pre_;
    const uint64_t pm1 = d->pm1, mshift = d->mshift;
    const uint32_t magic = (uint32_t)d->magic;
    uint64_t pages = 0, bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t si = (uint64_t)(int64_t)s[i], pi = (uint64_t)(int64_t)pre[i];
        bits |= si | pi;
        pages += KV_CDIV_MAGIC(si) - KV_CDIV_MAGIC(pi);
    }
    *bits_out = bits;
    return pages;
}
#endif

#undef KV_CDIV_POW2
#undef KV_FDIV_MAGIC
#undef KV_CDIV_MAGIC
#undef KV_ROW
