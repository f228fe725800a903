"""The Velox HTTP API mounted in a small FastAPI app, exercised through TestClient."""

from __future__ import annotations

import base64
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from _velox_helpers import make_model
from fastapi import FastAPI
from fastapi.testclient import TestClient

from inferline.velox import SplitModel, VeloxConfig, VeloxService, make_velox_router, partition_of


async def _tensor_features(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    return np.concatenate([a[:3], [1.0]])


@pytest.fixture
def client() -> Iterator[TestClient]:
    service = VeloxService()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Models are registered on the app's own event loop (the frontend does the same).
        await service.register(
            make_model("movies"), VeloxConfig(partitions=2, owned_partitions=(0,))
        )
        await service.register(SplitModel("tensors", 4, _tensor_features))
        yield
        await service.close()

    app = FastAPI(lifespan=lifespan)
    app.include_router(make_velox_router(service, max_body_bytes=4096))
    with TestClient(app) as c:
        yield c


def _owned_uid(i: int = 0) -> str:
    return [u for u in (f"user{j}" for j in range(100)) if partition_of(u, 2) == 0][i]


def _foreign_uid() -> str:
    return next(u for u in (f"user{j}" for j in range(100)) if partition_of(u, 2) == 1)


def test_predict_observe_top_k_round_trip(client: TestClient) -> None:
    uid = _owned_uid()
    r = client.post("/velox/movies/observe", json={"uid": uid, "x": 3, "y": 4.5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["seq"] == 1 and body["new_user"] is True and body["version"] == 1
    assert body["loss"] == pytest.approx(4.5**2)
    r = client.post("/velox/movies/predict", json={"uid": uid, "x": 3})
    assert r.status_code == 200 and r.json()["score"] > 0 and r.json()["new_user"] is False
    r = client.post(
        "/velox/movies/top_k", json={"uid": uid, "items": [1, 2, 3, 4], "k": 2, "alpha": 0.5}
    )
    assert r.status_code == 200, r.text
    top = r.json()
    assert len(top["items"]) == 2 and top["alpha"] == 0.5
    assert {"item", "index", "score", "bonus"} <= set(top["items"][0])


def test_tensor_items_travel_as_dtype_shape_bytes(client: TestClient) -> None:
    arr = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    x = {
        "dtype": "float32",
        "shape": list(arr.shape),
        "b64": base64.b64encode(arr.tobytes()).decode(),
    }
    r = client.post("/velox/tensors/observe", json={"uid": "u", "x": x, "y": 1.0})
    assert r.status_code == 200, r.text
    r = client.post("/velox/tensors/top_k", json={"uid": "u", "items": [x, [0, 0, 0]], "k": 1})
    assert r.status_code == 200, r.text
    assert r.json()["items"][0]["index"] == 0
    assert r.json()["items"][0]["item"]["shape"] == [2, 2]  # echoed as a tensor


def test_retrain_versions_rollback_and_events(client: TestClient) -> None:
    for i in range(20):
        uid = _owned_uid(i % 3)
        assert (
            client.post(
                "/velox/movies/observe", json={"uid": uid, "x": i, "y": float(i % 5)}
            ).status_code
            == 200
        )
    r = client.post("/velox/movies/retrain", json={"reason": "test", "wait": True})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and r.json()["version"] == 2
    r = client.get("/velox/movies/versions")
    body = r.json()
    assert body["current"] == 2
    assert [(v["version"], v["current"], v["reason"]) for v in body["versions"]] == [
        (1, False, "initial"),
        (2, True, "test"),
    ]
    r = client.post("/velox/movies/rollback", json={"version": 1})
    assert r.status_code == 200 and r.json()["current"] == 1
    assert client.get("/velox/movies/versions").json()["current"] == 1
    kinds = [e["kind"] for e in client.get("/velox/movies/events").json()["events"]]
    assert kinds == ["version", "retrained", "rollback"]
    r = client.post("/velox/movies/retrain", json={})
    assert r.status_code == 202 and r.json()["status"] == "running"
    stats = client.get("/velox/movies/stats").json()
    assert stats["users"] == 3 and stats["feature_cache"]["size"] > 0
    info = client.get(f"/velox/movies/users/{_owned_uid(0)}").json()
    assert info["observations"] >= 7


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/velox/movies/observe", {"uid": "u0", "x": 1}, 422, "y"),
        ("/velox/movies/observe", {"uid": "u0", "x": 1, "y": "high"}, 422, "y"),
        ("/velox/movies/observe", {"x": 1, "y": 1.0}, 422, "uid"),
        ("/velox/movies/observe", {"uid": "", "x": 1, "y": 1.0}, 422, "uid"),
        ("/velox/movies/observe", {"uid": "u0", "x": 1, "y": 1.0, "extra": 1}, 422, "extra"),
        ("/velox/movies/predict", {"uid": "u0"}, 422, "x"),
        ("/velox/movies/top_k", {"uid": "u0", "items": 5}, 422, "items"),
        ("/velox/movies/top_k", {"uid": "u0", "items": [1, 2], "k": 0}, 422, "k"),
        ("/velox/movies/top_k", {"uid": "u0", "items": [1, 2], "alpha": "x"}, 422, "alpha"),
        (
            "/velox/movies/top_k",
            {"uid": "u0", "items": [1, {"dtype": "float64", "shape": [3], "b64": "AA=="}]},
            422,
            "items[1].data",
        ),
        ("/velox/movies/rollback", {"version": "2"}, 422, "version"),
        # numbers JSON can write but a float cannot hold, and labels whose loss overflows
        ("/velox/movies/observe", {"uid": "u0", "x": 1, "y": 10**400}, 422, "y"),
        ("/velox/movies/observe", {"uid": "u0", "x": 1, "y": 1e308}, 422, "y"),
        ("/velox/movies/top_k", {"uid": "u0", "items": [1, 2], "alpha": 10**400}, 422, "alpha"),
        ("/velox/movies/observe", {"uid": "u0", "x": True, "y": 1.0}, 422, "x"),
        ("/velox/movies/predict", {"uid": "u0", "x": [[1]]}, 422, "x"),
        ("/velox/movies/retrain", {"wait": "yes"}, 422, "wait"),
    ],
)
def test_malformed_requests_name_the_field(
    client: TestClient, path: str, body: dict, status: int, field: str
) -> None:
    body = {k: (_owned_uid() if v == "u0" else v) for k, v in body.items()}
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"] == "ValidationError" and err["field"] == field
    assert field in err["detail"]


def test_a_uid_with_slashes_can_be_looked_up(client: TestClient) -> None:
    uid = next(u for u in (f"org/team/{j}" for j in range(100)) if partition_of(u, 2) == 0)
    assert (
        client.post("/velox/movies/observe", json={"uid": uid, "x": 3, "y": 1.0}).status_code == 200
    )
    r = client.get(f"/velox/movies/users/{uid.replace('/', '%2F')}")
    assert r.status_code == 200, r.text
    assert r.json()["uid"] == uid and r.json()["observations"] == 1
    assert client.get(f"/velox/movies/users/{uid}").json()["uid"] == uid


def test_not_found_misrouted_and_oversized(client: TestClient) -> None:
    uid = _owned_uid()
    r = client.post("/velox/nope/predict", json={"uid": uid, "x": 1})
    assert r.status_code == 404 and r.json()["kind"] == "velox model"
    assert "movies" in r.json()["detail"]  # lists the known models
    r = client.post("/velox/movies/predict", json={"uid": uid, "x": 12345})
    assert r.status_code == 404 and r.json()["kind"] == "item"
    r = client.get(f"/velox/movies/users/{_owned_uid(5)}")
    assert r.status_code == 404 and r.json()["kind"] == "user"
    r = client.post("/velox/movies/rollback", json={"version": 42})
    assert r.status_code == 404 and r.json()["kind"] == "version"
    r = client.post("/velox/movies/observe", json={"uid": _foreign_uid(), "x": 1, "y": 1.0})
    assert r.status_code == 421 and r.json()["partition"] == 1
    r = client.post("/velox/movies/top_k", json={"uid": uid, "items": list(range(2000))})
    assert r.status_code == 413
    r = client.post(
        "/velox/movies/predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"] == "MalformedJSON"
    assert r.json()["field"] == "body"
    r = client.post("/velox/movies/predict", json=[1, 2])
    assert r.status_code == 422 and r.json()["field"] == "body"


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        # NaN and Infinity literals: Python's parser takes them, JSON has no such numbers
        (b'{"uid": "U", "x": 1, "y": NaN}', 422, "y"),
        (b'{"uid": "U", "x": NaN, "y": 1}', 422, "x"),
        (b'{"uid": "U", "x": Infinity, "y": 1}', 422, "x"),
        # an integer too long for Python to convert (over sys.get_int_max_str_digits())
        (b'{"uid": "U", "x": 1, "y": ' + b"9" * 700 + b"}", 400, "body"),
        # an unpaired UTF-16 surrogate: valid JSON, but no text to store or answer with
        (b'{"uid": "\\ud800", "x": 1, "y": 1}', 422, "uid"),
    ],
)
def test_numbers_and_text_json_cannot_carry_are_refused(
    client: TestClient, raw: bytes, status: int, field: str
) -> None:
    """Each answer is strict JSON naming the field; the connection stays usable."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # the lowest allowed: the body stays under the test's limit
    try:
        _post_raw(client, raw, status, field)
    finally:
        sys.set_int_max_str_digits(old)


def _post_raw(client: TestClient, raw: bytes, status: int, field: str) -> None:
    raw = raw.replace(b'"U"', f'"{_owned_uid()}"'.encode())
    r = client.post(
        "/velox/movies/observe", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == status, r.text
    assert r.json()["field"] == field, r.text
    assert client.get("/velox/movies/stats").status_code == 200
