"""Mapping between inferline values and Triton tensors, driven by the model's configuration.

An inferline value for one query becomes one row of each batched input tensor:

- a model with one input takes the value itself (numpy array, nested list, number, str or
  bytes); a model with several inputs takes a mapping ``{input name: value}``;
- numeric values are cast to the input's dtype when numpy's ``same_kind`` rule allows it
  (float64 -> FP32 yes, float -> INT64 no) and no value changes (``core.cast_exact``: INT64
  1000 for an INT8 input is refused, not wrapped); strings travel as Triton ``BYTES`` (UTF-8);
- shapes must match the configured ``dims`` (``-1`` matches any length); dimensions of size 1
  may be added or dropped, so a scalar feeds a ``[1]`` input.

Outputs come back per query: the row of each output, as a numpy array; an output whose dims
are all 1 (e.g. a ``[1]`` label) as a scalar (numpy scalar, or ``str``/``bytes`` for BYTES);
one output as the value itself, several as ``{output name: value}``.

Anything that does not fit raises ``ValidationError`` naming the query and the input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import ValidationError, cast_exact

__all__ = [
    "NP_DTYPES",
    "ModelIO",
    "TensorSpec",
    "from_raw_contents",
    "raw_contents",
    "triton_datatype",
]

# Triton protocol datatypes -> numpy (BYTES are object arrays of bytes).
NP_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}


def triton_datatype(config_type: str) -> str:
    """``TYPE_FP32`` (model configuration) -> ``FP32`` (inference protocol)."""
    t = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if t == "STRING" else t


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: name, protocol datatype and dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    @property
    def np_dtype(self) -> np.dtype:
        try:
            return NP_DTYPES[self.datatype]
        except KeyError:
            raise ValidationError(
                f"tensor {self.name!r} datatype", f"one of {sorted(NP_DTYPES)}", self.datatype
            ) from None

    @property
    def scalar_like(self) -> bool:
        """All dims are 1 (``[1]``, ``[1, 1]``): one value per query."""
        return all(d == 1 for d in self.dims)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(str(d["name"]), str(d["datatype"]), tuple(d["dims"]))

    @classmethod
    def from_config(cls, d: Mapping[str, Any]) -> TensorSpec:
        dims = d.get("dims", [])
        return cls(
            str(d["name"]),
            triton_datatype(str(d.get("data_type", "TYPE_INVALID"))),
            tuple(int(x) for x in dims),
        )


def _shape_ok(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(
        d == -1 or d == s for s, d in zip(shape, dims, strict=True)
    )


def _fit_shape(a: np.ndarray, dims: tuple[int, ...]) -> np.ndarray | None:
    if _shape_ok(a.shape, dims):
        return a
    # Allow adding or dropping size-1 dimensions (a scalar for a [1] input).
    if -1 not in dims and tuple(s for s in a.shape if s != 1) == tuple(d for d in dims if d != 1):
        return a.reshape(dims)
    return None


def _to_bytes_array(v: Any, where: str) -> np.ndarray:
    a = np.asarray(v, dtype=np.object_)
    flat = a.reshape(-1)
    for i, x in enumerate(flat):
        if isinstance(x, str):
            flat[i] = x.encode("utf-8")
        elif isinstance(x, bytes | bytearray | memoryview):
            flat[i] = bytes(x)
        elif isinstance(x, np.bytes_ | np.str_):
            flat[i] = x.encode("utf-8") if isinstance(x, np.str_) else bytes(x)
        else:
            raise ValidationError(where, "str or bytes elements", type(x).__name__)
    return a


def _from_bytes(x: Any) -> Any:
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return x
    return x


@dataclass(frozen=True)
class ModelIO:
    """Inputs, outputs and batching of a Triton model, from its configuration."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0: the model takes no batch dimension

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "max_batch_size": self.max_batch_size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelIO:
        return cls(
            tuple(TensorSpec.from_dict(x) for x in d["inputs"]),
            tuple(TensorSpec.from_dict(x) for x in d["outputs"]),
            int(d["max_batch_size"]),
        )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ModelIO:
        return cls(
            tuple(TensorSpec.from_config(x) for x in cfg.get("input", [])),
            tuple(TensorSpec.from_config(x) for x in cfg.get("output", [])),
            int(cfg.get("max_batch_size", 0) or 0),
        )

    def output(self, name: str) -> TensorSpec:
        for t in self.outputs:
            if t.name == name:
                return t
        raise ValidationError("outputs", f"names among {[t.name for t in self.outputs]}", name)

    # -- encoding -----------------------------------------------------------------------

    def encode_item(self, item: Any, where: str = "input") -> dict[str, np.ndarray]:
        """One query's value as ``{input name: array of the input's dims}``."""
        names = sorted(t.name for t in self.inputs)
        if isinstance(item, Mapping):  # a mapping is never a tensor: it names the inputs
            if set(item) != set(names):
                raise ValidationError(
                    where, f"a mapping with exactly the inputs {names}", sorted(item)
                )
            values: Mapping[str, Any] = item
        elif len(self.inputs) == 1:
            values = {self.inputs[0].name: item}
        else:
            raise ValidationError(
                where,
                f"a mapping {{input name: value}} for the inputs {names}",
                type(item).__name__,
            )
        return {
            t.name: self._encode_tensor(t, values[t.name], f"{where}.{t.name}") for t in self.inputs
        }

    @staticmethod
    def _encode_tensor(t: TensorSpec, v: Any, where: str) -> np.ndarray:
        want = t.np_dtype
        if t.datatype == "BYTES":
            a = _to_bytes_array(v, where)
        else:
            try:
                a = np.asarray(v)
            except (TypeError, ValueError) as e:
                raise ValidationError(where, f"an array of {t.datatype}", str(e)) from None
            if a.dtype.kind not in "biuf":
                raise ValidationError(where, f"a numeric array for {t.datatype}", str(a.dtype))
            if a.dtype != want:
                if not np.can_cast(a.dtype, want, casting="same_kind"):
                    raise ValidationError(where, f"values castable to {t.datatype}", str(a.dtype))
                a = cast_exact(a, want, where)  # int64 1000 -> INT8 refused, not wrapped
        fitted = _fit_shape(a, t.dims)
        if fitted is None:
            raise ValidationError(where, f"shape {list(t.dims)}", list(a.shape))
        return fitted

    @staticmethod
    def stack(
        items: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Rows of the same shapes stacked along a new batch dimension."""
        return {n: np.stack([it[n] for it in items]) for n in names}

    @staticmethod
    def shape_key(item: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], ...]:
        return tuple(a.shape for a in item.values())

    # -- decoding -----------------------------------------------------------------------

    def decode(
        self, outputs: Mapping[str, np.ndarray], n: int, names: Sequence[str], batched: bool = True
    ) -> list[Any]:
        """Per-query values from batched outputs (``batched=False``: one query, no batch dim)."""
        per: dict[str, list[Any]] = {}
        for name in names:
            spec = self.output(name)
            arr = outputs.get(name)
            if arr is None:
                raise ValidationError(f"output {name!r}", "present in the response", None)
            if batched:
                if arr.ndim == 0 or arr.shape[0] != n:
                    raise ValidationError(
                        f"output {name!r}", f"a batch of {n} rows", list(arr.shape)
                    )
                rows = [arr[i] for i in range(n)]
            else:
                rows = [arr]
            per[name] = [self._decode_row(spec, r) for r in rows]
        if len(names) == 1:
            return per[names[0]]
        return [{name: per[name][i] for name in names} for i in range(n)]

    @staticmethod
    def _decode_row(spec: TensorSpec, row: np.ndarray) -> Any:
        if spec.scalar_like and math.prod(row.shape) == 1:
            x = row.reshape(-1)[0]
            return _from_bytes(x) if spec.datatype == "BYTES" else x
        if spec.datatype == "BYTES":
            out = np.empty(row.shape, dtype=np.object_)
            flat_in, flat_out = row.reshape(-1), out.reshape(-1)
            for i, x in enumerate(flat_in):
                flat_out[i] = _from_bytes(x)
            return out
        return row.copy() if not row.flags.owndata else row


# -- the inference protocol's raw tensor contents (gRPC ``raw_*_contents``) ----------------------

_LEN = np.dtype("<u4")


def raw_contents(a: np.ndarray, datatype: str) -> bytes:
    """``a`` as the protocol's raw bytes: little-endian values, or for ``BYTES`` each element
    as a 4-byte little-endian length and its bytes."""
    if datatype != "BYTES":
        return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    parts: list[bytes] = []
    for x in a.reshape(-1):
        b = x if isinstance(x, bytes) else bytes(x)
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return b"".join(parts)


def from_raw_contents(raw: bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """The array in ``raw`` (``raw_contents``' form), or ``ValidationError`` naming ``where``
    when its size does not match ``shape``. Numeric arrays are views of ``raw``."""
    n = math.prod(shape)
    if datatype != "BYTES":
        dt = NP_DTYPES.get(datatype)
        if dt is None:
            raise ValidationError(f"{where}.datatype", f"one of {sorted(NP_DTYPES)}", datatype)
        if len(raw) != n * dt.itemsize:
            raise ValidationError(where, f"{n * dt.itemsize} bytes", len(raw))
        return np.frombuffer(raw, dtype=dt.newbyteorder("<")).reshape(shape)
    out = np.empty(n, dtype=np.object_)
    pos, view = 0, memoryview(raw)
    for i in range(n):
        if pos + 4 > len(raw):
            raise ValidationError(where, f"{n} length-prefixed elements", i)
        size = int.from_bytes(view[pos : pos + 4], "little")
        out[i] = bytes(view[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if pos != len(raw):
        raise ValidationError(
            where, f"{n} length-prefixed elements", f"{len(raw) - pos} extra bytes"
        )
    return out.reshape(shape)
