"""KServe v2 over gRPC (``inference.GRPCInferenceService``, tritonclient's generated definitions)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from inferline.core import InferlineError, ValidationError
from inferline.server.frontdoors._deadline import RequestLimits, kserve_grpc_limits
from inferline.server.frontdoors._door import (
    KSERVE_EXTENSIONS,
    KSERVE_OF,
    FrontDoor,
    TensorInfo,
    decode_off_loop,
    dtype_name,
)
from inferline.server.frontdoors._grpc_status import (
    Admission,
    TokenCheck,
    grpc_fail,
    with_unimplemented,
)
from inferline.server.frontdoors._kserve_codec import (
    bytes_serialize,
    grpc_contents,
    tensor_from_kserve,
)

__all__ = [
    "KServeHandlers",
    "admit_infer",
    "decode_infer",
    "decode_infer_inputs",
    "infer_response",
    "kserve_servicer",
    "run_infer",
]


class KServeHandlers:
    """The KServe v2 RPCs inferline serves: health, metadata, model configuration, statistics
    and ``ModelInfer`` over a ``FrontDoor`` (``pb``: tritonclient's generated messages). Every
    RPC checks the token; ``ModelInfer`` then takes a slot of ``gate`` (none: unbounded)."""

    def __init__(
        self, door: FrontDoor, auth: TokenCheck, pb: Any, gate: Admission | None = None
    ) -> None:
        self.door = door
        self.auth = auth
        self.pb = pb
        self.gate = gate or Admission(None, lambda name: None)

    def _tmeta(self, t: TensorInfo) -> Any:
        return self.pb.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=KSERVE_OF.get(t.dtype, "FP32"), shape=[-1, *t.shape]
        )

    async def ServerLive(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        return self.pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        return self.pb.ServerReadyResponse(ready=self.door.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        return self.pb.ModelReadyResponse(ready=self.door.ready(request.name))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        from inferline.core import __version__

        return self.pb.ServerMetadataResponse(
            name="inferline", version=__version__, extensions=list(KSERVE_EXTENSIONS)
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self.auth.require(context)
        try:
            sig = await self.door.describe(request.name)
        except InferlineError as e:
            await grpc_fail(context, e)
        return self.pb.ModelMetadataResponse(
            name=request.name,
            versions=["1"],
            platform="inferline",
            inputs=[self._tmeta(t) for t in sig.inputs],
            outputs=[self._tmeta(t) for t in sig.outputs],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        """Triton's model-configuration extension (what perf_analyzer reads first)."""
        await self.auth.require(context)
        try:
            cfg = await self.door.model_config(request.name)
        except InferlineError as e:
            await grpc_fail(context, e)
        from tritonclient.grpc import model_config_pb2 as mc

        def tensors(cls: Any, ts: list[dict[str, Any]]) -> list[Any]:
            return [
                cls(name=t["name"], data_type=mc.DataType.Value(t["data_type"]), dims=t["dims"])
                for t in ts
            ]

        return self.pb.ModelConfigResponse(
            config=mc.ModelConfig(
                name=cfg["name"],
                platform=cfg["platform"],
                backend=cfg["backend"],
                max_batch_size=cfg["max_batch_size"],
                input=tensors(mc.ModelInput, cfg["input"]),
                output=tensors(mc.ModelOutput, cfg["output"]),
            )
        )

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """The KServe statistics extension: one model's, or every name's (empty name)."""
        await self.auth.require(context)
        try:
            body = self.door.model_stats(request.name or None)
        except InferlineError as e:
            await grpc_fail(context, e)
        pb = self.pb

        def dur(d: dict[str, int]) -> Any:
            return pb.StatisticDuration(count=d["count"], ns=d["ns"])

        return pb.ModelStatisticsResponse(
            model_stats=[
                pb.ModelStatistics(
                    name=m["name"],
                    version=m["version"],
                    last_inference=m["last_inference"],
                    inference_count=m["inference_count"],
                    execution_count=m["execution_count"],
                    inference_stats=pb.InferStatistics(
                        **{k: dur(v) for k, v in m["inference_stats"].items()}
                    ),
                )
                for m in body["model_stats"]
            ]
        )

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await admit_infer(self.auth, self.gate, request, context, self._infer)

    async def _infer(self, request: Any, context: Any) -> Any:
        try:
            tensors, limits = await decode_infer(request, context, self.door.max_rows)
            wanted = [o.name for o in request.outputs]
            outs = await run_infer(self.door, request.model_name, tensors, limits, wanted)
            return infer_response(self.pb, request, outs)
        except InferlineError as e:
            await grpc_fail(context, e)


async def admit_infer(
    auth: TokenCheck,
    gate: Admission,
    request: Any,
    context: Any,
    infer: Callable[[Any, Any], Awaitable[Any]],
) -> Any:
    """``ModelInfer`` on any gRPC door (this process's, a door worker's): the token, a slot
    of ``gate`` (or RESOURCE_EXHAUSTED, counted), then ``infer(request, context)``."""
    await auth.require(context)
    await gate.enter(context, request.model_name)
    try:
        return await infer(request, context)
    finally:
        gate.leave()


async def decode_infer(
    request: Any, context: Any, max_rows: int
) -> tuple[dict[str, np.ndarray], RequestLimits]:
    """A ``ModelInferRequest``'s input tensors (off the loop when large) and its limits (its
    parameters, cut to the client's deadline). Raises ``InferlineError``."""
    tensors = await decode_off_loop(request.ByteSize(), decode_infer_inputs, request, max_rows)
    return tensors, kserve_grpc_limits(request.parameters, context)


async def run_infer(
    door: FrontDoor,
    model: str,
    tensors: dict[str, np.ndarray],
    limits: RequestLimits,
    wanted: list[str],
) -> dict[str, np.ndarray]:
    """A decoded ``ModelInfer``'s outputs, stacked: datatypes and rows checked, its queries
    through the queue (here, or in the queue process for a door worker's call)."""
    door.check_datatypes(model, tensors)
    outs = await door.run(model, door.queries(model, tensors), limits)
    return door.stack(model, outs, wanted)


def infer_response(pb: Any, request: Any, outs: dict[str, np.ndarray]) -> Any:
    """The ``ModelInferResponse`` of ``outs`` (raw output contents, little-endian). Raises
    ``ValidationError`` for an output KServe cannot carry."""
    resp = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    for k, a in outs.items():
        dt = KSERVE_OF.get(dtype_name(a))
        if dt is None:
            raise ValidationError(f"outputs.{k}", "a numeric, bool or bytes tensor", str(a.dtype))
        resp.outputs.add(name=k, datatype=dt, shape=list(a.shape))
        resp.raw_output_contents.append(
            bytes_serialize(a)
            if dt == "BYTES"
            else np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"))).tobytes()
        )
    return resp


def decode_infer_inputs(request: Any, max_rows: int) -> dict[str, np.ndarray]:
    """A ``ModelInferRequest``'s input tensors (raw or typed contents), shapes checked first."""
    tensors = {}
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise ValidationError(
            "raw_input_contents",
            f"one entry per input ({len(request.inputs)})",
            f"{len(raws)} entries",
        )
    for i, t in enumerate(request.inputs):
        d = {"name": t.name, "datatype": t.datatype, "shape": [int(s) for s in t.shape]}
        if raws:
            tensors[t.name] = tensor_from_kserve(d, raws[i], f"inputs[{i}]", max_rows)
        else:
            vals = grpc_contents(t, f"inputs[{i}]")
            tensors[t.name] = tensor_from_kserve(
                {**d, "data": vals}, None, f"inputs[{i}]", max_rows
            )
    return tensors


def kserve_servicer(
    door: FrontDoor, auth: TokenCheck, pb: Any, pbg: Any, gate: Admission | None = None
) -> Any:
    """A ``GRPCInferenceServiceServicer``: :class:`KServeHandlers`, and UNIMPLEMENTED for the
    rest (model control, shared memory, ...)."""
    cls = with_unimplemented(KServeHandlers, pbg.GRPCInferenceServiceServicer, auth, "KServe")
    return cls(door, auth, pb, gate)
