"""Pure mode of the twin: reading and writing a request's attribute the way the
compiled route core (src/kvest/_src/reqroute.h) decides it can without running
any code of the caller's, or telling that it cannot.

The compiled kernels work a type's route out from its C structures; this module
works the same route out from what Python shows of them, touching only the
interpreter's own objects (class dicts read through ``type``'s own
descriptors, never through a metaclass; member and ``__dict__`` descriptors
called directly; dicts iterated, never searched), so that it too runs nothing
of the caller's.  It decides alike for classes defined in Python; a type
written in C (or made by ``PyType_FromSpec``) whose members are not object
slots is outside what the twin can see, and the two may then differ.
"""

from __future__ import annotations

import types
from typing import Any

from kvest._errors import INT64_MAX, impure_request
from kvest._inputs import req_length_value

INT64_MIN = -(2**63)

# The interpreter's own accessors, taken once: calling them runs no metaclass code.
_mro_of = type.__dict__["__mro__"].__get__
_dict_of = type.__dict__["__dict__"].__get__
_flags_of = type.__dict__["__flags__"].__get__
_dictoffset_of = type.__dict__["__dictoffset__"].__get__
_OBJ_GETATTRIBUTE = object.__dict__["__getattribute__"]
_OBJ_SETATTR = object.__dict__["__setattr__"]
_OBJ_DELATTR = object.__dict__["__delattr__"]
_HEAPTYPE = 1 << 9

GENERIC, DICT, MEMBER = 0, 1, 2
# Keys a dict's lookup compares with no code of the caller's (kv_plain_key).
_PLAIN_KEYS = (str, int)
MISSING = object()  # the attribute is not there (getattr would raise AttributeError)
IMPURE = object()  # reading it would run code of the caller's


def _lookup(mro: tuple, name: str) -> Any:
    """What _PyType_Lookup finds: the first class dict in the MRO holding name."""
    for klass in mro:
        # (a class dict's items, iterated: no key is compared by its own code)
        for key, value in _dict_of(klass).items():
            if key is name or (type(key) is str and key == name):
                return value
    return MISSING


def route(t: type, name: str) -> tuple[int, int]:
    """(get, set) route of name on type t, as kv_route_resolve works it out."""
    if type(name) is not str:
        return GENERIC, GENERIC
    mro = _mro_of(t)
    get_generic = (_lookup(mro, "__getattribute__") is _OBJ_GETATTRIBUTE
                   and _lookup(mro, "__getattr__") is MISSING)
    set_generic = (_lookup(mro, "__setattr__") is _OBJ_SETATTR
                   and _lookup(mro, "__delattr__") is _OBJ_DELATTR)
    if not get_generic and not set_generic:
        return GENERIC, GENERIC
    if not _plain_mro(mro):
        return GENERIC, GENERIC
    descr = _lookup(mro, name)
    if descr is MISSING:
        if not _plain_dict(t, mro):
            return GENERIC, GENERIC
        return (DICT if get_generic else GENERIC), (DICT if set_generic else GENERIC)
    if type(descr) is types.MemberDescriptorType:
        owner = descr.__objclass__
        if (_flags_of(owner) & _HEAPTYPE and descr.__name__ == name
                and any(klass is owner for klass in mro)):
            return (MEMBER if get_generic else GENERIC), (MEMBER if set_generic else GENERIC)
    return GENERIC, GENERIC


def _plain_mro(mro: tuple) -> bool:
    """kv_plain_mro: whether a lookup in the MRO compares no key with code of
    the caller's (every heap class's dict holding plain keys only; the
    interpreter's own types cannot be given a key)."""
    return all(type(key) in _PLAIN_KEYS for klass in mro if _flags_of(klass) & _HEAPTYPE
               for key in _dict_of(klass))


def _plain_dict(t: type, mro: tuple) -> bool:
    """kv_plain_dict: whether t's ``__dict__`` is the interpreter's own (the
    MRO's first a getset descriptor of that name, or none on a type whose
    instances have no dict), so that the instance dict it gives is the one
    generic getattr reads."""
    descr = _lookup(mro, "__dict__")
    if descr is MISSING:
        return _dictoffset_of(t) == 0
    return type(descr) is types.GetSetDescriptorType and descr.__name__ == "__dict__"


def _instance_dict(obj: Any) -> Any:
    """obj's instance dict as _PyObject_GetDictPtr finds it (None: it has none),
    on a type whose ``__dict__`` is the interpreter's own (:func:`_plain_dict`)."""
    descr = _lookup(_mro_of(type(obj)), "__dict__")
    return None if descr is MISSING else descr.__get__(obj)


def _scan(d: dict, name: str) -> Any:
    """kv_dict_scan: the entry for name found without a lookup, else MISSING, or
    IMPURE when any key is not plain (the lookup may compare it with its own
    ``__eq__``, found or not)."""
    found = MISSING
    for key, value in dict.items(d):
        if type(key) not in _PLAIN_KEYS:
            return IMPURE
        if found is MISSING and type(key) is str and (key is name or key == name):
            found = value
    return found


def get(obj: Any, name: str) -> Any:
    """obj.<name> read with no code of the caller's: the value, MISSING or IMPURE."""
    how, _ = route(type(obj), name)
    if how == MEMBER:
        descr = _lookup(_mro_of(type(obj)), name)
        try:
            return descr.__get__(obj, type(obj))
        except AttributeError:
            return MISSING
    if how == DICT:
        d = _instance_dict(obj)
        return MISSING if d is None else _scan(d, name)
    return IMPURE


def can_store(obj: Any, name: str) -> bool:
    """Whether setattr(obj, name, int) runs no code of the caller's, obj.<name>
    having been read as an exact int (a slot, or an entry of a dict whose keys
    are all plain: the store's search compares them without code)."""
    get_how, set_how = route(type(obj), name)
    if set_how != get_how:
        return False
    if set_how == MEMBER:
        return True
    if set_how == DICT:
        d = _instance_dict(obj)
        return d is not None and all(type(key) in _PLAIN_KEYS for key in dict.keys(d))
    return False


def length(req: Any, pos: int, attr: str, where: str) -> int:
    """reqs[pos].<attr> read where the layout says, in pure mode: an exact int in
    int64 (a negative one is judged by the shared rule), or an exception."""
    value = MISSING
    if where != "nested":
        value = get(req, attr)
        if value is IMPURE:
            raise impure_request(pos)
        if value is MISSING and where == "flat":
            raise AttributeError(f"reqs[{pos}] has no .{attr}")
    if value is MISSING:
        kv = get(req, "kv")
        if kv is IMPURE:
            raise impure_request(pos)
        if kv is not MISSING:
            value = get(kv, attr)
            if value is IMPURE:
                raise impure_request(pos)
        if value is MISSING:
            if where == "either":
                raise AttributeError(f"reqs[{pos}] has neither .{attr} nor .kv.{attr}")
            raise AttributeError(f"reqs[{pos}] has no .kv.{attr}")
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise impure_request(pos)
    return req_length_value(value, pos, attr)


def beam(req: Any, pos: int, rows: bool) -> Any:
    """req.beam_group is not None (rows=False), or its num_member_rows (0 without
    a group), read in pure mode."""
    group = get(req, "beam_group")
    if group is IMPURE:
        raise impure_request(pos)
    if group is MISSING:
        raise AttributeError(f"reqs[{pos}] has no .beam_group")
    if not rows:
        return group is not None
    if group is None:
        return 0
    value = get(group, "num_member_rows")
    if value is IMPURE:
        raise impure_request(pos)
    if value is MISSING:
        raise AttributeError(f"reqs[{pos}] has no .beam_group.num_member_rows")
    if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
        raise impure_request(pos)
    return value
