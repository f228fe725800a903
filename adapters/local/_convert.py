"""Protobuf ``Value`` <-> Python values, through ``inferline.core``'s wire dict form.

The protobuf message mirrors the dict form field for field, so all validation (dtype, shape,
byte counts) stays in ``core._wire``; this module only moves fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from inferline.core import ValidationError, decode_value, encode_error, encode_value

from . import replica_pb2 as pb

__all__ = [
    "error_to_pb",
    "from_pb",
    "from_pb_list",
    "pb_to_error_dict",
    "to_pb",
    "to_pb_list",
    "to_pb_strict",
]


def _dict_to_pb(d: dict[str, Any], out: pb.Value) -> None:
    kind = d["kind"]
    if kind == "tensor":
        t = out.tensor
        t.dtype = d["dtype"]
        t.shape.extend(d["shape"])
        t.data = d["data"]
        t.scalar = bool(d.get("scalar", False))
    elif kind == "str":
        out.str = d["value"]
    elif kind == "bytes":
        out.raw = d["value"]
    elif kind == "json":
        out.json = d["value"]
    elif kind == "error":
        _fill_error(d, out.error)
    elif kind == "list":
        lst = out.list
        lst.SetInParent()  # an empty list must still select the oneof
        for item in d["items"]:
            _dict_to_pb(item, lst.items.add())
    elif kind == "map":
        m = out.map
        m.SetInParent()
        for k, item in d["entries"].items():
            _dict_to_pb(item, m.entries[k])
    else:  # pragma: no cover - encode_value only produces the kinds above
        raise ValidationError("value.kind", "a known wire kind", kind)


def _fill_error(d: dict[str, Any], e: pb.Error) -> None:
    e.type = d["type"]
    e.message = d["message"]
    try:
        e.attrs_json = json.dumps(d.get("attrs") or {})
    except (TypeError, ValueError):
        e.attrs_json = "{}"


def pb_to_error_dict(e: pb.Error) -> dict[str, Any]:
    try:
        attrs = json.loads(e.attrs_json) if e.attrs_json else {}
    except ValueError:
        attrs = {}
    return {"kind": "error", "type": e.type, "message": e.message, "attrs": attrs}


def _pb_to_dict(v: pb.Value) -> dict[str, Any]:
    which = v.WhichOneof("kind")
    if which == "tensor":
        t = v.tensor
        return {
            "kind": "tensor",
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data": t.data,
            "scalar": t.scalar,
        }
    if which == "str":
        return {"kind": "str", "value": v.str}
    if which == "raw":
        return {"kind": "bytes", "value": v.raw}
    if which == "json":
        return {"kind": "json", "value": v.json}
    if which == "error":
        return pb_to_error_dict(v.error)
    if which == "list":
        return {"kind": "list", "items": [_pb_to_dict(x) for x in v.list.items]}
    if which == "map":
        return {"kind": "map", "entries": {k: _pb_to_dict(x) for k, x in v.map.entries.items()}}
    return {"kind": None}


def to_pb(value: Any, out: pb.Value) -> None:
    """Fill ``out`` with ``value``; a value with no wire form becomes an error value."""
    try:
        d = encode_value(value)
    except ValidationError as e:
        d = encode_error(e)
    _dict_to_pb(d, out)


def to_pb_strict(value: Any, out: pb.Value) -> None:
    """Fill ``out`` with ``value``; ``ValidationError`` if it has no wire form."""
    _dict_to_pb(encode_value(value), out)


def to_pb_list(values: Sequence[Any], out: Any) -> None:
    for v in values:
        to_pb(v, out.add())


def from_pb(v: pb.Value, field: str = "value") -> Any:
    return decode_value(_pb_to_dict(v), field)


def from_pb_list(values: Sequence[pb.Value], field: str) -> list[Any]:
    return [from_pb(v, f"{field}[{i}]") for i, v in enumerate(values)]


def error_to_pb(exc: BaseException, out: pb.Error) -> None:
    _fill_error(encode_error(exc), out)
