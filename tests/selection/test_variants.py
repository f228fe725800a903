"""Variant-aware planning and tuning (core/_variants.py): format, floors, branch-and-bound
planning over variant combinations, and the tuner switching to a cheaper variant on a burst."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    EstimatorOptions,
    InfeasibleError,
    InferLineController,
    Pipeline,
    PipelineVariants,
    Profiles,
    ValidationError,
    VariantController,
    VariantPlan,
    VariantTuner,
    gamma_trace,
    make_plan,
    pipeline_accuracy,
    plan_with_variants,
    plan_with_variants_section,
    simulate,
    stage_profiles,
    with_ladder,
)

PIPE = Pipeline("p", ("pre", "cls"), (("pre", "cls"),))
PROFILES = Profiles.from_latencies(
    {
        "pre": {"cpu": {1: 0.002, 2: 0.003, 4: 0.005, 8: 0.009}},
        "cls-big": {"cpu": {1: 0.020, 2: 0.030, 4: 0.050, 8: 0.090}},
        "cls-mid": {"cpu": {1: 0.008, 2: 0.012, 4: 0.020, 8: 0.036}},
        "cls-tiny": {"cpu": {1: 0.003, 2: 0.004, 4: 0.006, 8: 0.010}},
    }
)
DOC = {
    "format": "inferline.variants/1",
    "pipeline": "p",
    "accuracy_floor": 0.88,
    "stages": {
        "cls": {
            "variants": [
                {"name": "cls-big", "accuracy": 0.95},
                {"name": "cls-mid", "accuracy": 0.91},
                {"name": "cls-tiny", "accuracy": 0.80},
            ]
        }
    },
}
VARIANTS = PipelineVariants.from_dict(DOC)


def test_format_round_trip_and_validation():
    assert PipelineVariants.from_dict(json.loads(json.dumps(VARIANTS.to_dict()))) == VARIANTS
    bad = json.loads(json.dumps(DOC))
    bad["stages"]["cls"]["variants"][0]["accuracy"] = 1.5
    with pytest.raises(ValidationError, match=r"variants\[0\]\.accuracy"):
        PipelineVariants.from_dict(bad)
    bad = json.loads(json.dumps(DOC))
    bad["stages"]["cls"]["variants"].append({"name": "cls-big", "accuracy": 0.9})
    with pytest.raises(ValidationError, match="distinct"):
        PipelineVariants.from_dict(bad)
    bad = json.loads(json.dumps(DOC))
    bad["stages"]["nope"] = bad["stages"].pop("cls")
    with pytest.raises(ValidationError, match=r"stages\.nope"):
        PipelineVariants.from_dict(bad).check(PIPE)
    bad = json.loads(json.dumps(DOC))
    bad["stages"]["cls"]["variants"][0]["name"] = "unprofiled"
    with pytest.raises(ValidationError, match=r"stages\.cls\.variants\[0\]\.name.*unprofiled"):
        PipelineVariants.from_dict(bad).check(PIPE, PROFILES)
    bad = json.loads(json.dumps(DOC))
    bad["pipeline"] = "other"
    with pytest.raises(ValidationError, match=r"pipeline: expected the pipeline's name"):
        PipelineVariants.from_dict(bad).check(PIPE)
    bad = json.loads(json.dumps(DOC))
    bad["stages"]["cls"]["accuracy_floor"] = 0.99
    with pytest.raises(ValidationError, match="accuracy_floor"):
        PipelineVariants.from_dict(bad).check(PIPE)


def test_pipeline_accuracy_weights_stages_by_visit_probability():
    pipe = Pipeline("p", ("pre", "cls"), (("pre", "cls"),), {"cls": 0.5})
    assert pipeline_accuracy(pipe, VARIANTS, {"cls": "cls-tiny"}) == pytest.approx(0.9)
    assert pipeline_accuracy(PIPE, VARIANTS, {"cls": "cls-tiny"}) == pytest.approx(0.8)


def _trace(rate, n=2500, seed=0):
    return gamma_trace(rate, 1.0, n / rate, np.random.default_rng(seed))


def test_planner_picks_the_cheapest_combination_meeting_floor_and_slo():
    trace, slo = _trace(300.0), 0.15
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, trace, slo)
    # at 300 q/s big needs 4 replicas, mid 2, tiny 1; tiny is below the 0.88 floor
    assert vp.choice == {"cls": "cls-mid"} and vp.accuracy == pytest.approx(0.91)
    costs = {
        v: make_plan(
            "inferline", PIPE, stage_profiles(PROFILES, {"cls": v}), trace, slo
        ).cost_per_hour
        for v in ("cls-big", "cls-mid", "cls-tiny")
    }
    assert vp.plan.cost_per_hour == pytest.approx(costs["cls-mid"])
    assert costs["cls-mid"] < costs["cls-big"]
    assert all(c["cls"] != "cls-tiny" for c, *_ in vp.considered)
    # the plan really meets the SLO with the mid variant's profile
    cfg = vp.plan.models
    res = simulate(PIPE, cfg, stage_profiles(PROFILES, vp.choice), trace)
    assert res.percentile(99.0) <= slo
    # no floor: the cheapest variant wins; an impossible floor is infeasible
    cheap = plan_with_variants(PIPE, VARIANTS, PROFILES, trace, slo, accuracy_floor=0.0)
    assert cheap.choice == {"cls": "cls-tiny"} and cheap.plan.cost_per_hour <= costs["cls-tiny"]
    with pytest.raises(InfeasibleError, match="floor"):
        plan_with_variants(PIPE, VARIANTS, PROFILES, trace, slo, accuracy_floor=0.97)
    with pytest.raises(ValidationError, match=r"accuracy_floor: expected a number <= 1.0, got 1.5"):
        plan_with_variants(PIPE, VARIANTS, PROFILES, trace, slo, accuracy_floor=1.5)
    # an SLO no combination meets: the message names no floor when there is none
    doc = json.loads(json.dumps(DOC))
    del doc["accuracy_floor"]
    with pytest.raises(InfeasibleError) as err:
        plan_with_variants(PIPE, PipelineVariants.from_dict(doc), PROFILES, trace, 0.001)
    assert str(err.value) == "no variant combination meets the SLO 1 ms", str(err.value)
    assert VariantPlan.from_dict(json.loads(json.dumps(vp.to_dict()))) == vp


def test_equal_cost_prefers_accuracy_and_the_bound_skips_hopeless_combinations():
    trace = _trace(10.0, n=800)
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, trace, 0.2, accuracy_floor=0.0)
    assert vp.choice == {"cls": "cls-big"}  # one replica each at 10 q/s: same cost
    notes = [n for *_, n in vp.considered]
    assert any(n.startswith("skipped") for n in notes) or len(notes) == 3


def test_tuner_switches_to_a_cheaper_variant_instead_of_adding_replicas():
    slo = 0.15
    plan_trace = _trace(20.0, n=1500)
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, plan_trace, slo)
    assert vp.choice == {"cls": "cls-big"}  # low load: big costs no more than mid
    tuner = VariantTuner(PIPE, VARIANTS, PROFILES, vp)
    plain = tuner.policy  # before any switch
    state = tuner.initial_state(0.0)
    # a 6x burst in every window of the planning envelope
    env = dict(vp.plan.tuner.envelope)
    peaks = [int(6 * env.get(w, 0)) for w in tuner.windows]
    state, d = tuner.step(state, 1.0, peaks)
    assert d is not None and d.decision.action == "up"
    assert d.switched == {"cls": ("cls-big", "cls-mid")}
    assert d.cost_per_hour < d.scale_up_cost_per_hour
    assert "instead switch cls cls-big->cls-mid" in d.decision.reason
    # what plain scaling would have done: more replicas of big
    _, plain_d = plain.step(plain.initial_state(0.0), 1.0, peaks)
    assert plain_d.replicas["cls"] > d.decision.replicas["cls"]
    # the switched configuration meets the SLO at the provisioned rate
    configs = {
        m: type(c)(c.hardware, c.max_batch_size, d.decision.replicas[m])
        for m, c in vp.plan.models.items()
    }
    burst = _trace(d.decision.rate_qps, n=3000, seed=5)
    res = simulate(PIPE, configs, stage_profiles(PROFILES, d.variants), burst)
    assert res.percentile(99.0) <= slo * 1.1  # tolerance: a fresh trace, 3000 queries
    # with the floor above mid's accuracy the tuner just adds replicas
    strict = VariantTuner(PIPE, VARIANTS, PROFILES, vp, accuracy_floor=0.93)
    _, d2 = strict.step(strict.initial_state(0.0), 1.0, peaks)
    assert d2.switched == {} and d2.decision.replicas == plain_d.replicas


def test_tuner_with_a_ladder_switches_at_the_steps_batch_sizes_and_back_at_the_plan():
    """A plan with a ladder (what ``inferline plan`` writes): the alternative keeps the
    ladder's configuration and batch sizes, resizes the switched stage, and is checked at
    what runs; the ladder is rewritten for the new variant; back at the plan, the plan's
    variants return."""
    slo = 0.15
    plan_trace = _trace(20.0, n=1500)
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, plan_trace, slo)
    lplan = with_ladder(PIPE, stage_profiles(PROFILES, vp.choice), plan_trace, vp.plan)
    assert lplan.tuner.ladder
    vp = VariantPlan(lplan, vp.choice, vp.accuracy)
    tuner = VariantTuner(PIPE, VARIANTS, PROFILES, vp)
    plain = tuner.policy
    assert plain.uses_ladder
    env = dict(lplan.tuner.envelope)
    peaks = [int(3 * env.get(w, 0)) for w in tuner.windows]
    state, d = tuner.step(tuner.initial_state(0.0), 1.0, peaks)
    _, plain_d = plain.step(plain.initial_state(0.0), 1.0, peaks)
    assert d is not None and d.switched == {"cls": ("cls-big", "cls-mid")}
    assert d.cost_per_hour < d.scale_up_cost_per_hour == tuner.cost(plain_d.replicas)
    # the ladder's batch sizes run, and the configuration was checked at them
    assert d.decision.batch == plain_d.batch and state.batch == plain_d.batch
    assert d.decision.replicas["pre"] == plain_d.replicas["pre"]
    assert d.decision.replicas["cls"] < plain_d.replicas["cls"]
    rate = plain.room(d.decision.rate_qps, tuner.config.headroom)
    assert f"at {rate:.1f} q/s" in d.decision.reason
    configs = {
        m: type(c)(c.hardware, d.decision.batch[m], d.decision.replicas[m])
        for m, c in lplan.models.items()
    }
    res = simulate(PIPE, configs, stage_profiles(PROFILES, d.variants), _trace(rate, 3000, 5))
    assert res.percentile(99.0) <= slo * 1.1  # tolerance: a fresh trace, 3000 queries
    # the ladder goes on, rewritten for cls-mid: every step serves at least what a step of
    # the same batch sizes served before, with no more cls replicas, and its new rate is proven
    assert tuner.policy.uses_ladder and tuner.policy is not plain
    after = tuner.policy.inputs.ladder
    assert after
    for st in after:
        same = [
            o
            for o in lplan.tuner.ladder
            if all(o.models[m].max_batch_size == c.max_batch_size for m, c in st.models.items())
        ]
        assert any(
            st.rate_qps >= o.rate_qps and st.models["cls"].replicas <= o.models["cls"].replicas
            for o in same
        ), st
        configs = {m: c for m, c in st.models.items()}
        res = simulate(PIPE, configs, stage_profiles(PROFILES, d.variants), _trace(st.rate_qps))
        assert res.percentile(99.0) <= slo * 1.1  # tolerance: a fresh trace
    # the faster variant serves more with the top step than the slow one did
    assert after[-1].rate_qps > lplan.tuner.ladder[-1].rate_qps
    # the burst is over: once the horizon has passed, the scale-down returns to the plan and
    # to the plan's variants
    quiet = [int(0.5 * env.get(w, 0)) for w in tuner.windows]
    t, back = 1.0, None
    while back is None and t < 120.0:
        t += 0.5
        state, back = tuner.step(state, t, quiet)
    assert back is not None and back.decision.action == "down", back
    assert back.switched == {"cls": ("cls-mid", "cls-big")}
    assert back.variants == vp.choice and tuner.choice == vp.choice
    assert back.decision.replicas == {m: c.replicas for m, c in lplan.models.items()}
    assert tuner.policy is plain and "back at the plan" in back.decision.reason


def test_tuner_without_a_ladder_switches_back_once_the_traffic_fits_the_plan():
    plan_trace = _trace(20.0, n=1500)
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, plan_trace, 0.15)
    tuner = VariantTuner(PIPE, VARIANTS, PROFILES, vp)
    plain = tuner.policy
    env = dict(vp.plan.tuner.envelope)
    state, d = tuner.step(
        tuner.initial_state(0.0), 1.0, [int(6 * env.get(w, 0)) for w in tuner.windows]
    )
    assert d.switched == {"cls": ("cls-big", "cls-mid")} and tuner.policy is not plain
    quiet = [int(0.5 * env.get(w, 0)) for w in tuner.windows]
    t, back = 1.0, None
    while back is None and t < 120.0:
        t += 0.5
        state, back = tuner.step(state, t, quiet)
    assert back is not None and back.switched == {"cls": ("cls-mid", "cls-big")}, back
    assert t >= 1.0 + tuner.config.stabilization_delay_s  # not before the delay
    assert back.decision.replicas == {m: c.replicas for m, c in vp.plan.models.items()}
    assert tuner.choice == vp.choice and tuner.policy is plain
    # and it stays there while the traffic stays quiet
    for _ in range(20):
        t += 0.5
        state, again = tuner.step(state, t, quiet)
        assert again is None or not again.switched


def test_a_tick_without_arrivals_during_a_burst_does_not_switch_back():
    """The return to the plan's variants looks at the tuner's horizons, not at one tick: on a
    live service a 50 ms tick often sees no arrival even in a burst (found live: the stage
    went back to the slow variant mid-burst and forward again 50 ms later)."""
    pipe = Pipeline("p", ("cls",), ())
    vp = plan_with_variants(pipe, VARIANTS, PROFILES, _trace(20.0, n=1500), 0.15)
    tuner = VariantTuner(pipe, VARIANTS, PROFILES, vp)
    env = dict(vp.plan.tuner.envelope)
    burst = [int(2 * env.get(w, 0)) for w in tuner.windows]
    state, d = tuner.step(tuner.initial_state(0.0), 1.0, burst)
    assert d is not None and d.switched == {"cls": ("cls-big", "cls-mid")}
    # the cheap variant serves the burst with the plan's replica count: whether to return to
    # the plan is a question of every tick
    assert d.decision.replicas == {"cls": vp.plan.models["cls"].replicas}
    t = 1.0
    while t < 60.0:  # the burst goes on; every other tick sees nothing
        t += 0.5
        state, d = tuner.step(state, t, burst if int(t * 2) % 2 else [0] * len(burst))
        assert d is None or not d.switched, (t, d)
    assert tuner.choice == {"cls": "cls-mid"}
    # once it is over, back at the plan's variant
    quiet = [int(0.5 * env.get(w, 0)) for w in tuner.windows]
    back = None
    while back is None and t < 200.0:
        t += 0.5
        state, back = tuner.step(state, t, quiet)
    assert back is not None and back.switched == {"cls": ("cls-mid", "cls-big")}


def _burst_trace(seed: int = 3) -> np.ndarray:
    """20 q/s for 60 s, a 4x burst for 60 s, 20 q/s for 90 s."""
    rng, parts, t = np.random.default_rng(seed), [], 0.0
    for rate, dur in ((20.0, 60.0), (80.0, 60.0), (20.0, 90.0)):
        parts.append(gamma_trace(rate, 1.0, dur, rng) + t)
        t += dur
    return np.concatenate(parts)


def test_simulated_burst_switches_once_each_way_and_costs_less_than_adding_replicas():
    """The variant-aware tuner in the estimator's loop (``VariantController``), as it runs
    live. Found in this simulation: a scale-down of the switched variant's policy that reached
    the plan's replica counts switched back at once, mid-burst, and the plan's variant was
    scaled up again 0.1 s later; the return now also needs the plan's own tuner to fit."""
    slo = 0.15
    pt = _trace(20.0, n=3000)
    vp = plan_with_variants(PIPE, VARIANTS, PROFILES, pt, slo)
    lplan = with_ladder(PIPE, stage_profiles(PROFILES, vp.choice), pt, vp.plan)
    vp = VariantPlan(lplan, vp.choice, vp.accuracy)
    plan = plan_with_variants_section(vp, PIPE, VARIANTS, PROFILES, lplan)
    arr = _burst_trace()
    opt = EstimatorOptions(activation_delay_s=5.0)
    prof = stage_profiles(PROFILES, vp.choice)
    ctl = VariantController.from_plan(plan)
    assert ctl.stage_variants == {"cls": ("cls-mid", "cls-tiny")}
    res = simulate(
        PIPE, plan.models, prof, arr, options=opt, controller=ctl, variants=ctl.stage_variants
    )
    plain = simulate(
        PIPE, plan.models, prof, arr, options=opt, controller=InferLineController(plan)
    )
    stages = [(s, v) for _, s, v in res.variant_switches]
    assert stages == [("cls", "cls-mid"), ("cls", "cls")], res.variant_switches
    t_on, t_off = res.variant_switches[0][0], res.variant_switches[1][0]
    assert 60.0 < t_on < 62.0  # detected within 2 s of the burst's start
    assert t_off > 120.0 + 15.0  # after the burst and the stabilization delay
    assert res.cost_per_hour < 0.9 * plain.cost_per_hour
    # a 4x step misses while replicas start, with or without a switch; no worse with one
    assert res.miss_rate(slo) <= plain.miss_rate(slo) + 0.002
    assert all(vd.variants["cls"] in ("cls-big", "cls-mid") for vd in ctl.variant_decisions)
