"""Argument types shared by the CLI's commands: a number within bounds, one message shape."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number_in(
    lo: float, hi: float, what: str = "a number", *, lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``),
    else a one-line error naming ``what`` and the range."""
    shown = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi):
            raise argparse.ArgumentTypeError(f"expected {what} in {shown}, got {text!r}")
        return v

    return parse
