"""The planner's batch-wait timeouts (PlannerOptions(batch_wait=True)): chosen only where they
lower the cost, carried by the plan file, estimated as the independent SimPy model does."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from _simpy_reference import simpy_reference

from inferline.core import (
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    ValidationError,
    plan_inferline,
    simulate,
)

PIPE = Pipeline.linear("p", ["a"])
# a high per-batch cost (50 ms) next to 2 ms per query: small batches waste a replica
PROF = Profiles.from_latencies({"a": {"cpu": {b: 0.05 + 0.002 * b for b in (1, 2, 4, 8, 16, 32)}}})
TRACE = np.cumsum(np.random.default_rng(1).exponential(1 / 100, 6000))  # 100 q/s Poisson
OFF = PlannerOptions(rate_margin=0)
ON = PlannerOptions(rate_margin=0, batch_wait=True)


def _p99(configs: dict[str, ModelConfig]) -> float:
    return float(simulate(PIPE, configs, PROF, TRACE).percentile(99))


def test_a_wait_lowers_the_cost_where_greedy_batches_waste_replicas() -> None:
    slo = 0.11
    greedy = plan_inferline(PIPE, PROF, TRACE, slo, options=OFF)
    waited = plan_inferline(PIPE, PROF, TRACE, slo, options=ON)
    c = waited.models["a"]
    assert c.batch_wait_ms > 0
    assert waited.cost_per_hour < greedy.cost_per_hour - 1e-9
    assert c.replicas < greedy.models["a"].replicas
    assert _p99(dict(waited.models)) <= slo  # the plan meets the SLO with its wait ...
    assert _p99({"a": replace(c, batch_wait_ms=0.0)}) > slo  # ... and only with it
    assert waited.estimated_latency_s == pytest.approx(_p99(dict(waited.models)))


def test_no_wait_where_greedy_batching_is_as_cheap() -> None:
    slo = 0.3  # one replica suffices: nothing to save
    greedy = plan_inferline(PIPE, PROF, TRACE, slo, options=OFF)
    waited = plan_inferline(PIPE, PROF, TRACE, slo, options=ON)
    assert waited.models == greedy.models
    assert all(c.batch_wait_ms == 0 for c in waited.models.values())
    assert "batch_wait_ms" not in json.dumps(waited.to_dict())


def test_a_wait_the_user_set_in_the_estimator_options_stays_theirs() -> None:
    est = EstimatorOptions(batch_wait_s={"a": 0.001})
    plan = plan_inferline(PIPE, PROF, TRACE, 0.11, options=replace(ON, estimator=est))
    assert plan.models["a"].batch_wait_ms == 0  # not searched; the option's wait applies


def test_plan_files_carry_the_wait_and_old_ones_load() -> None:
    c = ModelConfig("cpu", 8, 2, 13.8)
    plan = Plan("p", 0.11, {"a": c})
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["models"]["a"]["batch_wait_ms"] == 13.8
    assert Plan.from_dict(d) == plan
    del d["models"]["a"]["batch_wait_ms"]  # a plan file from before: greedy batching
    assert Plan.from_dict(d).models["a"] == ModelConfig("cpu", 8, 2)
    for bad in (-1, "5", 1e9):
        d["models"]["a"]["batch_wait_ms"] = bad
        with pytest.raises(ValidationError) as e:
            Plan.from_dict(d)
        assert e.value.field == "models.a.batch_wait_ms"
    o = PlannerOptions(batch_wait=True)
    assert PlannerOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    with pytest.raises(ValidationError) as e:
        PlannerOptions.from_dict({"batch_wait": "yes"})
    assert e.value.field == "batch_wait"


def test_config_wait_wins_over_the_option_in_the_estimator() -> None:
    arr = np.array([0.0, 0.1, 0.2, 0.3, 2.0, 5.0])
    pr = Profiles.from_latencies({"a": {"cpu": {4: 1.0}}})
    opt = EstimatorOptions(batch_wait_s={"a": 0.05})
    by_cfg = simulate(PIPE, {"a": ModelConfig("cpu", 4, 1, 500.0)}, pr, arr, options=opt)
    by_opt = simulate(
        PIPE,
        {"a": ModelConfig("cpu", 4, 1)},
        pr,
        arr,
        options=EstimatorOptions(batch_wait_s={"a": 0.5}),
    )
    np.testing.assert_array_equal(by_cfg.latencies_s, by_opt.latencies_s)


_bench = simpy_reference


def test_planned_waits_agree_with_the_simpy_model() -> None:
    """The plan's configurations (waits in ModelConfig) estimated by the estimator and by the
    independent SimPy model (given the same waits as its options) on the planning trace."""
    bench = _bench()
    plan = plan_inferline(PIPE, PROF, TRACE, 0.11, options=ON)
    assert plan.models["a"].batch_wait_ms > 0
    arr = TRACE[:1500]
    ours = simulate(PIPE, dict(plan.models), PROF, arr).latencies_s
    waits = {m: c.batch_wait_s for m, c in plan.models.items()}
    plain = {m: replace(c, batch_wait_ms=0.0) for m, c in plan.models.items()}
    ref = bench.SimpyReference(
        PIPE, plain, PROF, arr, options=EstimatorOptions(batch_wait_s=waits)
    ).run()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9)
    greedy = simulate(PIPE, plain, PROF, arr).latencies_s
    assert not np.allclose(ours, greedy)  # the wait does change the schedule


def test_inferline_plan_writes_the_wait_and_no_batch_wait_turns_it_off(tmp_path, capsys) -> None:
    from inferline.cli import main
    from inferline.core import load_plan, save, save_trace

    save(PIPE, tmp_path / "p.json")
    save(PROF, tmp_path / "prof.json")
    save_trace(TRACE, tmp_path / "t.trace")
    base = ["plan", "--pipeline", str(tmp_path / "p.json"), "--profiles"]
    base += [str(tmp_path / "prof.json"), "--trace", str(tmp_path / "t.trace")]
    base += ["--slo-s", "0.11", "--rate-margin", "0", "--no-ladder", "-o"]
    assert main([*base, str(tmp_path / "on.json")]) == 0
    assert "batch wait ms" in capsys.readouterr().out
    assert main([*base, str(tmp_path / "off.json"), "--no-batch-wait"]) == 0
    on, off = load_plan(tmp_path / "on.json"), load_plan(tmp_path / "off.json")
    assert on.models["a"].batch_wait_ms > 0 and off.models["a"].batch_wait_ms == 0
    assert on.cost_per_hour < off.cost_per_hour


def test_ladder_steps_are_judged_with_and_carry_the_plan_s_waits() -> None:
    from inferline.core import plan_ladder

    plan = plan_inferline(PIPE, PROF, TRACE, 0.11, options=ON)
    steps = plan_ladder(PIPE, PROF, TRACE, plan, options=ON, factors=(1.5,), workers=1)
    assert steps and all(
        c.batch_wait_ms == plan.models["a"].batch_wait_ms for s in steps for c in s.models.values()
    )


def test_ladder_of_a_plan_without_waits_searches_none() -> None:
    """The live tuner keeps a model's policy: a step with a wait of its own would not run."""
    from inferline.core import plan_ladder

    plan = plan_inferline(PIPE, PROF, TRACE, 0.11, options=OFF)
    steps = plan_ladder(PIPE, PROF, TRACE, plan, options=ON, factors=(1.5, 2.0), workers=1)
    assert steps and all(c.batch_wait_ms == 0 for s in steps for c in s.models.values())
