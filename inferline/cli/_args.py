"""Argument types shared by the CLI's commands: bounded numbers, seeds, URLs and writable output
paths, checked at parse time with one message shape (``argument --x: expected ...``, exit
status 2)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path
from urllib.parse import urlsplit

from inferline.core.errors import ValidationError

__all__ = [
    "body_bytes",
    "checked_by",
    "count",
    "http_url",
    "int_in",
    "name_counts",
    "number_in",
    "output_folder",
    "output_path",
    "port",
    "positive",
    "seed",
    "slo_ms",
    "too_many_arrivals",
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


def checked_by(check: Callable[[float], object], what: str = "a number") -> Callable[[str], float]:
    """An argparse ``type``: a number that ``check`` (building a config with it) accepts. The
    flag then takes exactly what the config takes, and a refusal names the flag: the config's
    own error names its field, which the user never typed."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            check(v)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(f"expected {e.expected}, got {text!r}") from None
        return v

    return parse


def seed(text: str) -> int:
    """A random seed: a whole number >= 0 (numpy refuses a negative one with a traceback), read
    exactly, not through a float."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a seed, a whole number >= 0, got {text!r}")
    return v


def http_url(schemes: Collection[str] = ("http",)) -> Callable[[str], str]:
    """An argparse ``type``: ``SCHEME://host[:port][/path]`` with a port in range (a bad one
    surfaced as a traceback from the HTTP client, after the trace and inputs were loaded)."""
    shown = " or ".join(f"{s}://" for s in schemes)

    def parse(text: str) -> str:
        u = urlsplit(text)
        try:
            u.port  # noqa: B018 - raises ValueError on a port out of range or not a number
        except ValueError:
            ok = False
        else:
            ok = u.scheme in schemes and bool(u.hostname)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected an {shown}host:port URL, got {text!r}")
        return text

    return parse


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
        expected = f"{what} in an existing folder that can be written"
        _check_folder(folder, text, expected, f"no folder {str(folder)!r}")
        if suffixes is not None:
            allowed = sorted(suffixes() if callable(suffixes) else suffixes)
            if p.suffix.lower().removeprefix(".") not in allowed:
                shown = ", ".join(f".{s}" for s in allowed)
                raise argparse.ArgumentTypeError(
                    f"expected {what} ending in one of {shown}, got {text!r}"
                )
        return text

    return parse


def output_folder(what: str = "a folder") -> Callable[[str], str]:
    """An argparse ``type``: a folder a command writes into, made if missing: not a file, and
    the nearest part of it that exists a writable folder (``demo --out FILE`` failed at its
    ``mkdir`` with a traceback)."""

    def parse(text: str) -> str:
        p = Path(text)
        if p.exists() and not p.is_dir():
            raise argparse.ArgumentTypeError(f"expected {what}, got the file {text!r}")
        there = p.absolute()
        while not there.exists():  # a part under a file does not exist either
            there = there.parent
        _check_folder(there, text, f"{what} that can be written", f"{str(there)!r} is a file")
        return text

    return parse


def _check_folder(folder: Path, text: str, expected: str, not_a_folder: str) -> None:
    """``folder``, where ``text`` will be written, is a folder this process may write in."""
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r} ({not_a_folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"expected {expected}, got {text!r} ({str(folder)!r} is not writable)"
        )


def name_counts(what: str, lo: int) -> Callable[[str], dict[str, int]]:
    """An argparse ``type``: ``name=N[,name=N]`` (``cpu=16,gpu-v100=2``) with whole ``N >= lo``,
    each name once."""
    as_count = int_in(lo)

    def parse(text: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in text.split(","):
            name, eq, n = item.strip().partition("=")
            if not (name and eq):
                raise argparse.ArgumentTypeError(
                    f"expected {what}=N pairs separated by commas, got {item.strip()!r}"
                )
            if name in out:
                raise argparse.ArgumentTypeError(f"{what} {name!r} given twice")
            try:
                out[name] = as_count(n)
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{name}: {e}") from None
        return out

    return parse


# A trace is held in memory, then written as text (about 20 bytes an arrival): a rate x length
# past this exhausted memory with a traceback rather than being refused.
MAX_ARRIVALS = 100_000_000


def too_many_arrivals(expected: float, options: str) -> str | None:
    """For a ``check_args`` rule: what is wrong with traces of ``expected`` arrivals in all
    (from ``options``, as ``--rate/--duration-s``), or None."""
    if expected <= MAX_ARRIVALS:
        return None
    return (
        f"argument {options}: expected at most {MAX_ARRIVALS:,} arrivals (rate x length), "
        f"got {expected:.3g}"
    )
