"""The drift loop's decision rule (pure) and its config's JSON round trip."""

from __future__ import annotations

import json
import math

import pytest

from inferline.core import ValidationError
from inferline.deploy import (
    DriftConfig,
    DriftObservation,
    DriftPolicy,
    DriftState,
)


def _obs(est_ms: float, meas_ms: float, n: int = 100, app: str = "a") -> DriftObservation:
    return DriftObservation(app, est_ms / 1e3, meas_ms / 1e3, n)


def _run(policy: DriftPolicy, ticks: list[list[DriftObservation]], dt: float = 1.0):
    state = DriftState()
    out = []
    for i, obs in enumerate(ticks):
        d, state = policy.decide(state, obs, i * dt)
        out.append(d)
    return out, state


def test_config_round_trips_through_json():
    c = DriftConfig(
        mode="replan",
        window_s=5.0,
        tick_s=1.0,
        threshold=0.3,
        sustain=2,
        cooldown_s=12.0,
        min_queries=20,
        min_batches=10,
        plan_trace_s=15.0,
        hop_overhead_s=0.001,
        service_spread=True,
    )
    assert DriftConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert DriftConfig.from_dict({}) == DriftConfig()


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "loud"},
        {"window_s": 0},
        {"threshold": -1},
        {"sustain": 0},
        {"sustain": 1.5},
        {"cooldown_s": math.inf},
        {"service_spread": "yes"},
        {"colour": 1},
    ],
)
def test_config_rejects_bad_values_naming_the_field(bad):
    with pytest.raises(ValidationError):
        DriftConfig.from_dict(bad)


def test_acts_only_after_sustain_consecutive_ticks_apart():
    p = DriftPolicy(DriftConfig(mode="replan", sustain=3, threshold=0.2, cooldown_s=0))
    apart, close = [_obs(10, 20)], [_obs(19, 20)]
    ds, _ = _run(p, [apart, apart, close, apart, apart, apart])
    assert [d.action for d in ds] == ["none"] * 5 + ["recalibrate"]
    assert ds[-1].apps == ("a",)
    assert "measured 20.0 ms" in ds[-1].reason


def test_alert_mode_alerts_and_off_mode_never_acts():
    ticks = [[_obs(10, 30)]] * 3
    ds, _ = _run(DriftPolicy(DriftConfig(mode="alert", sustain=3)), ticks)
    assert [d.action for d in ds] == ["none", "none", "alert"]
    ds, state = _run(DriftPolicy(DriftConfig(mode="off", sustain=3)), ticks)
    assert [d.action for d in ds] == ["none"] * 3
    assert state.count("a") == 3


def test_cooldown_holds_the_next_action_and_counts_restart_after_acting():
    p = DriftPolicy(DriftConfig(mode="replan", sustain=2, cooldown_s=5.0))
    ds, _ = _run(p, [[_obs(10, 30)]] * 10, dt=1.0)
    acted = [d.time_s for d in ds if d.action == "recalibrate"]
    assert acted == [1.0, 6.0]  # sustained at t=1; then again 2 ticks later, once cooled down
    assert all(d.reason.startswith("cooling down") for d in ds if d.time_s in (3.0, 4.0, 5.0))


def test_an_action_that_changed_nothing_lifts_the_cooldown():
    """A calibration that kept the plan changed nothing a cooldown would wait to see: the
    next gap (a model slowing down right after) is acted on within ``sustain`` ticks. Fails
    if ``settled`` keeps the cooldown (the drift test's slowdown was then re-planned 5 s
    late), or lifts it after a change or after a later action than the one settled."""
    p = DriftPolicy(DriftConfig(mode="replan", sustain=2, cooldown_s=5.0))
    state = DriftState()
    d, state = p.decide(state, [_obs(40, 28)], 0.0)
    d, state = p.decide(state, [_obs(40, 28)], 1.0)  # the estimate ran high: calibrate
    assert d.action == "recalibrate"
    kept = p.settled(state, 1.0, changed=False)
    assert kept.last_action_s == -math.inf and kept.apart == state.apart
    slow = [_obs(30, 300)]
    d, after = p.decide(kept, slow, 2.0)
    d, after = p.decide(after, slow, 3.0)
    assert d.action == "recalibrate"  # not "cooling down" until t=6
    # a change (re-plan applied) keeps the cooldown; so does settling an older action
    assert p.settled(state, 1.0, changed=True) == state
    assert p.settled(state, 0.5, changed=False) == state
    d, held = p.decide(state, slow, 2.0)
    d, held = p.decide(held, slow, 3.0)
    assert d.action == "none" and d.reason.startswith("cooling down")


def test_thin_windows_and_unbounded_estimates():
    p = DriftPolicy(DriftConfig(mode="replan", sustain=2, min_queries=50, cooldown_s=0))
    ds, state = _run(p, [[_obs(10, 30, n=10)]] * 4)
    assert all(d.action == "none" for d in ds) and state.count("a") == 0
    inf = DriftObservation("a", math.inf, 0.02, 100)
    assert inf.gap == math.inf
    ds, _ = _run(p, [[inf], [inf]])
    assert ds[-1].action == "recalibrate"


def test_apps_are_counted_apart_and_the_decision_round_trips():
    p = DriftPolicy(DriftConfig(mode="alert", sustain=2, cooldown_s=0))
    ticks = [[_obs(10, 30, app="a"), _obs(20, 20, app="b")]] * 2
    ds, state = _run(p, ticks)
    assert ds[-1].apps == ("a",) and state.count("b") == 0 and state.count("a") == 0
    d = ds[-1].to_dict()
    assert json.loads(json.dumps(d)) == d and d["action"] == "alert"
    assert _obs(10, 20).to_dict()["gap"] == pytest.approx(0.5)


def test_decide_does_not_touch_its_inputs():
    p = DriftPolicy(DriftConfig(mode="replan", sustain=1, cooldown_s=0))
    s0 = DriftState((("a", 0),))
    obs = [_obs(10, 30)]
    d, s1 = p.decide(s0, obs, 3.0)
    assert s0 == DriftState((("a", 0),)) and obs == [_obs(10, 30)]
    assert d.action == "recalibrate" and s1.last_action_s == 3.0


# -- the live runner on a fake clock (no servers) -------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _service(clock: _Clock, took_s: float):
    from inferline.core import ModelConfig, Plan
    from inferline.server import App, Service

    async def handler(x, slo):
        clock.t += took_s  # every query takes took_s of the fake clock
        return x

    plan = Plan("p", 0.1, {"m": ModelConfig("cpu", 1, 1)})
    return Service([App("app", handler, 0.1)], plan=plan, clock=clock)


def _monitor(clock: _Clock, **kw):
    from inferline.core import Pipeline, Profiles
    from inferline.deploy import DriftMonitor

    cfg = DriftConfig(mode="replan", window_s=5.0, tick_s=1.0, sustain=2, min_queries=10, **kw)
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.005}}})
    return DriftMonitor(cfg, prof, Pipeline.linear("p", ["m"]), clock=clock)


def test_the_runner_measures_estimates_exports_and_acts_on_a_gap():
    import asyncio

    from inferline.deploy import drift_monitor
    from inferline.deploy._drift import DriftRoutes

    clock = _Clock()
    svc = _service(clock, took_s=0.05)
    mon = _monitor(clock)

    async def run():
        mon.attach(svc)
        assert drift_monitor(svc) is mon
        decisions = []
        for _ in range(2):
            for _ in range(40):  # 40 q/s on the fake clock, each answered in 50 ms
                await svc.predict("app", [1.0])
            decisions.append(await mon.tick())
            clock.t += 1.0
        if mon._acting is not None:
            await mon._acting
        body = await DriftRoutes(svc).get()
        await svc.close()
        return decisions, json.loads(body.body)

    decisions, snap = asyncio.run(run())
    o = mon.last["app"]
    assert o.measured_p99_s == pytest.approx(0.05)
    assert o.estimated_p99_s == pytest.approx(0.005, rel=0.01)  # batch of 1, 5 ms, no queueing
    assert [d.action for d in decisions] == ["none", "recalibrate"]
    kinds = [e["kind"] for e in snap["events"]]
    # no dispatcher, no batches: the loop says so instead of calibrating on nothing
    assert kinds == ["drift", "error"] and "nothing to calibrate" in snap["events"][1]["detail"]
    assert snap["apps"]["app"]["queries"] == 80 and snap["enabled"] is True
    text = _scrape(svc)
    assert _gauge(text, "inferline_estimated_p99_seconds") == pytest.approx(0.005, rel=0.01)
    assert _gauge(text, "inferline_measured_p99_seconds") == pytest.approx(0.05)


def test_start_service_leaves_the_loop_off_without_profiles(caplog):
    import logging

    from inferline.deploy import Loops
    from inferline.deploy._build import _drift_monitor

    with caplog.at_level(logging.INFO):
        assert _drift_monitor(Loops(drift=DriftConfig()), None, _Clock()) is None
    assert "drift loop off: it needs a plan, profiles, a pipeline" in caplog.text
    assert _drift_monitor(Loops(drift=DriftConfig(mode="off")), None, _Clock()) is None


def test_the_drift_loop_replans_with_the_deployments_admission_rule():
    from inferline.core import ModelConfig, Pipeline, Plan, Profiles
    from inferline.demo.simple import sleep_deployment
    from inferline.deploy import Deployment, Loops
    from inferline.deploy._build import _drift_monitor

    d = sleep_deployment(slo_ms=100.0)
    d["queue"] = {**d["queue"], "admission": "predicted", "admission_buffer_ms": 3}
    d["apps"]["app"]["max_refused"] = 0.001
    dep = Deployment.from_dict(d)
    loops = Loops(
        drift=DriftConfig(),
        profiles=Profiles.from_latencies({"m": {"cpu": {1: 0.01}}}),
        pipeline=Pipeline.linear("sleep", ["m"]),
    )
    plan = Plan("sleep", 0.1, {"m": ModelConfig("cpu", 1, 1)})
    mon = _drift_monitor(loops, plan, _Clock(), dep)
    assert mon is not None and mon.planner.admission and mon.planner.max_refused == 0.001
    assert mon.planner.admission_buffer_s == pytest.approx(0.003)
    d["queue"]["admission"] = "off"
    off = _drift_monitor(loops, plan, _Clock(), Deployment.from_dict(d))
    assert off is not None and not off.planner.admission


def _scrape(svc) -> str:
    from prometheus_client import generate_latest

    return generate_latest(svc.metrics.registry).decode()


def _gauge(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + '{app="app"}'))
    return float(line.split()[-1])


def test_an_estimate_over_the_slo_counts_as_apart_when_the_gap_has_closed():
    """After calibration the two P99s agree, but the plan misses its SLO (its re-plan did
    not apply, say): the policy acts again."""
    p = DriftPolicy(DriftConfig(mode="replan", sustain=2, cooldown_s=0))
    over = DriftObservation("a", 1.10, 1.00, 100, slo_s=0.1)
    assert over.gap < 0.25 and over.over_slo
    ds, _ = _run(p, [[over], [over]])
    assert ds[-1].action == "recalibrate" and "over the SLO 100 ms" in ds[-1].reason
    fits = DriftObservation("a", 0.09, 0.09, 100, slo_s=0.1)
    ds, _ = _run(p, [[fits], [fits]])
    assert [d.action for d in ds] == ["none", "none"]
