/*
 * Requests in address order.  Reading a request is a chain of dependent loads
 * (the request, its __dict__, req.kv, the ints), and a batch of thousands does
 * not fit in cache: walked in address order the hardware prefetcher and the
 * TLB keep up, walked in a shuffled order (SGLang's retract loop selects its
 * requests in retraction order) nearly every link misses (the benchmark:
 * bench/test_sglang_step.py::test_shuffled_selection).
 */
#ifndef KVEST_ADDRORDER_H
#define KVEST_ADDRORDER_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The walk's tuning constants, all here (the benchmark above justifies them).
 * The least batch that may go in address order (kvest._reqs._address_order
 * lets the tests lower it): below it a sort costs more than the misses (at
 * 1,024 release-shaped requests both orders take the same time on a 2-core
 * x86 host, while the sort costs about 300 instructions a request,
 * tools/cachegrind_hotspots.py; at 4,096 address order takes 0.6x the time). */
#define KV_ORDER_MIN 2048

/* From how many requests an estimate or the plan walks a whole batch from
 * its last request to its first: SGLang's passes over a batch go first to
 * last, and what is still in cache of one is the part it read last
 * (docs/development.md; below this a batch stays in cache anyway). */
#define KV_BACKWARD_MIN 2048

/* Whether items[0..m) mostly follow one another closely in memory: at most
 * one step in 8 jumps 2^KV_ORDER_NEAR bytes or more, either way.  Such a
 * batch (requests made one after another, even with the holes an allocator
 * reuses) is walked as it is: the prefetcher follows it, and sorting it was
 * measured slower.  A shuffled batch jumps nearly every step. */
#define KV_ORDER_NEAR 15

static inline int kv_mostly_near(PyObject *const *items, Py_ssize_t m)
{
    Py_ssize_t far = 0;
    for (Py_ssize_t j = 1; j < m; j++) {
        uintptr_t a = (uintptr_t)items[j], b = (uintptr_t)items[j - 1];
        far += (a > b ? a - b : b - a) >> KV_ORDER_NEAR != 0;
    }
    return far <= m / 8;
}

/* Addresses that differ only below 2^KV_ORDER_GRAIN bytes count as equal (a
 * request's own objects span more than that), and the sort takes
 * KV_ORDER_DIGIT bits a pass. */
#define KV_ORDER_GRAIN 8
#define KV_ORDER_DIGIT 11

/* out[0..m) = items[0..m) in ascending address order, to 2^KV_ORDER_GRAIN
 * bytes: a least-significant-digit radix sort of the addresses' offsets from
 * the least, as many passes as the offsets' span needs (a batch's requests
 * lie in a few tens of megabytes: two passes).  Equal keys keep their given
 * order.  Returns 0, or -1 with nothing set when memory runs out.  Runs no
 * Python code. */
static int kv_address_order(PyObject *const *items, Py_ssize_t m, PyObject **out)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0, span;
    Py_ssize_t j;
    int bits = 0, passes, digit;
    for (j = 0; j < m; j++) {
        uintptr_t a = (uintptr_t)items[j];
        if (a < lo) lo = a;
        if (a > hi) hi = a;
    }
    span = (hi - lo) >> KV_ORDER_GRAIN;
    while (bits < (int)(8 * sizeof(uintptr_t)) && (span >> bits) != 0) bits++;
    passes = (bits + KV_ORDER_DIGIT - 1) / KV_ORDER_DIGIT;
    if (passes == 0) {
        memcpy(out, items, (size_t)m * sizeof(PyObject *));
        return 0;
    }
    digit = (bits + passes - 1) / passes; /* the passes share the bits evenly */
    size_t buckets = (size_t)1 << digit;
    Py_ssize_t *at = (Py_ssize_t *)PyMem_Malloc(buckets * sizeof(Py_ssize_t));
    PyObject **spare = passes > 1 ? (PyObject **)PyMem_Malloc((size_t)m * sizeof(PyObject *))
                                  : NULL;
    if (at == NULL || (passes > 1 && spare == NULL)) {
        PyMem_Free(at);
        PyMem_Free(spare);
        return -1;
    }
    /* The last pass writes out: the first writes there too if the count is odd. */
    PyObject *const *src = items;
    PyObject **dst = passes % 2 ? out : spare;
    for (int p = 0; p < passes; p++) {
        int shift = KV_ORDER_GRAIN + p * digit;
        uintptr_t mask = buckets - 1;
        memset(at, 0, buckets * sizeof(Py_ssize_t));
        for (j = 0; j < m; j++) at[(((uintptr_t)src[j] - lo) >> shift) & mask]++;
        Py_ssize_t sum = 0;
        for (size_t b = 0; b < buckets; b++) {
            Py_ssize_t count = at[b];
            at[b] = sum;
            sum += count;
        }
        for (j = 0; j < m; j++) dst[at[(((uintptr_t)src[j] - lo) >> shift) & mask]++] = src[j];
        src = dst;
        dst = dst == out ? spare : out;
    }
    PyMem_Free(at);
    PyMem_Free(spare);
    return 0;
}

#endif
