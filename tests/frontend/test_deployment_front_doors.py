"""Front doors named in a deployment by protocol: ``"front_doors": ["kserve", "tfserving"]``
round-trips through the format (validation naming the field), ``inferline serve`` mounts their
HTTP routes on its port and, with ``--grpc-port``, starts their gRPC services. Real
``serve()`` runs (bundled runtime replicas, uvicorn, grpc.aio) in a thread."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
from _served_app import serving_deployment

from inferline.cli import build_parser
from inferline.core import ValidationError
from inferline.demo.simple import noop_deployment
from inferline.deploy import Deployment, serve


def _dep(doors: list[str] | None) -> Deployment:
    d = noop_deployment()
    if doors is not None:
        d["front_doors"] = doors
    return Deployment.from_dict(d)


def test_front_doors_round_trip_and_validation() -> None:
    dep = _dep(["kserve", "tfserving"])
    assert dep.front_doors == ("kserve", "tfserving")
    d = json.loads(json.dumps(dep.to_dict()))
    assert d["front_doors"] == ["kserve", "tfserving"]
    assert Deployment.from_dict(d) == dep
    assert "front_doors" not in _dep(None).to_dict()
    assert _dep(None).front_doors == ()
    for bad, field in [
        (["kserve", "grpc"], "front_doors[1]"),
        (["kserve", "kserve"], "front_doors"),
        ("kserve", "front_doors"),
        ([3], "front_doors[0]"),
    ]:
        with pytest.raises(ValidationError) as e:
            _dep(bad)
        assert e.value.field == field, (bad, e.value)


def test_serve_has_a_grpc_port_option_off_by_default() -> None:
    p = build_parser()
    assert p.parse_args(["serve", "--deployment", "d.json"]).grpc_port == -1
    assert p.parse_args(["serve", "--deployment", "d.json", "--grpc-port", "0"]).grpc_port == 0


def _serving(dep: Deployment, grpc_port: int | None) -> Any:
    return serving_deployment(dep, grpc_port)


def _kserve_body() -> dict[str, Any]:
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3] * 2}]
    }


def test_serve_mounts_the_named_doors_and_starts_their_grpc_services() -> None:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    pbg = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    from inferline.adapters.tfserving._protos import available, from_tensor_proto, stubs

    with _serving(_dep(["kserve", "tfserving"]), grpc_port=0) as info:
        assert info["front_doors"] == ["kserve", "tfserving"]
        with httpx.Client(base_url=info["url"], timeout=30) as c:
            assert c.get("/v2/health/ready").status_code == 200
            r = c.post("/v2/models/app/infer", json=_kserve_body())
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0] * 2
            r = c.post("/v1/models/app:predict", json={"instances": [[1.0, 2.0]]})
            assert r.status_code == 200 and r.json() == {"predictions": [[1.0, 2.0]]}, r.text
            assert c.post("/apps/app/predict", json={"input": [1.0]}).status_code == 200

        async def over_grpc() -> None:
            async with grpc.aio.insecure_channel(info["grpc"]) as ch:
                req = pb.ModelInferRequest(model_name="app")
                req.inputs.add(name="input", datatype="FP32", shape=[1, 2])
                req.raw_input_contents.append(np.array([4, 5], np.float32).tobytes())
                resp = await pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
                out = np.frombuffer(resp.raw_output_contents[0], np.float32)
                assert out.tolist() == [4.0, 5.0]
                if not available():
                    return
                st = stubs()
                p = st.predict_pb2.PredictRequest()
                p.model_spec.name = "app"
                tp = p.inputs["input"]
                tp.dtype = 1
                tp.tensor_shape.dim.add().size = 1
                tp.tensor_shape.dim.add().size = 2
                tp.float_val.extend([6.0, 7.0])
                predict = ch.unary_unary(
                    "/tensorflow.serving.PredictionService/Predict",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=st.predict_pb2.PredictResponse.FromString,
                )
                resp = await predict(p, timeout=30)
                (out,) = resp.outputs.values()
                assert from_tensor_proto(out).tolist() == [[6.0, 7.0]]

        assert "inference.GRPCInferenceService" in info["grpc_services"]
        asyncio.run(over_grpc())


def test_only_the_named_protocols_are_served() -> None:
    with _serving(_dep(["kserve"]), grpc_port=0) as info:
        assert info["grpc_services"] == ["inference.GRPCInferenceService"]
        with httpx.Client(base_url=info["url"], timeout=30) as c:
            assert c.post("/v2/models/app/infer", json=_kserve_body()).status_code == 200
            r = c.post("/v1/models/app:predict", json={"instances": [[1.0]]})
            assert r.status_code == 404, r.text


def test_grpc_port_needs_front_doors_and_no_doors_mount_nothing() -> None:
    with pytest.raises(ValidationError) as e:
        asyncio.run(serve(_dep(None), port=0, grpc_port=0, tuner=None))
    assert e.value.field == "--grpc-port"
    with _serving(_dep(None), grpc_port=None) as info:
        assert "grpc" not in info and info["front_doors"] == []
        with httpx.Client(base_url=info["url"], timeout=30) as c:
            assert c.post("/v2/models/app/infer", json=_kserve_body()).status_code == 404
