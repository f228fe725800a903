"""Failures on the server's side get JSON errors too: a store that cannot write (503 naming
the store, nothing acknowledged) and a bug in a route (a JSON 500, the connection kept)."""

from __future__ import annotations

import httpx
import pytest
from _served_app import served
from fastapi import APIRouter

from inferline.core import StorageError
from inferline.selection import SQLiteStore as SelectionStore
from inferline.server import App, Service, create_app
from inferline.velox import SQLiteStore as VeloxStore


async def _echo(x, slo):
    return x


def _bug_router() -> APIRouter:
    r = APIRouter()

    @r.get("/bug")
    async def bug() -> dict:
        raise RuntimeError("a bug in a mounted route")

    return r


@pytest.fixture()
def url():
    app = create_app(Service([App("echo", _echo, 1.0)]), routers=[_bug_router()])
    with served(app, log_level="critical") as port:
        yield f"http://127.0.0.1:{port}"


def test_a_bug_is_a_json_500_and_the_connection_stays_open(url, caplog):
    with httpx.Client(base_url=url) as c:
        r = c.get("/bug")
        assert r.status_code == 500
        assert r.json() == {
            "detail": "internal error (see the server log)",
            "error": "InternalError",
        }
        # the same keep-alive connection serves the next request (uvicorn closes it when an
        # exception reaches it)
        r = c.post("/apps/echo/predict", json={"input": [1]})
        assert r.status_code == 200 and r.json()["output"] == [1]
        assert c.get("/bug").status_code == 500
    assert any("a bug in a mounted route" in str(rec.exc_info) for rec in caplog.records)


def test_selection_store_full_or_read_only_raises_storage_error(tmp_path):
    """SQLite's own limits stand in for a full disk (max_page_count gives SQLITE_FULL) and a
    read-only file (query_only gives SQLITE_READONLY): the same errors on the same path."""
    store = SelectionStore(tmp_path / "sel.sqlite")
    store.update("u", lambda s: {"n": 1})
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageError, match="full") as e:
        store.update("big", lambda s: {"blob": "x" * 200_000})
    assert e.value.store.endswith("sel.sqlite")
    assert store.get("u") == {"n": 1}  # nothing half-written; the store still works
    store._db.execute("PRAGMA max_page_count = 1000000")
    store.update("big", lambda s: {"blob": "x" * 10})  # recovers once there is room
    store._db.execute("PRAGMA query_only = ON")
    with pytest.raises(StorageError, match="readonly"):
        store.put("u", {"n": 2})
    store.close()


def test_velox_observe_on_a_store_that_cannot_write_is_a_503(tmp_path):
    from fastapi.testclient import TestClient

    from inferline.velox import FeatureTable, TableModel, VeloxService, make_velox_router

    model = TableModel("m", FeatureTable([1, 2], [[1.0, 0.0], [0.0, 1.0]]), mf_iters=1)

    store = VeloxStore(tmp_path / "v.sqlite")
    svc = VeloxService(store)
    app = create_app(
        Service([App("echo", _echo, 1.0)]),
        routers=[make_velox_router(svc)],
        max_body_bytes=4096,
    )
    with TestClient(app) as c:
        c.portal.call(svc.register, model)
        assert c.post("/velox/m/observe", json={"uid": "u", "x": 1, "y": 1.0}).status_code == 200
        # on the event loop's own connection (each thread has one)
        c.portal.call(lambda: store._conn().execute("PRAGMA query_only = ON"))
        r = c.post("/velox/m/observe", json={"uid": "u", "x": 1, "y": 2.0})
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "StorageError" and r.json()["store"] == store.path
        # not acknowledged, so not applied: the user still has one observation
        assert c.get("/velox/m/users/u").json()["observations"] == 1

        # a chunked body (no Content-Length) over the frontend's limit: 413 on Velox's routes
        # as on every other (the guard counts it as it arrives)
        chunks = (b'{"uid": "u", "x": 1, "y": 1, "pad": "' + b"x" * 1000 for _ in range(10))
        r = c.post("/velox/m/observe", content=chunks, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge", r.text
