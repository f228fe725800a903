"""Every gRPC method of the front doors checks the token first, implemented or not; the ones
inferline does not serve answer UNIMPLEMENTED quietly (no traceback in the log per call).
Real ``grpc.aio`` servers on 127.0.0.1, called by method path with raw bytes, as a client
holding only the protos would."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from inferline.server import App, InputSpec, Service
from inferline.server.frontdoors import FrontDoor, FrontDoorGrpc, Signature, TensorInfo

grpc = pytest.importorskip("grpc")

_TF_UNSERVED = [
    "/tensorflow.serving.PredictionService/Classify",
    "/tensorflow.serving.PredictionService/Regress",
    "/tensorflow.serving.PredictionService/MultiInference",
    "/tensorflow.serving.ModelService/HandleReloadConfigRequest",
]
_KSERVE_UNSERVED = [
    "/inference.GRPCInferenceService/RepositoryIndex",
    "/inference.GRPCInferenceService/RepositoryModelLoad",
    "/inference.GRPCInferenceService/SystemSharedMemoryStatus",
]


async def _ident(x: Any, slo: float) -> Any:
    return np.asarray(x)


def _door() -> FrontDoor:
    svc = Service([App("m", _ident, 1.0, input_spec=InputSpec("float32", (3,)))])
    sig = Signature((TensorInfo("x", "float32", (3,)),), (TensorInfo("output", "float32", (3,)),))
    return FrontDoor(svc, {"m": sig})


async def _call(ch: Any, method: str, meta: tuple[tuple[str, str], ...]) -> Any:
    rpc = ch.unary_unary(method)  # bytes in, bytes out: an empty message of any type
    try:
        await rpc(b"", metadata=meta, timeout=10)
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("token", ["s3cret", None])
def test_unserved_grpc_methods_check_the_token_and_answer_unimplemented_quietly(
    token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    g = FrontDoorGrpc(_door(), token=token)

    async def main() -> dict[tuple[str, str], Any]:
        port = await g.start()
        seen = {}
        try:
            methods = [m for m in _TF_UNSERVED + _KSERVE_UNSERVED if m.split("/")[1] in g.services]
            assert methods, g.services
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                for m in methods:
                    for who, meta in (
                        ("none", ()),
                        ("wrong", (("authorization", "Bearer wrong"),)),
                        ("right", (("authorization", "Bearer s3cret"),)),
                    ):
                        seen[m, who] = await _call(ch, m, meta)
        finally:
            await g.stop()
        return seen

    with caplog.at_level(logging.DEBUG):
        seen = asyncio.run(main())
    for (m, who), code in seen.items():
        if token is None or who == "right":
            assert code == grpc.StatusCode.UNIMPLEMENTED, (m, who, code)
        else:
            assert code == grpc.StatusCode.UNAUTHENTICATED, (m, who, code)
    if "tensorflow.serving.PredictionService" in g.services:
        assert ("/tensorflow.serving.PredictionService/Classify", "none") in seen
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
