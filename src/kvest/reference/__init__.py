"""The pure-Python twin of every kvest function.

Each module here has the same name, functions, signatures and exceptions as its
compiled counterpart in ``kvest`` (``_kernels`` for arrays, ``_reqs`` for request
objects), written as the plain per-request loop a scheduler would write, over
Python ints.  ``KVEST_PURE_PYTHON=1`` serves these functions as ``kvest.*``; the
test suite checks both implementations against an oracle of its own.
"""

from __future__ import annotations

from kvest._names import FUNCTIONS
from kvest.reference._kernels import *  # noqa: F403
from kvest.reference._reqs import *  # noqa: F403
from kvest.reference._writes import *  # noqa: F403

__all__ = list(FUNCTIONS)  # kvest._names: the one list
