"""Argument types shared by kvest's command lines (``python -m kvest`` and its
``sglang`` doctor), in a module of their own so neither imports the other."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

# Every count, size and seed a command takes reaches int64 code (kvest's
# kernels, NumPy): a larger value is a usage error, not an OverflowError later.
INT64_MAX = 2**63 - 1
INT64_WHY = ": it does not fit in int64"


def int_at_least(minimum: int, maximum: int = INT64_MAX, why: str = ""
                 ) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum] (int64's largest by
    default), or a usage error (exit status 2); ``why`` follows the message
    above the maximum."""
    why = why or (INT64_WHY if maximum == INT64_MAX else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            # int() refuses more than sys.get_int_max_str_digits() digits: that
            # is an integer too large, not a word.
            if re.fullmatch(r"\s*[+-]?\d[\d_]*\s*", text):
                sign = "-" if text.strip().startswith("-") else ""
                raise argparse.ArgumentTypeError(
                    f"must be {'>=' if sign else '<='} {minimum if sign else maximum:,}, got "
                    f"{sign}an integer of {len(re.sub(r'[^0-9]', '', text)):,} digits"
                    + ("" if sign else why)) from None
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {_shown(value)}")
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"must be <= {maximum:,}, got {_shown(value, ',')}{why}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def int_list(minimum: int, maximum: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each as int_at_least checks it."""
    one = int_at_least(minimum, maximum)

    def parse(text: str) -> list[int]:
        return [one(part) for part in text.split(",")]

    parse.__name__ = "comma-separated integers"
    return parse


def positive_seconds(maximum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in (0, maximum]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
        if not 0 < value <= maximum:  # NaN fails here too
            raise argparse.ArgumentTypeError(
                f"must be in (0, {maximum:g}] seconds, got {_shown(text)}")
        return value

    parse.__name__ = "seconds"
    return parse


def _shown(value: object, spec: str = "") -> str:
    """``value`` for a message: a pasted megabyte is cut to its ends."""
    text = format(value, spec) if isinstance(value, int) else repr(value)
    return text if len(text) <= 60 else f"{text[:28]}...{text[-28:]} ({len(text):,} characters)"
