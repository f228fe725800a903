"""Velox served by ``inferline serve``: a split model whose features come from a model on the
bundled runtime (through the interposed queue) and a materialized-table model, over real HTTP."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from fastapi import APIRouter, Request

from inferline.measure import ServerProcess

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


# --------------------------------------------------------------------------- training data,
# starting weights, retraining and a backend redeploy, through a real `inferline serve`


def redeploy_router(service):  # a deployment "routers" factory, imported by the server process
    """``POST /test/redeploy {"model", "params", "version"}``: remove the backend model and deploy
    it again with new params and version (a real redeploy on the bundled runtime)."""
    from inferline.core import ModelSpec

    r = APIRouter(prefix="/test")

    @r.post("/redeploy")
    async def redeploy(request: Request) -> dict:
        b = await request.json()
        rec = service.backend._models[b["model"]]
        spec, cfg = rec.spec, rec.config
        await service.backend.remove(spec.name)
        new = ModelSpec(spec.name, spec.source, b["params"], str(b["version"]), spec.threads)
        await service.backend.deploy(new, cfg)
        return {"ok": True}

    return r


def _ratings_db(path, n_users: int, items: np.ndarray, rng: np.random.Generator):
    """A SQLite table of ratings by users with known true weights over the item features."""
    import sqlite3

    truth = {f"t{j}": rng.normal(size=items.shape[1]) for j in range(n_users)}
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE ratings (uid TEXT, item INTEGER, rating REAL, ts REAL)")
    rows = []
    for uid, w in truth.items():
        for i in rng.choice(len(items), size=12, replace=False):
            rows.append((uid, int(i), float(items[i] @ w + 0.1 * rng.normal()), 0.0))
    con.executemany("INSERT INTO ratings VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return truth, len(rows)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("velox-trained")
    rng = np.random.default_rng(7)
    items = rng.normal(size=(30, 6))  # an MF-form table: dim 6 = 4 factors + 2
    np.savez(tmp / "items.npz", ids=np.arange(30), matrix=items)
    _truth, n_rows = _ratings_db(tmp / "ratings.db", 8, items, rng)
    start = {"t0": np.full(6, 0.25), "t1": np.arange(6.0) / 10}
    np.savez(tmp / "users.npz", ids=np.array(list(start)), matrix=np.array(list(start.values())))
    dep = {
        "format": "inferline.deployment/1",
        "name": "velox-trained",
        "backend": "local://?oversubscribe=1",
        "models": [
            {
                "name": "embed",
                "source": "inferline.adapters.local.examples:scale",
                "params": {"factor": 2.0},
            }
        ],
        "apps": {},
        "routers": ["test_velox_serve:redeploy_router"],
        "velox": {
            "models": [
                {
                    "name": "rated",
                    "features": {"table": str(tmp / "items.npz")},
                    "training_data": {"sqlite": str(tmp / "ratings.db"), "table": "ratings"},
                    "starting_weights": {"users": str(tmp / "users.npz")},
                    "config": {"alpha": 0.0},
                },
                {
                    "name": "songs",
                    "dim": 3,
                    "features": {"model": "embed"},
                    "config": {"alpha": 0.0},
                },
            ]
        },
    }
    path = tmp / "deployment.json"
    path.write_text(json.dumps(dep))
    here = str(__import__("pathlib").Path(__file__).parent)
    with ServerProcess(path, token="tok", env={"PYTHONPATH": here}) as srv:
        yield srv, items, start, n_rows


def test_training_data_and_starting_weights_are_served_and_retrained_on(trained) -> None:
    server, items, start, n_rows = trained
    with httpx.Client(base_url=server.url, headers=H, timeout=60) as c:
        # version 1 serves the starting weights, with the confidence of their training rows
        for uid, w in start.items():
            r = c.post("/velox/rated/predict", json={"uid": uid, "x": 3})
            assert r.status_code == 200, r.text
            assert r.json()["score"] == pytest.approx(float(items[3] @ w), abs=1e-9)
            assert c.get(f"/velox/rated/users/{uid}").json()["observations"] == 12
        v1 = c.get("/velox/rated/versions").json()["versions"][0]
        assert v1["info"]["training_rows"] == n_rows
        # a user only in the training data has no weights yet (not in the starting file)
        assert c.get("/velox/rated/users/t5").status_code == 404
        for i in range(5):
            r = c.post("/velox/rated/observe", json={"uid": "live", "x": i, "y": 1.0})
            assert r.status_code == 200, r.text
        r = c.post("/velox/rated/retrain", json={"wait": True})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        vs = c.get("/velox/rated/versions").json()
        assert vs["current"] == 2
        info = vs["versions"][-1]["info"]
        # the retrain saw the training table and the live observations
        assert info["training_rows"] == n_rows and info["observations"] == 5
        assert info["users"] == 9  # 8 training users + the live one
        u5 = c.get("/velox/rated/users/t5")
        assert u5.status_code == 200 and u5.json()["version"] == 2


def test_feature_cache_follows_a_backend_redeploy(trained) -> None:
    server = trained[0]
    w_true = np.array([0.5, -1.0, 2.0])
    rng = np.random.default_rng(3)
    with httpx.Client(base_url=server.url, headers=H, timeout=60) as c:
        for _ in range(30):
            x = rng.normal(size=3)
            r = c.post(
                "/velox/songs/observe",
                json={"uid": "ann", "x": x.tolist(), "y": float(w_true @ (2.0 * x))},
            )
            assert r.status_code == 200, r.text
        x = [1.0, 0.5, 0.25]
        before = c.post("/velox/songs/predict", json={"uid": "ann", "x": x}).json()["score"]
        again = c.post("/velox/songs/predict", json={"uid": "ann", "x": x}).json()
        assert again["cached"] and again["score"] == before  # served from the cache
        r = c.post(
            "/test/redeploy", json={"model": "embed", "params": {"factor": 3.0}, "version": 2}
        )
        assert r.status_code == 200, r.text
        after = c.post("/velox/songs/predict", json={"uid": "ann", "x": x}).json()
        # the same user weights over the new model's features (x3 instead of x2)
        assert not after["cached"]
        assert after["score"] == pytest.approx(before * 1.5, rel=1e-6)
        # the default retrain of a split model can now change something: features recomputed
        r = c.post("/velox/songs/retrain", json={"wait": True})
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        vs = c.get("/velox/songs/versions").json()["versions"]
        assert vs[-1]["info"]["features_version"].startswith("2-")
        assert vs[0]["info"]["features_version"].startswith("1-")
        # refitted on features x3: y = w_true . 2x = (2/3 w_true) . 3x
        w = np.array(c.get("/velox/songs/users/ann").json()["weights"])
        assert np.allclose(w, w_true * 2 / 3, atol=0.1), w
