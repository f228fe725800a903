"""Front doors refuse, never corrupt or drop (issue 44, item 6): a value a cast would change is
a 400 / INVALID_ARGUMENT naming the field on every door (before, an int8 app answered KServe
INT64 ``[1000, 200, -129]`` as ``[-24, -56, 127]``); an output field that is None is left out
on all four doors (before, both gRPC doors failed with ``cannot convert 'NoneType' object to
bytes``, KServe HTTP answered ``null`` and TF Serving REST ``"None"``); an empty batch is a
400 naming ``inputs[0].shape`` (before, an internal "need at least one array to stack")."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest

from inferline.core import ValidationError, cast_exact, value_from_json
from inferline.server import App, InputSpec, Service, create_app
from inferline.server.frontdoors import (
    FrontDoor,
    FrontDoorGrpc,
    make_kserve_router,
    make_tfserving_router,
)


async def _echo(x: Any, slo: float) -> Any:
    return np.asarray(x)


async def _sleepish(x: Any, slo: float) -> Any:
    # what the bundled sleep model answers for an array input: "x" is None
    return {"pid": 7, "n": 1, "x": None}


def _door() -> FrontDoor:
    svc = Service(
        [
            App("i8", _echo, 1.0, input_spec=InputSpec("int8", (3,))),
            App("u8", _echo, 1.0, input_spec=InputSpec("uint8", (3,))),
            App("f32", _echo, 1.0, input_spec=InputSpec("float32", (3,))),
            App("none", _sleepish, 1.0, input_spec=InputSpec("float32", (None,))),
        ]
    )
    return FrontDoor(svc)


def _client(door: FrontDoor) -> httpx.AsyncClient:
    app = create_app(door.service, routers=[make_kserve_router(door), make_tfserving_router(door)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")


def _kserve(dt: str, data: list[Any], shape: list[int] | None = None) -> dict[str, Any]:
    shape = shape if shape is not None else [1, len(data)]
    return {"inputs": [{"name": "input", "datatype": dt, "shape": shape, "data": data}]}


def test_cast_exact_refuses_every_cast_that_changes_a_value() -> None:
    for a, dt in [
        (np.array([1000, 200, -129]), "int8"),
        (np.array([1, 2**40], np.uint64), "int32"),
        (np.array([-1]), "uint64"),
        (np.array([1.5]), "int32"),
        (np.array([np.nan]), "int64"),
        (np.array([2.0**63]), "int64"),
        (np.array([1e300]), "float32"),
        (np.array([70000]), "float16"),
        (np.array([2]), "bool"),
        (np.array(["1.5"]), "float32"),
    ]:
        with pytest.raises(ValidationError) as e:
            cast_exact(a, dt, "inputs.x")
        assert e.value.field == "inputs.x", (a, dt)
    assert cast_exact(np.array([1, -3]), "int8", "f").tolist() == [1, -3]
    assert cast_exact(np.array([2.0]), "int32", "f").dtype == np.int32
    assert cast_exact(np.array([0.1]), "float32", "f").dtype == np.float32  # floats round
    # the native typed form: numpy's own np.array(data, dtype) truncated 2.7 and made inf
    for j in [
        {"dtype": "int8", "data": [1000]},
        {"dtype": "int32", "data": [2.7]},
        {"dtype": "float32", "data": [1e300]},
        {"dtype": "float32", "data": ["1.5"]},
    ]:
        with pytest.raises(ValidationError) as e:
            value_from_json(j, "input")
        assert e.value.field == "input.data", j


def test_http_doors_refuse_values_the_app_dtype_cannot_hold() -> None:
    door = _door()

    async def main() -> None:
        async with _client(door) as c:
            for model, body in [
                ("i8", _kserve("INT64", [1000, 200, -129])),
                ("i8", _kserve("UINT64", [1000, 200, 1])),
                ("u8", _kserve("INT64", [1, 2, -1])),
                ("i8", _kserve("FP32", [1.5, 2, 3])),
                ("f32", _kserve("FP64", [1e300, 0, 0])),
                ("f32", _kserve("FP32", [1e300, 0, 0])),
            ]:
                r = await c.post(f"/v2/models/{model}/infer", json=body)
                assert r.status_code == 400, (model, body, r.text)
                assert "inputs" in r.json()["error"], r.text
            r = await c.post("/v2/models/i8/infer", json=_kserve("INT64", [100, -128, 127]))
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [100, -128, 127]
            r = await c.post("/v1/models/f32:predict", json={"instances": [[1e300, 0, 0]]})
            assert r.status_code == 400 and "inputs.input" in r.text, r.text
            r = await c.post("/v1/models/i8:predict", json={"instances": [[1000, 0, 0]]})
            assert r.status_code == 400, r.text

    asyncio.run(main())


def test_http_doors_leave_none_outputs_out_and_refuse_empty_batches() -> None:
    door = _door()

    async def main() -> None:
        async with _client(door) as c:
            r = await c.post("/v2/models/none/infer", json=_kserve("FP32", [1.0, 2.0], [2, 1]))
            assert r.status_code == 200, r.text
            outs = {o["name"]: o for o in r.json()["outputs"]}
            assert sorted(outs) == ["n", "pid"], r.text  # no "x": null
            assert outs["pid"]["data"] == [7, 7]
            r = await c.post("/v1/models/none:predict", json={"instances": [[1.0], [2.0]]})
            assert r.status_code == 200, r.text
            assert r.json() == {"predictions": [{"pid": 7, "n": 1}] * 2}  # no "x": "None"
            r = await c.post("/v2/models/f32/infer", json=_kserve("FP32", [], [0, 3]))
            assert r.status_code == 400, r.text
            assert "inputs[0].shape" in r.json()["error"], r.text
            assert "at least one row" in r.json()["error"], r.text
            r = await c.post("/v1/models/f32:predict", json={"inputs": []})
            assert r.status_code == 400 and "at least one row" in r.text, r.text

    asyncio.run(main())


def test_a_none_in_some_rows_only_is_refused_not_encoded() -> None:
    door = _door()
    with pytest.raises(ValidationError) as e:
        door.stack("none", [{"a": 1, "x": None}, {"a": 2, "x": 3.0}])
    assert e.value.field == "outputs.x"
    with pytest.raises(ValidationError) as e:
        door.stack("none", [{"a": 1, "x": "s"}, {"a": 2, "x": 3}])
    assert e.value.field == "outputs.x"  # bytes(3) would have been three zero bytes


async def _code(rpc: Callable[..., Awaitable[Any]], req: Any) -> tuple[Any, str]:
    import grpc

    try:
        await rpc(req, timeout=20)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_grpc_doors_refuse_casts_leave_none_out_and_log_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    g = FrontDoorGrpc(_door())

    def kserve(model: str, dt: str, shape: list[int], raw: bytes) -> Any:
        req = pb.ModelInferRequest(model_name=model)
        req.inputs.add(name="input", datatype=dt, shape=shape)
        req.raw_input_contents.append(raw)
        return req

    async def main() -> None:
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                infer = pbg.GRPCInferenceServiceStub(ch).ModelInfer
                wide = np.array([1000, 200, -129], np.int64).tobytes()
                for req in [
                    kserve("i8", "INT64", [1, 3], wide),
                    kserve("i8", "UINT64", [1, 3], np.array([1000, 2, 1], np.uint64).tobytes()),
                    kserve("f32", "FP32", [0, 3], b""),
                ]:
                    c, details = await _code(infer, req)
                    assert c == grpc.StatusCode.INVALID_ARGUMENT, (c, details)
                    assert "inputs" in details, details
                typed = pb.ModelInferRequest(model_name="i8")
                t = typed.inputs.add(name="input", datatype="INT64", shape=[1, 3])
                t.contents.int64_contents.extend([1000, 200, -129])
                c, details = await _code(infer, typed)
                assert c == grpc.StatusCode.INVALID_ARGUMENT and "inputs.input" in details
                resp = await infer(
                    kserve("none", "FP32", [2, 1], np.zeros(2, np.float32).tobytes()), timeout=20
                )
                assert sorted(o.name for o in resp.outputs) == ["n", "pid"]
                await _tf_serving_grpc(ch)
        finally:
            await g.stop()

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def _tf_serving_grpc(ch: Any) -> None:
    import grpc

    from inferline.adapters.tfserving._protos import available, stubs

    if not available():
        return
    st = stubs()
    predict = ch.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=st.predict_pb2.PredictResponse.FromString,
    )

    def req(model: str, dtype: int, vals: list[Any], field: str, dims: list[int]) -> Any:
        r = st.predict_pb2.PredictRequest()
        r.model_spec.name = model
        tp = r.inputs["input"]
        tp.dtype = dtype
        for d in dims:
            tp.tensor_shape.dim.add().size = d
        getattr(tp, field).extend(vals)
        return r

    for r in [
        req("i8", 9, [1000, 200, -129], "int64_val", [1, 3]),  # DT_INT64 to an int8 app
        req("i8", 6, [1000, 200, -129], "int_val", [1, 3]),  # DT_INT8 out of its own range
        req("f32", 1, [], "float_val", [0, 3]),
    ]:
        c, details = await _code(predict, r)
        assert c == grpc.StatusCode.INVALID_ARGUMENT, (c, details)
        assert "inputs" in details, details
    resp = await predict(req("none", 1, [1.0, 2.0], "float_val", [2, 1]), timeout=20)
    assert sorted(resp.outputs) == ["n", "pid"]


def test_json_body_of_refusals_names_the_field() -> None:
    door = _door()

    async def main() -> None:
        async with _client(door) as c:
            r = await c.post("/v2/models/i8/infer", json=_kserve("INT64", [1000, 200, -129]))
            body = r.json()
            assert r.status_code == 400 and "inputs.input" in body["error"], json.dumps(body)

    asyncio.run(main())


def test_doors_native_typed_form_refuses_a_wrapping_cast() -> None:
    svc = Service([App("i8", _echo, 1.0, input_spec=InputSpec("int8", (3,)))])

    async def main() -> int:
        app = create_app(svc)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            x = {"dtype": "int64", "data": [1000, 200, -129]}
            return (await c.post("/apps/i8/predict", json={"input": x})).status_code

    assert asyncio.run(main()) in (400, 422)
