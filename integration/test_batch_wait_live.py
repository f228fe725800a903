"""A plan's batch-wait timeout served: ``inferline serve --plan`` with a plan whose model
carries ``batch_wait_ms`` runs delayed batching with that wait on the bundled runtime (real
replica processes over HTTP), ``GET /admin/models`` shows it, and a plan without a wait put
through ``PUT /admin/plan`` brings greedy batching back. A deployment that names a policy keeps
it whatever the plan says.

Catches: a planned wait that never reaches the served queue (the four queries sent together
would run as a batch of one and one of three), a wait that outlives the plan that set it.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from inferline.core import ModelConfig, Plan, save
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, apply_plan, start_service
from inferline.measure import ServerProcess
from inferline.queueing import DelayedBatching, FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
WAIT_MS = 250.0


async def _burst(url: str, n: int) -> list[float]:
    """``n`` queries sent at once; each one's latency."""
    async with httpx.AsyncClient(timeout=30) as c:

        async def one(i: int) -> float:
            t = time.monotonic()
            r = await c.post(url + "/apps/app/predict", json={"input": [float(i)]})
            assert r.status_code == 200, r.text
            return time.monotonic() - t

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def test_served_plan_with_a_wait_uses_delayed_batching(tmp_path) -> None:
    dep = tmp_path / "d.json"
    dep.write_text(json.dumps(sleep_deployment(base_s=0.005)))
    plan = tmp_path / "plan.json"
    save(Plan("sleep", 1.0, {"m": ModelConfig("cpu", 8, 1, batch_wait_ms=WAIT_MS)}), plan)
    assert json.loads(plan.read_text())["models"]["m"]["batch_wait_ms"] == WAIT_MS
    with ServerProcess(dep, plan) as srv:
        models = httpx.get(srv.url + "/admin/models").json()
        assert models["m"]["batching"] == {
            "policy": "delayed",
            "max_batch_size": 8,
            "batch_wait_s": WAIT_MS / 1e3,
        }
        asyncio.run(_burst(srv.url, 1))  # warm the replica process
        before = httpx.get(srv.url + "/admin/models").json()["m"]["queue"]["batch_sizes"]
        lat = asyncio.run(_burst(srv.url, 4))
        after = httpx.get(srv.url + "/admin/models").json()["m"]["queue"]["batch_sizes"]
        new = {b: after.get(b, 0) - before.get(b, 0) for b in after}
        # the four arrive within the wait: one batch of four, not 1 + 3 as greedy batching runs
        assert {b: n for b, n in new.items() if n} == {"4": 1}, (before, after)
        assert min(lat) >= 0.9 * WAIT_MS / 1e3 - 0.05  # nobody ran before the batch filled
        # a plan without a wait: greedy (fixed) batching again
        greedy = Plan("sleep", 1.0, {"m": ModelConfig("cpu", 8, 1)}).to_dict()
        r = httpx.put(srv.url + "/admin/plan", json=greedy, timeout=60)
        assert r.status_code == 200, r.text
        models = httpx.get(srv.url + "/admin/models").json()
        assert models["m"]["batching"] == {"policy": "fixed", "max_batch_size": 8}


def test_a_policy_the_deployment_names_wins_over_the_plan_s_wait() -> None:
    d = sleep_deployment(base_s=0.002)
    d["models"][0]["batching"] = {"policy": "fixed"}
    dep = Deployment.from_dict(d)
    waited = Plan("sleep", 1.0, {"m": ModelConfig("cpu", 4, 1, batch_wait_ms=30.0)})

    async def main() -> None:
        svc = await start_service(dep, waited)
        try:
            assert svc.dispatcher.batching("m") == FixedBatching(4)
            await apply_plan(svc, waited)
            assert svc.dispatcher.batching("m") == FixedBatching(4)
        finally:
            await svc.close()
        plain = Deployment.from_dict(sleep_deployment(base_s=0.002))
        svc = await start_service(plain, waited)
        try:
            assert svc.dispatcher.batching("m") == DelayedBatching(4, 0.03)
            done = await apply_plan(svc, waited)
            assert done["m"].endswith("batch wait 30 ms"), done
        finally:
            await svc.close()

    asyncio.run(main())
