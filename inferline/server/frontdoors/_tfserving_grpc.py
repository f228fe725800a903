"""TF Serving over gRPC: ``PredictionService`` and ``ModelService`` (when the tensorflow-serving-api stubs are installed)."""

from __future__ import annotations

from typing import Any

from inferline.adapters.tfserving._protos import from_tensor_proto, to_tensor_proto
from inferline.core import InferlineError
from inferline.server.frontdoors._door import TF_OF, FrontDoor
from inferline.server.frontdoors._grpc_status import TokenCheck, grpc_fail, with_unimplemented

__all__ = ["ModelStatusHandlers", "PredictionHandlers", "tfserving_servicers"]

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


class PredictionHandlers:
    """TF Serving's ``PredictionService``: ``Predict`` and ``GetModelMetadata`` over a
    ``FrontDoor`` (``st``: the tensorflow-serving-api stubs)."""

    def __init__(self, door: FrontDoor, auth: TokenCheck, st: Any) -> None:
        self.door = door
        self.auth = auth
        self.st = st

    async def Predict(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        name = request.model_spec.name
        try:
            tensors = {k: from_tensor_proto(v, f"inputs.{k}") for k, v in request.inputs.items()}
            outs = self.door.stack(
                name,
                await self.door.run(name, self.door.queries(name, tensors)),
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
            sig = self.door.signature(name)
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


def tfserving_servicers(door: FrontDoor, auth: TokenCheck, st: Any) -> tuple[Any, Any]:
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
    return pred(door, auth, st), models(door, auth, st)
