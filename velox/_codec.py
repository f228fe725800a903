"""JSON-safe encoding of inputs, labels and shared state, for storage and the wire.

Nothing here unpickles: values use the project's JSON wire form (``core/_wire.py``): numpy
arrays as dtype + shape + base64 raw bytes, everything else plain JSON. The same form is
accepted over HTTP, so a client can send a tensor input.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from inferline.core import value_from_json, value_to_json

__all__ = ["decode_value", "dumps", "encode_value", "loads", "vector_from_bytes", "vector_to_bytes"]


def encode_value(x: Any) -> Any:
    """The project's JSON form of ``x`` (``inferline.core.value_to_json``): arrays as
    ``{"dtype", "shape", "b64"}``, so a tensor is written the same way to ``/velox`` routes,
    to ``/apps`` predict and to Velox's own storage."""
    return value_to_json(x)


def decode_value(x: Any, field: str = "x") -> Any:
    """Inverse of :func:`encode_value`; ``field`` names the input in error messages."""
    return value_from_json(x, field)


def dumps(x: Any) -> str:
    return json.dumps(encode_value(x), separators=(",", ":"), allow_nan=True)


def loads(s: str | bytes) -> Any:
    return decode_value(json.loads(s))


def vector_to_bytes(v: np.ndarray) -> bytes:
    """float64 vector/matrix as little-endian raw bytes (the storage form of features, A, b)."""
    return np.ascontiguousarray(v, dtype="<f8").tobytes()


def vector_from_bytes(b: bytes, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(b, dtype="<f8").reshape(shape).astype(np.float64)
