"""The tuner's ladder: re-plans on the planned hardware, their format, and the tuner using them
(batch sizes change with replicas, in the estimator's loop and as pure decisions)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from _tuner_ticks import run_ticks

from inferline.core import (
    EstimatorOptions,
    InferLineController,
    LadderStep,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    TunerConfig,
    TunerDecision,
    TunerInputs,
    TunerModel,
    TunerPolicy,
    TunerState,
    ValidationError,
    capacity_factor,
    compress,
    gamma_trace,
    pin_hardware,
    plan_inferline,
    plan_ladder,
    simulate,
    simulate_plan,
    varying_trace,
    with_ladder,
)


def _setup():
    """Two stages: a CPU model that does not batch, a GPU model that batches well (its
    throughput grows with the batch size, so a re-plan for a higher rate picks larger ones)."""
    pipe = Pipeline.linear("two", ["pre", "net"])
    prof = Profiles.from_latencies(
        {
            "pre": {"cpu": {b: 0.004 * b for b in (1, 2, 4)}},
            "net": {
                "gpu-k80": {b: 0.02 + 0.004 * b for b in (1, 2, 4, 8, 16, 32)},
                "gpu-v100": {b: 0.008 + 0.0015 * b for b in (1, 2, 4, 8, 16, 32)},
            },
        }
    )
    trace = gamma_trace(100.0, 1.0, 60.0, np.random.default_rng(3))
    return pipe, prof, trace


@pytest.fixture(scope="module")
def planned():
    pipe, prof, trace = _setup()
    paper = PlannerOptions(rate_margin=0.0)  # proven on the sample itself (no margin)
    plan = plan_inferline(pipe, prof, trace, 0.15, options=paper)
    return pipe, prof, trace, with_ladder(pipe, prof, trace, plan, options=paper)


def test_steps_are_re_plans_on_the_planned_hardware_proven_for_their_rate(planned):
    pipe, prof, trace, plan = planned
    steps = plan.tuner.ladder
    assert len(steps) >= 3
    rates = [s.rate_qps for s in steps]
    assert rates == sorted(rates) and rates[0] > plan.tuner.mean_rate_qps
    costs = [s.cost_per_hour for s in steps]
    assert costs == sorted(costs)  # a dearer step below a cheaper one is dropped
    for s in steps:
        assert {m: c.hardware for m, c in s.models.items()} == {
            m: c.hardware for m, c in plan.models.items()
        }
        # proven: the estimator meets the SLO on the sample compressed to the step's rate
        f = s.rate_qps / plan.tuner.mean_rate_qps
        compressed = trace[0] + (trace - trace[0]) / f
        r = simulate(pipe, s.models, prof, compressed)
        assert r.percentile(99) <= plan.slo_s
    # more rate than the plan's configuration can serve: more capacity in the top step
    top = steps[-1].models
    assert sum(c.replicas for c in top.values()) > sum(c.replicas for c in plan.models.values())


def test_a_rate_margin_is_kept_on_every_step():
    """With the planner's ``rate_margin``, a step's rate is what its configuration serves
    with that margin on top: proven on the sample sped up to rate x (1 + margin)."""
    pipe, prof, trace = _setup()
    opts = PlannerOptions(rate_margin=0.2)
    plan = plan_inferline(pipe, prof, trace, 0.15, options=opts)
    steps = plan_ladder(pipe, prof, trace, plan, factors=(1.25, 1.5, 2.0), options=opts)
    assert steps
    for s in steps:
        f = s.rate_qps / plan.tuner.mean_rate_qps * 1.2
        r = simulate(pipe, s.models, prof, compress(trace, f))
        assert r.percentile(99) <= plan.slo_s
    # without the margin the same plan is proven for a higher rate
    plain = plan_ladder(
        pipe, prof, trace, plan, factors=(1.25,), options=PlannerOptions(rate_margin=0.0)
    )
    assert plain[0].rate_qps > steps[0].rate_qps


def test_capacity_is_the_highest_proven_rate_factor(planned):
    pipe, prof, trace, plan = planned
    paper = PlannerOptions(rate_margin=0.0)  # the factor itself, no margin on top
    f = capacity_factor(
        pipe, plan.models, prof, trace, plan, lo=1.0, hi=4.0, iterations=8, options=paper
    )
    assert 1.0 <= f < 4.0

    def p99(factor):
        compressed = trace[0] + (trace - trace[0]) / factor
        return simulate(pipe, plan.models, prof, compressed).percentile(99)

    assert p99(f) <= plan.slo_s
    step = 3.0 / 2**8  # the bisection's resolution on [1, 4]
    assert p99(f + 2 * step) > plan.slo_s  # infeasible just above
    # each step's rate is its configuration's capacity: feasible there (checked above for all)
    # and the first step is never the plan at its planning rate
    assert plan.tuner.ladder[0].rate_qps > plan.tuner.mean_rate_qps


def test_ladder_round_trips_in_the_plan_file_and_is_checked(planned):
    _, _, _, plan = planned
    assert Plan.from_dict(plan.to_dict()) == plan
    d = plan.to_dict()
    d["tuner"]["ladder"][0]["models"]["net"]["hardware"] = "gpu-v100"
    with pytest.raises(ValidationError) as e:
        Plan.from_dict(d)
    assert "tuner.ladder[0].models.net.hardware" in str(e.value)
    d = plan.to_dict()
    del d["tuner"]["ladder"][0]["models"]["pre"]
    with pytest.raises(ValidationError) as e:
        Plan.from_dict(d)
    assert "tuner.ladder[0].models" in str(e.value)
    # plans written before the ladder existed still load (no "ladder" key)
    d = plan.to_dict()
    del d["tuner"]["ladder"]
    assert Plan.from_dict(d).tuner.ladder == ()


def test_pin_hardware_and_bad_inputs(planned):
    pipe, prof, trace, plan = planned
    pinned = pin_hardware(prof, plan)
    assert pinned.hardware_for("net") == [plan.models["net"].hardware]
    with pytest.raises(ValidationError):
        plan_ladder(pipe, prof, trace, plan, factors=(0.5, 2.0))
    with pytest.raises(ValidationError):
        plan_ladder(pipe, prof, trace, replace(plan, tuner=None))
    seen = []
    plan_ladder(
        pipe,
        prof,
        trace,
        plan,
        factors=(1.5, 1000.0),
        options=PlannerOptions(max_replicas=20),
        progress=lambda f, s: seen.append((f, s)),
    )
    assert seen[0][0] == 1.5 and seen[0][1] is not None
    assert seen[-1] == (1000.0, None)  # infeasible within 20 replicas: the ladder stops


def test_factors_planned_in_threads_give_the_ladder_planned_one_by_one(planned):
    pipe, prof, trace, plan = planned
    factors = (1.3, 2.0, 3.0, 1000.0, 1001.0, 1002.0)
    runs = {}
    for workers in (1, 3):
        seen = []
        steps = plan_ladder(
            pipe,
            prof,
            trace,
            plan,
            factors=factors,
            options=PlannerOptions(max_replicas=20),
            progress=lambda f, s, seen=seen: seen.append((f, s is None)),
            workers=workers,
        )
        runs[workers] = (steps, seen)
    assert runs[1] == runs[3]
    # reported in factor order, and the ladder stops at the first infeasible factor
    assert runs[3][1] == [(1.3, False), (2.0, False), (3.0, False), (1000.0, True)]
    rates = [s.rate_qps for s in runs[3][0]]
    assert len(rates) >= 2 and rates == sorted(rates)


# -- the policy with a ladder (pure) -----------------------------------------------------------
ENV = ((0.1, 30), (1.0, 120), (5.0, 540))
INPUTS = TunerInputs(
    service_time_s=0.1,
    envelope=ENV,
    mean_rate_qps=100.0,
    models={"a": TunerModel(1.0, 50.0, 0.5), "b": TunerModel(1.0, 40.0, 0.625)},
    ladder=(
        LadderStep(150.0, {"a": ModelConfig("cpu", 4, 5), "b": ModelConfig("cpu", 8, 3)}, 8.0),
        LadderStep(200.0, {"a": ModelConfig("cpu", 8, 5), "b": ModelConfig("cpu", 2, 6)}, 11.0),
    ),
)
PLANNED = {"a": 4, "b": 4}
BATCH = {"a": 2, "b": 2}


def policy(**kw):
    kw.setdefault("headroom", 0.0)
    return TunerPolicy(INPUTS, PLANNED, TunerConfig(lookahead_s=0.0, **kw), BATCH)


def test_target_is_the_first_step_with_enough_rate_then_scales_the_top_one():
    p = policy()
    assert p.uses_ladder
    assert p.target(100.0) == (PLANNED, BATCH, 0)
    assert p.target(120.0) == ({"a": 5, "b": 3}, {"a": 4, "b": 8}, 1)
    assert p.target(200.0)[2] == 2
    k, b, i = p.target(300.0)  # beyond the top: its counts x 1.5
    assert (k, b, i) == ({"a": 8, "b": 9}, {"a": 8, "b": 2}, 2)
    assert policy(floor="one").target(50.0)[0] == {"a": 2, "b": 2}
    # no ladder (or replicas asked for): the paper's replica rule
    assert not TunerPolicy(INPUTS, PLANNED, TunerConfig(reconfigure="replicas"), BATCH).uses_ladder
    assert not TunerPolicy(INPUTS, PLANNED, TunerConfig()).uses_ladder


def test_scale_up_never_shrinks_a_batch_or_a_count_then_scale_down_settles_on_a_step():
    p = policy()
    s = p.initial_state(0.0)
    assert s.batch == BATCH
    # 1 s window at 180 q/s (planned 120): scaled rate 150 -> step 1
    s, d = p.step(s, 1.0, (0, 180, 0))
    assert d is not None and d.action == "up"
    assert d.replicas == {"a": 5, "b": 4}  # b keeps its 4 (step 1 has 3 at batch 8)
    assert d.batch == {"a": 4, "b": 8}
    assert "ladder step 1 (150.0 q/s)" in d.reason and "b 4x b2->4x b8" in d.reason
    # calm: back to the plan after the delay and once the burst left the keep horizon
    s, downs = run_ticks(p, s, 1.0, 80.0, (10, 90, 450))
    assert downs and downs[-1].replicas == PLANNED and downs[-1].batch == BATCH
    # the plan's replicas first (b short of them keeps its batch 8 until they serve), then,
    # the activation time later, the plan's batch sizes
    assert [d.action for d in downs[-2:]] == ["down", "settle"]
    assert "the plan" in downs[-2].reason and downs[-2].batch == {"a": 2, "b": 8}
    assert downs[-1].time_s == pytest.approx(downs[-2].time_s + 5.0)
    assert "b 4x b8->4x b2" in downs[-1].reason
    assert TunerState.from_dict(s.to_dict()) == s


def test_headroom_provisions_more_than_the_measured_rate():
    p = policy(headroom_basis="rate", headroom=0.2)
    s = p.initial_state(0.0)
    # 1 s window at 156 (planned 120): scaled rate 130; x 1.2 = 156 -> step 2 (200 q/s)
    s, d = p.step(s, 1.0, (0, 156, 0))
    assert d is not None and d.rate_qps == pytest.approx(130.0)
    assert "ladder step 2 (200.0 q/s)" in d.reason
    # without headroom the same window asks step 1 (150 q/s)
    s, d = policy().step(policy().initial_state(0.0), 1.0, (0, 156, 0))
    assert "ladder step 1 (150.0 q/s)" in d.reason


def test_headroom_of_the_planned_rate_is_the_same_room_at_every_level():
    """``headroom_basis="plan"`` (default): room of headroom x the plan's mean rate (100 q/s
    here), not x the rate, so a peak well above the plan is not asked to hold a share of
    itself on top (at a 250 q/s peak planned at 150, 1.2 x 250 crossed a GPU step)."""
    by_plan, by_rate = policy(headroom=0.2), policy(headroom=0.2, headroom_basis="rate")
    assert TunerConfig().headroom_basis == "plan"
    assert by_plan.room(128.0, 0.2) == pytest.approx(148.0)
    assert by_rate.room(128.0, 0.2) == pytest.approx(153.6)
    assert by_plan.room(100.0, 0.2) == by_rate.room(100.0, 0.2)
    # far above the plan (from 1 / headroom_rate_share = 1.67x on) a share of the rate again:
    # 0.2 x 0.6 x 250, not 0.2 x 100
    assert by_plan.room(250.0, 0.2) == pytest.approx(280.0)
    assert policy(headroom_rate_share=0.0).room(250.0, 0.2) == pytest.approx(270.0)
    assert by_rate.room(250.0, 0.2) == pytest.approx(300.0)
    with pytest.raises(ValidationError, match="headroom_rate_share"):
        TunerConfig(headroom_rate_share=-1.0)
    # 1 s window of 154 (planned 120): scaled 128.3 q/s; + 20 = 148.3 fits step 1 (150),
    # x 1.2 = 154 does not
    _, d = by_plan.step(by_plan.initial_state(0.0), 1.0, (0, 154, 0))
    assert d is not None and "ladder step 1 (150.0 q/s)" in d.reason
    _, d = by_rate.step(by_rate.initial_state(0.0), 1.0, (0, 154, 0))
    assert d is not None and "ladder step 2 (200.0 q/s)" in d.reason
    # what scale-down keeps follows the same room
    at_2 = TunerState({"a": 5, "b": 6}, 0.0, batch={"a": 8, "b": 2})
    _, ds = run_ticks(by_plan, at_2, 0.0, 20.0, (0, 154, 0))
    assert ds and ds[0].action == "down" and "ladder step 1" in ds[0].reason
    _, ds = run_ticks(by_rate, at_2, 0.0, 20.0, (0, 154, 0))
    assert all(d.action != "down" for d in ds)
    cfg = TunerConfig(headroom_basis="rate")
    assert TunerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValidationError, match="headroom_basis"):
        TunerConfig(headroom_basis="level")  # type: ignore[arg-type]


def test_hysteresis_keeps_a_step_until_its_headroom_falls_below_the_band():
    at_step_1 = TunerState({"a": 5, "b": 3}, 0.0, batch={"a": 4, "b": 8})
    # 1 s window of 154 (planned 120): scaled 128.3 q/s; x 1.2 = 154 is above step 1 (150)
    _, d = policy(headroom_basis="rate", headroom=0.2, hysteresis=0.0).step(
        at_step_1, 1.0, (0, 154, 0)
    )
    assert d is not None and "ladder step 2" in d.reason
    # with a band of 0.05 step 1 still has 1.15 x 128.3 = 147.6 q/s of room: it stays
    banded = policy(headroom_basis="rate", headroom=0.2, hysteresis=0.05)
    s, d = banded.step(at_step_1, 1.0, (0, 154, 0))
    assert d is None
    # 160 (133.3 q/s, x 1.15 = 153 > 150): it moves, and with the full headroom (160 q/s)
    _, d = banded.step(s, 1.1, (0, 160, 0))
    assert d is not None and d.action == "up" and "ladder step 2" in d.reason
    assert TunerConfig(hysteresis=0.05) == TunerConfig.from_dict(
        TunerConfig(hysteresis=0.05).to_dict()
    )
    with pytest.raises(ValidationError, match="hysteresis"):
        TunerConfig(hysteresis=-0.1)


def test_room_trigger_leaves_a_plan_without_room_inside_the_planned_envelope():
    # traffic at 90% of the planned envelope at every window: 90 q/s as the tuner reads it.
    # The plan is proven for 100 q/s: 11% room, less than the band (headroom 0.2 - 0.05)
    at_90 = (27, 108, 486)
    room = policy(headroom_basis="rate", headroom=0.2, hysteresis=0.05, trigger="room")
    s, ds = run_ticks(room, room.initial_state(0.0), 0.0, 3.0, at_90)
    assert len(ds) == 1 and ds[0].action == "up" and ds[0].time_s <= 0.2
    assert "less than 15% room for 90.0 q/s" in ds[0].reason
    assert "ladder step 1 (150.0 q/s)" in ds[0].reason and ds[0].replicas == {"a": 5, "b": 4}
    # then it settles on step 1 itself (b keeps the plan's 4 until the stabilization delay)
    # and stays there: step 1 has the room, so no scale-up or scale-down follows
    s, ds = run_ticks(room, s, 3.0, 60.0, at_90)
    assert [(d.action, d.replicas) for d in ds] == [("down", {"a": 5, "b": 3})]
    assert "ladder step 1" in ds[0].reason
    # the paper's trigger waits for a window above the planned envelope: no scale-up
    env = policy(headroom_basis="rate", headroom=0.2, hysteresis=0.05)  # the default trigger
    _, ds = run_ticks(env, env.initial_state(0.0), 0.0, 40.0, at_90)
    assert all(d.action == "down" for d in ds) and ds[0].time_s >= 15.0
    # at 80% (80 q/s x 1.15 = 92 q/s) the plan has the room: no change either way
    _, ds = run_ticks(room, room.initial_state(0.0), 0.0, 40.0, (24, 96, 432))
    assert ds == []
    assert TunerConfig().trigger == "envelope"
    assert TunerConfig.from_dict(TunerConfig(trigger="room").to_dict()).trigger == "room"
    with pytest.raises(ValidationError, match="trigger"):
        TunerConfig(trigger="sometimes")  # type: ignore[arg-type]


def test_scale_down_takes_the_steps_batch_sizes_even_where_no_replica_is_saved():
    p = policy(stabilization_delay_s=1.0, keep_horizon_s=0.0)
    s = TunerState({"a": 8, "b": 6}, 0.0, batch={"a": 8, "b": 8})
    # 5 s windows at 180 q/s (planned 540 / 5 s = 108 q/s at 100 q/s): scaled 166.7 -> step 2
    _, d = p.step(s, 2.0, (0, 0, 900))
    assert d is not None and d.action == "down"
    assert d.replicas == {"a": 5, "b": 6}
    # b: 6 replicas either way; step 2 is proven at batch 2, not at the 8 it had
    assert d.batch == {"a": 8, "b": 2}
    # settle_s=None with down_to="saving": the earlier rule, a larger batch is kept where no
    # replica is saved
    keep = policy(stabilization_delay_s=1.0, keep_horizon_s=0.0, settle_s=None, down_to="saving")
    _, d = keep.step(s, 2.0, (0, 0, 900))
    assert d is not None and d.batch == {"a": 8, "b": 8}


def test_scale_down_to_the_step_adds_the_replicas_a_model_is_short_of():
    """``down_to="step"`` (default): after the stabilization delay the configuration becomes
    the step for the recent traffic exactly (a delayed room trigger); ``"saving"`` moves a
    model only where that saves a replica, and leaves one short of the step's replicas alone."""
    # 5 s windows of 500 (planned 540): 92.6 q/s, x 1.2 = 111 -> step 1 (a 5 x b4, b 3 x b8),
    # inside the planned envelope, so no scale-up fires
    kw = {"stabilization_delay_s": 1.0, "keep_horizon_s": 0.0, "headroom": 0.2}
    mixed = TunerState({"a": 8, "b": 2}, 0.0, batch={"a": 4, "b": 8})
    saving = policy(**kw, down_to="saving")
    _, d = saving.step(mixed, 2.0, (0, 0, 500))
    assert d is not None and (d.replicas, d.action) == ({"a": 5, "b": 2}, "down")
    step = policy(**kw)
    _, d = step.step(mixed, 2.0, (0, 0, 500))
    assert d is not None and (d.replicas, d.batch) == ({"a": 5, "b": 3}, {"a": 4, "b": 8})
    assert d.action == "down" and "scale down" in d.reason and "b 2x b8->3x b8" in d.reason
    # only short of replicas: "saving" keeps it; "step" adds them, an "up" for the logs
    short = TunerState({"a": 5, "b": 2}, 0.0, batch={"a": 4, "b": 8})
    assert saving.step(short, 2.0, (0, 0, 500))[1] is None
    s, d = step.step(short, 2.0, (0, 0, 500))
    assert d is not None and d.replicas == {"a": 5, "b": 3} and d.action == "up"
    assert d.reason.startswith("move up to the step") and s.last_change_s == 2.0
    assert TunerConfig.from_dict(TunerConfig(down_to="saving").to_dict()).down_to == "saving"
    assert TunerConfig().down_to == "step"
    with pytest.raises(ValidationError, match="down_to"):
        TunerConfig(down_to="exactly")  # type: ignore[arg-type]


def test_settle_gives_held_replicas_the_batch_sizes_of_a_proven_step():
    """A scale-up raises batch sizes at once (capacity while replicas start); the activation
    time later the configuration settles on the batch sizes of a step its replicas hold,
    without restarting the stabilization delay. Covering a rate needs a step's own batch
    sizes: a larger batch at the same replicas is not that step."""
    p = policy(headroom=0.2)
    # step 2's replicas with larger batch sizes (a leftover of a scale-up)
    s = TunerState({"a": 5, "b": 6}, 0.0, batch={"a": 8, "b": 8})
    # 1 s window of 130 (planned 120): 108.3 q/s, x 1.15 = 124.6; steps 1 and 2 are proven
    # for it and the replicas hold both: the one proven for more traffic (step 2) it is
    s, ds = run_ticks(p, s, 0.0, 6.0, (0, 130, 0))
    assert [d.action for d in ds] == ["settle"] and ds[0].time_s == pytest.approx(5.0)
    assert ds[0].replicas == {"a": 5, "b": 6} and ds[0].batch == {"a": 8, "b": 2}
    assert s.last_change_s == 0.0 and s.batch == {"a": 8, "b": 2}
    assert "b 6x b8->6x b2" in ds[0].reason
    # step 1's replicas with step 2's batch sizes, inside the planned envelope (110 of 120:
    # 91.7 q/s, x 1.15 = 105.4, more than the plan's 100): step 1's batch sizes
    s = TunerState({"a": 5, "b": 3}, 0.0, batch={"a": 8, "b": 2})
    _, ds = run_ticks(p, s, 0.0, 6.0, (0, 110, 0))
    assert [(d.action, d.batch) for d in ds] == [("settle", {"a": 4, "b": 8})]
    d = TunerDecision.from_dict(ds[0].to_dict())
    assert d == ds[0]
    assert TunerConfig.from_dict(TunerConfig(settle_s=None).to_dict()).settle_s is None
    assert TunerConfig.from_dict({"settle_s": 2}).settle_s == 2.0
    with pytest.raises(ValidationError, match="settle_s"):
        TunerConfig(settle_s=-1.0)


def test_scale_down_covers_the_bursts_of_the_horizon_not_only_its_5s_rate():
    p = policy(stabilization_delay_s=1.0, headroom=0.2)
    s = TunerState({"a": 8, "b": 6}, -10.0, batch={"a": 8, "b": 8})
    # a 0.1 s burst of 29 (planned 30: 96.7 q/s as a scaled rate, x 1.2 = 116 q/s) and the 5 s
    # rate well below the plan (400 of 540: 74 q/s): the burst asks for step 1 (150 q/s), where
    # the 5 s rate alone would have gone back to the plan
    s, d = p.step(s, 0.1, (29, 0, 400))
    assert d is not None and d.action == "down"
    assert d.replicas == {"a": 5, "b": 3} and "0.1 s windows" in d.reason
    s, ds = run_ticks(p, s, 0.1, 29.9, (20, 90, 400))
    assert ds == []  # the burst is remembered for 30 s
    s, ds = run_ticks(p, s, 29.9, 40.0, (20, 90, 400))
    assert ds[0].replicas == PLANNED and 30.0 <= ds[0].time_s <= 30.5
    assert TunerState.from_dict(s.to_dict()) == s


def test_lookahead_provisions_a_rising_rate_ahead():
    # headroom 0: the plan (proven for its 100 q/s) is enough until the rate passes 100 q/s
    cfg = TunerConfig(lookahead_s=10.0, headroom=0.0, hysteresis=0.0, trigger="room")
    p = TunerPolicy(INPUTS, PLANNED, cfg, BATCH)
    # the 5 s count rises 3 per tick (0.1 s), 6 q/s per s, inside the planned envelope; the
    # trend is read once the first 5 s window has filled and 10 s of it exist
    s, ds = run_ticks(p, p.initial_state(0.0), 0.0, 14.5, lambda i: (0, 100, 60 + 3 * i))
    assert ds == []
    s0 = s
    s, d = p.step(s, 15.0, (0, 100, 510))  # 94.4 q/s now, inside the planned envelope
    # the rise alone (trigger="room"): where the rate will be in 10 s is more than the plan
    # has room for
    assert (
        d is not None
        and d.action == "up"
        and "less than 0% of the planned rate as room" in d.reason
    )
    assert "rising" in d.reason and d.rate_qps > 150.0 and "ladder step 2" in d.reason
    s, d = p.step(s0, 15.0, (0, 121, 540))  # just above the plan at 1 s: 100.8 q/s now
    assert d is not None and "rising" in d.reason and "10 s ahead" in d.reason
    assert d.rate_qps > 150.0  # 100.8 + about 6 q/s per s x 10 s
    assert d.replicas == {"a": 5, "b": 6} and "ladder step 2" in d.reason
    # the same excess without the rise: step 1 only
    flat = TunerPolicy(INPUTS, PLANNED, cfg, BATCH)
    s = flat.initial_state(0.0)
    s, _ = run_ticks(flat, s, 0.0, 5.5, (0, 100, 500))
    s, d = flat.step(s, 5.6, (0, 121, 500))
    assert d is not None and "rising" not in d.reason and d.rate_qps < 101.0


def test_after_the_stabilization_delay_a_rise_alone_moves_nothing_up():
    """``step_lookahead="hold"`` (default): after the stabilization delay the look-ahead keeps
    a configuration (no scale-down while the rate rises) but a move up needs the measured rate
    to ask for it. A step change of the rate reads as a rise for one window's time; "move"
    (the earlier rule) moved up on it and back a stabilization delay later."""
    kw = {"lookahead_s": 10.0, "stabilization_delay_s": 1.0, "keep_horizon_s": 0.0}

    def ramp(i):  # the 5 s count rises 3 per tick (6 q/s per s), inside the planned envelope
        return (0, 100, min(60 + 3 * i, 510))

    def tuner(**extra):
        return TunerPolicy(INPUTS, PLANNED, TunerConfig(**{**kw, **extra}), BATCH)

    def run(**extra):
        p = tuner(**extra)
        return run_ticks(p, p.initial_state(0.0), 0.0, 16.0, ramp)[1]

    # headroom 0: the measured rate (at most 94.4 q/s) never asks more than the plan's 100;
    # the rise (read once 10 s of the 5 s counts exist) does
    assert run(headroom=0.0) == []
    moved = run(headroom=0.0, step_lookahead="move")
    assert moved[0].action == "up" and "rising" in moved[0].reason
    assert moved[0].reason.startswith("move up to the step") and moved[0].rate_qps > 100.0
    # headroom 0.2: from 83.9 q/s (x 1.2 > 100) the measured rate asks for step 1 on its own;
    # then the rise asks for step 2, which only "move" takes
    held = run(headroom=0.2)
    assert len(held) == 1 and "ladder step 1" in held[0].reason
    assert "rising" not in held[0].reason and held[0].rate_qps < 100.0
    moved = run(headroom=0.2, step_lookahead="move")
    assert "ladder step 2" in moved[1].reason and "rising" in moved[1].reason
    # once the measured rate asks for a move, the look-ahead sizes it: at 16 s the 5 s count
    # of 480 (88.9 q/s, x 1.2 > 100) asks for step 1, the rise of 6 q/s per s for step 2
    late = tuner(headroom=0.2, stabilization_delay_s=16.0)
    _, ds = run_ticks(late, late.initial_state(0.0), 0.0, 16.0, lambda i: (0, 100, 3 * i))
    assert len(ds) == 1 and ds[0].time_s == 16.0 and "ladder step 2" in ds[0].reason
    assert "rising 6.0 q/s per s" in ds[0].reason
    # while the rate rises, no scale-down: on step 2 the rise holds it, where without the
    # look-ahead the measured rate goes back to step 1
    p = tuner(headroom=0.2)
    s, _ = run_ticks(p, p.initial_state(0.0), 0.0, 14.8, ramp)
    at_2 = replace(s, replicas={"a": 5, "b": 6}, batch={"a": 8, "b": 2}, last_change_s=0.0)
    assert run_ticks(p, at_2, 14.8, 16.0, lambda i: ramp(148 + i))[1] == []
    flat = tuner(headroom=0.2, lookahead_s=0.0)
    _, ds = run_ticks(flat, at_2, 14.8, 16.0, lambda i: ramp(148 + i))
    assert ds and "ladder step 1" in ds[0].reason
    assert TunerConfig().step_lookahead == "hold"
    cfg = TunerConfig(step_lookahead="move")
    assert TunerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValidationError, match="step_lookahead"):
        TunerConfig(step_lookahead="ahead")  # type: ignore[arg-type]


def test_a_burst_is_not_a_rise_but_a_ramp_is():
    from inferline.core.tuner._ladder_rule import _rise

    ticks = [round(0.1 * i, 10) for i in range(101)]  # 10 s of 5 s-window counts
    ramp = tuple((t, 500.0 + 30.0 * t) for t in ticks)  # the 5 s rate rises 6 q/s per s
    assert _rise(ramp, 10.0, 5.0) == pytest.approx(6.0)
    # a burst lifts the count for the 5 s it stays in the window: the short rise sees it, the
    # rise over 10 s (whose base is before the burst) too, but once it left the window neither
    burst = tuple((t, 500.0 + (300.0 if 6.0 <= t < 11.0 else 0.0)) for t in ticks)
    assert _rise(burst, 10.0, 5.0) > 0.0
    after = tuple((t + 3.0, 500.0 + (300.0 if 3.0 <= t < 8.0 else 0.0)) for t in ticks)
    assert _rise(after, 13.0, 5.0) == 0.0
    # a burst that came and went within the last 5 s never reads as a rise
    short = tuple((t, 500.0 + (300.0 if 1.0 <= t < 3.0 else 0.0)) for t in ticks)
    assert _rise(short, 10.0, 5.0) == 0.0
    assert _rise(ramp[:40], 3.9, 5.0) == 0.0  # less than 2 windows of history


# -- in the estimator's loop -------------------------------------------------------------------
def test_estimator_applies_batch_sizes_a_controller_returns(planned):
    pipe, prof, _, plan = planned

    class Resize:
        interval_s = 1.0

        def __init__(self, batch: int) -> None:
            self.batch = batch

        def observe(self, now_s, new_arrivals, state):
            if now_s < 1.5:
                c = plan.models["net"]
                return {"net": ModelConfig(c.hardware, self.batch, c.replicas)}
            return None

    trace = gamma_trace(150.0, 1.0, 30.0, np.random.default_rng(1))
    base = simulate_plan(pipe, plan, prof, trace)
    big = simulate_plan(pipe, plan, prof, trace, controller=Resize(32))
    assert big.models["net"].mean_batch_size > base.models["net"].mean_batch_size
    with pytest.raises(ValidationError) as e:
        simulate_plan(pipe, plan, prof, trace, controller=Resize(64))
    assert "max_batch_size" in str(e.value)

    class WrongHardware(Resize):
        def observe(self, now_s, new_arrivals, state):
            return {"net": ModelConfig("cpu", 1, 1)}

    with pytest.raises(ValidationError) as e:
        simulate_plan(pipe, plan, prof, trace, controller=WrongHardware(1))
    assert "hardware" in str(e.value)


def test_ladder_tuner_follows_a_rate_surge_cheaper_than_replica_scaling(planned):
    pipe, prof, _, plan = planned
    rng = np.random.default_rng(11)
    live = varying_trace(
        [(100.0, 1.0, 40.0), (220.0, 1.0, 80.0), (100.0, 1.0, 80.0)], rng, transition_s=30.0
    )
    opts = EstimatorOptions(activation_delay_s=2.0)
    start = float(live[0])
    ladder = InferLineController(plan, TunerConfig(), start_s=start)
    r = simulate_plan(pipe, plan, prof, live, options=opts, controller=ladder)
    assert r.miss_rate(plan.slo_s) <= 0.01
    assert ladder.decisions and all(d.batch for d in ladder.decisions)
    replicas = InferLineController(
        plan, TunerConfig(reconfigure="replicas", down_rate="window"), start_s=start
    )
    rr = simulate_plan(pipe, plan, prof, live, options=opts, controller=replicas)
    assert all(not d.batch for d in replicas.decisions)
    assert r.cost_per_hour <= rr.cost_per_hour
    bare = simulate_plan(pipe, plan, prof, live, options=opts)
    assert bare.miss_rate(plan.slo_s) > 0.05  # the surge needs the tuner
