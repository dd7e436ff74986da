"""The compiled request-object writers: the same names, signatures and
exceptions as kvest.reference._writes, their pure-Python twin.  They are
compiled in kvest._reqs, beside the readers, so that the request core and its
one memo (src/kvest/_src/reqroute.h) are compiled once; the loops are in
src/kvest/_src/reqwrite.h."""

from __future__ import annotations

from kvest._names import WRITE_FUNCTIONS

# (re-exported: `name as name`; the two flags are for the tests)
from kvest._reqs import _DICT_ENTRIES as _DICT_ENTRIES
from kvest._reqs import _MANAGED_DICT as _MANAGED_DICT
from kvest._reqs import add_to_attrs as add_to_attrs
from kvest._reqs import max_into_attr as max_into_attr

__all__ = list(WRITE_FUNCTIONS)
