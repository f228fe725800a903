"""Reading and writing the JSON formats, with errors that name the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from ._hardware import DEFAULT_CATALOG, HardwareCatalog
from ._pipeline import Pipeline
from ._plan import Plan
from ._profiles import Profiles
from ._validate import read_text
from .errors import ValidationError

__all__ = [
    "dump_json",
    "load_catalog",
    "load_json",
    "load_pipeline",
    "load_plan",
    "load_profiles",
    "save",
]

T = TypeVar("T")


def load_json(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    text = read_text(p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValidationError(
            str(p), "valid JSON", f"line {e.lineno} col {e.colno}: {e.msg}"
        ) from None


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write any format object (``to_dict()``) atomically."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(dump_json(obj.to_dict()))
    os.replace(tmp, p)


def _load(cls: Any, path: str | os.PathLike[str]) -> Any:
    d = load_json(path)
    try:
        return cls.from_dict(d)
    except ValidationError as e:
        raise ValidationError(f"{path}: {e.field}", e.expected, e.got) from None


def load_profiles(path: str | os.PathLike[str]) -> Profiles:
    return _load(Profiles, path)  # type: ignore[no-any-return]


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    return _load(Pipeline, path)  # type: ignore[no-any-return]


def load_plan(path: str | os.PathLike[str]) -> Plan:
    return _load(Plan, path)  # type: ignore[no-any-return]


def load_catalog(path: str | os.PathLike[str] | None = None) -> HardwareCatalog:
    """The default catalog, with the entries of ``path`` (if given) added or overriding."""
    if path is None:
        return DEFAULT_CATALOG
    return DEFAULT_CATALOG.merged(_load(HardwareCatalog, path))
