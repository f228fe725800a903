"""Doors that tell the truth (issue 44, item 5): a served app's KServe metadata and model
config declare the outputs it really returns. Before, ``inferline serve`` of the bundled
example (``sleep`` through ``passthrough``, front doors ``kserve``) declared an ``output``
tensor the app never returns, and perf_analyzer, which asks for the declared outputs, failed
with ``outputs: expected names among ['n', 'pid', 'x'], got ['output']``. A real ``serve()``
(bundled runtime replicas, uvicorn, grpc.aio) runs in a thread."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest
from _served_app import serving_deployment

from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment
from inferline.server import App, InputSpec, Service
from inferline.server.frontdoors import FrontDoor


def _serving(dep: Deployment, grpc_port: int | None) -> Any:
    return serving_deployment(dep, grpc_port)


# the sleep model answers {"pid", "n", "x"}; "x" is None for an array input (left out)
_REAL = {"n": "INT64", "pid": "INT64"}


def _check_http(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        cfg = c.get("/v2/models/app/config").json()
        assert {o["name"]: o["data_type"] for o in cfg["output"]} == {
            k: f"TYPE_{v}" for k, v in _REAL.items()
        }, cfg
        meta = c.get("/v2/models/app").json()
        assert {o["name"]: o["datatype"] for o in meta["outputs"]} == _REAL, meta
        # what perf_analyzer sends: the declared inputs, asking for the declared outputs
        body = {
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "data": [0.5] * 6}],
            "outputs": [{"name": o["name"]} for o in cfg["output"]],
        }
        r = c.post("/v2/models/app/infer", json=body)
        assert r.status_code == 200, r.text
        assert sorted(o["name"] for o in r.json()["outputs"]) == sorted(_REAL)
        tf = c.get("/v1/models/app/metadata").json()
        sd = tf["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sorted(sd["outputs"]) == sorted(_REAL), sd


async def _check_grpc(target: str) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    from inferline.adapters.tfserving._protos import available, stubs

    async with grpc.aio.insecure_channel(target) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        cfg = (await stub.ModelConfig(pb.ModelConfigRequest(name="app"), timeout=30)).config
        assert sorted(o.name for o in cfg.output) == sorted(_REAL)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="app"), timeout=30)
        assert {o.name: o.datatype for o in meta.outputs} == _REAL
        req = pb.ModelInferRequest(model_name="app")
        req.inputs.add(name="input", datatype="FP32", shape=[1, 2])
        req.raw_input_contents.append(np.array([4, 5], np.float32).tobytes())
        for o in cfg.output:
            req.outputs.add(name=o.name)
        resp = await stub.ModelInfer(req, timeout=30)
        assert sorted(o.name for o in resp.outputs) == sorted(_REAL)
        if not available():
            return
        st = stubs()
        get_meta = ch.unary_unary(
            "/tensorflow.serving.PredictionService/GetModelMetadata",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=st.get_model_metadata_pb2.GetModelMetadataResponse.FromString,
        )
        mreq = st.get_model_metadata_pb2.GetModelMetadataRequest()
        mreq.model_spec.name = "app"
        mreq.metadata_field.append("signature_def")
        sig_map = st.get_model_metadata_pb2.SignatureDefMap()
        (await get_meta(mreq, timeout=30)).metadata["signature_def"].Unpack(sig_map)
        assert sorted(sig_map.signature_def["serving_default"].outputs) == sorted(_REAL)


def test_served_sleep_example_declares_the_outputs_it_returns() -> None:
    pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc.service_pb2")
    d = sleep_deployment()
    d["front_doors"] = ["kserve", "tfserving"]
    with _serving(Deployment.from_dict(d), grpc_port=0) as info:
        _check_http(info["url"])
        asyncio.run(_check_grpc(info["grpc"]))


async def _vec(x: Any, slo: float) -> Any:
    x = np.asarray(x)
    return {"y": x * 2, "total": float(x.sum())}


def test_outputs_traced_with_free_sizes_declared_minus_one_and_learned_from_answers() -> None:
    svc = Service(
        [
            App("vec", _vec, 1.0, input_spec=InputSpec("float32", (None,))),
            App("any", _vec, 1.0),  # no InputSpec: nothing to trace with
        ]
    )
    door = FrontDoor(svc)
    sig = asyncio.run(door.describe("vec"))
    assert {t.name: (t.dtype, t.shape) for t in sig.outputs} == {
        "y": ("float32", (-1,)),
        "total": ("float64", ()),
    }
    assert [t.name for t in asyncio.run(door.describe("any")).outputs] == ["output"]
    door.stack("any", asyncio.run(door.run("any", [np.ones(3, np.float32)])))
    assert sorted(t.name for t in asyncio.run(door.describe("any")).outputs) == ["total", "y"]
    sampled = FrontDoor(svc, samples={"any": [[1.0, 2.0]]})
    assert sorted(t.name for t in asyncio.run(sampled.describe("any")).outputs) == ["total", "y"]
