/*
 * One CPU variant of every loop: loops.c includes this file once per target,
 * with KV_TARGET set (baseline, avx2, avx512) and the target's code-generation
 * pragma in force.  It instantiates loops_body.h for int32 and int64 lengths
 * and collects the loops in a table named kv_table_<KV_TARGET>.
 */
#define KV_PASTE_(a, b, c) a##_##b##_##c
#define KV_PASTE(a, b, c) KV_PASTE_(a, b, c)

#define KV_T int32_t
#define KV_T_IS_INT32 1
#define KV_NAME(x) KV_PASTE(x, i32, KV_TARGET)
#include "loops_body.h"
#ifdef KV_CUSTOM_MAGIC
#include "loops_avx2.h"
#endif
#undef KV_NAME
#undef KV_T_IS_INT32
#undef KV_T

#define KV_T int64_t
#define KV_T_IS_INT32 0
#define KV_NAME(x) KV_PASTE(x, i64, KV_TARGET)
#include "loops_body.h"
#ifdef KV_CUSTOM_MAGIC
#include "loops_avx2.h"
#endif
#undef KV_NAME
#undef KV_T_IS_INT32
#undef KV_T

#define KV_ENTRY(x) {KV_PASTE(x, i32, KV_TARGET), KV_PASTE(x, i64, KV_TARGET)}
static const kv_table KV_PASTE(kv, table, KV_TARGET) = {
    KV_ENTRY(spec_v2_pow2),    KV_ENTRY(spec_v2_magic),    KV_ENTRY(spec_v2_gather),
    KV_ENTRY(mod_count_pow2),  KV_ENTRY(mod_count_magic),  KV_ENTRY(mod_count_gather),
    KV_ENTRY(extend_pages_pow2), KV_ENTRY(extend_pages_magic),
};
#undef KV_ENTRY
#undef KV_PASTE
#undef KV_PASTE_
