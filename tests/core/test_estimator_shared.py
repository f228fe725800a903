"""Shared cores in the estimator (``EstimatorOptions.shared_units``): processor sharing among
the busy replicas of a pool, on hand-computed cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    ValidationError,
    simulate,
)


def prof(hw: str = "cpu", **lat: dict[int, float]) -> Profiles:
    return Profiles.from_latencies({m: {hw: t} for m, t in lat.items()})


def shared(units: float, **per_model: float) -> EstimatorOptions:
    return EstimatorOptions(shared_units={"cpu": units}, replica_units=per_model)


def close(a: np.ndarray, b: list[float]) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_two_replicas_on_one_core_share_it() -> None:
    p = Pipeline.linear("p", ["a"])
    c = {"a": ModelConfig("cpu", 1, 2)}
    pr = prof(a={1: 1.0})
    close(simulate(p, c, pr, np.array([0.0, 0.0])).latencies_s, [1.0, 1.0])
    r = simulate(p, c, pr, np.array([0.0, 0.0]), options=shared(1))
    close(r.latencies_s, [2.0, 2.0])
    # each replica was occupied for the whole 2 s, not for its 1 s of work
    assert r.models["a"].utilization == pytest.approx(1.0)
    # staggered: q0 runs alone for 0.5 s, then both at half speed until q0's last 0.5 s of
    # work is done (t = 1.5); q1 has done 0.5 by then and finishes alone at 2.0
    r = simulate(p, c, pr, np.array([0.0, 0.5]), options=shared(1))
    close(r.latencies_s, [1.5, 1.5])


def test_enough_units_change_nothing_on_a_random_dag() -> None:
    rng = np.random.default_rng(3)
    arr = np.cumsum(rng.exponential(0.004, 3000))
    p = Pipeline("d", ("a", "b", "c"), (("a", "b"), ("a", "c")))
    pr = prof(a={1: 0.003, 2: 0.004}, b={1: 0.006, 2: 0.008}, c={1: 0.002, 2: 0.003})
    c = {
        "a": ModelConfig("cpu", 2, 2),
        "b": ModelConfig("cpu", 2, 3),
        "c": ModelConfig("cpu", 1, 1),
    }
    base = simulate(p, c, pr, arr)
    same = simulate(p, c, pr, arr, options=shared(6))
    np.testing.assert_array_equal(same.latencies_s, base.latencies_s)
    fewer = simulate(p, c, pr, arr, options=shared(2))
    assert fewer.percentile(99) > 1.5 * base.percentile(99)
    assert fewer.percentile(50) > base.percentile(50)


def test_stages_of_a_pipeline_slow_each_other() -> None:
    # q0 alone on a [0, 1]; at 1 q0 on b and q1 on a share the core: both end at 3; q1 on b
    # alone from 3 to 4
    p = Pipeline.linear("p", ["a", "b"])
    c = {"a": ModelConfig("cpu", 1, 1), "b": ModelConfig("cpu", 1, 1)}
    pr = prof(a={1: 1.0}, b={1: 1.0})
    arr = np.array([0.0, 1.0])
    close(simulate(p, c, pr, arr).latencies_s, [2.0, 2.0])
    close(simulate(p, c, pr, arr, options=shared(1)).latencies_s, [3.0, 3.0])


def test_only_the_named_hardware_is_shared() -> None:
    p = Pipeline.linear("p", ["a", "b"])
    pr = Profiles.from_latencies({"a": {"cpu": {1: 1.0}}, "b": {"gpu-k80": {1: 1.0}}})
    c = {"a": ModelConfig("cpu", 1, 1), "b": ModelConfig("gpu-k80", 1, 1)}
    arr = np.array([0.0, 1.0])
    close(simulate(p, c, pr, arr, options=shared(1)).latencies_s, [2.0, 2.0])


def test_a_replica_takes_its_threads() -> None:
    # a takes 2 units, b 1, of 2: together they run at 2/3 speed
    p = Pipeline("d", ("a", "b"), ())
    c = {"a": ModelConfig("cpu", 1, 1), "b": ModelConfig("cpu", 1, 1)}
    pr = prof(a={1: 1.0}, b={1: 1.0})
    r = simulate(p, c, pr, np.array([0.0]), options=shared(2, a=2))
    close(r.latencies_s, [1.5])
    r = simulate(p, c, pr, np.array([0.0]), options=shared(2))
    close(r.latencies_s, [1.0])


def test_replicas_added_by_a_schedule_join_the_pool() -> None:
    # 40 replicas (more slots than the state starts with) on one core: 20 queries at once
    # each get 1/20 of it
    p = Pipeline.linear("p", ["a"])
    arr = np.full(20, 1.0)
    r = simulate(
        p,
        {"a": ModelConfig("cpu", 1, 1)},
        prof(a={1: 1.0}),
        arr,
        options=shared(1),
        schedule=[(0.5, "a", 40)],
    )
    close(r.latencies_s, [20.0] * 20)


def test_options_round_trip_and_reject_bad_units() -> None:
    o = EstimatorOptions(shared_units={"cpu": 2}, replica_units={"a": 4})
    assert EstimatorOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    with pytest.raises(ValidationError, match=r"shared_units\.cpu"):
        EstimatorOptions(shared_units={"cpu": 0})
    with pytest.raises(ValidationError, match=r"replica_units\.a"):
        EstimatorOptions.from_dict({"replica_units": {"a": "two"}})
    p = Pipeline.linear("p", ["a"])
    with pytest.raises(ValidationError, match=r"options\.shared_units.*tpu"):
        simulate(
            p,
            {"a": ModelConfig("cpu", 1, 1)},
            prof(a={1: 1.0}),
            np.array([0.0]),
            options=EstimatorOptions(shared_units={"tpu": 1}),
            catalog=DEFAULT_CATALOG,
        )


def pinned(cores: int) -> EstimatorOptions:
    return EstimatorOptions(pinned_cores={"cpu": cores})


def test_pinned_replicas_share_only_their_core() -> None:
    # a -> core 0, b -> core 1, c -> core 0 (least used, lowest on ties). q1 on a and q0 on c
    # share core 0 from 2 to 4; one pool of 2 cores would not slow them
    p = Pipeline.linear("p", ["a", "b", "c"])
    c = {m: ModelConfig("cpu", 1, 1) for m in "abc"}
    pr = prof(a={1: 1.0}, b={1: 1.0}, c={1: 1.0})
    arr = np.array([0.0, 2.0])
    close(simulate(p, c, pr, arr, options=pinned(2)).latencies_s, [4.0, 4.0])
    close(simulate(p, c, pr, arr, options=shared(2)).latencies_s, [3.0, 3.0])
    close(simulate(p, c, pr, arr, options=pinned(3)).latencies_s, [3.0, 3.0])


def test_pinning_follows_scaling_and_frees_removed_replicas() -> None:
    # 3 cores: a -> 0, b -> 1; a's second replica -> 2, removed, requested again -> 2 (its
    # core was freed), so the two a replicas do not share
    p = Pipeline("d", ("a", "b"), ())
    c = {"a": ModelConfig("cpu", 1, 1), "b": ModelConfig("cpu", 1, 1)}
    pr = prof(a={1: 1.0}, b={1: 1.0})
    arr = np.array([1.0, 1.0])
    sched = [(0.5, "a", 2), (0.6, "a", 1), (0.7, "a", 2)]
    r = simulate(p, c, pr, arr, options=pinned(3), schedule=sched)
    close(r.latencies_s, [1.0, 2.0])  # b serves q0 then q1
    # on 2 cores the second a replica lands on core 0 with the first: they share it
    r = simulate(p, c, pr, arr, options=pinned(2), schedule=sched[:1])
    close(r.latencies_s, [2.0, 2.0])


def test_pinned_and_shared_are_exclusive() -> None:
    with pytest.raises(ValidationError, match=r"pinned_cores\.cpu"):
        EstimatorOptions(shared_units={"cpu": 2}, pinned_cores={"cpu": 2})
    o = EstimatorOptions(pinned_cores={"cpu": 2})
    assert EstimatorOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o


# -- the planner on shared cores ---------------------------------------------------------------
def _three_stages() -> tuple[Pipeline, Profiles]:
    fast = {1: 0.002, 2: 0.0025, 4: 0.003}
    slow = {1: 0.010, 2: 0.012, 4: 0.015}
    return Pipeline.linear("p", ["a", "b", "c"]), prof(a=fast, b=fast, c=slow)


def test_a_plan_for_pinned_cores_meets_the_slo_where_the_own_core_plan_does_not() -> None:
    from inferline.core import PlannerOptions, gamma_trace, plan_inferline, simulate_plan

    p, pr = _three_stages()
    trace = gamma_trace(40.0, 1.0, 30.0, np.random.default_rng(0))
    pin = pinned(2)
    own = plan_inferline(p, pr, trace, 0.03)
    on_two = plan_inferline(p, pr, trace, 0.03, options=PlannerOptions(estimator=pin))
    # three replicas on two cores: c shares core 0 with a, which the own-core plan ignores
    assert simulate_plan(p, own, pr, trace, options=pin).percentile(99) > 0.03
    assert simulate_plan(p, on_two, pr, trace, options=pin).percentile(99) <= 0.03
    assert on_two.estimated_latency_s <= 0.03
    assert on_two.cost_per_hour >= own.cost_per_hour


def test_the_planner_stops_at_the_shared_cores_and_says_so() -> None:
    from inferline.core import InfeasibleError, PlannerOptions, gamma_trace, plan_inferline

    # 120 q/s of a 20 ms model needs 2.4 cores: however many replicas share two, no plan
    p = Pipeline.linear("p", ["a"])
    trace = gamma_trace(120.0, 1.0, 10.0, np.random.default_rng(0))
    opts = PlannerOptions(estimator=pinned(2))
    with pytest.raises(InfeasibleError, match=r"cpu: 2 shared cores, 32 replicas"):
        plan_inferline(p, prof(a={1: 0.02}), trace, 0.2, options=opts)
    plan = plan_inferline(
        p, prof(a={1: 0.02}), trace, 0.2, options=PlannerOptions(estimator=pinned(3))
    )
    assert plan.models["a"].replicas == 3
