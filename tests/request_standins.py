"""Request stand-ins for the tests: the one module the test files take them from.

The release-shaped classes are defined once, in ``kvest._bench.requests`` (the
object benchmarks of ``python -m kvest bench`` time kvest on them, so they ship);
this module serves them to the tests under the same names.  See that module for
each shape: ``FlatReq`` (0.5.11-0.5.15), ``MixedReq`` (0.5.16-0.5.18),
``NestedReq`` with ``ReqKvInfo`` (0.5.19+), ``TinyFlat`` / ``TinyNested``.

(Not ``requests.py``: the tests folder is on ``sys.path`` under pytest, and that
name would shadow the HTTP library for everything the tests import, SGLang
included.)
"""

from __future__ import annotations

from kvest._bench.requests import (
    ALL,
    LAYOUT_OF,
    RELEASE_SHAPED,
    FlatReq,
    MixedReq,
    NestedReq,
    ReqKvInfo,
    ReqKvInfo0517,
    TinyFlat,
    TinyKV,
    TinyNested,
)

__all__ = ["ALL", "LAYOUT_OF", "RELEASE_SHAPED", "FlatReq", "MixedReq", "NestedReq", "ReqKvInfo",
           "ReqKvInfo0517", "TinyFlat", "TinyKV", "TinyNested"]
