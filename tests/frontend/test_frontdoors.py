"""Front doors over an in-process service (no servers): KServe v2 and TF Serving REST shapes,
binary tensors, errors and the bearer token. The real clients run in
``integration/test_tfserving_attach.py``."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import httpx
import numpy as np
import pytest

from inferline.core import ValidationError
from inferline.server import App, InputSpec, Service, create_app
from inferline.server.frontdoors import (
    FrontDoor,
    Signature,
    TensorInfo,
    kserve_decode,
    kserve_encode,
    make_kserve_router,
    make_tfserving_router,
)


async def double(x: Any, slo: float) -> Any:
    x = np.asarray(x)
    return {"y": x * 2, "s": np.float32(x.sum())}


def make_service() -> tuple[Service, FrontDoor]:
    svc = Service([App("dbl", double, 1.0, input_spec=InputSpec("float32", (3,)))])
    sig = Signature(
        (TensorInfo("x", "float32", (3,)),),
        (TensorInfo("y", "float32", (3,)), TensorInfo("s", "float32", ())),
    )
    return svc, FrontDoor(svc, {"dbl": sig})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")


def test_signature_round_trip() -> None:
    sig = Signature((TensorInfo("x", "float32", (3, -1)),), (TensorInfo("y", "int64", ()),))
    assert Signature.from_dict(json.loads(json.dumps(sig.to_dict()))) == sig


def test_kserve_binary_round_trip_and_errors() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"ab", b"cde"], dtype=object)
    blob_w = b"".join(struct.pack("<I", len(w)) + w for w in words)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": 24},
                },
                {
                    "name": "w",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(blob_w)},
                },
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    req, t = kserve_decode(head + x.tobytes() + blob_w, len(head))
    np.testing.assert_array_equal(t["x"], x)
    assert t["w"].tolist() == [b"ab", b"cde"]
    body, hl = kserve_encode("m", req, {"y": x * 2})
    meta = json.loads(body[:hl])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(body[hl:], np.float32).reshape(2, 3), x * 2)
    with pytest.raises(ValidationError, match="24 binary bytes"):
        kserve_decode(head + x.tobytes()[:8], len(head))
    with pytest.raises(ValidationError, match="datatype"):
        kserve_decode(
            json.dumps(
                {"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}
            ).encode(),
            None,
        )


def test_kserve_http_routes_json() -> None:
    svc, fd = make_service()
    app = create_app(svc, routers=[make_kserve_router(fd)])

    async def main() -> None:
        async with client(app) as c:
            assert (await c.get("/v2/health/ready")).status_code == 200
            meta = (await c.get("/v2/models/dbl")).json()
            assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
            body = {
                "id": "7",
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5]}
                ],
            }
            r = (await c.post("/v2/models/dbl/infer", json=body)).json()
            assert r["id"] == "7"
            outs = {o["name"]: o for o in r["outputs"]}
            assert outs["y"]["data"] == [0, 2, 4, 6, 8, 10] and outs["y"]["shape"] == [2, 3]
            assert outs["s"]["data"] == [3, 12] and outs["s"]["shape"] == [2]
            r = await c.post("/v2/models/nope/infer", json=body)
            assert r.status_code == 404
            bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
            r = await c.post("/v2/models/dbl/infer", json=bad)
            assert r.status_code == 400 and "shape" in r.json()["error"]

    run(main())


def test_tfserving_http_routes_and_token() -> None:
    svc, fd = make_service()
    app = create_app(svc, token="s3cret", routers=[make_tfserving_router(fd)])

    async def main() -> None:
        async with client(app) as c:
            assert (await c.get("/v1/models/dbl")).status_code == 401
            h = {"Authorization": "Bearer s3cret"}
            st = (await c.get("/v1/models/dbl", headers=h)).json()
            assert st["model_version_status"][0]["state"] == "AVAILABLE"
            meta = (await c.get("/v1/models/dbl/versions/1/metadata", headers=h)).json()
            assert (
                meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"][
                    "x"
                ]["dtype"]
                == "DT_FLOAT"
            )
            r = (
                await c.post("/v1/models/dbl:predict", headers=h, json={"instances": [[1, 2, 3]]})
            ).json()
            assert r == {"predictions": [{"y": [2.0, 4.0, 6.0], "s": 6.0}]}
            r = (
                await c.post(
                    "/v1/models/dbl/versions/1:predict",
                    headers=h,
                    json={"inputs": {"x": [[1, 1, 1]]}},
                )
            ).json()
            assert r == {"outputs": {"y": [[2.0, 2.0, 2.0]], "s": [3.0]}}
            r = await c.post("/v1/models/dbl:predict", headers=h, json={"instances": [[1, 2]]})
            assert r.status_code == 400 and "error" in r.json()
            r = await c.post("/v1/models/nope:predict", headers=h, json={"instances": [[1, 2, 3]]})
            assert r.status_code == 404
            r = await c.post("/v1/models/dbl:classify", headers=h, json={})
            assert r.status_code == 404
            # malformed: both forms, rows with other keys, a version that is not a number
            both = {"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]}
            r = await c.post("/v1/models/dbl:predict", headers=h, json=both)
            assert r.status_code == 400 and "exactly one of" in r.json()["error"]
            rows = {"instances": [{"x": [1, 2, 3]}, {"z": [1, 2, 3]}]}
            r = await c.post("/v1/models/dbl:predict", headers=h, json=rows)
            assert r.status_code == 400 and "instances[1]" in r.json()["error"]
            one = {"instances": [[1, 2, 3]]}
            r = await c.post("/v1/models/dbl/versions/abc:predict", headers=h, json=one)
            assert r.status_code == 404

    run(main())


@pytest.mark.parametrize(
    ("req", "header", "field"),
    [
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}, "abc", None),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": []}]},
            None,
            "inputs[0].parameters",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1],
                        "parameters": {"binary_data_size": "abc"},
                    }
                ]
            },
            None,
            "inputs[0].parameters.binary_data_size",
        ),
        (
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "parameters": [],
            },
            None,
            "request.parameters",
        ),
        (
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                "outputs": [{"name": "y", "parameters": [1]}],
            },
            None,
            "outputs[0].parameters",
        ),
        # a shape whose element count np.prod would wrap around to 0
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "datatype": "FP32",
                        "shape": [1, 2**32, 2**32],
                        "parameters": {"binary_data_size": 0},
                    }
                ]
            },
            None,
            "inputs[0].data",
        ),
    ],
)
def test_malformed_kserve_requests_are_400s_naming_the_field(req, header, field) -> None:
    """Each was a plain-text 500 with a traceback in the server log."""
    svc, fd = make_service()
    app = create_app(svc, routers=[make_kserve_router(fd)])

    async def main() -> None:
        async with client(app) as c:
            headers = {"Inference-Header-Content-Length": header} if header else {}
            r = await c.post("/v2/models/dbl/infer", content=json.dumps(req), headers=headers)
            assert r.status_code == 400, r.text
            assert (field or "Inference-Header-Content-Length") in r.json()["error"]

    run(main())


def test_kserve_grpc_needs_the_token_on_every_rpc_and_checks_raw_inputs() -> None:
    """A real gRPC server on 127.0.0.1: with a token, health, metadata, readiness and the RPCs
    inferline does not serve all answer UNAUTHENTICATED without it; with it, an unserved RPC
    is UNIMPLEMENTED and raw contents that do not match the inputs are INVALID_ARGUMENT."""
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    from inferline.server.frontdoors import FrontDoorGrpc

    _svc, fd = make_service()

    async def main() -> None:
        g = FrontDoorGrpc(fd, token="s3cret")
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.GRPCInferenceServiceStub(ch)
                calls = [
                    (stub.ServerLive, pb.ServerLiveRequest()),
                    (stub.ServerReady, pb.ServerReadyRequest()),
                    (stub.ModelReady, pb.ModelReadyRequest(name="dbl")),
                    (stub.ServerMetadata, pb.ServerMetadataRequest()),
                    (stub.ModelMetadata, pb.ModelMetadataRequest(name="dbl")),
                    (stub.ModelStatistics, pb.ModelStatisticsRequest(name="dbl")),
                    (stub.RepositoryIndex, pb.RepositoryIndexRequest()),
                ]
                for meta in ((), (("authorization", "Bearer wrong"),)):
                    for rpc, req in calls:
                        with pytest.raises(grpc.aio.AioRpcError) as e:
                            await rpc(req, metadata=meta)
                        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, rpc
                ok = (("authorization", "Bearer s3cret"),)
                assert (await stub.ModelReady(pb.ModelReadyRequest(name="dbl"), metadata=ok)).ready
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=ok)
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
                req = pb.ModelInferRequest(model_name="dbl")
                req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
                req.inputs.add(name="z", datatype="FP32", shape=[1, 3])
                req.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ModelInfer(req, metadata=ok)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "raw_input_contents" in e.value.details()
        finally:
            await g.stop()

    run(main())


def test_readiness_follows_the_replicas() -> None:
    """KServe and TF Serving readiness say not ready while an app's model has no serving
    replica (its backend down): before, they said ready whenever the name was known."""

    class _Backend:  # a fake: only replicas(), which Service.health reads
        n = 0

        def replicas(self, model: str) -> list[Any]:
            return [object()] * self.n

    be = _Backend()
    svc = Service(
        [App("dbl", double, 1.0, input_spec=InputSpec("float32", (3,)), models=("m",))],
        backend=be,
        models=["m"],
    )
    fd = FrontDoor(svc, {"dbl": make_service()[1].signatures["dbl"]})
    app = create_app(svc, routers=[make_kserve_router(fd), make_tfserving_router(fd)])

    async def probe() -> tuple[int, int, int, str]:
        async with client(app) as c:
            status = (await c.get("/v1/models/dbl")).json()["model_version_status"][0]["state"]
            return (
                (await c.get("/v2/health/ready")).status_code,
                (await c.get("/v2/models/dbl/ready")).status_code,
                (await c.get("/v2/models/nope/ready")).status_code,
                status,
            )

    assert run(probe()) == (503, 503, 400, "LOADING")
    be.n = 2
    assert run(probe()) == (200, 200, 400, "AVAILABLE")


@pytest.mark.parametrize(
    ("inp", "field", "says"),
    [
        (
            {"datatype": "FP32", "shape": [1, 3], "data": ["1", "2", "3"]},
            "inputs[0].data",
            "strings",
        ),
        (
            {"datatype": "FP32", "shape": [1, 3], "data": [True, False, True]},
            "inputs[0].data",
            "booleans",
        ),
        (
            {"datatype": "INT32", "shape": [1, 3], "data": [1, 2.7, 3]},
            "inputs[0].data",
            "fractional",
        ),
        ({"datatype": "INT8", "shape": [1, 3], "data": [1, 300, 3]}, "inputs[0].data", "300"),
        ({"datatype": "BOOL", "shape": [1, 3], "data": [1, 0, 1]}, "inputs[0].data", "integers"),
        # the signature's input is FP32: FP64 values are not narrowed without a word
        (
            {"datatype": "FP64", "shape": [1, 3], "data": [0.1, 0.2, 0.3]},
            "inputs.x.datatype",
            "FP32",
        ),
    ],
)
def test_kserve_values_and_datatypes_are_not_converted(inp: dict, field: str, says: str) -> None:
    """Triton refuses these; the front door converted them (strings and booleans to floats,
    2.7 to 2, 300 to an INT8, FP64 to FP32)."""
    svc, fd = make_service()
    app = create_app(svc, routers=[make_kserve_router(fd)])

    async def main() -> None:
        async with client(app) as c:
            r = await c.post("/v2/models/dbl/infer", json={"inputs": [{"name": "x", **inp}]})
            assert r.status_code == 400, r.text
            assert field in r.json()["error"] and says in r.json()["error"], r.text

    run(main())


def test_a_declared_one_element_output_keeps_its_dimension() -> None:
    """A model's [1] output reaches pipelines as a scalar; its KServe and TF Serving routes
    answer the declared [n, 1] (they answered [n])."""

    async def label(x: Any, slo: float) -> Any:
        return np.int64(np.asarray(x).sum())

    svc = Service([App("lbl", label, 1.0)])
    sig = Signature((TensorInfo("x", "float32", (3,)),), (TensorInfo("label", "int64", (1,)),))
    fd = FrontDoor(svc, {"lbl": sig})
    app = create_app(svc, routers=[make_kserve_router(fd), make_tfserving_router(fd)])

    async def main() -> None:
        async with client(app) as c:
            body = {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1] * 3 + [2] * 3}
                ]
            }
            r = await c.post("/v2/models/lbl/infer", json=body)
            assert r.status_code == 200, r.text
            (out,) = r.json()["outputs"]
            assert out["shape"] == [2, 1] and out["data"] == [3, 6]
            r = await c.post("/v1/models/lbl:predict", json={"instances": [[1, 1, 1]]})
            assert r.status_code == 200, r.text
            assert r.json()["predictions"] == [[3]]

    run(main())


def test_kserve_grpc_typed_contents_must_match_the_datatype() -> None:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    from inferline.server.frontdoors import FrontDoorGrpc

    _svc, fd = make_service()

    async def main() -> None:
        g = FrontDoorGrpc(fd)
        port = await g.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.GRPCInferenceServiceStub(ch)
                req = pb.ModelInferRequest(model_name="dbl")
                t = req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
                t.contents.int_contents.extend([1, 2, 3])  # FP32 values belong in fp32_contents
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ModelInfer(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "fp32_contents" in e.value.details()
                req = pb.ModelInferRequest(model_name="dbl")
                t = req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
                t.contents.fp32_contents.extend([1, 2, 3])
                r = await stub.ModelInfer(req)
                assert [o.name for o in r.outputs] == ["y", "s"]
        finally:
            await g.stop()

    run(main())
