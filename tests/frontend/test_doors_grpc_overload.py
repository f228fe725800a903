"""Past its capacity a gRPC door refuses, never resets (issue 44, item 6): more concurrent calls
than the door's ``max_inflight`` are answered RESOURCE_EXHAUSTED before any work, counted in
``inferline_overloaded_total``, and the door keeps serving. Before, 2,000 concurrent calls on one
channel came back 5-32% ``CANCELLED`` (grpc-core reset the calls the event loop had not taken
yet, past its pending-call backlog of 1,000) and nothing counted them.

A real ``grpc.aio`` server on 127.0.0.1 and ``grpc.aio`` clients in the same loop; the app
holds every call it admits until all the calls fired are either inside it or answered, so the
number refused is exact: fired minus the bound."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from inferline.server import App, InputSpec, Service
from inferline.server.frontdoors import FrontDoor, FrontDoorGrpc

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

_REFUSALS = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}


class _Held:
    """An app that holds every query until released, counting how many it holds at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.inside = 0
        self.peak = 0
        self.entered = 0

    async def __call__(self, x: Any, slo: float) -> Any:
        self.entered += 1
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        try:
            await self.release.wait()
        finally:
            self.inside -= 1
        return np.asarray(x)


def _kserve_req() -> Any:
    req = pb.ModelInferRequest(model_name="slow")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 3])
    req.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    return req


def _overloaded(svc: Service, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(svc.metrics.render().decode()):
        if fam.name == "inferline_overloaded":
            return sum(
                s.value
                for s in fam.samples
                if s.name == "inferline_overloaded_total" and s.labels.get("model") == model
            )
    return 0.0


async def _code(call: Awaitable[Any]) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)
    return "OK"


async def _burst(
    held: _Held, calls: list[Callable[[], Awaitable[Any]]], settle_s: float = 60.0
) -> list[str]:
    """Fire every call at once; release the app once each call is in it or answered (or
    after ``settle_s``), then collect every call's status."""
    answered: list[str] = []

    async def one(c: Callable[[], Awaitable[Any]]) -> str:
        code = await _code(c())
        answered.append(code)
        return code

    tasks = [asyncio.ensure_future(one(c)) for c in calls]
    loop = asyncio.get_running_loop()
    end = loop.time() + settle_s
    while held.inside + len(answered) < len(calls) and loop.time() < end:
        await asyncio.sleep(0.02)
    held.release.set()
    return list(await asyncio.gather(*tasks))


def _service(held: _Held) -> Service:
    return Service([App("slow", held, 60.0, input_spec=InputSpec("float32", (3,)))])


def test_grpc_door_refuses_past_its_default_bound_and_never_resets() -> None:
    """2,000 concurrent KServe calls on one channel against the default bound (1,024)."""
    n = 2000

    async def main() -> tuple[list[str], _Held, float, str]:
        held = _Held()
        svc = _service(held)
        g = FrontDoorGrpc(FrontDoor(svc), protocols=("kserve",))
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                infer = pbg.GRPCInferenceServiceStub(ch).ModelInfer
                req = _kserve_req()
                codes = await _burst(held, [lambda: infer(req, timeout=90)] * n)
                after = await _code(infer(req, timeout=30))
        finally:
            await g.stop()
        return codes, held, _overloaded(svc, "slow"), after

    codes, held, counted, after = asyncio.run(main())
    seen = collections.Counter(codes)
    assert set(seen) <= {"OK"} | _REFUSALS, seen  # no CANCELLED, no UNKNOWN
    refused = sum(seen[c] for c in _REFUSALS)
    assert seen["OK"] == 1024 and refused == n - 1024, seen
    assert held.peak == 1024
    assert counted == refused, (counted, seen)
    assert after == "OK"


def test_grpc_doors_share_one_bound_and_health_is_never_refused() -> None:
    """KServe and TF Serving calls together against ``max_inflight=16``: exactly 16 run, the
    rest are refused and counted; health answers while the door is full; then it serves."""
    from inferline.adapters.tfserving._protos import available, stubs

    n, bound = 300, 16

    async def main() -> tuple[list[str], _Held, float, list[str]]:
        held = _Held()
        svc = _service(held)
        g = FrontDoorGrpc(FrontDoor(svc), max_inflight=bound)
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.GRPCInferenceServiceStub(ch)
                req = _kserve_req()
                calls: list[Callable[[], Awaitable[Any]]] = [
                    lambda: stub.ModelInfer(req, timeout=60)
                ] * n
                if available():
                    st = stubs()
                    predict = ch.unary_unary(
                        "/tensorflow.serving.PredictionService/Predict",
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=st.predict_pb2.PredictResponse.FromString,
                    )
                    treq = st.predict_pb2.PredictRequest()
                    treq.model_spec.name = "slow"
                    tp = treq.inputs["input"]
                    tp.dtype = 1  # DT_FLOAT
                    for d in (1, 3):
                        tp.tensor_shape.dim.add().size = d
                    tp.float_val.extend([0.0, 1.0, 2.0])
                    calls[1::2] = [lambda: predict(treq, timeout=60)] * len(calls[1::2])
                burst = asyncio.ensure_future(_burst(held, calls))
                while held.inside < bound:
                    await asyncio.sleep(0.01)
                live = await _code(stub.ServerLive(pb.ServerLiveRequest(), timeout=10))
                codes = await burst
                after = [live, await _code(stub.ModelInfer(req, timeout=30))]
        finally:
            await g.stop()
        return codes, held, _overloaded(svc, "slow"), after

    codes, held, counted, after = asyncio.run(main())
    seen = collections.Counter(codes)
    assert set(seen) <= {"OK"} | _REFUSALS, seen
    refused = sum(seen[c] for c in _REFUSALS)
    assert seen["OK"] == bound and refused == n - bound, seen
    assert held.peak == bound
    assert counted == refused
    assert after == ["OK", "OK"]


def test_max_inflight_must_be_positive() -> None:
    svc = Service([App("slow", _Held(), 1.0)])
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_inflight"):
            FrontDoorGrpc(FrontDoor(svc), max_inflight=bad)
