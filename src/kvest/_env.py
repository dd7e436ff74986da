"""Environment switches, read as people write them.

A switch that is set to something kvest cannot read warns and keeps its
default: a typo in the environment must never make ``import kvest`` fail.
"""

from __future__ import annotations

import os
import warnings

_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"", "0", "false", "no", "off", "n", "f"})


def flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable ``name`` (unset: ``default``)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    warnings.warn(
        f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no or on/off); "
        f"using the default, {default}",
        RuntimeWarning, stacklevel=2,
    )
    return default
