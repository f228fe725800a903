"""Fleets: one model's replicas over two real ``local://`` runtimes (real replica processes,
real gRPC), built through ``open_backend`` from a list of URLs; drain and undrain under load."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferline.adapters.fleet import FleetBackend, spread
from inferline.core import CapacityError, InferlineError, ModelConfig, ModelSpec, ValidationError
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from _fleet_fakes import FakeMember
from _fleet_helpers import OpenLoad, Outcome, serve_with

pytestmark = pytest.mark.timeout(90)
# 30 ms a batch of up to 4: one replica serves ~130 queries/s, the load sends 200/s
SLEEP = ModelSpec("m", source="inferline.adapters.local.examples:Sleep", params={"base_s": 0.03})


def test_spread_is_even_within_room_and_shrinks_drained_members_first() -> None:
    assert spread(5, {0: 0, 1: 0}, {0: None, 1: None}) == {0: 3, 1: 2}
    assert spread(4, {0: 0, 1: 0, 2: 0}, {0: 1, 1: None, 2: 2}) == {0: 1, 1: 2, 2: 1}
    assert spread(3, {0: 2, 1: 2}, {0: None, 1: None}, draining={1}) == {0: 2, 1: 1}
    assert spread(5, {0: 2, 1: 1}, {0: None, 1: None}, draining={1}) == {0: 4, 1: 1}
    # a member whose server is away keeps its share; growth goes to the survivors
    assert spread(6, {0: 2, 1: 2}, {0: None, 1: None}, down={1}) == {0: 4, 1: 2}
    assert spread(3, {0: 2, 1: 2}, {0: None, 1: None}, down={1}) == {0: 1, 1: 2}
    assert spread(1, {0: 0, 1: 2}, {0: None, 1: None}, down={1}) == {0: 0, 1: 1}
    with pytest.raises(CapacityError):
        spread(3, {0: 0, 1: 0}, {0: 1, 1: 1})
    with pytest.raises(CapacityError):
        spread(1, {0: 0, 1: 0}, {0: None, 1: None}, draining={0, 1})


def test_a_list_of_urls_is_checked_field_by_field() -> None:
    host = plugin_host()
    with pytest.raises(ValidationError, match=r"backend\[1\]"):
        open_backend(host, ["local://", 7])
    with pytest.raises(ValidationError, match="non-empty"):
        open_backend(host, "[]")
    with pytest.raises(ValidationError, match="JSON list"):
        open_backend(host, "[local://")
    with pytest.raises(ValidationError, match=r"backend\[1\]"):
        open_backend(host, '["local://?cores=0", "local://?cores=0"]')


def _pids(out: list[Outcome], after: float, before: float = float("inf")) -> set[int]:
    """The replica processes that answered the queries submitted after ``after`` and
    answered before ``before``."""
    return {
        o.value["pid"]
        for o in out
        if o.kind == "ok" and after < o.submitted and o.answered < before
    }


def test_two_local_runtimes_serve_one_model_and_drain_without_a_failed_query() -> None:
    async def main() -> None:
        b = open_backend(plugin_host(), ["local://?cores=0", "local://?cores=1"])
        assert isinstance(b, FleetBackend)
        await serve_with(b, body)

    async def body(b: FleetBackend, d: Dispatcher) -> None:
        a, c = b.servers
        assert b.inventory() == {"cpu": 2}
        with pytest.raises(CapacityError):  # one core each: three do not fit
            await b.deploy(SLEEP, ModelConfig("cpu", 4, 3))
        await b.deploy(SLEEP, ModelConfig("cpu", 4, 2))
        assert sorted(h.server for h in b.replicas("m")) == [a, c]  # type: ignore[attr-defined]
        assert len({h.id for h in b.replicas("m")}) == 2
        assert b.free() == {"cpu": 0}
        d.add_model("m", batching=FixedBatching(4), max_retries=1)
        d.attach(b)
        load = OpenLoad(d, "m")
        load.start()
        await asyncio.sleep(0.8)
        assert len(_pids(load.out, 0)) == 2  # both servers answered (one alone cannot keep up)

        st = b.drain(c)
        assert st["draining"] and st["server"] == c
        assert [h.server for h in b.replicas("m")] == [a]  # type: ignore[attr-defined]
        t_drain = time.monotonic()
        assert await b.wait_drained(c, 5.0)
        assert b.drain_status(c)["empty"]
        await asyncio.sleep(0.6)
        fs = await b.stats("m")
        assert [s["draining"] for s in fs["servers"]] == [False, True]
        assert {r["server"] for r in fs["replicas"]} == {a, c}

        b.undrain(c)
        t_undrain = time.monotonic()
        assert sorted(h.server for h in b.replicas("m")) == [a, c]  # type: ignore[attr-defined]
        await asyncio.sleep(0.6)
        await load.finish(15)
        # queries submitted and answered while the server was drained: the other one only
        assert len(_pids(load.out, t_drain, t_undrain)) == 1
        assert len(_pids(load.out, t_undrain)) == 2
        errors = load.failed()
        assert len(load.out) == len(load.tasks) and not errors, errors[:3]

        await b.scale("m", 1)
        assert len(b.replicas("m")) == 1
        await b.remove("m")

    asyncio.run(main())


def test_a_deployment_with_a_list_of_backends_serves_and_drains_over_http() -> None:
    """The whole path: ``"backend"`` as a JSON list in a deployment, ``start_service``, the
    admin API (``/admin/drain``, ``/admin/undrain``, ``/admin/models``) and ``/metrics``."""
    from inferline.core import Plan
    from inferline.demo.simple import sleep_deployment
    from inferline.deploy import Deployment, start_service
    from inferline.server import create_app, make_admin_router

    urls = ["local://?cores=0", "local://?cores=1"]
    dep = Deployment.from_dict(sleep_deployment(backend=urls))  # type: ignore[arg-type]
    assert Deployment.from_dict(dep.to_dict()) == dep
    plan = Plan("sleep", 1.0, {"m": ModelConfig("cpu", 4, 2)})

    async def main() -> None:
        svc = await start_service(dep, plan)
        app = create_app(svc, routers=[make_admin_router], close_service_on_shutdown=False)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as c:
                await body(svc, c)
        finally:
            await svc.close()

    async def body(svc: Any, c: httpx.AsyncClient) -> None:
        answers = await asyncio.gather(*(svc.predict("app", [float(i)]) for i in range(20)))
        assert len(answers) == 20
        models = (await c.get("/admin/models")).json()
        assert sorted(r["server"] for r in models["m"]["backend"]["replicas"]) == urls
        text = (await c.get("/metrics")).text
        servers = {
            s.labels["server"]
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "inferline_replica_info"
        }
        assert servers == set(urls)
        r = await c.post("/admin/drain", json={"server": urls[1], "wait_s": 5})
        assert r.status_code == 200 and r.json()["empty"] is True, r.text
        assert (await c.get("/admin/drain")).json()["servers"][1]["draining"] is True
        await asyncio.gather(*(svc.predict("app", [float(i)]) for i in range(10)))
        bad = await c.post("/admin/drain", json={"server": "local://?cores=9"})
        assert bad.status_code == 404, bad.text
        bad = await c.post("/admin/drain", json={"server": urls[0], "wait_s": -1})
        assert bad.status_code == 422 and "wait_s" in bad.text
        r = await c.post("/admin/undrain", json={"server": urls[1]})
        assert r.status_code == 200 and r.json()["draining"] is False
        assert len(svc.backend.replicas("m")) == 2

    asyncio.run(main())


def test_fleet_bookkeeping_on_a_refused_deploy_and_a_server_away() -> None:
    async def main() -> None:
        a, c = FakeMember("fake://a", 4), FakeMember("fake://c", 4)
        fleet = FleetBackend([a, c], replace_grace_s=0.05)
        published: list[list[str]] = []
        fleet.subscribe(lambda m, hs: published.append(sorted(h.id for h in hs)))
        c.fail.add("deploy")
        with pytest.raises(InferlineError, match="refused"):
            await fleet.deploy(SLEEP, ModelConfig("cpu", 4, 2))
        assert a.calls[-1] == ("remove", "m", 0) and fleet.models() == []  # undone
        c.fail.clear()
        await fleet.deploy(SLEEP, ModelConfig("cpu", 4, 4))
        assert published[-1] == ["m-0@0", "m-0@1", "m-1@0", "m-1@1"]
        c.lose()
        assert published[-1] == ["m-0@0", "m-1@0"]  # re-published at once
        assert (await fleet.stats("m"))["shortfall"] == 2
        await asyncio.sleep(0.3)  # after the grace, c's 2 are re-placed on a (room for 2)
        st = await fleet.stats("m")
        assert a.held["m"] == 4 and len(published[-1]) == 4
        assert (st["shortfall"], st["unplaced"], st["servers"][0]["covering"]) == (0, 0, 2)
        await fleet.scale("m", 5)  # c is away: a's share grows into its cover's place
        st = await fleet.stats("m")
        assert a.held["m"] == 4 and c.held["m"] == 2  # a: 3 of its own and 1 cover
        assert (st["shortfall"], st["unplaced"], st["servers"][0]["covering"]) == (1, 1, 1)
        assert not [x for x in c.calls if x[0] == "scale"]
        c.back()  # c's replicas are back: the cover goes after the grace
        await asyncio.sleep(0.3)
        st = await fleet.stats("m")
        assert a.held["m"] == 3 and len(published[-1]) == 5 and st["shortfall"] == 0
        assert st["servers"][0]["covering"] == 0 and st["unplaced"] == 0
        await fleet.scale("m", 2)  # the larger share shrinks first
        assert (a.held["m"], c.held["m"]) == (1, 1)
        with pytest.raises(CapacityError):
            await fleet.scale("m", 9)
        await fleet.close()

    asyncio.run(main())


def test_a_fleet_deployment_file_round_trips_with_its_list() -> None:
    """The list a user wrote comes back a list (not the JSON text it is kept as)."""
    from inferline.deploy import Deployment

    d = Deployment.from_dict(
        {
            "format": "inferline.deployment/1",
            "name": "f",
            "backend": ["local://", "local://?cores=1"],
            "models": [{"name": "m", "source": "inferline.adapters.local.examples:sleep"}],
            "apps": {},
        }
    )
    out = d.to_dict()
    assert out["backend"] == ["local://", "local://?cores=1"]
    assert Deployment.from_dict(out) == d
