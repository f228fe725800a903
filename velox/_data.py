"""Loading a Velox model's training data and starting user weights from files.

Training rows become :class:`~inferline.velox.Observation` s with ``seq = 0`` and
``version = 0`` (they precede the observation log), so a retrain takes them exactly like logged
observations; see :class:`~inferline.velox.TrainingData` for the formats.
"""

from __future__ import annotations

import csv
import json
import math
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

from ._config import TrainingData
from ._model import Observation

__all__ = ["load_training_data", "load_user_weights", "parse_item"]

_COLUMNS = ("uid", "item", "rating")


def parse_item(v: Any) -> Any:
    """An item id as a client would send it: JSON when the text is JSON, else the text."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except ValueError:
        return v


def _rows(rows: Iterable[Mapping[str, Any]], where: str) -> list[Observation]:
    out: list[Observation] = []
    for n, r in enumerate(rows, 1):
        uid, rating = r["uid"], r["rating"]
        if uid is None or str(uid) == "":
            raise ValidationError(f"{where} row {n}: uid", "a user id", uid)
        try:
            y = float(rating)
        except (TypeError, ValueError):
            raise ValidationError(f"{where} row {n}: rating", "a number", rating) from None
        if not math.isfinite(y):
            raise ValidationError(f"{where} row {n}: rating", "a finite number", rating)
        ts = r.get("ts")
        out.append(
            Observation(
                str(uid),
                parse_item(r["item"]),
                y,
                0,
                0.0 if ts in (None, "") else float(ts),
                seq=0,
            )
        )
    return out


def _check_header(names: Iterable[str], where: str) -> None:
    missing = [c for c in _COLUMNS if c not in set(names)]
    if missing:
        raise ValidationError(
            where, "columns uid, item, rating (and optionally ts)", f"missing {missing}"
        )


def load_training_data(spec: TrainingData) -> list[Observation]:
    """The rows ``spec`` names, in file (or rowid) order."""
    if spec.file is not None:
        where = "training_data.file"
        try:
            with open(spec.file, newline="") as fh:
                reader = csv.DictReader(fh)
                _check_header(reader.fieldnames or (), where)
                return _rows(reader, where)
        except OSError as e:
            raise ValidationError(where, "a readable CSV file", str(e)) from None
    assert spec.sqlite is not None and spec.table is not None  # validated by TrainingData
    where = "training_data.sqlite"
    if not Path(spec.sqlite).is_file():
        raise ValidationError(where, "an existing SQLite database file", spec.sqlite)
    con = sqlite3.connect(f"file:{spec.sqlite}?mode=ro", uri=True)
    try:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{spec.table}")')]
        if not cols:
            raise ValidationError("training_data.table", f"a table of {spec.sqlite}", spec.table)
        _check_header(cols, "training_data.table")
        names = [*_COLUMNS, *(["ts"] if "ts" in cols else [])]
        cur = con.execute(f'SELECT {", ".join(names)} FROM "{spec.table}" ORDER BY rowid')
        return _rows((dict(zip(names, r, strict=True)) for r in cur), "training_data.table")
    except sqlite3.Error as e:
        raise ValidationError(where, "a readable SQLite database", str(e)) from None
    finally:
        con.close()


def load_user_weights(path: str, dim: int) -> dict[str, np.ndarray]:
    """``uid -> weights`` from an ``.npz`` file with ``ids`` and ``matrix`` (n x ``dim``)."""
    where = "starting_weights.users"
    try:
        with np.load(path, allow_pickle=False) as z:
            ids, m = z["ids"].tolist(), np.asarray(z["matrix"], dtype=np.float64)
    except (OSError, KeyError, ValueError) as e:
        raise ValidationError(where, "an .npz file with 'ids' and 'matrix'", str(e)) from None
    if m.ndim != 2 or m.shape != (len(ids), dim):
        raise ValidationError(where, f"a matrix of shape ({len(ids)}, {dim})", m.shape)
    if not np.all(np.isfinite(m)):
        raise ValidationError(where, "finite weights", "non-finite entries")
    return {str(u): m[j] for j, u in enumerate(ids)}
