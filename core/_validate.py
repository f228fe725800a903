"""Small helpers that turn malformed JSON-ish input into ValidationError naming the field."""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import NotFoundError, ValidationError

__all__ = [
    "as_float",
    "as_int",
    "as_list",
    "as_mapping",
    "as_str",
    "check_format",
    "import_object",
    "no_extra_keys",
    "read_text",
    "req",
]


def read_text(path: str | os.PathLike[str], what: str = "an existing file") -> str:
    """A text file's content, or a ValidationError naming it: a folder, an unreadable or a
    binary file given where a file is read surfaced as a traceback."""
    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError:
        raise ValidationError(str(p), what, "no such file") from None
    except IsADirectoryError:
        raise ValidationError(str(p), "a file", "a folder") from None
    except UnicodeDecodeError:
        raise ValidationError(str(p), "a UTF-8 text file", "binary data") from None
    except OSError as e:
        raise ValidationError(str(p), "a readable file", e.strerror) from None


def as_mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(field, "a JSON object", value)
    return value


def req(obj: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in obj:
        raise ValidationError(f"{field}.{key}" if field else key, "a value (missing)", None)
    return obj[key]


def as_float(
    value: Any,
    field: str,
    *,
    positive: bool = False,
    nonneg: bool = False,
    lo: float | None = None,
    hi: float | None = None,
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, "a number", value)
    f = float(value)
    if not math.isfinite(f):
        raise ValidationError(field, "a finite number", value)
    if positive and f <= 0:
        raise ValidationError(field, "a number > 0", value)
    if nonneg and f < 0:
        raise ValidationError(field, "a number >= 0", value)
    if lo is not None and f < lo:
        raise ValidationError(field, f"a number >= {lo}", value)
    if hi is not None and f > hi:
        raise ValidationError(field, f"a number <= {hi}", value)
    return f


def as_int(value: Any, field: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValidationError(field, "an integer", value)
    if minimum is not None and value < minimum:
        raise ValidationError(field, f"an integer >= {minimum}", value)
    return int(value)


def as_str(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "a non-empty string", value)
    return value


def as_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValidationError(field, "a JSON array", value)
    return list(value)


def check_format(obj: Any, expected: str) -> Mapping[str, Any]:
    m = as_mapping(obj, "document")
    got = m.get("format")
    if got != expected:
        raise ValidationError("format", repr(expected), got)
    return m


def no_extra_keys(obj: Mapping[str, Any], allowed: set[str], field: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        where = f"{field}.{extra[0]}" if field else extra[0]
        raise ValidationError(where, f"one of the keys {sorted(allowed)!r}", "unknown key")


def import_object(path: str, field: str = "import path") -> Any:
    """``package.module:attr`` -> the object (dots after the colon walk attributes)."""
    mod, sep, attr = str(path).partition(":")
    if not sep or not mod or not attr:
        raise ValidationError(field, "'package.module:name'", path)
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as e:
        raise ValidationError(field, "an importable module", f"{mod} ({e})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise NotFoundError(f"attribute of {mod}", part) from None
    return obj
