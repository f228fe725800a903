"""Argument types shared by the CLI's commands: bounded numbers and writable output paths,
checked at parse time with one message shape (``argument --x: expected ...``, exit status 2)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path

__all__ = [
    "body_bytes",
    "count",
    "int_in",
    "number_in",
    "output_path",
    "port",
    "positive",
    "slo_ms",
]


def number_in(
    lo: float, hi: float, what: str = "a number", *, lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``),
    else a one-line error naming ``what`` and the range."""
    if hi == math.inf:
        shown = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        shown = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi):
            raise argparse.ArgumentTypeError(f"expected {what} {shown}, got {text!r}")
        return v

    return parse


def int_in(lo: int, hi: float = math.inf, what: str = "a whole number") -> Callable[[str], int]:
    """:func:`number_in` for counts, ports and sizes (``what`` says it is whole): also a whole
    number (``1e3`` is 1000)."""
    as_number = number_in(lo, hi, what)
    shown = f">= {lo}" if hi == math.inf else f"in [{lo}, {int(hi)}]"

    def parse(text: str) -> int:
        try:
            v = as_number(text)
        except argparse.ArgumentTypeError:
            v = math.nan  # one message for both, with the range shown as whole numbers
        if not v.is_integer():
            raise argparse.ArgumentTypeError(f"expected {what} {shown}, got {text!r}")
        return int(v)

    return parse


def positive(what: str) -> Callable[[str], float]:
    """A finite number > 0 (rates, durations)."""
    return number_in(0, math.inf, what, lo_open=True)


count = int_in(1, what="a count")
# 0 binds any free port: both servers read the bound port back (_app.bind_socket)
port = int_in(0, 65535, "a port")
# gRPC takes its message limit as a C int (2**31 overflows it); HTTP shares the flag's type
body_bytes = int_in(1, 2**31 - 1, "a whole number of bytes")
slo_ms = number_in(0, 3_600_000, "milliseconds", lo_open=True)  # as --slo-s: up to an hour

Suffixes = Collection[str] | Callable[[], Collection[str]]


def output_path(suffixes: Suffixes | None = None, what: str = "a file") -> Callable[[str], str]:
    """An argparse ``type``: a path a command can write, checked before it does any work (a
    missing folder surfaced as a traceback once the work was done, minutes into ``profile``):
    not a folder, in an existing writable folder and, with ``suffixes`` (no dots; a callable is
    asked only when the option is given, so that e.g. matplotlib loads only then), ending in one
    of them."""

    def parse(text: str) -> str:
        p = Path(text)
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"expected {what}, got the folder {text!r}")
        folder = p.parent  # "." for a bare name
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(
                f"expected {what} in an existing folder, got {text!r} (no folder {str(folder)!r})"
            )
        if not os.access(folder, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(
                f"expected {what} in a writable folder, got {text!r} ({str(folder)!r} is not)"
            )
        if suffixes is not None:
            allowed = sorted(suffixes() if callable(suffixes) else suffixes)
            if p.suffix.lower().removeprefix(".") not in allowed:
                shown = ", ".join(f".{s}" for s in allowed)
                raise argparse.ArgumentTypeError(
                    f"expected {what} ending in one of {shown}, got {text!r}"
                )
        return text

    return parse
