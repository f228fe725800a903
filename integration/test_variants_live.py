"""Model variants live on the bundled runtime: a plan made with variants deploys every variant,
serves each stage from its chosen one, and the running tuner switches a stage to a cheaper
variant on a burst (new replicas first, then the stage moves, then the old variant drains and
stops) and back after it; ``apply_plan`` moves stages the same way. No query is lost."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import numpy as np
import pytest
from live_burst import SHORT_TUNER, burst_offsets, planned_inputs, replay_and_watch

from inferline.core import (
    ModelConfig,
    Pipeline,
    PipelineVariants,
    Plan,
    Profiles,
    ValidationError,
    VariantPlan,
    plan_with_variants_section,
)
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, apply_plan, planned_models, start_service
from inferline.server import create_app, make_admin_router

pytestmark = pytest.mark.integration

SLOW_S, FAST_S = 0.05, 0.0125  # the accurate variant serves 20 q/s per replica, the cheap one 80
PLANNED_QPS, BURST_QPS, SLO_S = 6.0, 24.0, 0.5
PIPE = Pipeline("sleep", ("m",), ())
# The tuner's inputs: what profiling these two Sleep containers gives (one query per batch).
PROFILES = Profiles.from_latencies({"m-slow": {"cpu": {1: SLOW_S}}, "m-fast": {"cpu": {1: FAST_S}}})
VARIANTS = PipelineVariants.from_dict(
    {
        "format": "inferline.variants/1",
        "pipeline": "sleep",
        "accuracy_floor": 0.85,
        "stages": {
            "m": {
                "variants": [
                    {"name": "m-slow", "accuracy": 0.95},
                    {"name": "m-fast", "accuracy": 0.9},
                ]
            }
        },
    }
)


def _deployment() -> Deployment:
    d = sleep_deployment(base_s=SLOW_S, slo_ms=SLO_S * 1e3)
    slow = d["models"][0]
    fast = json.loads(json.dumps(slow))
    slow["name"], fast["name"] = "m-slow", "m-fast"
    fast["params"]["base_s"] = FAST_S
    d["models"] = [slow, fast]  # the pipeline calls stage "m"; no model has that name
    return Deployment.from_dict(d)


def _plan(variant: str = "m-slow") -> Plan:
    inputs = planned_inputs(SLOW_S, PLANNED_QPS)
    plan = Plan("sleep", SLO_S, {"m": ModelConfig("cpu", 1, 1)}, tuner=inputs)
    acc = VARIANTS.stages["m"].accuracy_of(variant)
    return plan_with_variants_section(
        VariantPlan(plan, {"m": variant}, acc), PIPE, VARIANTS, PROFILES
    )


def _counts(svc) -> dict[str, int]:
    return {m: len(svc.backend.replicas(m)) for m in ("m-slow", "m-fast")}


def test_plan_file_round_trips_and_names_the_served_models():
    plan = _plan()
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert planned_models(plan) == {
        "m-slow": ModelConfig("cpu", 1, 1),
        "m-fast": ModelConfig("cpu", 1, 0),  # deployed idle: a switch only starts replicas
    }
    bad = plan.to_dict()
    del bad["variants"]["profiles"]["models"]["m-fast"]
    with pytest.raises(ValidationError, match=r"variants\.profiles\.models\.m-fast"):
        Plan.from_dict(bad)


# time (~15 s): a 6 s burst and 4 s after it, plus the tuner's delay before switching back.
def test_tuner_switches_to_the_cheaper_variant_on_a_burst_and_back_after_it():
    dep = _deployment()
    plan = _plan()
    offsets = burst_offsets(PLANNED_QPS, BURST_QPS, 6.0, 4.0)

    async def main():
        svc = await start_service(dep, plan, tuner=SHORT_TUNER)
        try:
            assert _counts(svc) == {"m-slow": 1, "m-fast": 0}
            assert svc.dispatcher.resolve("m") == "m-slow"
            tuner = svc.tuner
            assert tuner.variant_tuner is not None
            results: list[tuple[float, float, int]] = []

            async def one(at: float) -> None:
                p = await svc.predict("app", np.asarray([at], dtype=np.float32))
                results.append((at, p.latency_s, int(p.output["pid"])))

            t0, seen = await replay_and_watch(
                offsets,
                one,
                lambda t: (t, svc.dispatcher.resolve("m"), _counts(svc)),
                lambda: (
                    svc.dispatcher.resolve("m") == "m-slow"
                    and _counts(svc) == {"m-slow": 1, "m-fast": 0}
                    and len(tuner.applied) >= len(tuner.variant_decisions)
                ),
            )
            metrics = svc.metrics.render().decode()
            stats = {m: svc.dispatcher.stats(m).completed for m in ("m-slow", "m-fast")}
            return tuner, t0, seen, results, metrics, stats
        finally:
            await svc.close()

    tuner, t0, seen, results, metrics, stats = asyncio.run(main())
    timeline = [
        (round(v.decision.time_s - t0, 2), v.decision.action, dict(v.switched), v.decision.reason)
        for v in tuner.variant_decisions
    ]
    applied = [
        (round(a.started_s - t0, 2), round(a.finished_s - t0, 2), a.error) for a in tuner.applied
    ]
    print("decisions", timeline, "applied", applied)
    # 1. every query was answered (a prediction, not an error), also across both switches
    assert len(results) == len(offsets)
    # 2. the burst switched the stage to the cheap variant instead of adding a replica
    ups = [v for v in tuner.variant_decisions if v.switched]
    assert ups and ups[0].switched == {"m": ("m-slow", "m-fast")}, timeline
    assert (
        ups[0].decision.replicas == {"m": 1}
        and ups[0].scale_up_cost_per_hour > ups[0].cost_per_hour
    )
    assert 3.0 < ups[0].decision.time_s - t0 < 6.0, timeline
    # the stage moved only once the new variant served, and the old one then stopped
    moved = [(t, c) for t, r, c in seen if r == "m-fast"]
    assert moved, seen
    assert all(c["m-fast"] >= 1 for _, c in moved)
    assert any(c == {"m-slow": 0, "m-fast": 1} for _, c in moved), seen
    print("stage served by m-fast from", round(moved[0][0], 2), "s to", round(moved[-1][0], 2), "s")
    assert stats["m-fast"] > 0
    # the burst's end is served within the SLO
    lat = np.array([lat for at, lat, _ in results if 7.5 <= at < 9.0])
    assert lat.size > 20 and float(np.mean(lat <= SLO_S)) >= 0.95, np.percentile(lat, 99)
    # 3. after the burst, back to the plan's variant
    backs = [v for v in tuner.variant_decisions if v.switched.get("m") == ("m-fast", "m-slow")]
    assert backs, timeline
    assert seen[-1][1:] == ("m-slow", {"m-slow": 1, "m-fast": 0}), seen[-1]
    assert all(a.error is None for a in tuner.applied), applied
    # 4. exported
    assert 'inferline_tuner_variant_switches_total{stage="m",variant="m-fast"} 1.0' in metrics
    assert 'inferline_tuner_variant_switches_total{stage="m",variant="m-slow"} 1.0' in metrics


def test_apply_plan_moves_a_stage_to_another_variant_without_losing_queries():
    dep = _deployment()

    async def main():
        svc = await start_service(dep, _plan("m-slow"))
        try:
            # a backlog on the slow variant when the new plan arrives
            pending = [
                asyncio.create_task(svc.predict("app", np.asarray([float(i)], np.float32)))
                for i in range(15)
            ]
            await asyncio.sleep(0.05)
            new = _plan("m-fast")
            new = replace(new, models={"m": ModelConfig("cpu", 1, 2)})
            assert svc.health()["status"] == "ok", svc.health()
            assert svc.health()["idle_variants"] == ["m-fast"]
            done = await apply_plan(svc, new)
            after = [svc.predict("app", np.asarray([1.0], np.float32)) for _ in range(10)]
            outs = await asyncio.gather(*pending, *after)
            counts = _counts(svc)
            # the operator's view: which variant serves the stage now
            app = create_app(svc, routers=[make_admin_router])
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                admin = (await c.get("/admin/models")).json()
            assert admin["m-fast"]["serves_stages"] == ["m"], admin
            assert admin["m-slow"]["serves_stages"] == [], admin  # idle now
            # health: the variant left idle by the switch is not a fault, the serving one is
            health = [svc.health()]
            await svc.backend.scale("m-fast", 0)
            health.append(svc.health())
            return (
                done,
                outs,
                svc.dispatcher.resolve("m"),
                counts,
                svc.dispatcher.routes,
                health,
            )
        finally:
            await svc.close()

    done, outs, route, counts, routes, health = asyncio.run(main())
    assert health[0]["status"] == "ok" and health[0]["idle_variants"] == ["m-slow"], health
    assert health[1]["status"] == "degraded" and health[1]["replicas"]["m-fast"] == 0, health
    assert len(outs) == 25 and all(isinstance(p.output, dict) for p in outs)
    assert route == "m-fast" and routes == {"m": "m-fast"}
    assert counts == {"m-slow": 0, "m-fast": 2}
    assert done["m"] == "served by m-fast" and done["m-fast"].startswith("2 replicas"), done
    assert done["m-slow"].startswith("0 replicas"), done


def test_a_deployment_missing_a_variant_is_refused_by_name():
    dep = _deployment()
    only_slow = replace(dep, models=tuple(m for m in dep.models if m.name == "m-slow"))
    with pytest.raises(ValidationError, match="m-fast"):
        asyncio.run(start_service(only_slow, _plan()))


# time (~13 s): three CLI processes (profile both variants on the real runtime, plan,
# deploy --dry-run).
def test_profile_plan_and_deploy_a_variant_deployment_from_the_command_line(tmp_path, capsys):
    """The whole chain on the real runtime: ``inferline profile --variants`` traces the stage
    (running its first variant) and profiles both variants on its inputs; ``inferline plan
    --variants`` picks the cheap variant where the accurate one needs more replicas;
    ``inferline deploy --dry-run`` lists what would run."""
    import subprocess
    import sys

    from inferline.cli import main
    from inferline.core import gamma_trace, load_pipeline, load_plan, load_profiles, save_trace

    d, v = tmp_path / "d.json", tmp_path / "v.json"
    d.write_text(json.dumps(_deployment().to_dict()))
    v.write_text(json.dumps(VARIANTS.to_dict()))
    prof, pipe = tmp_path / "prof.json", tmp_path / "pipe.json"
    cmd = [sys.executable, "-m", "inferline", "profile", "--deployment", str(d), "-o", str(prof)]
    cmd += ["--pipeline-out", str(pipe), "--variants", str(v), "--max-batch", "2", "--quick"]
    cmd += ["--no-contention", "--samples", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert load_pipeline(pipe).models == ("m",)
    profiles = load_profiles(prof)
    slow, fast = (profiles.latency(m, "cpu", 1) for m in ("m-slow", "m-fast"))
    assert SLOW_S <= slow < SLOW_S + 0.03 and FAST_S <= fast < FAST_S + 0.03, (slow, fast)
    trace = tmp_path / "t.txt"
    save_trace(gamma_trace(60.0, 1.0, 60.0, np.random.default_rng(0)), trace)
    plan_file = tmp_path / "plan.json"
    args = ["plan", "--pipeline", str(pipe), "--profiles", str(prof), "--trace", str(trace)]
    args += ["--slo-s", "0.5", "--variants", str(v), "-o", str(plan_file), "--workers", "1"]
    assert main(args) == 0
    plan = load_plan(plan_file)
    assert plan.variants.choice == {"m": "m-fast"}, capsys.readouterr().out
    capsys.readouterr()
    assert main(["deploy", str(plan_file), "--deployment", str(d), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "m-fast: 1 x cpu" in out and "m-slow: 0 x cpu" in out, out


def test_apply_plan_after_the_tuner_switched_drains_the_variant_that_serves():
    """The service left the old plan (a live tuner switched the stage to the cheap variant);
    re-applying the plan moves the stage back only after the accurate variant serves and
    lets the cheap one drain, though by the old plan it had no replicas to give up."""
    dep = _deployment()
    plan = _plan("m-slow")

    async def main():
        svc = await start_service(dep, plan)
        try:
            # what the tuner's switch leaves behind
            await svc.backend.scale("m-fast", 1)
            svc.dispatcher.route("m", "m-fast")
            await svc.backend.scale("m-slow", 0)
            pending = [
                asyncio.create_task(svc.predict("app", np.asarray([float(i)], np.float32)))
                for i in range(40)  # about 0.5 s of work queued at the cheap variant
            ]
            await asyncio.sleep(0.02)
            done = await apply_plan(svc, plan)
            outs = await asyncio.wait_for(asyncio.gather(*pending), 20.0)
            return done, outs, svc.dispatcher.resolve("m"), _counts(svc)
        finally:
            await svc.close()

    done, outs, route, counts = asyncio.run(main())
    assert len(outs) == 40 and all(isinstance(p.output, dict) for p in outs)
    assert route == "m-slow" and counts == {"m-slow": 1, "m-fast": 0}, (route, counts, done)
