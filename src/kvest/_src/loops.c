/*
 * Runtime CPU dispatch for kvest's loops.
 *
 * The loops are compiled three times from one source (loops_body.h): for the
 * baseline target of the build, and, on x86-64 with GCC or Clang, for AVX2 and
 * AVX-512 through per-function target pragmas.  The best variant the CPU
 * supports is chosen when the module loads (kv_select_variant), from CPUID via
 * __builtin_cpu_supports, which needs no ifunc support from the C library, so
 * the same code builds against glibc or musl.  Other compilers and
 * architectures get the baseline variant only.
 */
#include "loops.h"
#include "rows.h"

#if defined(_MSC_VER) && !defined(__clang__)
#define restrict __restrict
#endif

/* Loop signatures; each table entry holds {int32 loop, int64 loop}. */
typedef uint64_t (*spec_v2_dense_fn)(const void *, const void *, int64_t,
                                     const kv_divisor *, uint64_t, uint64_t *);
typedef uint64_t (*spec_v2_gather_fn)(const void *, const void *, int64_t,
                                      const kv_divisor *, uint64_t, const int64_t *,
                                      int64_t, uint64_t *);
typedef uint64_t (*mod_count_dense_fn)(const void *, int64_t, const kv_divisor *,
                                       uint64_t, uint64_t *);
typedef uint64_t (*mod_count_gather_fn)(const void *, int64_t, const kv_divisor *,
                                        uint64_t, const int64_t *, int64_t, uint64_t *);
typedef uint64_t (*extend_pages_fn)(const void *, const void *, int64_t,
                                    const kv_divisor *, uint64_t *);
typedef struct {
    spec_v2_dense_fn spec_v2_pow2[2], spec_v2_magic[2];
    spec_v2_gather_fn spec_v2_gather[2];
    mod_count_dense_fn mod_count_pow2[2], mod_count_magic[2];
    mod_count_gather_fn mod_count_gather[2];
    extend_pages_fn extend_pages_pow2[2], extend_pages_magic[2];
} kv_table;

#define KV_TARGET baseline
#include "loops_variant.h"
#undef KV_TARGET

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define KV_X86_DISPATCH 1
#if defined(__clang__)
#define KV_PUSH_TARGET(t) _Pragma(t)
#define KV_POP_TARGET _Pragma("clang attribute pop")
#define KV_AVX2 "clang attribute push (__attribute__((target(\"avx2,bmi2,fma\"))), apply_to = function)"
#define KV_AVX512 "clang attribute push (__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2,fma\"))), apply_to = function)"
#else
#define KV_PUSH_TARGET(t) _Pragma("GCC push_options") _Pragma(t)
#define KV_POP_TARGET _Pragma("GCC pop_options")
#define KV_AVX2 "GCC target(\"avx2,bmi2,fma\")"
/* Generic tuning picks the vector width: forcing 512-bit vectors
 * (prefer-vector-width=512) measured no faster here on memory-bound sizes. */
#define KV_AVX512 "GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2,fma\")"
#endif

KV_PUSH_TARGET(KV_AVX2)
#define KV_TARGET avx2
#define KV_CUSTOM_MAGIC 1
#include "loops_variant.h"
#undef KV_CUSTOM_MAGIC
#undef KV_TARGET
KV_POP_TARGET

KV_PUSH_TARGET(KV_AVX512)
#define KV_TARGET avx512
#include "loops_variant.h"
#undef KV_TARGET
KV_POP_TARGET
#else
#define KV_X86_DISPATCH 0
#endif

static const kv_table *const kv_tables[KV_NUM_VARIANTS] = {
    &kv_table_baseline,
#if KV_X86_DISPATCH
    &kv_table_avx2, &kv_table_avx512,
#else
    0, 0,
#endif
};
static const char *const kv_names[KV_NUM_VARIANTS] = {"baseline", "avx2", "avx512"};

/* Written once at import (under the GIL) and only read afterwards. */
static int kv_variant = 0;

const char *kv_variant_name(int variant)
{
    return (variant >= 0 && variant < KV_NUM_VARIANTS) ? kv_names[variant] : "unknown";
}

int kv_variant_supported(int variant)
{
    if (variant == 0) return 1;
#if KV_X86_DISPATCH
    __builtin_cpu_init();
    if (variant == 1)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2")
               && __builtin_cpu_supports("fma");
    if (variant == 2)
        return kv_variant_supported(1) && __builtin_cpu_supports("avx512f")
               && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
               && __builtin_cpu_supports("avx512dq");
#endif
    return 0;
}

int kv_best_variant(void)
{
    int best = 0;
    for (int v = 1; v < KV_NUM_VARIANTS; v++)
        if (kv_variant_supported(v)) best = v;
    return best;
}

int kv_select_variant(int variant)
{
    if (variant < 0 || variant >= KV_NUM_VARIANTS || !kv_variant_supported(variant))
        return -1;
    kv_variant = variant;
    return 0;
}

int kv_current_variant(void) { return kv_variant; }

uint64_t kv_spec_v2_pages(const void *c, const void *a, int itemsize, int64_t n,
                          const kv_divisor *d, uint64_t reserve,
                          const int64_t *idx, int64_t m, uint64_t *bits)
{
    const kv_table *t = kv_tables[kv_variant];
    int w = itemsize == 8;
    if (idx)
        return t->spec_v2_gather[w](c, a, n, d, reserve, idx, m, bits);
    spec_v2_dense_fn f = d->pow2 ? t->spec_v2_pow2[w] : t->spec_v2_magic[w];
    return f(c, a, n, d, reserve, bits);
}

uint64_t kv_mod_count(const void *c, int itemsize, int64_t n, const kv_divisor *d,
                      uint64_t want, const int64_t *idx, int64_t m, uint64_t *bits)
{
    const kv_table *t = kv_tables[kv_variant];
    int w = itemsize == 8;
    if (idx)
        return t->mod_count_gather[w](c, n, d, want, idx, m, bits);
    mod_count_dense_fn f = d->pow2 ? t->mod_count_pow2[w] : t->mod_count_magic[w];
    return f(c, n, d, want, bits);
}

uint64_t kv_extend_pages(const void *s, const void *pre, int itemsize, int64_t n,
                         const kv_divisor *d, uint64_t *bits)
{
    const kv_table *t = kv_tables[kv_variant];
    int w = itemsize == 8;
    extend_pages_fn f = d->pow2 ? t->extend_pages_pow2[w] : t->extend_pages_magic[w];
    return f(s, pre, n, d, bits);
}
