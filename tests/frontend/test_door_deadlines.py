"""Per-request deadline and priority on the protocol doors (issue 45, item 1): KServe v2
``parameters.timeout`` (microseconds) and ``parameters.priority`` over HTTP and gRPC, and the
deadline a gRPC client sets, on the KServe and TF Serving gRPC doors. The served name's SLO
is the default and the cap; priority classes are strict, EDF within a class.

Real servers on 127.0.0.1 in one event loop: uvicorn (``serve_app``) and the gRPC doors, over
a dispatcher whose one in-process replica takes ``BUSY_S`` per query (batches of one), so the
order in which queued queries reach it is the queue's order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from inferline.core import ValidationError
from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica
from inferline.server import App, InputSpec, Service, bind_socket, create_app, serve_app
from inferline.server.frontdoors import FrontDoor, FrontDoorGrpc, make_kserve_router
from inferline.server.frontdoors._deadline import RequestLimits, kserve_limits

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

pytestmark = [pytest.mark.timeout(60)]
BUSY_S = 0.4
SLO_S = 5.0


class Recorder:
    """Answers each input with itself, recording the order inputs reach the replica."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        self.seen += [float(np.asarray(x).reshape(-1)[0]) for x in inputs]
        return [np.asarray(x, np.float32) for x in inputs]


class Bed:
    """A dispatcher model ``m``, an app ``app`` over it, and the doors' addresses."""

    def __init__(self) -> None:
        d = Dispatcher()
        d.add_model("m", batching=FixedBatching(1), expire_late=True, expire_grace_s=0.01)
        self.rec = Recorder()
        d.set_replicas("m", [InProcessReplica("m", self.rec, service_s=BUSY_S)])

        async def pipeline(x: Any, ctx: Any) -> Any:
            return await ctx.predict("m", x)

        app = App.from_pipeline("app", pipeline, d, SLO_S, input_spec=InputSpec("float32", (1,)))
        self.dispatcher = d
        self.svc = Service([app], dispatcher=d, models=["m"])
        self.door = FrontDoor(self.svc, model_slo_s=SLO_S)
        self.http = ""
        self.grpc = ""

    async def busy(self, send: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        """Start ``send`` and wait until its query holds the replica."""
        t = asyncio.ensure_future(send())
        t0 = time.monotonic()
        while self.dispatcher.stats("m").in_flight == 0:
            assert time.monotonic() - t0 < 10, "the replica never took the first query"
            await asyncio.sleep(0.005)
        return t

    async def queued(self, n: int) -> None:
        t0 = time.monotonic()
        while self.dispatcher.queued("m") < n:
            assert time.monotonic() - t0 < 10, "the query never reached the queue"
            await asyncio.sleep(0.002)


@asynccontextmanager
async def serving(protocols: tuple[str, ...] = ("kserve",)) -> AsyncIterator[Bed]:
    bed = Bed()
    sock = bind_socket("127.0.0.1", 0)
    bed.http = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = asyncio.Event()
    up = asyncio.Event()
    app = create_app(bed.svc, routers=[make_kserve_router(bed.door)])
    server = asyncio.ensure_future(serve_app(app, sock, ready=up.set, stop=stop))
    door = FrontDoorGrpc(bed.door, protocols=protocols)
    bed.grpc = f"127.0.0.1:{await door.start()}"
    await asyncio.wait_for(up.wait(), 10)
    try:
        yield bed
    finally:
        stop.set()
        await server
        await door.stop()
        sock.close()


def _kserve_json(v: float, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [v]}]
    }
    if params:
        body["parameters"] = params
    return body


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"timeout": -5}, "parameters.timeout"),
        ({"timeout": 1.5}, "parameters.timeout"),
        ({"timeout": True}, "parameters.timeout"),
        ({"priority": 101}, "parameters.priority"),
        ({"priority": "1"}, "parameters.priority"),
    ],
)
def test_bad_parameters_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as ei:
        kserve_limits(params)
    assert ei.value.field == field
    assert kserve_limits({"timeout": 0}) == RequestLimits()  # Triton's "none"
    assert kserve_limits({"timeout": 2500, "priority": -3}) == RequestLimits(0.0025, -3)
    assert RequestLimits(9.0).budget(SLO_S) == SLO_S  # the SLO is the cap


@pytest.mark.parametrize("name", ["app", "m"])
def test_kserve_http_timeout_expires_at_its_own_deadline_and_priority_overtakes(
    name: str,
) -> None:
    async def main() -> None:
        async with serving() as bed, httpx.AsyncClient(timeout=30) as c:
            url = f"{bed.http}/v2/models/{name}/infer"
            first = await bed.busy(lambda: c.post(url, json=_kserve_json(1)))
            # queued behind a busy replica: expired at 30 ms (+ the 10 ms grace), not the SLO
            t0 = time.monotonic()
            r = await c.post(url, json=_kserve_json(2, timeout=30_000))
            took = time.monotonic() - t0
            assert r.status_code == 504, r.text
            assert took < BUSY_S, f"answered after {took:.3f} s"
            # a higher class overtakes an earlier query of the default class
            low = asyncio.ensure_future(c.post(url, json=_kserve_json(3)))
            await bed.queued(1)
            high = await c.post(url, json=_kserve_json(4, priority=7))
            assert high.status_code == 200 and (await low).status_code == 200
            assert (await first).status_code == 200
            assert bed.rec.seen == [1.0, 4.0, 3.0]
            bad = await c.post(url, json=_kserve_json(5, priority=1000))
            assert bad.status_code == 400 and bad.json()["field"] == "parameters.priority"

    asyncio.run(main())


def _grpc_req(name: str, v: float, **params: int) -> Any:
    req = pb.ModelInferRequest(model_name=name)
    req.inputs.add(name="input", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(np.float32([v]).tobytes())
    for k, x in params.items():
        if k == "priority":
            req.parameters[k].uint64_param = x  # as tritonclient sends it
        else:
            req.parameters[k].int64_param = x
    return req


async def _code(call: Awaitable[Any]) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)
    return "OK"


def test_kserve_grpc_timeout_priority_and_client_deadline() -> None:
    async def main() -> None:
        async with serving() as bed, grpc.aio.insecure_channel(bed.grpc) as ch:
            infer = pbg.GRPCInferenceServiceStub(ch).ModelInfer
            first = await bed.busy(lambda: infer(_grpc_req("app", 1)))
            t0 = time.monotonic()
            code = await _code(infer(_grpc_req("app", 2, timeout=30_000)))
            took = time.monotonic() - t0
            assert code == "DEADLINE_EXCEEDED" and took < BUSY_S, (code, took)
            # the client's gRPC deadline orders the queue (EDF): a later call with a nearer
            # deadline goes first; a higher class before both
            far = asyncio.ensure_future(infer(_grpc_req("app", 3), timeout=4.0))
            await bed.queued(1)
            near = asyncio.ensure_future(infer(_grpc_req("app", 4), timeout=2.0))
            await bed.queued(2)
            high = asyncio.ensure_future(infer(_grpc_req("app", 5, priority=3)))
            await asyncio.gather(first, far, near, high)
            assert bed.rec.seen == [1.0, 5.0, 4.0, 3.0]
            bad = _grpc_req("app", 6)
            bad.parameters["timeout"].string_param = "soon"
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await infer(bad)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "parameters.timeout" in str(ei.value.details())

    asyncio.run(main())


def test_tfserving_grpc_client_deadline_orders_the_queue() -> None:
    from inferline.adapters.tfserving import grpc_available, grpc_stubs, to_tensor_proto

    if not grpc_available():
        pytest.skip("tensorflow-serving-api missing")
    st = grpc_stubs()

    def req(v: float) -> Any:
        r = st.predict_pb2.PredictRequest()
        r.model_spec.name = "m"
        to_tensor_proto(np.float32([[v]]), st, into=r.inputs["input"])
        return r

    async def main() -> None:
        async with serving(("tfserving",)) as bed, grpc.aio.insecure_channel(bed.grpc) as ch:
            predict = st.prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict
            first = await bed.busy(lambda: predict(req(1)))
            far = asyncio.ensure_future(predict(req(2), timeout=4.0))
            await bed.queued(1)
            near = asyncio.ensure_future(predict(req(3), timeout=2.0))
            await asyncio.gather(first, far, near)
            assert bed.rec.seen == [1.0, 3.0, 2.0]

    asyncio.run(main())
