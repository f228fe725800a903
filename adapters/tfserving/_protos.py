"""TF Serving's generated gRPC stubs (``tensorflow-serving-api``), when installed, and tensors.

The stubs import TensorFlow's own message modules (``tensorflow.core.framework.tensor_pb2``
and friends). Importing them the ordinary way runs ``tensorflow/__init__.py``, which loads the
whole TensorFlow runtime (about 10 s and several hundred MB) only to get a few protobuf
classes. ``stubs()`` imports just the generated message modules: it lets Python find the
``tensorflow`` package's sub-folders without running its ``__init__``, then removes that
placeholder from ``sys.modules`` so that a later real ``import tensorflow`` works as usual
(and reuses the same message modules). When TensorFlow is already imported it is used as is.

Tensors travel as ``TensorProto`` with ``tensor_content`` (raw little-endian bytes), the form
TF Serving itself answers with; typed repeated fields (``float_val``...) are read as well.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

import numpy as np

from inferline.core import ValidationError, cast_exact

__all__ = [
    "DTYPES",
    "REST_DTYPES",
    "Stubs",
    "available",
    "from_tensor_proto",
    "np_dtype",
    "stubs",
    "to_tensor_proto",
]

# TensorFlow DataType enum names -> numpy dtypes (the subset with a portable byte layout).
DTYPES: dict[str, Any] = {
    "DT_FLOAT": np.float32,
    "DT_DOUBLE": np.float64,
    "DT_INT32": np.int32,
    "DT_UINT8": np.uint8,
    "DT_INT16": np.int16,
    "DT_INT8": np.int8,
    "DT_INT64": np.int64,
    "DT_BOOL": np.bool_,
    "DT_UINT16": np.uint16,
    "DT_HALF": np.float16,
    "DT_UINT32": np.uint32,
    "DT_UINT64": np.uint64,
    "DT_STRING": np.object_,
}
REST_DTYPES = DTYPES  # the REST API's metadata names dtypes the same way
_BY_NUMPY = {np.dtype(v).str: k for k, v in DTYPES.items() if v is not np.object_}
_ENUM = {
    "DT_FLOAT": 1,
    "DT_DOUBLE": 2,
    "DT_INT32": 3,
    "DT_UINT8": 4,
    "DT_INT16": 5,
    "DT_INT8": 6,
    "DT_STRING": 7,
    "DT_INT64": 9,
    "DT_BOOL": 10,
    "DT_UINT16": 17,
    "DT_HALF": 19,
    "DT_UINT32": 22,
    "DT_UINT64": 23,
}
_ENUM_NAME = {v: k for k, v in _ENUM.items()}


def np_dtype(tf_name: str, field: str = "dtype") -> np.dtype:
    if tf_name not in DTYPES:
        raise ValidationError(field, f"a TensorFlow dtype among {sorted(DTYPES)}", tf_name)
    return np.dtype(DTYPES[tf_name])


def tf_dtype_of(a: np.ndarray) -> str:
    if a.dtype.kind in "OSU":
        return "DT_STRING"
    name = _BY_NUMPY.get(a.dtype.newbyteorder("<").str if a.dtype.byteorder == ">" else a.dtype.str)
    if name is None:
        raise ValidationError("input", "an array of a TensorFlow-compatible dtype", str(a.dtype))
    return name


class Stubs:
    """The generated modules TF Serving's gRPC API needs."""

    def __init__(self) -> None:
        apis = "tensorflow_serving.apis."
        self.predict_pb2 = importlib.import_module(apis + "predict_pb2")
        self.get_model_metadata_pb2 = importlib.import_module(apis + "get_model_metadata_pb2")
        self.get_model_status_pb2 = importlib.import_module(apis + "get_model_status_pb2")
        self.model_management_pb2 = importlib.import_module(apis + "model_management_pb2")
        self.prediction_service_pb2_grpc = importlib.import_module(
            apis + "prediction_service_pb2_grpc"
        )
        self.model_service_pb2_grpc = importlib.import_module(apis + "model_service_pb2_grpc")
        self.model_server_config_pb2 = importlib.import_module(
            "tensorflow_serving.config.model_server_config_pb2"
        )
        self.tensor_pb2 = importlib.import_module("tensorflow.core.framework.tensor_pb2")


_LOCK = threading.Lock()
_STUBS: Stubs | None = None
_ERROR: str | None = None


def stubs() -> Stubs:
    """The stubs, or ``ValidationError`` naming the missing package."""
    global _STUBS, _ERROR
    with _LOCK:
        if _STUBS is not None:
            return _STUBS
        if _ERROR is None:
            try:
                _STUBS = _load()
                return _STUBS
            except ImportError as e:
                _ERROR = str(e)
        raise ValidationError(
            "tfserving gRPC",
            "the package tensorflow-serving-api (and tensorflow or tensorflow-cpu) installed",
            _ERROR,
        )


def available() -> bool:
    try:
        stubs()
    except ValidationError:
        return False
    return True


def _load() -> Stubs:
    if importlib.util.find_spec("tensorflow_serving") is None:
        raise ImportError("No module named 'tensorflow_serving'")
    if "tensorflow" in sys.modules:
        return Stubs()
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'tensorflow' (tensorflow or tensorflow-cpu)")
    placeholder = types.ModuleType("tensorflow")
    placeholder.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = placeholder
    try:
        return Stubs()
    finally:
        if sys.modules.get("tensorflow") is placeholder:
            del sys.modules["tensorflow"]


# ---------------------------------------------------------------- tensors


def to_tensor_proto(value: Any, st: Stubs | None = None, into: Any = None) -> Any:
    """A numpy array (or bytes/str array) as a ``TensorProto``, written into ``into`` (a
    request's ``inputs[name]``, so the tensor is not built apart and copied in) when given."""
    a = np.asarray(value)
    if into is None:
        into = (st or stubs()).tensor_pb2.TensorProto()
    tp = into
    name = tf_dtype_of(a)
    tp.dtype = _ENUM[name]
    dims = tp.tensor_shape.dim
    for d in a.shape:
        dims.add().size = int(d)
    if name == "DT_STRING":
        tp.string_val.extend(
            x.encode() if isinstance(x, str) else bytes(x) for x in a.reshape(-1).tolist()
        )
    else:
        # one copy: the array's bytes into the message (tobytes copies a strided array once)
        tp.tensor_content = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return tp


def from_tensor_proto(tp: Any, field: str = "output") -> np.ndarray:
    """A ``TensorProto`` as a numpy array (``tensor_content`` or the typed value fields)."""
    name = _ENUM_NAME.get(int(tp.dtype))
    if name is None:
        raise ValidationError(f"{field}.dtype", f"one of {sorted(_ENUM)}", int(tp.dtype))
    shape = tuple(int(d.size) for d in tp.tensor_shape.dim)
    n = int(np.prod(shape)) if shape else 1
    if name == "DT_STRING":
        vals = list(tp.string_val)
        if len(vals) == 1 and n > 1:
            vals = vals * n
        return np.array(vals, dtype=object).reshape(shape)
    dt = np_dtype(name).newbyteorder("<")
    if tp.tensor_content:
        if len(tp.tensor_content) != n * dt.itemsize:
            raise ValidationError(
                f"{field}.tensor_content", f"{n * dt.itemsize} bytes", len(tp.tensor_content)
            )
        return (
            np.frombuffer(tp.tensor_content, dtype=dt).astype(dt.newbyteorder("=")).reshape(shape)
        )
    vals = {
        "DT_FLOAT": tp.float_val,
        "DT_DOUBLE": tp.double_val,
        "DT_INT64": tp.int64_val,
        "DT_BOOL": tp.bool_val,
        "DT_UINT32": tp.uint32_val,
        "DT_UINT64": tp.uint64_val,
        "DT_HALF": tp.half_val,
    }.get(name, tp.int_val)
    arr = np.array(list(vals))
    # the typed fields are wider than the dtype (int_val is int32 for DT_INT8...): a value
    # that does not fit is refused (core.cast_exact), never wrapped
    if name == "DT_HALF":  # half_val holds the float16 bit patterns
        arr = cast_exact(arr, np.uint16, f"{field}.half_val").view(np.float16)
    arr = cast_exact(arr, dt.newbyteorder("="), f"{field}")
    if arr.size == 1 and n != 1:  # TF's "fill" form: one value for every element
        arr = np.full(n, arr[0], dtype=arr.dtype)
    if arr.size != n:
        raise ValidationError(f"{field}", f"{n} values for shape {list(shape)}", arr.size)
    return arr.reshape(shape)
