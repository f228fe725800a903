"""InferLine planner: feasibility, local optimality, determinism, infeasibility, tuner inputs."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    InfeasibleError,
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    ValidationError,
    compress,
    gamma_trace,
    max_arrivals_in_window,
    mean_rate,
    plan_inferline,
    simulate,
    tuner_inputs,
)

HW = ("cpu", "gpu-k80", "gpu-v100")


def _profiles(seed: int, models: tuple[str, ...]) -> Profiles:
    """GPU models that batch well, CPUs that do not; some models CPU-friendly."""
    rng = np.random.default_rng(seed)
    table: dict[str, dict[str, dict[int, float]]] = {}
    for m in models:
        base = float(rng.uniform(0.004, 0.015))
        cpu = base * float(rng.uniform(1.5, 5.0))
        table[m] = {
            "gpu-v100": {b: base * (1 + 0.15 * b) for b in (1, 2, 4, 8)},
            "gpu-k80": {b: 2.2 * base * (1 + 0.3 * b) for b in (1, 2, 4, 8)},
            "cpu": {b: cpu * b for b in (1, 2, 4, 8)},
        }
    return Profiles.from_latencies(table)


def _case(seed: int = 0, rate: float = 40.0, cv: float = 2.0, duration: float = 20.0):
    pipe = Pipeline.linear("two", ["a", "b"])
    prof = _profiles(seed, pipe.models)
    trace = gamma_trace(rate, cv, duration, np.random.default_rng(seed))
    return pipe, prof, trace


def _p99(pipe, configs, prof, trace, seed=0):
    res = simulate(pipe, configs, prof, trace, options=EstimatorOptions(seed=seed))
    return res.percentile(99)


def _cost(configs) -> float:
    return sum(c.cost_per_hour(DEFAULT_CATALOG) for c in configs.values())


def _ladder(prof, m, h):
    """The batch sizes the planner's doubling reaches: 1, then each size of 1, 2, 4, ... that
    raises the single-replica throughput over the previous one."""
    out = [1]
    for b in (2, 4, 8):
        if b <= prof.max_batch(m, h) and prof.throughput(m, h, b) > prof.throughput(
            m, h, out[-1]
        ) * (1 + 1e-9):
            out.append(b)
    return out


def _single_actions(pipe, prof, configs):
    """Every cheaper configuration one of the paper's actions away: one replica fewer; a larger
    batch with fewer replicas; a cheaper hardware with any batch size and replica count that
    costs less than the model does now (downgrade plus local re-optimization)."""
    out = []
    for m in pipe.models:
        c = configs[m]
        cur = c.cost_per_hour(DEFAULT_CATALOG)
        for h in prof.hardware_for(m):
            price = DEFAULT_CATALOG.cost(h)
            if h == c.hardware:
                sizes = [b for b in _ladder(prof, m, h) if b >= c.max_batch_size]
            elif price < DEFAULT_CATALOG.cost(c.hardware):
                sizes = _ladder(prof, m, h)
            else:
                continue
            for b in sizes:
                for r in range(1, 40):
                    if r * price >= cur - 1e-9:
                        break
                    out.append({**configs, m: ModelConfig(h, b, r)})
    return out


@pytest.mark.parametrize("extensions", [False, True])
def test_plan_is_feasible_and_locally_optimal(extensions):
    pipe, prof, trace = _case(seed=1)
    slo = 0.12
    # the paper's test (no rate margin): guarantee 2 is about the sample itself
    options = PlannerOptions(escape=extensions, widen=extensions, rate_margin=0.0)
    planner = Planner(pipe, prof, trace, slo, options=options)
    plan = planner.plan()
    # feasibility as judged by a direct estimator run, not the planner's cache
    p99 = _p99(pipe, plan.models, prof, trace)
    assert p99 <= slo
    assert plan.estimated_latency_s == pytest.approx(p99)
    assert plan.cost_per_hour == pytest.approx(_cost(plan.models))
    # guarantee 2: no single cheaper action keeps the SLO
    for cfg in _single_actions(pipe, prof, plan.models):
        assert _p99(pipe, cfg, prof, trace) > slo, cfg
    if extensions:  # widen's fixed point: no other batch size at equal cost has more slack
        for m in pipe.models:
            c = plan.models[m]
            for b in _ladder(prof, m, c.hardware):
                other = {**plan.models, m: ModelConfig(c.hardware, b, c.replicas)}
                assert _p99(pipe, other, prof, trace) >= p99 - 1e-12


def test_deterministic():
    pipe, prof, trace = _case(seed=2, cv=4.0)
    a = plan_inferline(pipe, prof, trace, 0.1)
    b = plan_inferline(pipe, prof, trace, 0.1)
    assert a.to_dict() == b.to_dict()


def test_escape_finds_a_strictly_cheaper_plan_than_the_paper_algorithm():
    """A pinned case (found by a search over small seeded systems) where Algorithm 2 stops in a
    local optimum that the escape extension leaves: the paper's algorithm costs $10.44/h, with
    the escape $1.00/h. Making ``Planner.escape`` a no-op (``return dict(configs)``) fails this
    test (both plans then cost $10.44/h); the plan with the escape still meets the SLO."""
    pipe, prof, trace = _case(seed=2, rate=40.0, cv=2.0, duration=10.0)
    slo = 0.0546
    paper_only = PlannerOptions(escape=False, widen=False, rate_margin=0.0)
    paper = plan_inferline(pipe, prof, trace, slo, options=paper_only)
    escaped = plan_inferline(pipe, prof, trace, slo, options=replace(paper_only, escape=True))
    full = plan_inferline(
        pipe, prof, trace, slo, options=replace(paper_only, escape=True, widen=True)
    )
    assert paper.cost_per_hour == pytest.approx(10.4445, abs=1e-3)
    assert escaped.cost_per_hour < 0.5 * paper.cost_per_hour
    assert full.cost_per_hour <= escaped.cost_per_hour + 1e-9  # widen never adds cost
    for plan in (paper, escaped, full):
        assert _p99(pipe, plan.models, prof, trace) <= slo


def _exhaustive(pipe, prof, trace, slo, max_r, options=None, cost_cap=math.inf):
    """The cheapest feasible configuration with at most ``max_r`` replicas per model (an int,
    or a bound per model) within ``options``' inventory, if any, and cost at most ``cost_cap``
    (combinations above it are never enumerated)."""
    per = []
    for m in pipe.models:
        top = max_r if isinstance(max_r, int) else max_r[m]
        per.append(
            [
                ModelConfig(h, b, r)
                for h in prof.hardware_for(m)
                for b in _ladder(prof, m, h)
                for r in range(1, top + 1)
                if r * DEFAULT_CATALOG.cost(h) <= cost_cap + 1e-9
            ]
        )
    price = {c: c.cost_per_hour(DEFAULT_CATALOG) for cs in per for c in cs}
    combos = [cs for cs in itertools.product(*per) if sum(price[c] for c in cs) <= cost_cap + 1e-9]
    combos.sort(key=lambda cs: sum(price[c] for c in cs))
    # its pruning is sound; the cache saves time
    planner = Planner(pipe, prof, trace, slo, options=options)
    for cs in combos:
        cfg = dict(zip(pipe.models, cs, strict=True))
        if planner.feasible(cfg):
            return cfg
    return None


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_feasible_whenever_one_exists_and_near_optimal(seed):
    """The reference optimum searches every hardware, ladder batch size and replica count up to
    the plan's count for that model plus 2 (at least 4), at a cost up to the plan's: the plan
    is among its candidates, so the optimum never costs more than the plan (before, at most 4
    replicas per model made it cost more than the planner's plan for seeds 4 and 5: 10.11 vs
    1.80, 15.43 vs 11.58). Seed 5's optimum, $11.51/h, is 0.6% below the plan's $11.58/h."""
    rng = np.random.default_rng(seed)
    pipe = Pipeline("fan", ("a", "b", "c"), (("a", "b"), ("a", "c")), {"c": 0.5})
    prof = _profiles(seed, pipe.models)
    trace = gamma_trace(30.0, float(rng.choice([1.0, 4.0])), 15.0, rng)
    fastest = pipe.critical_path({m: prof.latency(m, "gpu-v100", 1) for m in pipe.models})[0]
    slo = round(fastest * float(rng.uniform(1.5, 4.0)), 4)
    options = PlannerOptions(rate_margin=0.0)  # the paper's test, as the reference judges
    plan = plan_inferline(pipe, prof, trace, slo, options=options)
    assert _p99(pipe, plan.models, prof, trace) <= slo
    max_r = {m: max(4, c.replicas + 2) for m, c in plan.models.items()}
    opt = _exhaustive(pipe, prof, trace, slo, max_r, options, cost_cap=plan.cost_per_hour)
    assert opt is not None  # the plan itself is a candidate
    assert _cost(opt) <= plan.cost_per_hour + 1e-9
    assert plan.cost_per_hour <= 1.2 * _cost(opt) + 1e-9


def test_infeasible_slo_names_best_service_time():
    pipe, prof, trace = _case(seed=7)
    best = sum(min(prof.latency(m, h, 1) for h in HW) for m in pipe.models)
    with pytest.raises(InfeasibleError) as ei:
        plan_inferline(pipe, prof, trace, best * 0.9)
    assert ei.value.best_latency_s == pytest.approx(best)
    assert f"{best:.4g}" in str(ei.value)
    # just above the best service time there is a plan (enough batch-1 replicas)
    plan = plan_inferline(pipe, prof, trace, best * 1.3)
    assert _p99(pipe, plan.models, prof, trace) <= best * 1.3


def test_rare_conditional_branch_does_not_make_slo_infeasible():
    """The paper's longest-path test would reject this SLO; the percentile-aware one does not:
    fewer than 1% of queries visit the slow branch."""
    pipe = Pipeline("rare", ("a", "slow"), (("a", "slow"),), {"slow": 0.005})
    prof = Profiles.from_latencies(
        {"a": {"cpu": {1: 0.01, 2: 0.02}}, "slow": {"cpu": {1: 0.5, 2: 1.0}}}
    )
    trace = gamma_trace(20.0, 1.0, 30.0, np.random.default_rng(0))
    plan = plan_inferline(pipe, prof, trace, 0.1)
    assert _p99(pipe, plan.models, prof, trace) <= 0.1


def test_initialization_adds_replicas_to_the_bottleneck():
    pipe = Pipeline.linear("p", ["fast", "slow"])
    prof = Profiles.from_latencies({"fast": {"cpu": {1: 0.002}}, "slow": {"cpu": {1: 0.05}}})
    trace = gamma_trace(60.0, 1.0, 20.0, np.random.default_rng(1))
    planner = Planner(pipe, prof, trace, 0.2)
    init = planner.initialize()
    assert init["fast"].replicas == 1
    assert init["slow"].replicas >= 4  # 60 q/s at 20 q/s per replica
    assert planner.feasible(init)
    smaller = {**init, "slow": ModelConfig("cpu", 1, init["slow"].replicas - 1)}
    assert not planner.feasible(smaller)  # the loop stopped at the first feasible count


def test_progress_callback_reports_phases():
    pipe, prof, trace = _case(seed=8)
    events = []
    plan_inferline(pipe, prof, trace, 0.12, progress=events.append)
    phases = [e.phase for e in events]
    assert phases[0] == "initialize" and phases[-1] == "done"
    assert any(p == "minimize" for p in phases)
    assert all(e.simulations >= 0 for e in events)


def test_tuner_inputs_match_the_definitions():
    pipe = Pipeline("p", ("a", "b"), (("a", "b"),), {"b": 0.5})
    prof = Profiles.from_latencies(
        {"a": {"cpu": {1: 0.01, 2: 0.015}}, "b": {"cpu": {1: 0.02, 4: 0.05}}}
    )
    trace = gamma_trace(50.0, 2.0, 120.0, np.random.default_rng(3))
    cfg = {"a": ModelConfig("cpu", 2, 2), "b": ModelConfig("cpu", 4, 3)}
    ti = tuner_inputs(pipe, prof, cfg, trace)
    assert ti.service_time_s == pytest.approx(0.015 + 0.05)
    windows = [w for w, _ in ti.envelope]
    assert windows[0] == pytest.approx(0.065)
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(windows[:-1]))
    assert windows[-1] == 60.0 and windows[-2] < 60.0
    for w, n in ti.envelope:
        assert n == max_arrivals_in_window(trace, w)
    rate = mean_rate(trace)
    assert ti.mean_rate_qps == pytest.approx(rate)
    assert ti.models["a"].throughput_qps == pytest.approx(2 / 0.015)
    assert ti.models["b"].scale_factor == 0.5
    assert ti.models["b"].max_provisioning_ratio == pytest.approx(rate * 0.5 / (3 * 4 / 0.05))


def test_plan_round_trips_with_tuner_inputs():
    from inferline.core import Plan

    pipe, prof, trace = _case(seed=9)
    plan = plan_inferline(pipe, prof, trace, 0.12)
    assert plan.tuner is not None
    assert Plan.from_dict(plan.to_dict()) == plan


def test_planner_options_round_trip_and_validation():
    o = PlannerOptions(EstimatorOptions(hop_overhead_s=0.001, seed=3), prune=False, escape=False)
    assert PlannerOptions.from_dict(o.to_dict()) == o
    assert PlannerOptions.from_dict({}) == PlannerOptions()
    with pytest.raises(ValidationError):
        PlannerOptions.from_dict({"prune": "yes"})
    with pytest.raises(ValidationError):
        PlannerOptions(max_replicas=0)
    m = PlannerOptions(rate_margin=0.05)
    assert PlannerOptions.from_dict(m.to_dict()) == m
    with pytest.raises(ValidationError, match="rate_margin"):
        PlannerOptions(rate_margin=-0.1)
    with pytest.raises(ValidationError, match="rate_margin"):
        PlannerOptions.from_dict({"rate_margin": "5%"})


def test_rate_margin_plans_for_the_sped_up_sample_and_keeps_the_sample_as_reference():
    """With ``rate_margin`` the plan meets the SLO on the sample sped up by 1 + margin (the
    slack that carries it over other traffic of the same process); the tuner's reference
    (envelope, mean rate) and the printed estimate stay those of the sample itself."""
    pipe, prof, trace = _case(seed=12, rate=60.0, cv=1.0, duration=30.0)
    plain = plan_inferline(pipe, prof, trace, 0.1)
    margin = 0.3
    wide = plan_inferline(pipe, prof, trace, 0.1, options=PlannerOptions(rate_margin=margin))
    fast = compress(trace, 1.0 + margin)
    assert _p99(pipe, wide.models, prof, fast) <= 0.1
    assert _p99(pipe, plain.models, prof, fast) > 0.1  # the margin is what made it hold
    assert wide.cost_per_hour > plain.cost_per_hour
    assert wide.estimated_latency_s == pytest.approx(_p99(pipe, wide.models, prof, trace))
    assert wide.tuner.mean_rate_qps == pytest.approx(mean_rate(trace))
    assert wide.tuner.envelope[0][1] == max_arrivals_in_window(trace, wide.tuner.envelope[0][0])


def test_pruning_changes_nothing_but_the_simulation_count():
    pipe, prof, trace = _case(seed=10, cv=4.0)
    a = Planner(pipe, prof, trace, 0.1)
    b = Planner(pipe, prof, trace, 0.1, options=PlannerOptions(prune=False))
    pa, pb = a.plan(), b.plan()
    assert pa.models == pb.models
    assert a.stats().simulations < b.stats().simulations
    assert math.isclose(pa.estimated_latency_s, pb.estimated_latency_s)


def test_unknown_model_and_unpriced_hardware_are_clear_errors():
    pipe = Pipeline.linear("p", ["a", "b"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.01}}})
    trace = gamma_trace(10.0, 1.0, 5.0, np.random.default_rng(0))
    with pytest.raises(Exception, match="'b'"):
        Planner(pipe, prof, trace, 0.1)
    prof2 = Profiles.from_latencies({"a": {"cpu": {1: 0.01}}, "b": {"tpu": {1: 0.01}}})
    with pytest.raises(ValidationError, match="catalog"):
        Planner(pipe, prof2, trace, 0.1)


def test_widen_takes_the_slack_of_equal_cost_batch_sizes():
    """Near saturation at batch 2, the same replicas at batch 4 cost the same and queue less."""
    pipe = Pipeline.linear("one", ["m"])
    prof = Profiles.from_latencies({"m": {"gpu-k80": {1: 0.03, 2: 0.04, 4: 0.055, 8: 0.12}}})
    trace = gamma_trace(95.0, 1.0, 30.0, np.random.default_rng(5))
    tight = plan_inferline(
        pipe, prof, trace, 1.0, options=PlannerOptions(escape=False, widen=False, rate_margin=0)
    )
    wide = plan_inferline(pipe, prof, trace, 1.0, options=PlannerOptions(rate_margin=0))
    assert wide.cost_per_hour <= tight.cost_per_hour + 1e-9
    assert wide.estimated_latency_s < tight.estimated_latency_s
    assert wide.models["m"].max_batch_size > tight.models["m"].max_batch_size


def test_hop_overhead_is_planned_for():
    pipe, prof, trace = _case(seed=11)
    opts = EstimatorOptions(hop_overhead_s=0.01)
    plan = plan_inferline(pipe, prof, trace, 0.12, options=PlannerOptions(estimator=opts))
    res = simulate(pipe, plan.models, prof, trace, options=opts)
    assert res.percentile(99) <= 0.12
    best = sum(min(prof.latency(m, h, 1) for h in HW) for m in pipe.models)
    with pytest.raises(InfeasibleError) as ei:  # two hops push the best latency over the SLO
        plan_inferline(pipe, prof, trace, best + 0.015, options=PlannerOptions(estimator=opts))
    assert ei.value.best_latency_s == pytest.approx(best + 0.02)
