"""TF Serving over gRPC: ``PredictionService`` and ``ModelService`` (when the tensorflow-serving-api stubs are installed)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferline.adapters.tfserving import from_tensor_proto, to_tensor_proto
from inferline.core import InferlineError, ValidationError, cast_exact
from inferline.server.frontdoors._deadline import grpc_limits
from inferline.server.frontdoors._door import TF_OF, FrontDoor, check_shape, decode_off_loop
from inferline.server.frontdoors._grpc_status import (
    Admission,
    TokenCheck,
    grpc_fail,
    with_unimplemented,
)

__all__ = ["ModelStatusHandlers", "PredictionHandlers", "check_tensor_proto", "tfserving_servicers"]

_DT_ENUMS = {
    "DT_FLOAT": 1,
    "DT_DOUBLE": 2,
    "DT_INT32": 3,
    "DT_UINT8": 4,
    "DT_INT16": 5,
    "DT_INT8": 6,
    "DT_STRING": 7,
    "DT_INT64": 9,
    "DT_BOOL": 10,
}


# bytes per element of TF's DataType enums (DT_STRING: at least one)
_ITEMSIZE = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 7: 1, 9: 8, 10: 1, 17: 2, 19: 2, 22: 4, 23: 8}
# the TF dtypes narrower than the int32s of ``int_val`` that carries them
_INT_VAL_DTYPES = {4: "uint8", 5: "int16", 6: "int8", 17: "uint16"}
_VALUE_FIELDS = (
    "float_val",
    "double_val",
    "int_val",
    "int64_val",
    "bool_val",
    "string_val",
    "half_val",
    "uint32_val",
    "uint64_val",
)


def check_tensor_proto(tp: Any, field: str, max_rows: int, max_bytes: int) -> None:
    """A ``TensorProto``'s declared shape against what it carries, before it is decoded: sizes
    >= 0, at most ``max_rows`` rows, ``tensor_content`` of exactly the declared size, one
    typed value per element, or TF's "fill" form (one value for every element) only for a
    tensor no larger than ``max_bytes`` (the message limit). A 41-byte request declaring 10^8
    floats made the server allocate gigabytes before."""
    shape = [int(d.size) for d in tp.tensor_shape.dim]
    n = check_shape(shape, f"{field}.tensor_shape", max_rows)
    size = _ITEMSIZE.get(int(tp.dtype), 1)
    if tp.tensor_content:
        if len(tp.tensor_content) != n * size and int(tp.dtype) != 7:
            raise ValidationError(
                f"{field}.tensor_content",
                f"{n * size} bytes for shape {shape}",
                f"{len(tp.tensor_content)} bytes",
            )
        return
    narrow = _INT_VAL_DTYPES.get(int(tp.dtype))
    if narrow is not None and tp.int_val:
        # int_val holds int32s; the decoder's astype would wrap 1000 to an int8 -24
        cast_exact(np.asarray(tp.int_val, np.int64), narrow, f"{field}.int_val")
    count = sum(len(getattr(tp, f)) for f in _VALUE_FIELDS)
    if count == n or (count == 1 and n * size <= max_bytes):
        return
    raise ValidationError(
        field,
        f"{n} values for shape {shape}"
        + (" (or one value to fill it)" if n * size <= max_bytes else ""),
        f"{count} values",
    )


def _decode(inputs: Any, max_rows: int, max_bytes: int) -> dict[str, np.ndarray]:
    for k, v in inputs.items():
        check_tensor_proto(v, f"inputs.{k}", max_rows, max_bytes)
    return {k: from_tensor_proto(v, f"inputs.{k}") for k, v in inputs.items()}


class PredictionHandlers:
    """TF Serving's ``PredictionService``: ``Predict`` and ``GetModelMetadata`` over a
    ``FrontDoor`` (``st``: the tensorflow-serving-api stubs). ``Predict`` takes a slot of
    ``gate`` (none: unbounded) after the token check."""

    def __init__(
        self,
        door: FrontDoor,
        auth: TokenCheck,
        st: Any,
        max_bytes: int = 1 << 20,
        gate: Admission | None = None,
    ) -> None:
        self.door = door
        self.auth = auth
        self.st = st
        self.max_bytes = max_bytes
        self.gate = gate or Admission(None, lambda name: None)

    async def Predict(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        await self.gate.enter(context, request.model_spec.name)
        try:
            return await self._predict(request, context)
        finally:
            self.gate.leave()

    async def _predict(self, request: Any, context: Any) -> Any:
        name = request.model_spec.name
        try:
            tensors = await decode_off_loop(
                request.ByteSize(), _decode, request.inputs, self.door.max_rows, self.max_bytes
            )
            outs = self.door.stack(
                name,
                # TF Serving's API carries no deadline but gRPC's own
                await self.door.run(name, self.door.queries(name, tensors), grpc_limits(context)),
                list(request.output_filter),
            )
        except InferlineError as e:
            await grpc_fail(context, e)
        resp = self.st.predict_pb2.PredictResponse()
        resp.model_spec.name = name
        resp.model_spec.version.value = 1
        for k, a in outs.items():
            resp.outputs[k].CopyFrom(to_tensor_proto(a, self.st))
        return resp

    async def GetModelMetadata(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        name = request.model_spec.name
        try:
            sig = await self.door.describe(name)
        except InferlineError as e:
            await grpc_fail(context, e)
        sig_map = self.st.get_model_metadata_pb2.SignatureDefMap()
        sd = sig_map.signature_def["serving_default"]
        sd.method_name = "tensorflow/serving/predict"
        for part, tensors in (("inputs", sig.inputs), ("outputs", sig.outputs)):
            for t in tensors:
                ti = getattr(sd, part)[t.name]
                ti.name = t.name
                ti.dtype = _DT_ENUMS.get(TF_OF.get(t.dtype, "DT_FLOAT"), 1)
                for s in (-1, *t.shape):
                    ti.tensor_shape.dim.add().size = int(s)
        resp = self.st.get_model_metadata_pb2.GetModelMetadataResponse()
        resp.model_spec.name = name
        resp.model_spec.version.value = 1
        resp.metadata["signature_def"].Pack(sig_map)
        return resp


class ModelStatusHandlers:
    """TF Serving's ``ModelService``: ``GetModelStatus`` (model reloads are the operator's)."""

    def __init__(self, door: FrontDoor, auth: TokenCheck, st: Any) -> None:
        self.door = door
        self.auth = auth
        self.st = st

    async def GetModelStatus(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        try:
            self.door.check(request.model_spec.name)
        except InferlineError as e:
            await grpc_fail(context, e)
        resp = self.st.get_model_status_pb2.GetModelStatusResponse()
        mv = resp.model_version_status.add()
        mv.version = 1
        mv.state = 30 if self.door.ready(request.model_spec.name) else 20  # AVAILABLE / LOADING
        return resp


def tfserving_servicers(
    door: FrontDoor,
    auth: TokenCheck,
    st: Any,
    max_bytes: int = 1 << 20,
    gate: Admission | None = None,
) -> tuple[Any, Any]:
    """The two servicers, each answering UNIMPLEMENTED for the RPCs inferline does not serve."""
    pred = with_unimplemented(
        PredictionHandlers,
        st.prediction_service_pb2_grpc.PredictionServiceServicer,
        auth,
        "Prediction",
    )
    models = with_unimplemented(
        ModelStatusHandlers, st.model_service_pb2_grpc.ModelServiceServicer, auth, "Models"
    )
    return pred(door, auth, st, max_bytes, gate), models(door, auth, st)
