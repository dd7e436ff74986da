"""Argument types shared by kvest's command lines (``python -m kvest`` and its
``sglang`` doctor), in a module of their own so neither imports the other."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int, maximum: int | None = None, why: str = ""
                 ) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum (and <= maximum, if given), or a
    usage error (exit status 2); ``why`` follows the message above the maximum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}, got {value:,}{why}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse
