"""The tuner policy (InferLine §5): scale-up rule, scale-down rule, reasons, state round trips."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from _tuner_ticks import run_ticks

from inferline.core import (
    ModelConfig,
    Plan,
    Tuner,
    TunerConfig,
    TunerDecision,
    TunerInputs,
    TunerModel,
    TunerPolicy,
    TunerState,
    ValidationError,
    envelope_windows,
    gamma_trace,
    trace_envelope,
)

# Two models: ``a`` sees every query, ``b`` half of them. Planned for 100 q/s:
# a: 4 replicas of 50 q/s -> rho = 100 / 200 = 0.5; b: 2 replicas of 40 q/s -> rho = 50 / 80.
ENV = ((0.1, 30), (1.0, 120), (5.0, 540))
INPUTS = TunerInputs(
    service_time_s=0.1,
    envelope=ENV,
    mean_rate_qps=100.0,
    models={
        "a": TunerModel(1.0, 50.0, 0.5),
        "b": TunerModel(0.5, 40.0, 0.625),
    },
)
PLANNED = {"a": 4, "b": 2}


def policy(**kw):
    return TunerPolicy(INPUTS, PLANNED, TunerConfig(**kw))


def test_need_reproduces_the_plan_at_the_planned_rate():
    p = policy()
    assert p.need(100.0) == PLANNED  # exact ratios: no float-noise extra replica
    assert p.need(250.0) == {"a": 10, "b": 5}
    # the down rule uses the smallest rho (0.5) for every model: more replicas for b
    assert p.need(100.0, rho=0.5) == {"a": 4, "b": 3}


def test_windows_add_the_scale_down_window_once():
    assert policy().windows == (0.1, 1.0, 5.0)  # 5 s is already an envelope window
    assert policy(down_window_s=2.0).windows == (0.1, 1.0, 5.0, 2.0)


def test_no_decision_while_traffic_stays_inside_the_planned_envelope():
    p = policy()
    s = p.initial_state(0.0)
    for k in range(1, 400):  # 40 s of ticks, counts at the planned maxima
        s, d = p.step(s, k * 0.1, (30, 120, 540))
        assert d is None
    assert s.replicas == PLANNED
    # equal counts dominate older ones: the sliding-max skyline stays one entry long
    assert s.down_peaks == ((399 * 0.1, 540.0),) and s.up_peaks == ((399 * 0.1, 0.0),)


def test_sliding_maxima_match_a_brute_force_scan():
    rng = np.random.default_rng(5)
    p = policy(down_horizon_s=3.0, keep_horizon_s=1.5, stabilization_delay_s=1e9)
    s = p.initial_state(0.0)
    seen = []
    for k in range(1, 600):
        t = k * 0.1
        c5 = int(rng.integers(0, 600))
        s, _ = p.step(s, t, (0, 0, c5))
        seen.append((t, c5))
        expect = max(c for u, c in seen if u > t - 3.0)
        assert s.down_peaks[0][1] == expect
        assert all(a[1] > b[1] for a, b in itertools.pairwise(s.down_peaks))
        assert len(s.down_peaks) <= 31


def test_scale_up_uses_the_largest_exceeding_rate_and_says_why():
    p = policy(up_rate="window")  # the paper's rule: the window's own rate
    s = p.initial_state(0.0)
    # 1 s window: 150 > 120 (150 q/s); 0.1 s window: 31 > 30 (310 q/s) -> the larger rate wins
    s, d = p.step(s, 2.0, (31, 150, 500))
    assert isinstance(d, TunerDecision)
    assert d.action == "up" and d.window_s == 0.1 and d.rate_qps == pytest.approx(310.0)
    assert d.replicas == {"a": math.ceil(310 / 25), "b": math.ceil(155 / 25)}  # 13, 7
    assert "0.1 s window" in d.reason and "310.0 q/s" in d.reason and "a 4->13" in d.reason
    assert s.replicas == d.replicas and s.last_change_s == 2.0
    # a smaller excess later never lowers counts and produces no decision
    s2, d2 = p.step(s, 2.1, (0, 125, 0))
    assert d2 is None and s2.replicas == s.replicas and s2.last_change_s == 2.0
    # a larger one raises them again
    _s3, d3 = p.step(s2, 2.2, (40, 0, 0))
    assert d3 is not None and d3.replicas == {"a": 16, "b": 8}


def test_scaled_rule_provisions_for_the_plan_scaled_by_the_excess():
    p = policy(up_rate="scaled")
    # excess ratios: 0.1 s 31/30, 1 s 150/120 = 1.25 -> 1.25 x the planned 100 q/s
    _s, d = p.step(p.initial_state(0.0), 2.0, (31, 150, 500))
    assert d is not None and d.window_s == 1.0 and d.rate_qps == pytest.approx(125.0)
    assert d.replicas == {"a": 5, "b": 3}
    assert "150 arrivals in a 1 s window (150.0 q/s)" in d.reason
    assert "provisioning for 125.0 q/s" in d.reason


def test_curve_rule_fits_a_service_rate_within_the_planned_delay():
    p = policy(up_rate="curve")
    # a: capacity 4 x 50 = 200 q/s, b: 2 x 40 / 0.5 = 160 q/s; the planned envelope never
    # deviates from either rate by more than the shortest window, so D = 0.1 s for both.
    # Doubled counts need max(60 / 0.2, 240 / 1.1, 1080 / 5.1) = 300 q/s of service:
    # a 4 x 300/200 = 6, b 2 x 300/160 = 3.75 -> 4.
    _s, d = p.step(p.initial_state(0.0), 1.0, (60, 240, 1080))
    assert d is not None and d.replicas == {"a": 6, "b": 4} and d.window_s == 0.1
    # at the planned envelope the fitted rate is within the plan's capacity: no change
    _s, d = p.step(p.initial_state(0.0), 1.0, (31, 120, 540))
    assert d is None


def test_scale_down_waits_for_the_stabilization_delay_then_uses_rho_min():
    p = policy(up_rate="window", down_rate="window")  # the literal rule (down_cap="none")
    s = p.initial_state(0.0)
    s, d = p.step(s, 1.0, (60, 0, 0))  # 600 q/s burst -> a 24, b 12
    assert d is not None and d.replicas == {"a": 24, "b": 12}
    # calm: 5 s windows of 450 (90 q/s), below the plan everywhere
    s, downs = run_ticks(p, s, 1.0, 60.0, (10, 90, 450))
    first = downs[0]
    # eligible 15 s after the change, but the burst's rate is still among the last 30 s of
    # exceeding rates until 31 s: the counts it needs are kept until then
    assert first.action == "down" and first.time_s == pytest.approx(31.0)
    # rate = 450 / 5 = 90 q/s with rho_min 0.5: a 4 (plan 4), b ceil(45/20)=3 (> plan 2)
    assert first.replicas == {"a": 4, "b": 3}
    assert "rho_min=0.500" in first.reason and "90.0 q/s" in first.reason
    assert first.window_s == 5.0 and first.rate_qps == pytest.approx(90.0)
    assert len(downs) == 1  # b stays at 3: the conservative rho keeps it above its plan


def test_scale_down_returns_to_the_plan_within_the_planned_envelope():
    # Same story with the cap: 450 arrivals in 5 s is within the planned 540, so the
    # plan (proven for its envelope) is what the rate needs; rho_min alone would keep b at 3.
    p = policy(up_rate="window", down_cap="plan")
    s = p.initial_state(0.0)
    s, _ = p.step(s, 1.0, (60, 0, 0))
    s, downs = run_ticks(p, s, 1.0, 60.0, (10, 90, 450))
    assert [d.replicas for d in downs] == [{"a": 4, "b": 2}]
    assert downs[0].time_s == pytest.approx(31.0)
    assert "within the planned envelope" in downs[0].reason
    # above the planned 5 s count (560 > 540, 112 q/s) the literal rule applies: rho_min 0.5
    # gives a ceil(112 / 25) = 5, b ceil(56 / 20) = 3
    s = replace(p.initial_state(0.0), replicas={"a": 8, "b": 4})
    s, d = p.step(s, 20.0, (10, 90, 560))
    assert d is not None and d.replicas == {"a": 5, "b": 3}
    assert "within the planned envelope" not in d.reason


def test_scale_down_keeps_what_recent_exceeding_rates_need():
    p = policy(up_rate="window")
    s = p.initial_state(0.0)
    s, _ = p.step(s, 1.0, (60, 0, 0))  # up for 600 q/s
    decisions = []
    for k in range(1, 400):
        # still exceeding at 1 s (130 q/s) but never more than the last decision asked for
        s, d = p.step(s, 1.0 + k * 0.1, (0, 130, 450))
        if d is not None:
            decisions.append(d)
    (d,) = decisions
    assert d.action == "down" and d.time_s == pytest.approx(31.0)
    # 130 q/s needs a ceil(130/25)=6, b ceil(65/25)=3; the 5 s rate needs less
    assert d.replicas == {"a": 6, "b": 3}


def test_scale_down_never_goes_below_the_plan_unless_asked():
    for floor, expect in (("plan", {"a": 4, "b": 2}), ("one", {"a": 1, "b": 1})):
        p = policy(floor=floor, up_rate="window")
        s = p.initial_state(0.0)
        s, _ = p.step(s, 0.1, (50, 0, 0))
        for k in range(2, 500):
            s, _ = p.step(s, k * 0.1, (0, 0, 5))  # 1 q/s
        assert s.replicas == expect


def test_after_a_down_step_the_delay_starts_again():
    p = policy(stabilization_delay_s=5.0, down_horizon_s=2.0, keep_horizon_s=2.0, up_rate="window")
    s = p.initial_state(0.0)
    s, _ = p.step(s, 0.0, (100, 0, 0))  # 1000 q/s: a 40, b 25
    s, _ = p.step(s, 0.5, (0, 300, 0))  # exceeding 300 q/s, recorded in the history
    times = []
    for k in range(1, 200):
        s, d = p.step(s, 0.5 + k * 0.1, (0, 0, 1000 if k < 30 else 300))
        if d is not None:
            times.append(round(d.time_s, 6))
    assert times[0] == 5.0
    assert all(b - a >= 5.0 - 1e-9 for a, b in itertools.pairwise(times))


def test_step_validates_its_inputs():
    p = policy()
    with pytest.raises(ValidationError):
        p.step(p.initial_state(), 1.0, (1, 2))
    with pytest.raises(ValidationError):
        TunerPolicy(INPUTS, {"a": 1, "zzz": 1})
    with pytest.raises(ValidationError):
        TunerConfig(floor="zero")
    plan = Plan("p", 0.5, {"a": ModelConfig("cpu", 1, 4)})
    with pytest.raises(ValidationError):
        TunerPolicy.from_plan(plan)


def test_round_trips():
    c = TunerConfig(stabilization_delay_s=3.0, resolution_s=None, floor="one", up_rate="scaled")
    assert TunerConfig.from_dict(c.to_dict()) == c
    assert TunerConfig.from_dict(TunerConfig().to_dict()) == TunerConfig()
    d = TunerDecision(1.5, {"a": 3}, "why", 0.1, 310.0, "up")
    assert TunerDecision.from_dict(d.to_dict()) == d
    p = policy(up_rate="window")
    s, _ = p.step(p.initial_state(0.0), 1.0, (60, 0, 0))
    assert TunerState.from_dict(s.to_dict()) == s


def test_choice_fields_take_exactly_their_types_values():
    """down_rate's type allowed 'curve' (an up_rate only), which the config refuses; flags are
    derived from these types (inferline.cli._tuner_args.add_config_flag)."""
    from typing import Literal, get_args, get_origin, get_type_hints

    hints = get_type_hints(TunerConfig)
    choices = {k: get_args(t) for k, t in hints.items() if get_origin(t) is Literal}
    assert choices["down_rate"] == ("window", "scaled")
    for name, values in choices.items():
        for v in values:
            c = TunerConfig(**{name: v})
            assert TunerConfig.from_dict({name: v}) == c
        with pytest.raises(ValidationError, match=name):
            TunerConfig.from_dict({name: "curve" if name == "down_rate" else "bogus"})


def _plan_for(trace: np.ndarray) -> Plan:
    windows = envelope_windows(0.1)
    env = trace_envelope(trace, windows)
    inputs = TunerInputs(0.1, env.points, 100.0, INPUTS.models)
    return Plan(
        "p",
        0.5,
        {"a": ModelConfig("cpu", 1, 4), "b": ModelConfig("cpu", 1, 2)},
        tuner=inputs,
    )


def test_tuner_on_streams_detects_rate_and_burstiness_changes():
    rng = np.random.default_rng(7)
    plan = _plan_for(gamma_trace(100.0, 1.0, 300.0, rng))
    cfg = TunerConfig(interval_s=0.1, up_rate="window")

    def run(live: np.ndarray) -> Tuner:
        tuner = Tuner.from_plan(plan, cfg)
        t = 0.0
        i = 0
        while t < live[-1]:
            t = round(t + cfg.interval_s, 10)
            j = int(np.searchsorted(live, t, side="left"))
            tuner.record(live[i:j])
            i = j
            tuner.tick(t)
        return tuner

    # same process: at most a marginal false alarm (a long window a hair above the sample's
    # maximum asks for one more replica; a short-window one would ask for far more)
    same = run(gamma_trace(100.0, 1.0, 60.0, rng))
    assert len(same.decisions) <= 1
    assert same.replicas["a"] <= 5 and same.replicas["b"] <= 3

    # rate doubles at 20 s: detected within a few seconds, then back to plan after it ends
    live = np.concatenate(
        [
            gamma_trace(100.0, 1.0, 20.0, rng),
            gamma_trace(200.0, 1.0, 20.0, rng, start_s=20.0),
            gamma_trace(100.0, 1.0, 60.0, rng, start_s=40.0),
        ]
    )
    t = run(live)
    ups = [d for d in t.decisions if d.action == "up"]
    assert ups and 20.0 < ups[0].time_s < 23.0
    assert max(d.replicas["a"] for d in ups) >= 8  # at least the doubled rate's share
    downs = [d for d in t.decisions if d.action == "down"]
    assert downs and downs[0].time_s >= ups[-1].time_s + 15.0
    assert all(b.time_s - a.time_s >= 15.0 for a, b in itertools.pairwise(downs))
    # 60 s after the surge the counts are back near the plan (the conservative rho keeps more)
    assert 4 <= t.replicas["a"] <= 6 and 2 <= t.replicas["b"] <= 3

    # same mean rate, CV 1 -> 4: short windows exceed, long ones do not
    bursty = run(gamma_trace(100.0, 4.0, 40.0, rng))
    assert bursty.decisions and bursty.decisions[0].window_s < 5.0
