/*
 * The fence, and what a type's version tag says.
 *
 * KV_PRIVATE: whether the request kernels may use CPython's private API
 * (docs/development.md lists each use, with the versions tested: 3.10 to
 * 3.13).  Off on any Python newer than 3.13, and in a build that asks for the
 * public API alone (KVEST_PUBLIC_API_ONLY=1 at build time, setup.py); CI
 * builds and tests that way too.
 *
 * A type's version tag says whether what was worked out for the type while it
 * held that tag still holds (CPython changes or clears the tag whenever the
 * type or a base changes).  3.13 stopped setting Py_TPFLAGS_VALID_VERSION_TAG
 * and marks an invalid tag with 0 instead.  The tag's meaning is the
 * interpreter's own business: behind the fence it is not read, and what was
 * worked out for a type lasts one call that runs no Python code (pure mode),
 * the one place routes are used there (reqroute.h).
 */
#ifndef KVEST_TYPETAG_H
#define KVEST_TYPETAG_H

#include <Python.h>

#if PY_VERSION_HEX >= 0x030E0000 && !defined(KVEST_PUBLIC_API_ONLY)
#define KVEST_PUBLIC_API_ONLY 1
#endif
#ifdef KVEST_PUBLIC_API_ONLY
#define KV_PRIVATE 0
#else
#define KV_PRIVATE 1
#endif

static inline int kv_tag_valid(PyTypeObject *t)
{
#if !KV_PRIVATE
    (void)t;
    return 1; /* per call only: see above */
#elif PY_VERSION_HEX >= 0x030D0000
    return t->tp_version_tag != 0;
#else
    return (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag != 0;
#endif
}

/* The tag to key what was worked out for t by (0 behind the fence). */
static inline unsigned int kv_tag(PyTypeObject *t)
{
#if KV_PRIVATE
    return t->tp_version_tag;
#else
    (void)t;
    return 0;
#endif
}

#endif
