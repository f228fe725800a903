"""Velox served by ``inferline serve``: a split model whose features come from a model on the
bundled runtime (through the interposed queue) and a materialized-table model, over real HTTP."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from inferline.measure._server_proc import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("velox-serve")
    rng = np.random.default_rng(0)
    np.savez(tmp / "items.npz", ids=np.arange(50), matrix=rng.normal(size=(50, 4)))
    np.save(tmp / "w.npy", rng.normal(size=(3, 5)).astype(np.float64))
    np.save(tmp / "b.npy", np.zeros(5))
    dep = {
        "format": "inferline.deployment/1",
        "name": "velox-demo",
        "backend": "local://?oversubscribe=1",
        "models": [
            {
                "name": "embed",
                "source": "inferline.adapters.local.examples:scale",
                "params": {"factor": 2.0},
            },
            {
                "name": "proj",
                "source": "inferline.adapters.local.examples:linear",
                "params": {
                    "weights": str(tmp / "w.npy"),
                    "bias": str(tmp / "b.npy"),
                    "scores": True,
                },
            },
        ],
        "apps": {},
        "velox": {
            "store": str(tmp / "velox.sqlite"),
            "models": [
                {
                    "name": "songs",
                    "dim": 3,
                    "features": {"model": "embed", "input": {"dtype": "float32", "shape": [3]}},
                    "config": {"alpha": 0.0},
                },
                {"name": "songs5", "dim": 5, "features": {"model": "proj", "output": "scores"}},
                {"name": "movies", "features": {"table": str(tmp / "items.npz")}},
            ],
        },
    }
    path = tmp / "deployment.json"
    path.write_text(json.dumps(dep))
    with ServerProcess(path, token="tok") as srv:
        yield srv


H = {"Authorization": "Bearer tok"}


def test_split_model_learns_a_user_through_backend_features(server: ServerProcess) -> None:
    rng = np.random.default_rng(1)
    w_true = np.array([0.5, -1.0, 2.0])
    with httpx.Client(base_url=server.url, headers=H, timeout=30) as c:
        for _ in range(40):
            x = rng.normal(size=3)
            y = float(w_true @ (2.0 * x))  # the backend model doubles x: features are 2x
            r = c.post("/velox/songs/observe", json={"uid": "alice", "x": x.tolist(), "y": y})
            assert r.status_code == 200, r.text
        x = [1.0, 1.0, 1.0]
        r = c.post("/velox/songs/predict", json={"uid": "alice", "x": x})
        assert r.status_code == 200, r.text
        assert r.json()["score"] == pytest.approx(
            float(w_true @ np.array([2.0, 2.0, 2.0])), abs=0.3
        )
        r = c.post("/velox/songs5/observe", json={"uid": "bob", "x": [1.0, 0.0, 0.0], "y": 1.0})
        assert r.status_code == 200, r.text
        # an item the feature model's declared input refuses: 422 naming x, before the call
        for bad in ("zzz", None, [1.0, 2.0], [[1.0, 2.0, 3.0]], ["1", "2", "3"]):
            r = c.post("/velox/songs/observe", json={"uid": "alice", "x": bad, "y": 1.0})
            assert r.status_code == 422 and r.json()["field"] == "x", (bad, r.text)
        # without the token: refused like every other endpoint
        assert (
            httpx.post(server.url + "/velox/songs/predict", json={"uid": "a", "x": x}).status_code
            == 401
        )


def test_table_model_top_k_and_errors(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, headers=H, timeout=30) as c:
        for item, y in [(1, 5.0), (2, 1.0), (3, 4.5)]:
            assert (
                c.post("/velox/movies/observe", json={"uid": "u", "x": item, "y": y}).status_code
                == 200
            )
        # The ranking must agree with the model's own scores (predict), not just have k rows.
        # Injected bug caught: top_k returning its k items in reverse (ascending) order.
        items = list(range(10))
        own = {}
        for i in items:
            r = c.post("/velox/movies/predict", json={"uid": "u", "x": i})
            assert r.status_code == 200, r.text
            own[i] = r.json()["score"]
        expect = sorted(items, key=lambda i: -own[i])[:3]  # stable: ties by position
        r = c.post("/velox/movies/top_k", json={"uid": "u", "items": items, "k": 3, "alpha": 0})
        assert r.status_code == 200, r.text
        got = r.json()["items"]
        assert [g["item"] for g in got] == expect, (got, own)
        for g in got:
            assert g["score"] == pytest.approx(own[g["item"]], abs=1e-9) and g["bonus"] == 0.0
        # With the default exploration (alpha = 1): ordered by score + bonus, scores still the
        # model's, and the top 3 are the head of the full ranking.
        r = c.post("/velox/movies/top_k", json={"uid": "u", "items": items, "k": 10})
        assert r.status_code == 200, r.text
        full = r.json()["items"]
        assert sorted(g["item"] for g in full) == items
        ucb = [g["score"] + g["bonus"] for g in full]
        assert ucb == sorted(ucb, reverse=True), full
        assert all(g["score"] == pytest.approx(own[g["item"]], abs=1e-9) for g in full)
        assert all(g["bonus"] > 0 for g in full)
        r = c.post("/velox/movies/top_k", json={"uid": "u", "items": items, "k": 3})
        assert r.status_code == 200, r.text
        assert [g["item"] for g in r.json()["items"]] == [g["item"] for g in full[:3]]
        r = c.post("/velox/movies/predict", json={"uid": "u", "x": 999})
        assert r.status_code == 404 and "999" in r.text
        r = c.post("/velox/nope/predict", json={"uid": "u", "x": 1})
        assert r.status_code == 404
        r = c.get("/velox/movies/versions")
        assert r.status_code == 200 and r.json()
