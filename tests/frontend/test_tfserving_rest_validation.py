"""The TF Serving REST door validates as TF Serving does: JSON values of the signature's
types (``"0.5"`` and ``true`` are not floats), ``signature_name`` of the served signature,
version 1 and no labels; every refusal is TF Serving's ``{"error": "..."}`` shape. Over a
real uvicorn server."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest
from _served_app import served

from inferline.server import App, Service, create_app
from inferline.server.frontdoors import FrontDoor, Signature, TensorInfo, make_tfserving_router


async def _echo(x: Any, slo: float) -> Any:
    return {k: np.asarray(v) for k, v in x.items()} if isinstance(x, dict) else np.asarray(x)


@pytest.fixture(scope="module")
def base() -> Any:
    svc = Service([App("f", _echo, 1.0), App("multi", _echo, 1.0)])
    sigs = {
        "f": Signature((TensorInfo("x", "float32", (2,)),), (TensorInfo("y", "float32", (2,)),)),
        "multi": Signature(
            (
                TensorInfo("i", "int32", ()),
                TensorInfo("b", "bool", ()),
                TensorInfo("s", "object", ()),
            ),
            (),
        ),
    }
    app = create_app(svc, routers=[make_tfserving_router(FrontDoor(svc, sigs))])
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        yield c


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {"instances": [[1.0, "0.5"]]},
            'JSON Value: "0.5" Type: String is not of expected type: float (instances[0][1])',
        ),
        (
            {"instances": [[True, 1.0]]},
            "JSON Value: true Type: Bool is not of expected type: float (instances[0][0])",
        ),
        (
            {"inputs": {"x": [[1.0, 2.0], [None, 1]]}},
            "JSON Value: null Type: Null is not of expected type: float (inputs.x[1][0])",
        ),
        (
            {"inputs": [[1.0, {"a": 1}]]},
            'JSON Value: {"a": 1} Type: Object is not of expected type: float (inputs[0][1])',
        ),
        (
            {"signature_name": "other", "instances": [[1.0, 2.0]]},
            'Serving signature name: "other" not found in signature def',
        ),
    ],
)
def test_values_and_signature_are_checked_as_tf_serving_does(
    base: httpx.Client, body: dict, says: str
) -> None:
    r = base.post("/v1/models/f:predict", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {"error": says}


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"i": 1.5, "b": True, "s": "a"}, "Type: Number is not of expected type: int32"),
        ({"i": 2**40, "b": True, "s": "a"}, "Type: Number is not of expected type: int32"),
        ({"i": True, "b": True, "s": "a"}, "Type: Bool is not of expected type: int32"),
        ({"i": 1, "b": 1, "s": "a"}, "Type: Number is not of expected type: bool"),
        ({"i": 1, "b": True, "s": 3}, "Type: Number is not of expected type: string"),
    ],
)
def test_integer_bool_and_string_inputs(base: httpx.Client, row: dict, says: str) -> None:
    r = base.post("/v1/models/multi:predict", json={"instances": [row]})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"] and "(instances[0]." in r.json()["error"], r.text
    assert list(r.json()) == ["error"]


def test_good_requests_still_pass(base: httpx.Client) -> None:
    for body in (
        {"instances": [[1.0, 2]]},
        {"signature_name": "serving_default", "instances": [[1.0, 2.0]]},
        {"inputs": {"x": [[0.5, -1]]}},
    ):
        r = base.post("/v1/models/f:predict", json=body)
        assert r.status_code == 200, (body, r.text)
    r = base.post("/v1/models/f/versions/1:predict", json={"instances": [[1.0, 2.0]]})
    assert r.status_code == 200 and r.json() == {"predictions": [[1.0, 2.0]]}, r.text
    b64 = base64.b64encode(b"\x00hi").decode()
    r = base.post(
        "/v1/models/multi:predict",
        json={
            "instances": [{"i": 3, "b": False, "s": {"b64": b64}}, {"i": -1, "b": True, "s": "x"}]
        },
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("method", "path", "says"),
    [
        (
            "POST",
            "/v1/models/f/versions/2:predict",
            "Servable not found for request: Specific(f, 2)",
        ),
        ("GET", "/v1/models/f/versions/7", "Servable not found for request: Specific(f, 7)"),
        ("GET", "/v1/models/f/versions/3/metadata", "Specific(f, 3)"),
        ("POST", "/v1/models/f/labels/canary:predict", "Labelled(f, canary)"),
        ("GET", "/v1/models/f/labels/stable", "Labelled(f, stable)"),
    ],
)
def test_other_versions_and_labels_are_not_found(
    base: httpx.Client, method: str, path: str, says: str
) -> None:
    r = base.request(method, path, json={"instances": [[1.0, 2.0]]} if method == "POST" else None)
    assert r.status_code == 404, r.text
    assert says in r.json()["error"] and list(r.json()) == ["error"], r.text
    assert base.get("/v1/models/f/versions/1").status_code == 200
