/*
 * kvest's compiled loops: one portable C interface, several CPU variants.
 *
 * The Cython module validates arguments and calls the kv_* entry points
 * below with raw pointers; loops.c picks, once, the loop variant compiled for
 * the best instruction set the running CPU supports (runtime dispatch, so a
 * wheel built without -march flags still runs AVX2/AVX-512 code).
 */
#ifndef KVEST_LOOPS_H
#define KVEST_LOOPS_H

#include <stdint.h>

/* Fast range: page size, reserve and every length below 2^29 keep every
 * intermediate (at most 3 * 2^29) below 2^31, where the 32-bit magic division
 * is exact; rows are limited to 2^32 so no page sum can reach 2^63. */
#define KV_FAST_LIMIT ((uint64_t)1 << 29)
#define KV_FAST_MAX_ROWS ((int64_t)1 << 32)

/* Division by the page size p, precomputed once per call.
 * floor(x / p) == (x * magic) >> mshift for every x < 2^31 when p <= 2^30:
 * with l = ceil(log2 p), mshift = 31 + l and magic = ceil(2^mshift / p), the
 * error term x * (magic * p - 2^mshift) / (p * 2^mshift) stays below 1 / p. */
typedef struct {
    uint64_t p, pm1, magic, mshift, shift;
    int pow2;
} kv_divisor;

static inline void kv_divisor_init(kv_divisor *d, uint64_t p)
{
    uint64_t l = 0;
    while (((uint64_t)1 << l) < p) l++;
    d->p = p;
    d->pm1 = p - 1;
    d->pow2 = (p & (p - 1)) == 0;
    d->shift = l;
    d->mshift = 31 + l;
    d->magic = ((((uint64_t)1 << d->mshift) + p - 1) / p);
}

static inline uint64_t kv_fdiv(uint64_t x, const kv_divisor *d)
{
    return d->pow2 ? x >> d->shift : ((uint64_t)(uint32_t)x * d->magic) >> d->mshift;
}

static inline uint64_t kv_cdiv(uint64_t x, const kv_divisor *d)
{
    return kv_fdiv(x + d->pm1, d);
}

static inline uint64_t kv_mod(uint64_t x, const kv_divisor *d)
{
    return x - kv_fdiv(x, d) * d->p;
}

/* Entry points.  `lengths` arrays are int32 (itemsize 4) or int64 (itemsize 8),
 * contiguous; `idx` (may be NULL) holds m row numbers already checked to lie in
 * [-n, n).  Each returns a page or row count and stores in *bits the OR of every
 * length read; the result is exact whenever *bits < KV_FAST_LIMIT. */
uint64_t kv_spec_v2_pages(const void *c, const void *a, int itemsize, int64_t n,
                          const kv_divisor *d, uint64_t reserve,
                          const int64_t *idx, int64_t m, uint64_t *bits);
uint64_t kv_mod_count(const void *c, int itemsize, int64_t n, const kv_divisor *d,
                      uint64_t want, const int64_t *idx, int64_t m, uint64_t *bits);
uint64_t kv_extend_pages(const void *s, const void *pre, int itemsize, int64_t n,
                         const kv_divisor *d, uint64_t *bits);

/* CPU variants: 0 baseline, 1 avx2, 2 avx512. */
#define KV_NUM_VARIANTS 3
const char *kv_variant_name(int variant);
int kv_variant_supported(int variant);
int kv_best_variant(void);
/* Selects the variant the entry points run; returns 0, or -1 if unsupported. */
int kv_select_variant(int variant);
int kv_current_variant(void);

#endif
