/*
 * Whether a type's version tag is valid, so that what was worked out for the
 * type while it held that tag still holds (CPython changes or clears the tag
 * whenever the type or a base changes).  3.13 stopped setting
 * Py_TPFLAGS_VALID_VERSION_TAG and marks an invalid tag with 0 instead.
 */
#ifndef KVEST_TYPETAG_H
#define KVEST_TYPETAG_H

#include <Python.h>

static inline int kv_tag_valid(PyTypeObject *t)
{
#if PY_VERSION_HEX >= 0x030D0000
    return t->tp_version_tag != 0;
#else
    return (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag != 0;
#endif
}

#endif
