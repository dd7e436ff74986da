/*
 * AVX2 versions of the "magic" loops (page sizes that are not powers of two),
 * included by loops_variant.h for the avx2 target only, once per length type.
 *
 * GCC and Clang vectorize the portable loops well except here: AVX2 has no
 * 64-bit multiply, and the compilers emulate the full 64x64 product (three
 * multiplies and shuffles per vector).  The fast range keeps every dividend
 * below 2^31 and the magic number below 2^32, so one _mm256_mul_epu32 (the
 * low 32 bits of each 64-bit lane, widened) is the whole product.
 */
#include <immintrin.h>

/* Four lengths of type KV_T, sign-extended to 64-bit lanes. */
static inline __m256i KV_NAME(load4)(const KV_T *p)
{
#if KV_T_IS_INT32
    return _mm256_cvtepi32_epi64(_mm_loadu_si128((const __m128i *)p));
#else
    return _mm256_loadu_si256((const __m256i *)p);
#endif
}

static inline uint64_t KV_NAME(hsum)(__m256i v)
{
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

static inline uint64_t KV_NAME(hor)(__m256i v)
{
    __m128i s = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) | (uint64_t)_mm_extract_epi64(s, 1);
}

#define KV_AVX2_SETUP                                                          \
    const __m256i vmagic = _mm256_set1_epi64x((int64_t)d->magic);             \
    const __m128i vshift = _mm_cvtsi64_si128((int64_t)d->mshift);             \
    const __m256i zero = _mm256_setzero_si256();                              \
    __m256i acc = zero, vbits = zero;                                          \
    int64_t i = 0
#define KV_AVX2_FDIV(x) _mm256_srl_epi64(_mm256_mul_epu32((x), vmagic), vshift)

static uint64_t KV_NAME(spec_v2_magic)(const void *c_, const void *a_, int64_t n,
                                       const kv_divisor *d, uint64_t reserve,
                                       uint64_t *bits_out)
{
    const KV_T *c = (const KV_T *)c_, *a = (const KV_T *)a_;
    KV_AVX2_SETUP;
    const __m256i vneed = _mm256_set1_epi64x((int64_t)(reserve + d->pm1));
    const __m256i vpm1 = _mm256_set1_epi64x((int64_t)d->pm1);
    for (; i + 4 <= n; i += 4) {
        __m256i ci = KV_NAME(load4)(c + i), ai = KV_NAME(load4)(a + i);
        vbits = _mm256_or_si256(vbits, _mm256_or_si256(ci, ai));
        __m256i grow = _mm256_sub_epi64(KV_AVX2_FDIV(_mm256_add_epi64(ci, vneed)),
                                        KV_AVX2_FDIV(_mm256_add_epi64(ai, vpm1)));
        acc = _mm256_add_epi64(acc, _mm256_and_si256(grow, _mm256_cmpgt_epi64(grow, zero)));
    }
    uint64_t pages = KV_NAME(hsum)(acc), bits = KV_NAME(hor)(vbits);
    for (; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i], ai = (uint64_t)(int64_t)a[i];
        bits |= ci | ai;
        int64_t grow = (int64_t)(kv_cdiv(ci + reserve, d) - kv_cdiv(ai, d));
        pages += (uint64_t)(grow > 0 ? grow : 0);
    }
    *bits_out = bits;
    return pages;
}

static uint64_t KV_NAME(mod_count_magic)(const void *c_, int64_t n, const kv_divisor *d,
                                         uint64_t want, uint64_t *bits_out)
{
    const KV_T *c = (const KV_T *)c_;
    KV_AVX2_SETUP;
    const __m256i vp = _mm256_set1_epi64x((int64_t)d->p);
    const __m256i vwant = _mm256_set1_epi64x((int64_t)want);
    for (; i + 4 <= n; i += 4) {
        __m256i ci = KV_NAME(load4)(c + i);
        vbits = _mm256_or_si256(vbits, ci);
        __m256i rem = _mm256_sub_epi64(ci, _mm256_mul_epu32(KV_AVX2_FDIV(ci), vp));
        acc = _mm256_sub_epi64(acc, _mm256_cmpeq_epi64(rem, vwant)); /* true lanes are -1 */
    }
    uint64_t count = KV_NAME(hsum)(acc), bits = KV_NAME(hor)(vbits);
    for (; i < n; i++) {
        uint64_t ci = (uint64_t)(int64_t)c[i];
        bits |= ci;
        count += kv_mod(ci, d) == want;
    }
    *bits_out = bits;
    return count;
}

static uint64_t KV_NAME(extend_pages_magic)(const void *s_, const void *pre_, int64_t n,
                                            const kv_divisor *d, uint64_t *bits_out)
{
    const KV_T *s = (const KV_T *)s_, *pre = (const KV_T *)pre_;
    KV_AVX2_SETUP;
    const __m256i vpm1 = _mm256_set1_epi64x((int64_t)d->pm1);
    for (; i + 4 <= n; i += 4) {
        __m256i si = KV_NAME(load4)(s + i), pi = KV_NAME(load4)(pre + i);
        vbits = _mm256_or_si256(vbits, _mm256_or_si256(si, pi));
        acc = _mm256_add_epi64(acc, _mm256_sub_epi64(KV_AVX2_FDIV(_mm256_add_epi64(si, vpm1)),
                                                     KV_AVX2_FDIV(_mm256_add_epi64(pi, vpm1))));
    }
    uint64_t pages = KV_NAME(hsum)(acc), bits = KV_NAME(hor)(vbits);
    for (; i < n; i++) {
        uint64_t si = (uint64_t)(int64_t)s[i], pi = (uint64_t)(int64_t)pre[i];
        bits |= si | pi;
        pages += kv_cdiv(si, d) - kv_cdiv(pi, d);
    }
    *bits_out = bits;
    return pages;
}

#undef KV_AVX2_SETUP
#undef KV_AVX2_FDIV
