/*
 * One definition of each row formula, for every compiled path: the C loops'
 * scalar (gather) loops, the checked loops of the array kernels and the
 * request-object kernels all call these.  All inputs are non-negative
 * lengths (the callers check); p >= 1, reserve >= 0.
 *
 * Two flavours:
 *   - "fast" rows assume the fast range of loops.h (every length, p and the
 *     reserve below KV_FAST_LIMIT): no intermediate can overflow, and the
 *     division is the precomputed kv_divisor;
 *   - "checked" rows take any int64 inputs and report an int64 overflow by
 *     returning non-zero, leaving the result unset.
 */
#ifndef KVEST_ROWS_H
#define KVEST_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "loops.h"

/* ceil(x / p), x >= 0, p >= 1, no overflow for any int64 x. */
static inline int64_t kv_ceil_div(int64_t x, int64_t p)
{
    return x / p + (x % p != 0);
}

/* spec v2, fast range: pages the row grows by, max(0, ceil(C+R) - ceil(A)). */
static inline uint64_t kv_spec_v2_row_fast(uint64_t c, uint64_t a, uint64_t reserve,
                                           const kv_divisor *d)
{
    int64_t grow = (int64_t)(kv_cdiv(c + reserve, d) - kv_cdiv(a, d));
    return (uint64_t)(grow > 0 ? grow : 0);
}

/* spec v2, checked: *tokens = ceil_align(max(A, C + R), p) - ceil_align(A, p). */
static inline int kv_spec_v2_row(int64_t c, int64_t a, int64_t p, int64_t reserve,
                                 int64_t *tokens)
{
    if (c > INT64_MAX - reserve) return 1;
    int64_t need = kv_ceil_div(c + reserve > a ? c + reserve : a, p);
    if (need > INT64_MAX / p) return 1;
    *tokens = (need - kv_ceil_div(a, p)) * p;
    return 0;
}

/* Adds a non-negative term to a non-negative running total; 1 on int64 overflow. */
static inline int kv_add_total(int64_t *total, int64_t term)
{
    if (*total > INT64_MAX - term) return 1;
    *total += term;
    return 0;
}

/* Decode: whether C mod p == want (0: a token page boundary; 1: a decode page). */
static inline int kv_mod_row_fast(uint64_t c, const kv_divisor *d, uint64_t want)
{
    return kv_mod(c, d) == want;
}

static inline int kv_mod_row(int64_t c, int64_t p, int64_t want)
{
    return c % p == want;
}

/* The fast rows over a chunk of lengths read from requests (kvest._reqs'
 * runs): the spec v2 pages of rows c[i], a[i], or (a NULL) how many c[i] sit
 * on a page boundary; *bits gets the OR of every length, and the answer is
 * exact when it stays below KV_FAST_LIMIT. */
static inline uint64_t kv_chunk_fast(const int64_t *c, const int64_t *a, int64_t k,
                                     uint64_t reserve, const kv_divisor *d, uint64_t *bits)
{
    uint64_t sum = 0, seen = 0;
    if (a == NULL) {
        for (int64_t i = 0; i < k; i++) {
            seen |= (uint64_t)c[i];
            sum += kv_mod_row_fast((uint64_t)c[i], d, 0);
        }
    } else {
        for (int64_t i = 0; i < k; i++) {
            seen |= (uint64_t)c[i] | (uint64_t)a[i];
            sum += kv_spec_v2_row_fast((uint64_t)c[i], (uint64_t)a[i], reserve, d);
        }
    }
    *bits = seen;
    return sum;
}

/* Allocation plan, checked: *nxt = max(A, ceil_align(C + R, p)) (aligned) or
 * max(A, C + R); 1 on int64 overflow.  The row's page growth is then
 * kv_ceil_div(*nxt, p) - kv_ceil_div(A, p), which never exceeds *nxt - A. */
static inline int kv_plan_row(int64_t c, int64_t a, int64_t p, int64_t reserve, int aligned,
                              int64_t *nxt)
{
    if (c > INT64_MAX - reserve) return 1;
    int64_t need = c + reserve;
    if (aligned) {
        need = kv_ceil_div(need, p);
        if (need > INT64_MAX / p) return 1;
        need *= p;
    }
    *nxt = need > a ? need : a;
    return 0;
}

/* Allocation plan, fast range: *nxt as kv_plan_row; returns the row's page
 * growth.  Every intermediate stays below 2^31 (see loops.h). */
static inline uint64_t kv_plan_row_fast(uint64_t c, uint64_t a, uint64_t reserve, int aligned,
                                        const kv_divisor *d, uint64_t *nxt)
{
    uint64_t need = c + reserve;
    if (aligned) need = kv_cdiv(need, d) * d->p;
    *nxt = need > a ? need : a;
    return kv_cdiv(*nxt, d) - kv_cdiv(a, d);
}

#endif
