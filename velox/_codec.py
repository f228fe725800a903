"""JSON-safe encoding of inputs, labels and shared state, for storage and the wire.

Nothing here unpickles: numpy arrays travel as ``{"__ndarray__": {"dtype", "shape", "data"}}``
with base64 raw bytes (the project's tensor rule: dtype + shape + bytes), everything else is
plain JSON. The same envelope is accepted over HTTP, so a client can send a tensor input.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

__all__ = ["decode_value", "dumps", "encode_value", "loads", "vector_from_bytes", "vector_to_bytes"]

_TAG = "__ndarray__"
_MAX_DEPTH = 32


def encode_value(x: Any, _depth: int = 0) -> Any:
    """A JSON-serialisable form of ``x`` that :func:`decode_value` turns back into ``x``.

    Tuples come back as lists (JSON has one sequence type); numpy scalars come back as 0-d
    arrays' items, i.e. Python numbers.
    """
    if _depth > _MAX_DEPTH:
        raise ValidationError("x", f"a value nested at most {_MAX_DEPTH} deep", "deeper")
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            raise ValidationError("x", "a numeric array", str(x.dtype))
        a = np.ascontiguousarray(x)
        return {
            _TAG: {
                "dtype": a.dtype.str,
                "shape": list(a.shape),
                "data": base64.b64encode(a.tobytes()).decode("ascii"),
            }
        }
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple)):
        return [encode_value(v, _depth + 1) for v in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise ValidationError("x", "a dict with str keys", list(x))
        if _TAG in x:
            raise ValidationError("x", f"a dict without the reserved key {_TAG!r}", list(x))
        return {k: encode_value(v, _depth + 1) for k, v in x.items()}
    raise ValidationError("x", "JSON values or numpy arrays", type(x).__name__)


def _decode_array(spec: Any, field: str) -> np.ndarray:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data"}:
        raise ValidationError(field, 'an {"__ndarray__": {"dtype", "shape", "data"}} object', spec)
    try:
        dt = np.dtype(spec["dtype"])
    except TypeError as e:
        raise ValidationError(f"{field}.dtype", "a numpy dtype string like '<f4'", spec["dtype"]) from e
    if dt.hasobject:
        raise ValidationError(f"{field}.dtype", "a numeric dtype", spec["dtype"])
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ValidationError(f"{field}.shape", "a list of non-negative ints", shape)
    try:
        raw = base64.b64decode(spec["data"], validate=True)
    except (ValueError, TypeError) as e:
        raise ValidationError(f"{field}.data", "base64 of the raw bytes", "invalid base64") from e
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(raw) != n:
        raise ValidationError(f"{field}.data", f"{n} bytes for shape {shape} and {dt.str}", len(raw))
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def decode_value(x: Any, field: str = "x", _depth: int = 0) -> Any:
    """Inverse of :func:`encode_value`; ``field`` names the input in error messages."""
    if _depth > _MAX_DEPTH:
        raise ValidationError(field, f"a value nested at most {_MAX_DEPTH} deep", "deeper")
    if isinstance(x, dict):
        if _TAG in x:
            if len(x) != 1:
                raise ValidationError(field, f"{_TAG!r} as the only key", list(x))
            return _decode_array(x[_TAG], field)
        return {k: decode_value(v, f"{field}.{k}", _depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return [decode_value(v, f"{field}[{i}]", _depth + 1) for i, v in enumerate(x)]
    return x


def dumps(x: Any) -> str:
    return json.dumps(encode_value(x), separators=(",", ":"), allow_nan=True)


def loads(s: str | bytes) -> Any:
    return decode_value(json.loads(s))


def vector_to_bytes(v: np.ndarray) -> bytes:
    """float64 vector/matrix as little-endian raw bytes (the storage form of features, A, b)."""
    return np.ascontiguousarray(v, dtype="<f8").tobytes()


def vector_from_bytes(b: bytes, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(b, dtype="<f8").reshape(shape).astype(np.float64)
