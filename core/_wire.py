"""Wire forms of values that cross a process or network boundary (no pickle, ever).

Three forms, all produced and read by pure functions here:

* the **dict form** (``encode_value`` / ``decode_value``): a small tagged dict with raw
  ``bytes`` inside, which RPC layers (the bundled runtime's protobuf ``Value``, other adapters)
  mirror field for field::

      {"kind": "tensor", "dtype": "float32", "shape": [8, 8], "data": b"...", "scalar": False}
      {"kind": "str", "value": "text"}          {"kind": "bytes", "value": b"..."}
      {"kind": "json", "value": "[1, 2.5, null]"}   # JSON text
      {"kind": "list", "items": [<dict form>, ...]}  # only when an item is not plain JSON
      {"kind": "map", "entries": {"key": <dict form>, ...}}
      {"kind": "error", "type": "ValidationError", "message": "...", "attrs": {...}}

  Tensors are numpy arrays (``scalar`` marks a numpy scalar) as dtype + shape + raw
  little-endian bytes. Errors are exceptions as values: the class name, the message and the
  JSON-able constructor attributes of inferline's own errors, never a pickled traceback.
* the **bytes form** (``dumps_value`` / ``loads_value``): the dict form framed as one byte
  string (a JSON header, then the raw payloads), for transports that carry opaque bytes.
* the **JSON form** (``value_to_json`` / ``value_from_json``), used by the HTTP frontend:
  arrays as ``{"dtype": "float32", "shape": [8, 8], "b64": "..."}`` (or with a nested-list
  ``"data"``), bytes as ``{"bytes_b64": "..."}``, errors as ``{"error": {"type", "message"}}``
  and everything else as plain JSON.

Every malformed input raises ``ValidationError`` naming the offending field.

``cast_exact`` is the one cast of an array to a declared dtype that every door and the
native route apply: it refuses, naming the field, every value the cast would change (an
integer out of range or negative for an unsigned type, a float with a fraction, NaN or inf
for an integer type, a finite float that overflows to inf, a bool type given other than
0/1). Floats round to the nearest value of a float type: that is the precision it declares.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import (
    BackendError,
    CapacityError,
    DeadlineExceededError,
    InferlineError,
    NotFoundError,
    OverloadedError,
    ValidationError,
)

__all__ = [
    "KINDS",
    "cast_exact",
    "decode_error",
    "decode_value",
    "dumps_value",
    "encode_error",
    "encode_value",
    "loads_value",
    "value_from_json",
    "value_to_json",
]

KINDS = ("tensor", "str", "bytes", "json", "list", "map", "error")

# dtype kinds that travel as raw bytes: bool, ints, unsigned, floats, complex, fixed-width
# unicode and byte strings. Object, void (structured) and datetime dtypes are refused: they
# either hold Python objects or have no portable byte layout.
_DTYPE_KINDS = frozenset("biufcUS")
_MAX_DEPTH = 64
_FRAME_MAGIC = b"ILV1"


def _dtype_name(dt: np.dtype) -> str:
    # Numeric dtypes by name ("float32") so the JSON form reads naturally; strings need their
    # width, which only the array-protocol string ("<U5") carries.
    return dt.str if dt.kind in "US" else dt.name


def _parse_dtype(s: Any, field: str) -> np.dtype:
    if not isinstance(s, str) or not s:
        raise ValidationError(field, "a numpy dtype name such as 'float32'", s)
    try:
        dt = np.dtype(s)
    except (TypeError, ValueError):
        raise ValidationError(field, "a numpy dtype name such as 'float32'", s) from None
    if dt.kind not in _DTYPE_KINDS or dt.fields is not None:
        raise ValidationError(field, "a numeric, bool or fixed-width string dtype", s)
    return dt


def _parse_shape(shape: Any, field: str) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple):
        raise ValidationError(field, "a list of non-negative integers", shape)
    out = []
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
            raise ValidationError(field, "a list of non-negative integers", shape)
        out.append(int(dim))
    return tuple(out)


def _is_plain_json(v: Any, depth: int = 0) -> bool:
    """True when ``v`` is made only of JSON's own types (so it can travel as JSON text)."""
    if depth > _MAX_DEPTH:
        return False
    if v is None or isinstance(v, bool | int | str):
        return True
    if isinstance(v, float):
        return True
    if isinstance(v, list | tuple):
        return all(_is_plain_json(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_plain_json(x, depth + 1) for k, x in v.items())
    return False


def _little_endian(a: np.ndarray) -> np.ndarray:
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    # Not ascontiguousarray: it turns a 0-d array into a 1-d one.
    return a if a.flags.c_contiguous else a.copy(order="C")


# ---------------------------------------------------------------- checked casts


def _span(a: np.ndarray) -> str:
    lo, hi = a.min().item(), a.max().item()
    return f"{lo}" if lo == hi else f"values from {lo} to {hi}"


def cast_exact(a: np.ndarray, dtype: Any, field: str) -> np.ndarray:
    """``a`` as ``dtype``, or ``ValidationError(field, ...)`` when a value would change
    (see the module docstring); ``a`` itself when it already has that dtype. numpy's
    ``astype`` wraps: int8 of ``[1000, 200, -129]`` is ``[-24, -56, 127]``."""
    dt = np.dtype(dtype)
    if a.dtype == dt:
        return a
    src, dst = a.dtype.kind, dt.kind
    if src not in "biuf" or dst not in "biuf":
        if src == dst or (src in "SU" and dst in "SU"):
            return a.astype(dt)
        raise ValidationError(field, f"values of {dt.name}", f"values of {a.dtype.name}")
    if a.size == 0 or src == "b":
        return a.astype(dt)
    if dst == "f":
        return _to_float(a, dt, field)
    if src == "f":
        bad = ~np.isfinite(a)
        if bad.any():
            raise ValidationError(field, f"whole numbers that fit {dt.name}", "NaN or inf")
        if (a != np.trunc(a)).any():
            raise ValidationError(field, f"whole numbers for {dt.name}", "numbers with a fraction")
    if dst == "b":
        lo, hi = 0, 1
    else:
        info = np.iinfo(dt)
        lo, hi = int(info.min), int(info.max)
    # Python scalars compare exactly (a float64 2**63 is not <= int64's max)
    if a.min().item() < lo or a.max().item() > hi:
        want = "0 or 1" if dst == "b" else f"integers in [{lo}, {hi}]"
        raise ValidationError(field, f"{want} ({dt.name})", _span(a))
    return a.astype(dt)


def _to_float(a: np.ndarray, dt: np.dtype, field: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        out = a.astype(dt)
    grew = np.isinf(out) & ~np.isinf(a) if a.dtype.kind == "f" else np.isinf(out)
    if grew.any():
        big = float(np.finfo(dt).max)
        raise ValidationError(field, f"numbers within +-{big:g} ({dt.name})", _span(a))
    return out


# ---------------------------------------------------------------- errors as values


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An exception as an error value: class name, message and JSON-able attributes."""
    attrs: dict[str, Any] = {}
    for name in ("field", "expected", "kind", "name", "model", "late_by_s", "capacity"):
        if hasattr(exc, name):
            val = getattr(exc, name)
            attrs[name] = val if _is_plain_json(val) else repr(val)
    if isinstance(exc, ValidationError):
        attrs["got"] = exc.got if _is_plain_json(exc.got) else repr(exc.got)
    if isinstance(exc, NotFoundError):
        attrs["known"] = exc.known if _is_plain_json(exc.known) else repr(exc.known)
    return {"kind": "error", "type": type(exc).__name__, "message": str(exc), "attrs": attrs}


def decode_error(d: Mapping[str, Any], field: str = "value") -> InferlineError:
    """The ``InferlineError`` an error value stands for.

    inferline's own client-facing errors come back as their class (so the frontend can map a
    ``ValidationError`` raised by a container to a 4xx); anything else becomes a
    ``BackendError`` whose ``error_type`` attribute keeps the remote class name.
    """
    typ = d.get("type")
    msg = d.get("message", "")
    attrs = d.get("attrs") or {}
    if not isinstance(typ, str) or not typ:
        raise ValidationError(f"{field}.type", "an error class name", typ)
    if not isinstance(msg, str):
        raise ValidationError(f"{field}.message", "a string", msg)
    if not isinstance(attrs, Mapping):
        raise ValidationError(f"{field}.attrs", "an object", attrs)
    err: InferlineError
    try:
        if typ == "ValidationError":
            err = ValidationError(attrs["field"], attrs["expected"], attrs.get("got"))
        elif typ == "NotFoundError":
            err = NotFoundError(attrs["kind"], attrs["name"], attrs.get("known"))
        elif typ == "DeadlineExceededError":
            err = DeadlineExceededError(attrs["model"], float(attrs["late_by_s"]))
        elif typ == "OverloadedError":
            err = OverloadedError(attrs["model"], int(attrs["capacity"]))
        elif typ == "CapacityError":
            err = CapacityError(msg)
        else:
            raise KeyError(typ)
    except (KeyError, TypeError, ValueError):
        err = BackendError("remote", f"{typ}: {msg}")
    err.error_type = typ  # type: ignore[attr-defined]
    err.remote_message = msg  # type: ignore[attr-defined]
    return err


# ---------------------------------------------------------------- dict form


def encode_value(v: Any, _depth: int = 0) -> dict[str, Any]:
    """The dict form of ``v`` (see the module docstring). Raises ``ValidationError`` for a
    value that has no wire form (arbitrary Python objects, object arrays)."""
    if _depth > _MAX_DEPTH:
        raise ValidationError("value", f"nesting at most {_MAX_DEPTH} deep", "deeper")
    if isinstance(v, np.ndarray | np.generic):
        scalar = isinstance(v, np.generic)
        a = np.asarray(v)
        if a.dtype.kind not in _DTYPE_KINDS or a.dtype.fields is not None:
            raise ValidationError("value", "an array of a numeric, bool or string dtype", a.dtype)
        a = _little_endian(a)
        return {
            "kind": "tensor",
            "dtype": _dtype_name(a.dtype),
            "shape": list(a.shape),
            "data": a.tobytes(),
            "scalar": scalar,
        }
    if isinstance(v, str):
        return {"kind": "str", "value": v}
    if isinstance(v, bytes | bytearray | memoryview):
        return {"kind": "bytes", "value": bytes(v)}
    if isinstance(v, BaseException):
        return encode_error(v)
    if _is_plain_json(v):
        return {"kind": "json", "value": json.dumps(v, separators=(",", ":"))}
    if isinstance(v, list | tuple):
        return {"kind": "list", "items": [encode_value(x, _depth + 1) for x in v]}
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValidationError("value", "a mapping with string keys", k)
        return {"kind": "map", "entries": {k: encode_value(x, _depth + 1) for k, x in v.items()}}
    raise ValidationError(
        "value",
        "a numpy array or scalar, str, bytes, JSON-able value, or list/dict of those",
        type(v).__name__,
    )


def decode_value(d: Any, field: str = "value", _depth: int = 0) -> Any:
    """The value a dict form stands for; error values decode to ``InferlineError`` instances."""
    if _depth > _MAX_DEPTH:
        raise ValidationError(field, f"nesting at most {_MAX_DEPTH} deep", "deeper")
    if not isinstance(d, Mapping):
        raise ValidationError(field, "a wire value (a mapping with 'kind')", type(d).__name__)
    kind = d.get("kind")
    if kind == "tensor":
        dt = _parse_dtype(d.get("dtype"), f"{field}.dtype")
        shape = _parse_shape(d.get("shape"), f"{field}.shape")
        data = d.get("data")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValidationError(f"{field}.data", "raw bytes", type(data).__name__)
        return _array_from_bytes(bytes(data), dt, shape, bool(d.get("scalar", False)), field)
    if kind == "str":
        s = d.get("value")
        if not isinstance(s, str):
            raise ValidationError(f"{field}.value", "a string", type(s).__name__)
        return s
    if kind == "bytes":
        b = d.get("value")
        if not isinstance(b, bytes | bytearray | memoryview):
            raise ValidationError(f"{field}.value", "bytes", type(b).__name__)
        return bytes(b)
    if kind == "json":
        text = d.get("value")
        if not isinstance(text, str | bytes):
            raise ValidationError(f"{field}.value", "JSON text", type(text).__name__)
        try:
            return json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValidationError(f"{field}.value", "valid JSON text", str(e)) from None
    if kind == "list":
        items = d.get("items")
        if not isinstance(items, list | tuple):
            raise ValidationError(f"{field}.items", "a list of wire values", type(items).__name__)
        return [decode_value(x, f"{field}[{i}]", _depth + 1) for i, x in enumerate(items)]
    if kind == "map":
        entries = d.get("entries")
        if not isinstance(entries, Mapping):
            raise ValidationError(f"{field}.entries", "a mapping", type(entries).__name__)
        return {str(k): decode_value(x, f"{field}.{k}", _depth + 1) for k, x in entries.items()}
    if kind == "error":
        return decode_error(d, field)
    raise ValidationError(f"{field}.kind", f"one of {list(KINDS)}", kind)


def _array_from_bytes(
    data: bytes, dt: np.dtype, shape: tuple[int, ...], scalar: bool, field: str
) -> Any:
    n = math.prod(shape)
    if len(data) != n * dt.itemsize:
        raise ValidationError(
            f"{field}.data",
            f"{n * dt.itemsize} bytes for dtype {_dtype_name(dt)} and shape {list(shape)}",
            f"{len(data)} bytes",
        )
    if scalar and shape != ():
        raise ValidationError(f"{field}.shape", "[] for a scalar", list(shape))
    # Copy so the result is writable and owns its memory (frombuffer aliases the message).
    a = np.frombuffer(data, dtype=dt.newbyteorder("<") if dt.kind not in "bS" else dt).copy()
    a = a.astype(dt.newbyteorder("="), copy=False).reshape(shape)
    return a[()] if scalar else a


# ---------------------------------------------------------------- bytes form


def dumps_value(v: Any) -> bytes:
    """``v`` as one byte string: magic, a length-prefixed JSON header, then the raw buffers."""
    buffers: list[bytes] = []

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        out = dict(d)
        for key in ("data", "value"):
            if isinstance(out.get(key), bytes):
                buffers.append(out[key])
                out[key] = {"buf": len(buffers) - 1}
        if "items" in out:
            out["items"] = [strip(x) for x in out["items"]]
        if "entries" in out:
            out["entries"] = {k: strip(x) for k, x in out["entries"].items()}
        return out

    header = json.dumps(strip(encode_value(v)), separators=(",", ":")).encode()
    parts = [_FRAME_MAGIC, struct.pack("<II", len(header), len(buffers)), header]
    for b in buffers:
        parts.append(struct.pack("<Q", len(b)))
        parts.append(b)
    return b"".join(parts)


def loads_value(blob: bytes, field: str = "value") -> Any:
    """The value a ``dumps_value`` byte string stands for."""
    mv = memoryview(blob)
    if len(mv) < 12 or bytes(mv[:4]) != _FRAME_MAGIC:
        raise ValidationError(field, "a frame starting with b'ILV1'", bytes(mv[:4]))
    hlen, nbuf = struct.unpack_from("<II", mv, 4)
    pos = 12 + hlen
    if pos > len(mv):
        raise ValidationError(field, f"a header of {hlen} bytes", f"{len(mv) - 12} bytes")
    try:
        header = json.loads(bytes(mv[12:pos]))
    except ValueError as e:
        raise ValidationError(f"{field}.header", "JSON", str(e)) from None
    buffers: list[bytes] = []
    for i in range(nbuf):
        if pos + 8 > len(mv):
            raise ValidationError(f"{field}.buffers[{i}]", "a length prefix", "end of data")
        (n,) = struct.unpack_from("<Q", mv, pos)
        pos += 8
        if pos + n > len(mv):
            raise ValidationError(f"{field}.buffers[{i}]", f"{n} bytes", f"{len(mv) - pos}")
        buffers.append(bytes(mv[pos : pos + n]))
        pos += n
    if pos != len(mv):
        raise ValidationError(field, "no bytes after the last buffer", f"{len(mv) - pos} bytes")

    def fill(d: Any, where: str) -> Any:
        if not isinstance(d, dict):
            return d
        out = dict(d)
        for key in ("data", "value"):
            ref = out.get(key)
            if isinstance(ref, dict) and "buf" in ref:
                idx = ref["buf"]
                if not isinstance(idx, int) or not 0 <= idx < len(buffers):
                    raise ValidationError(f"{where}.{key}", "a buffer index", idx)
                out[key] = buffers[idx]
        if isinstance(out.get("items"), list):
            out["items"] = [fill(x, f"{where}[{i}]") for i, x in enumerate(out["items"])]
        if isinstance(out.get("entries"), dict):
            out["entries"] = {k: fill(x, f"{where}.{k}") for k, x in out["entries"].items()}
        return out

    return decode_value(fill(header, field), field)


# ---------------------------------------------------------------- JSON form (HTTP)


def value_to_json(v: Any, _depth: int = 0) -> Any:
    """A JSON-able rendering of ``v``: arrays as ``{"dtype", "shape", "b64"}``, numpy scalars
    as plain numbers, bytes as ``{"bytes_b64"}``, exceptions as ``{"error": {...}}``."""
    if _depth > _MAX_DEPTH:
        raise ValidationError("output", f"nesting at most {_MAX_DEPTH} deep", "deeper")
    if isinstance(v, np.generic):
        if v.dtype.kind in "biuf":
            return v.item()
        v = np.asarray(v)
    if isinstance(v, np.ndarray):
        d = encode_value(v)
        return {
            "dtype": d["dtype"],
            "shape": d["shape"],
            "b64": base64.b64encode(d["data"]).decode(),
        }
    if isinstance(v, bytes | bytearray | memoryview):
        return {"bytes_b64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, BaseException):
        e = encode_error(v)
        return {"error": {"type": e["type"], "message": e["message"]}}
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [value_to_json(x, _depth + 1) for x in v]
    if isinstance(v, dict):
        return {str(k): value_to_json(x, _depth + 1) for k, x in v.items()}
    raise ValidationError("output", "a value with a JSON form", type(v).__name__)


def value_from_json(j: Any, field: str = "input", _depth: int = 0) -> Any:
    """The value a JSON form stands for.

    ``{"dtype", "shape", "b64"}`` and ``{"dtype", "shape"?, "data": nested list}`` become numpy
    arrays, ``{"bytes_b64"}`` becomes bytes; plain lists stay lists (the model decides how to
    read them). Malformed tagged objects raise ``ValidationError`` naming the field.
    """
    if _depth > _MAX_DEPTH:
        raise ValidationError(field, f"nesting at most {_MAX_DEPTH} deep", "deeper")
    if isinstance(j, list):
        return [value_from_json(x, f"{field}[{i}]", _depth + 1) for i, x in enumerate(j)]
    if not isinstance(j, dict):
        if j is None or isinstance(j, bool | int | float | str):
            return j
        raise ValidationError(field, "a JSON value", type(j).__name__)
    if "dtype" in j and ("b64" in j or "data" in j):
        return _array_from_json(j, field)
    if "bytes_b64" in j:
        if set(j) != {"bytes_b64"}:
            raise ValidationError(field, "only the key 'bytes_b64'", sorted(j))
        return _b64(j["bytes_b64"], f"{field}.bytes_b64")
    return {k: value_from_json(x, f"{field}.{k}", _depth + 1) for k, x in j.items()}


def _b64(s: Any, field: str) -> bytes:
    if not isinstance(s, str):
        raise ValidationError(field, "a base64 string", type(s).__name__)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(field, "valid base64", s[:40]) from None


def _array_from_json(j: dict[str, Any], field: str) -> np.ndarray:
    extra = set(j) - {"dtype", "shape", "b64", "data"}
    if extra:
        raise ValidationError(field, "only keys dtype, shape, b64 or data", sorted(extra))
    dt = _parse_dtype(j["dtype"], f"{field}.dtype")
    if "b64" in j:
        if "data" in j:
            raise ValidationError(field, "either 'b64' or 'data', not both", sorted(j))
        if "shape" not in j:
            raise ValidationError(f"{field}.shape", "a list of non-negative integers", None)
        shape = _parse_shape(j["shape"], f"{field}.shape")
        return _array_from_bytes(_b64(j["b64"], f"{field}.b64"), dt, shape, False, field)
    a = _nested_list(j["data"], dt, f"{field}.data")
    if "shape" in j:
        shape = _parse_shape(j["shape"], f"{field}.shape")
        if a.shape != shape:
            raise ValidationError(
                f"{field}.shape", f"the shape of data {list(a.shape)}", list(shape)
            )
    return a


def _nested_list(data: Any, dt: np.dtype, field: str) -> np.ndarray:
    """A nested list as ``dt``: numbers read as themselves, then cast exactly (numpy's own
    ``np.array(data, dtype)`` truncates 2.7 to 2 for an int and makes 1e300 inf for float32)."""
    try:
        a = np.array(data)
        if a.dtype.kind == "O" or dt.kind in "SU":
            # ragged (refused below), integers beyond int64 (numpy checks their range when
            # given the dtype) or strings
            a = np.array(data, dtype=dt)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValidationError(field, f"a nested list of {dt.name}", str(e)) from None
    if a.dtype.kind == "O":
        raise ValidationError(field, "a rectangular nested list", "ragged")
    if a.dtype.kind in "SU" and dt.kind not in "SU":
        raise ValidationError(field, f"a nested list of {dt.name}", "strings")
    return cast_exact(a, dt, field)
