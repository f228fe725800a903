"""Batching policies named in a deployment run in the served queue: each model entry's
``"batching"`` builds the policy, plans and tuner decisions change its bound and keep it, and
``GET /admin/models`` shows its name and state."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from inferline.core import ModelConfig, Plan, ValidationError
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, apply_plan, start_service
from inferline.deploy._batching import BATCHING_POLICIES, BatchingSpec, with_max_batch
from inferline.queueing import AIMDBatching, DelayedBatching, FixedBatching
from inferline.server import create_app, make_admin_router


def _dep(batching: dict | None) -> Deployment:
    d = sleep_deployment(base_s=0.002, slo_ms=100)
    if batching is not None:
        d["models"][0]["batching"] = batching
    return Deployment.from_dict(d)


@pytest.mark.parametrize(
    "spec",
    [
        {"policy": "fixed"},
        {"policy": "delayed", "batch_wait_ms": 2},
        {"policy": "aimd", "backoff": 0.5, "increase": 2, "margin_ms": 5},
        {"policy": "rafiki", "delta_ms": 1, "latencies_ms": {"1": 2, "4": 5, "8": 9}},
    ],
)
def test_batching_specs_round_trip_and_build(spec):
    s = BatchingSpec.from_dict(spec)
    assert BatchingSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    dep = _dep(spec)
    assert Deployment.from_dict(dep.to_dict()) == dep
    policy = s.build(8, 0.1)
    assert policy.to_dict()["policy"] == spec["policy"]
    assert policy.max_batch_size <= 8
    # a new bound keeps the policy (before, every plan and tuner decision installed fixed)
    moved = with_max_batch(policy, 4)
    assert moved.to_dict()["policy"] == spec["policy"] and moved.max_batch_size <= 4


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"policy": "nagle"}, "models[0].batching.policy"),
        ({"policy": "fixed", "batch_wait_ms": 2}, "models[0].batching.batch_wait_ms"),
        ({"policy": "delayed", "batch_wait_ms": -1}, "batching.batch_wait_ms"),
        ({"policy": "aimd", "backoff": 1.5}, "backoff"),
        ({"policy": "rafiki"}, "batching.latencies_ms"),
    ],
)
def test_bad_batching_is_refused_naming_the_field(spec, field):
    with pytest.raises(ValidationError) as ei:
        _dep(spec)
    assert field in ei.value.field


def test_served_policy_is_kept_by_a_new_plan_and_shown_in_admin():
    dep = _dep({"policy": "aimd", "increase": 1, "backoff": 0.5})
    plan = Plan("sleep", 0.1, {"m": ModelConfig("cpu", 8, 1)})

    async def main():
        svc = await start_service(dep, plan)
        try:
            pol = svc.dispatcher.batching("m")
            assert isinstance(pol, AIMDBatching) and pol.maximum == 8 and pol.slo_s == 0.1
            # full batches under the SLO grow AIMD's size
            await asyncio.gather(*(svc.predict("app", [float(i)]) for i in range(40)))
            grown = svc.dispatcher.batching("m")
            assert isinstance(grown, AIMDBatching) and grown.size > 1
            await apply_plan(svc, Plan("sleep", 0.1, {"m": ModelConfig("cpu", 4, 1)}))
            kept = svc.dispatcher.batching("m")
            assert isinstance(kept, AIMDBatching) and kept.maximum == 4
            assert kept.size == min(grown.size, 4)
            app = create_app(svc, routers=[make_admin_router], close_service_on_shutdown=False)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as c:
                models = (await c.get("/admin/models")).json()
            assert models["m"]["batching"]["policy"] == "aimd"
            assert models["m"]["batching"]["size"] == kept.size
        finally:
            await svc.close()

    asyncio.run(main())


# a distinctive value per *_ms parameter; latencies_ms is a {batch size: ms} table
_MS_VALUE = 7.25
_MS_TABLE = {"1": 7.25, "4": 11.5, "8": 19.75}


def _ms_fields() -> list[tuple[str, str]]:
    return sorted(
        (policy, name)
        for policy, names in BATCHING_POLICIES.items()
        for name in names
        if name.endswith("_ms")
    )


def test_every_ms_field_of_every_policy_reaches_the_policy_in_seconds():
    """Each policy's every ``*_ms`` parameter, set to a distinctive value in a deployment,
    is in the built policy as ``*_s`` = value / 1000. Fails if any of them is taken as
    seconds (e.g. ``margin_ms`` without ``/ 1e3``) or not passed on at all."""
    fields = _ms_fields()
    assert {n for _, n in fields} >= {"batch_wait_ms", "margin_ms", "delta_ms", "latencies_ms"}
    for policy, name in fields:
        params: dict = {"latencies_ms": dict(_MS_TABLE)} if policy == "rafiki" else {}
        params[name] = dict(_MS_TABLE) if name == "latencies_ms" else _MS_VALUE
        dep = _dep({"policy": policy, **params})
        built = dep.batching_of("m").build(8, 0.1).to_dict()
        assert built["policy"] == policy
        got = built[name[: -len("_ms")] + "_s"]
        if name == "latencies_ms":
            table = dict(zip(built["candidate_sizes"], got, strict=True))
            assert table == {int(b): pytest.approx(ms / 1e3) for b, ms in _MS_TABLE.items()}
        else:
            assert got == pytest.approx(_MS_VALUE / 1e3), (policy, name, got)


def test_served_aimd_with_a_margin_grows_its_batch_bound():
    """AIMD served with ``margin_ms`` 50 under a 100 ms SLO (2 ms batches): full batches
    under SLO - margin grow its bound past 1, and the policy holds the margin in seconds.
    Fails if ``margin_ms`` is taken as seconds (50 s: every batch counts as late and the
    bound never leaves 1)."""
    dep = _dep({"policy": "aimd", "increase": 1, "backoff": 0.5, "margin_ms": 50})
    plan = Plan("sleep", 0.1, {"m": ModelConfig("cpu", 8, 1)})

    async def main():
        svc = await start_service(dep, plan)
        try:
            pol = svc.dispatcher.batching("m")
            assert isinstance(pol, AIMDBatching) and pol.size == 1
            await asyncio.gather(*(svc.predict("app", [float(i)]) for i in range(40)))
            grown = svc.dispatcher.batching("m")
            assert isinstance(grown, AIMDBatching) and grown.size > 1, grown
            assert grown.margin_s == pytest.approx(0.05)
        finally:
            await svc.close()

    asyncio.run(main())


def test_without_a_batching_entry_the_plan_s_fixed_batching_is_served():
    dep = _dep(None)

    async def main():
        svc = await start_service(dep, Plan("sleep", 0.1, {"m": ModelConfig("cpu", 4, 1)}))
        try:
            assert svc.dispatcher.batching("m") == FixedBatching(4)
        finally:
            await svc.close()

    asyncio.run(main())


def test_delayed_batching_waits_for_a_fuller_batch():
    policy = BatchingSpec("delayed", {"batch_wait_ms": 5}).build(8, 0.1)
    assert isinstance(policy, DelayedBatching) and policy.batch_wait_s == 0.005
    d = policy.decide(0.0, 2, 0.1, 0.0)
    assert d.take == 0 and d.wait_until is not None
