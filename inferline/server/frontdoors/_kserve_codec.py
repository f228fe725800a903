"""KServe v2 tensors on the wire: JSON ``data``, the binary tensor extension, and gRPC's typed contents, decoded with every declared size checked against what was sent."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferline.core import ValidationError, cast_exact
from inferline.server._http import decode_json
from inferline.server.frontdoors._door import (
    DEFAULT_MAX_ROWS,
    KSERVE_DTYPES,
    KSERVE_OF,
    check_shape,
    dtype_name,
)

__all__ = [
    "bytes_serialize",
    "grpc_contents",
    "header_length",
    "kserve_decode",
    "kserve_encode",
    "tensor_from_kserve",
]


def _bytes_elements(raw: bytes, n: int, field: str) -> np.ndarray:
    if 4 * n > len(raw):  # each element has a 4-byte length prefix: refuse before the loop
        raise ValidationError(
            f"{field}.data", f"{n} length-prefixed BYTES elements", f"{len(raw)} bytes"
        )
    out, pos = [], 0
    for _ in range(n):
        if pos + 4 > len(raw):
            raise ValidationError(field, f"{n} length-prefixed BYTES elements", "truncated data")
        (k,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + k])
        pos += 4 + k
    return np.array(out, dtype=object)


def bytes_serialize(a: np.ndarray) -> bytes:
    parts = []
    for x in a.reshape(-1).tolist():
        b = x.encode() if isinstance(x, str) else bytes(x)
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def tensor_from_kserve(
    t: Mapping[str, Any], raw: bytes | None, field: str, max_rows: int | None = DEFAULT_MAX_ROWS
) -> np.ndarray:
    """One input tensor; its declared shape (at most ``max_rows`` rows) and element count are
    checked against the values or bytes sent before anything is allocated for it."""
    dt = t.get("datatype")
    if dt not in KSERVE_DTYPES:
        raise ValidationError(f"{field}.datatype", f"one of {sorted(KSERVE_DTYPES)}", dt)
    shape = t.get("shape")
    if not isinstance(shape, list):
        raise ValidationError(f"{field}.shape", "a list of sizes", shape)
    n = check_shape(shape, f"{field}.shape", max_rows)
    try:
        if raw is not None:
            if dt == "BYTES":
                return _bytes_elements(raw, n, field).reshape(shape)
            npdt = np.dtype(KSERVE_DTYPES[dt]).newbyteorder("<")
            if len(raw) != n * npdt.itemsize:
                raise ValidationError(f"{field}.data", f"{n * npdt.itemsize} bytes", len(raw))
            return np.frombuffer(raw, npdt).astype(npdt.newbyteorder("=")).reshape(shape)
        if "data" not in t:
            raise ValidationError(f"{field}.data", "the tensor's values", None)
        if dt == "BYTES":
            flat = np.array(np.asarray(t["data"], dtype=object).reshape(-1).tolist(), dtype=object)
            _check_count(flat.size, n, shape, field)
            return flat.reshape(shape)
        vals = np.asarray(t["data"])
        _check_count(vals.size, n, shape, field)
        _check_json_values(vals, dt, f"{field}.data")
        return cast_exact(vals, KSERVE_DTYPES[dt], f"{field}.data").reshape(shape)
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, ValidationError):
            raise
        raise ValidationError(f"{field}.data", f"{n} values of {dt}", str(e)) from None


def _check_count(got: int, n: int, shape: list[int], field: str) -> None:
    if got != n:
        raise ValidationError(f"{field}.data", f"{n} values for shape {shape}", f"{got} values")


_KIND_WORDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "fractional numbers"}


def _check_json_values(vals: np.ndarray, dt: str, field: str) -> None:
    """Values of the declared datatype, as Triton reads them: JSON booleans for BOOL, integers
    in range for INT/UINT, numbers for FP. Before, numpy converted "1.5", true and 2.7 for an
    INT32 input (to 1) without a word."""
    if vals.size == 0:
        return
    kind = vals.dtype.kind
    if dt == "BOOL":
        ok, want = kind == "b", "JSON booleans"
    elif dt.startswith(("INT", "UINT")):
        ok, want = kind in "iu", f"integers that fit {dt}"
    else:
        ok, want = kind in "iuf", "JSON numbers"
    if not ok:
        got = _KIND_WORDS.get(kind, "strings" if kind in "SU" else "mixed or nested values")
        raise ValidationError(field, f"{want} for {dt}", got)
    if kind in "iu" and dt != "BOOL" and not dt.startswith("FP"):
        info = np.iinfo(KSERVE_DTYPES[dt])
        lo, hi = int(vals.min()), int(vals.max())
        if lo < info.min or hi > info.max:
            raise ValidationError(field, f"integers that fit {dt}", f"values from {lo} to {hi}")


def _params(obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """An object's optional ``parameters``: a JSON object (KServe v2) or nothing."""
    p = obj.get("parameters")
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise ValidationError(f"{field}.parameters", "a JSON object", type(p).__name__)
    return p


def header_length(value: str | None, body_len: int) -> int | None:
    """The ``Inference-Header-Content-Length`` header as a byte count within the body."""
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= body_len:
        raise ValidationError(
            "Inference-Header-Content-Length", f"a byte count in [0, {body_len}]", value
        )
    return n


def kserve_decode(
    body: bytes, header_len: int | None, max_rows: int | None = DEFAULT_MAX_ROWS
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A KServe v2 infer request (JSON, or JSON + binary tensors) -> (request, tensors);
    each tensor at most ``max_rows`` rows."""
    head, rest = (body, b"") if header_len is None else (body[:header_len], body[header_len:])
    req = decode_json(head, "a KServe v2 inference request (JSON)")
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list) or not req["inputs"]:
        raise ValidationError("inputs", "a non-empty list of input tensors", None)
    _params(req, "request")
    outputs = req.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise ValidationError("outputs", "a list of requested outputs", type(outputs).__name__)
        for i, o in enumerate(outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ValidationError(f"outputs[{i}]", "an object with a name", o)
            _params(o, f"outputs[{i}]")
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    for i, t in enumerate(req["inputs"]):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ValidationError(f"inputs[{i}]", "an object with name, shape, datatype", t)
        size = _params(t, f"inputs[{i}]").get("binary_data_size")
        raw = None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValidationError(
                    f"inputs[{i}].parameters.binary_data_size", "a byte count", size
                )
            raw = rest[pos : pos + size]
            if len(raw) != size:
                raise ValidationError(f"inputs[{i}]", f"{size} binary bytes", len(raw))
            pos += size
        tensors[t["name"]] = tensor_from_kserve(t, raw, f"inputs[{i}]", max_rows)
    return req, tensors


def kserve_encode(
    name: str, req: Mapping[str, Any], outs: Mapping[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body and, for binary outputs, the JSON header's length."""
    params = req.get("parameters") or {}
    asked = {
        o["name"]: (o.get("parameters") or {})
        for o in req.get("outputs") or []
        if isinstance(o, dict)
    }
    binary_all = bool(params.get("binary_data_output", False))
    out_json, blobs = [], []
    for k, a in outs.items():
        dt = KSERVE_OF.get(dtype_name(a))
        if dt is None:
            raise ValidationError(f"outputs.{k}", "a numeric, bool or bytes tensor", str(a.dtype))
        entry: dict[str, Any] = {"name": k, "datatype": dt, "shape": list(a.shape)}
        if asked.get(k, {}).get("binary_data", binary_all):
            blob = (
                bytes_serialize(a)
                if dt == "BYTES"
                else np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"))).tobytes()
            )
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            flat = a.reshape(-1).tolist()
            entry["data"] = [
                x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in flat
            ]
        out_json.append(entry)
    body: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": out_json}
    if "id" in req:
        body["id"] = req["id"]
    head = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


# KServe's typed contents field per datatype (FP16 has none: raw_input_contents only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def grpc_contents(t: Any, field: str) -> list[Any]:
    """The values of a typed-contents input, from the field its datatype names (values in
    another field were converted before: ints for an FP32 input, floats for INT32)."""
    want = _CONTENTS.get(t.datatype)
    if want is None:
        raise ValidationError(f"{field}.contents", f"raw_input_contents for {t.datatype}", None)
    others = [f for f in sorted(set(_CONTENTS.values())) if f != want and getattr(t.contents, f)]
    if others:
        raise ValidationError(f"{field}.contents", f"{want} for {t.datatype}", others)
    return list(getattr(t.contents, want))
