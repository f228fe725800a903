"""``queue.expire_grace_ms`` in a deployment: validated, round-trips, and reaches the served
dispatcher's expiry timers (a query queued behind a busy replica process of the bundled
runtime is answered at its deadline plus that grace)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from inferline.core import ModelConfig, Plan, ValidationError
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, QueueSpec, start_service

pytestmark = [pytest.mark.timeout(120)]
SLO_MS = 100


def _dep(queue: dict[str, Any]) -> Deployment:
    d = sleep_deployment(base_s=1.0, slo_ms=SLO_MS, default_output={"label": "late"})
    d["queue"] = {**d["queue"], **queue}
    return Deployment.from_dict(d)


def test_default_round_trip_and_old_deployments() -> None:
    assert QueueSpec().expire_grace_ms == 50.0  # the bound: 50 ms at most by default
    assert _dep({}).queue.expire_grace_ms == 50.0  # a deployment without the key
    dep = _dep({"expire_late": True, "expire_grace_ms": 20})
    assert dep.queue.expire_grace_ms == 20.0 and dep.queue.expire_grace_s == 0.02
    again = Deployment.from_dict(json.loads(json.dumps(dep.to_dict())))
    assert again == dep and again.queue.to_dict()["expire_grace_ms"] == 20.0


@pytest.mark.parametrize("bad", [-1, "20", True, 1e6, float("nan"), None])
def test_bad_grace_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError) as ei:
        _dep({"expire_late": True, "expire_grace_ms": bad})
    assert ei.value.field == "queue.expire_grace_ms"
    with pytest.raises(ValidationError) as ei:
        QueueSpec(expire_grace_ms=bad)
    assert ei.value.field == "queue.expire_grace_ms"


async def _late_answer_s(grace_ms: float) -> tuple[float, Any]:
    """Seconds until a query queued behind a replica busy for 1 s is answered."""
    dep = _dep({"expire_late": True, "expire_grace_ms": grace_ms})
    svc = await start_service(dep, Plan("sleep", 0.1, {"m": ModelConfig("cpu", 1, 1)}))
    try:
        await svc.predict("app", [0.0], slo_s=5.0)  # warm the replica process
        busy = asyncio.ensure_future(svc.predict("app", [1.0], slo_s=5.0))
        t0 = time.monotonic()
        while svc.dispatcher.stats("m").in_flight == 0:
            assert time.monotonic() - t0 < 20, "the replica never took the first query"
            await asyncio.sleep(0.005)
        t = time.monotonic()
        out = await svc.predict("app", [2.0])
        took = time.monotonic() - t
        await busy
        return took, out
    finally:
        await svc.close()


def test_the_served_dispatcher_expires_at_deadline_plus_the_deployment_s_grace() -> None:
    slo = SLO_MS / 1e3
    for grace_ms in (0.0, 400.0):
        took, out = asyncio.run(_late_answer_s(grace_ms))
        assert out.output == {"label": "late"}  # the default output, by the expiry timer
        # never before deadline + grace; well before the replica frees up (1 s), with room
        # for a loaded 2-core machine
        assert slo + grace_ms / 1e3 - 0.01 <= took <= slo + grace_ms / 1e3 + 0.25, (grace_ms, took)
