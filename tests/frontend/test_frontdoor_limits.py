"""Every front door caps the rows of one request and checks declared shapes against the bytes
sent before allocating: over a real uvicorn server (KServe v2 and TF Serving REST) and real
``grpc.aio`` servers (KServe v2 and TF Serving gRPC). Before, one 600 KB KServe request of
150,000 rows held the server 10 s (``/healthz`` unanswered meanwhile) and a 29-byte TF Serving
gRPC request declaring 10^8 floats grew the server by 4 GB (``benchmarks/frontdoor_limits.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
from _served_app import served

from inferline.server import App, InputSpec, Service, create_app
from inferline.server.frontdoors import (
    FrontDoor,
    FrontDoorGrpc,
    Signature,
    TensorInfo,
    make_kserve_router,
    make_tfserving_router,
)
from inferline.server.frontdoors._door import DEFAULT_MAX_ROWS, OFF_LOOP_BYTES, decode_off_loop


async def _double(x: Any, slo: float) -> Any:
    return np.asarray(x) * 2


def _door(max_rows: int = DEFAULT_MAX_ROWS) -> FrontDoor:
    svc = Service([App("m", _double, 1.0, input_spec=InputSpec("float32", (1,)))])
    sig = Signature((TensorInfo("x", "float32", (1,)),), (TensorInfo("output", "float32", (1,)),))
    return FrontDoor(svc, {"m": sig}, max_rows=max_rows)


def _kserve(rows: int, shape: list[int] | None = None) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": shape if shape is not None else [rows, 1],
                    "data": [0.5] * rows,
                }
            ]
        }
    ).encode()


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]


def test_the_default_cap_is_the_native_routes() -> None:
    assert App("a", _double, 1.0).max_batch_inputs == DEFAULT_MAX_ROWS == 256


def test_150k_rows_are_refused_at_once_and_healthz_keeps_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    door = _door()
    app = create_app(door.service, routers=[make_kserve_router(door), make_tfserving_router(door)])
    slowest = [0.0]
    with caplog.at_level(logging.INFO), served(app) as port:
        base = f"http://127.0.0.1:{port}"
        done = threading.Event()

        def watch() -> None:
            with httpx.Client(timeout=30) as c:
                while not done.is_set():
                    t = time.perf_counter()
                    assert c.get(f"{base}/healthz").status_code == 200
                    slowest[0] = max(slowest[0], time.perf_counter() - t)
                    time.sleep(0.01)

        w = threading.Thread(target=watch)
        w.start()
        try:
            with httpx.Client(timeout=60) as c:
                t = time.perf_counter()
                r = c.post(f"{base}/v2/models/m/infer", content=_kserve(150_000))
                took = time.perf_counter() - t
                assert r.status_code == 400, r.text
                assert "inputs[0].shape" in r.json()["error"]
                assert "at most 256 rows" in r.json()["error"]
                assert took < 3, took
                # at the cap: served
                r = c.post(f"{base}/v2/models/m/infer", content=_kserve(256))
                assert r.status_code == 200, r.text
                assert r.json()["outputs"][0]["shape"] == [256, 1]
                # TF Serving REST, both formats
                r = c.post(f"{base}/v1/models/m:predict", json={"instances": [[0.5]] * 257})
                assert r.status_code == 400 and "instances" in r.json()["error"], r.text
                r = c.post(f"{base}/v1/models/m:predict", json={"inputs": [[0.5]] * 257})
                assert r.status_code == 400 and "inputs" in r.json()["error"], r.text
                r = c.post(f"{base}/v1/models/m:predict", json={"instances": [[0.5]] * 256})
                assert r.status_code == 200, r.text
                # the native route's cap is the same
                r = c.post(f"{base}/apps/m/predict", json={"input_batch": [[0.5]] * 257})
                assert r.status_code == 422 and r.json()["field"] == "input_batch", r.text
        finally:
            done.set()
            w.join(30)
    assert slowest[0] < 2, slowest
    _no_tracebacks(caplog)


@pytest.mark.parametrize(
    ("shape", "data_rows", "says"),
    [
        ([-1, 1], 1, "inputs[0].shape"),
        ([1, -3], 1, "inputs[0].shape"),
        ([1, 2**32, 2**32], 1, "inputs[0].data"),  # 2^64: an int64 product wraps to 0
        ([3, 1], 1, "inputs[0].data"),  # declared more than sent
        ([1, "a"], 1, "inputs[0].shape"),
    ],
)
def test_bad_kserve_shapes_are_400s_naming_the_field(
    shape: list[Any], data_rows: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    door = _door()
    app = create_app(door.service, routers=[make_kserve_router(door)])

    async def main() -> httpx.Response:
        t = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=t, base_url="http://t") as c:
            return await c.post("/v2/models/m/infer", content=_kserve(data_rows, shape))

    with caplog.at_level(logging.INFO):
        r = asyncio.run(main())
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(says), r.text
    _no_tracebacks(caplog)


def test_the_cap_is_configurable_on_every_http_door() -> None:
    door = _door(max_rows=4)
    app = create_app(door.service, routers=[make_kserve_router(door), make_tfserving_router(door)])

    async def main() -> list[int]:
        t = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=t, base_url="http://t") as c:
            return [
                (await c.post("/v2/models/m/infer", content=_kserve(5))).status_code,
                (await c.post("/v2/models/m/infer", content=_kserve(4))).status_code,
                (await c.post("/v1/models/m:predict", json={"instances": [[1.0]] * 5})).status_code,
                (await c.post("/v1/models/m:predict", json={"instances": [[1.0]] * 4})).status_code,
            ]

    assert asyncio.run(main()) == [400, 200, 400, 200]
    with pytest.raises(Exception, match="max_rows"):
        FrontDoor(door.service, max_rows=0)


def test_large_bodies_are_decoded_off_the_event_loop() -> None:
    async def main() -> tuple[int, int, int]:
        here = threading.get_ident()
        small = await decode_off_loop(100, threading.get_ident)
        big = await decode_off_loop(OFF_LOOP_BYTES + 1, threading.get_ident)
        return here, small, big

    here, small, big = asyncio.run(main())
    assert small == here and big != here


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_grpc_doors_check_shapes_before_allocating(caplog: pytest.LogCaptureFixture) -> None:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    from inferline.adapters.tfserving._protos import available, stubs

    g = FrontDoorGrpc(_door(max_rows=8))

    def kserve(shape: list[int], raw: bytes | None = None, fp32: list[float] = ()) -> Any:
        req = pb.ModelInferRequest(model_name="m")
        t = req.inputs.add(name="x", datatype="FP32", shape=shape)
        if raw is not None:
            req.raw_input_contents.append(raw)
        else:
            t.contents.fp32_contents.extend(fp32)
        return req

    async def code(rpc: Any, req: Any) -> tuple[Any, str]:
        try:
            await rpc(req, timeout=20)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""

    async def main() -> None:
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                infer = pbg.GRPCInferenceServiceStub(ch).ModelInfer
                ok = await code(infer, kserve([2, 1], fp32=[1.0, 2.0]))
                assert ok[0] == grpc.StatusCode.OK, ok
                for req, says in [
                    (kserve([-5, 1], fp32=[1.0]), "inputs[0].shape"),
                    (kserve([9, 1], np.zeros(9, np.float32).tobytes()), "at most 8 rows"),
                    (kserve([1, 2**31, 2**33], b""), "inputs[0].data"),
                    (kserve([4, 1], fp32=[1.0]), "inputs[0].data"),
                ]:
                    c, details = await code(infer, req)
                    assert c == grpc.StatusCode.INVALID_ARGUMENT, (c, details)
                    assert says in details, details
                if not available():
                    return
                st = stubs()
                predict = ch.unary_unary(
                    "/tensorflow.serving.PredictionService/Predict",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=st.predict_pb2.PredictResponse.FromString,
                )

                def tf(dims: list[int], vals: list[float], content: bytes = b"") -> Any:
                    req = st.predict_pb2.PredictRequest()
                    req.model_spec.name = "m"
                    tp = req.inputs["x"]
                    tp.dtype = 1
                    for d in dims:
                        tp.tensor_shape.dim.add().size = d
                    tp.float_val.extend(vals)
                    tp.tensor_content = content
                    return req

                assert (await code(predict, tf([2, 1], [1.0, 2.0])))[0] == grpc.StatusCode.OK
                assert (await code(predict, tf([3, 1], [1.0])))[0] == grpc.StatusCode.OK  # fill
                # 10^8 floats (400 MB) in a fill form of a few bytes: as 10^8 rows (the row
                # cap refuses it) and as one row of 10^8 (only the fill-form size check does)
                for dims in ([100_000_000], [1, 100_000_000]):
                    before = _maxrss_mb()
                    t = time.perf_counter()
                    huge = tf(dims, [1.0])
                    assert huge.ByteSize() < 64
                    c, details = await code(predict, huge)
                    assert time.perf_counter() - t < 5
                    assert _maxrss_mb() - before < 100, dims
                    assert c == grpc.StatusCode.INVALID_ARGUMENT and "inputs.x" in details, details
                for req, says in [
                    (tf([-1, 1], [1.0]), "inputs.x.tensor_shape"),
                    (tf([1, 2**40, 2**40], [1.0]), "inputs.x"),
                    (tf([2, 1], [1.0, 2.0, 3.0]), "inputs.x"),
                    (tf([2, 1], [], b"\0" * 7), "inputs.x.tensor_content"),
                    (tf([9, 1], [], np.zeros(9, np.float32).tobytes()), "at most 8 rows"),
                ]:
                    c, details = await code(predict, req)
                    assert c == grpc.StatusCode.INVALID_ARGUMENT, (c, details)
                    assert says in details, details
        finally:
            await g.stop()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    _no_tracebacks(caplog)


def test_a_fill_form_of_10e8_elements_is_refused_before_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TF Serving gRPC's "fill" form (one value for every element) declaring one row of 10^8
    floats (400 MB if allocated, in a request of a few bytes) is refused by the shape check,
    before anything is decoded, under the default 1 MB message limit and a raised 64 MB one;
    a fill that fits stays accepted. Fails if the fill form is accepted whatever its size
    (``count == 1`` without ``n * size <= max_bytes``), which only a 2^80-element case
    caught. Nothing is allocated: decoding is replaced by a function that fails the test."""
    pytest.importorskip("grpc")
    from inferline.adapters.tfserving._protos import available, stubs
    from inferline.core import ValidationError
    from inferline.server.frontdoors import _tfserving_grpc as tfg

    if not available():
        pytest.skip("tensorflow-serving-api not installed")
    st = stubs()

    def fill(dims: list[int]) -> Any:
        tp = st.tensor_pb2.TensorProto(dtype=1)
        for d in dims:
            tp.tensor_shape.dim.add().size = d
        tp.float_val.append(1.0)
        return tp

    def no_decode(tp: Any, field: str = "output") -> Any:
        raise AssertionError(f"{field} decoded (allocated) before its size was checked")

    monkeypatch.setattr(tfg, "from_tensor_proto", no_decode)
    huge = fill([1, 100_000_000])
    assert huge.ByteSize() < 64
    for max_bytes in (1 << 20, 64 << 20):
        with pytest.raises(ValidationError) as e:
            tfg.check_tensor_proto(huge, "inputs.x", 8, max_bytes)
        assert e.value.field == "inputs.x" and "100000000 values" in e.value.expected
        assert "fill" not in e.value.expected  # too large to fill: no such offer
        with pytest.raises(ValidationError):
            tfg._decode({"x": huge}, 8, max_bytes)
    tfg.check_tensor_proto(fill([1, 1000]), "inputs.x", 8, 1 << 20)  # 4 KB: a fill that fits
