"""Request stand-ins for the tests: the one module the test files take them from.

The release-shaped classes are defined once, in ``kvest.sglang.standins`` (the
doctor's parity run draws its requests from them and the object benchmarks of
``python -m kvest bench`` time kvest on them, so they ship), the tiny shapes in
``kvest._bench.requests``; this module serves them to the tests under the same
names.  See that module for
each shape: ``FlatReq`` (0.5.11-0.5.15), ``MixedReq`` (0.5.16-0.5.18),
``NestedReq`` with ``ReqKvInfo`` (0.5.19+), ``TinyFlat`` / ``TinyNested``.

(Not ``requests.py``: the tests folder is on ``sys.path`` under pytest, and that
name would shadow the HTTP library for everything the tests import, SGLang
included.)
"""

from __future__ import annotations

from kvest._bench.requests import ALL, LAYOUT_OF, TinyFlat, TinyKV, TinyNested
from kvest.sglang.standins import (
    RELEASE_SHAPED,
    FlatReq,
    MixedReq,
    NestedReq,
    ReqKvInfo,
    ReqKvInfo0517,
)

__all__ = ["ALL", "LAYOUT_OF", "RELEASE_SHAPED", "FlatReq", "MixedReq", "NestedReq", "ReqKvInfo",
           "ReqKvInfo0517", "TinyFlat", "TinyKV", "TinyNested"]
