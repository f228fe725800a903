"""Exact event traces of the estimator on small hand-computed cases (docs/design.md contract)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    ModelConfig,
    ModelSimStats,
    Pipeline,
    Plan,
    Profiles,
    SystemState,
    ValidationError,
    draw_visits,
    simulate,
    simulate_plan,
)

CPU = DEFAULT_CATALOG.cost("cpu")


def prof(**lat: dict[int, float]) -> Profiles:
    return Profiles.from_latencies({m: {"cpu": t} for m, t in lat.items()})


def cfg(b: int = 1, r: int = 1) -> ModelConfig:
    return ModelConfig("cpu", b, r)


def close(a: np.ndarray, b: list[float]) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


# -- single model ----------------------------------------------------------------------------
def test_one_replica_batch_one_is_lindley() -> None:
    p = Pipeline.linear("p", ["a"])
    arr = np.array([0.0, 0.5, 0.75, 3.0, 3.0])
    r = simulate(p, {"a": cfg()}, prof(a={1: 1.0}), arr)
    close(r.latencies_s, [1.0, 1.5, 2.25, 1.0, 2.0])
    s = r.models["a"]
    assert (s.visits, s.batches, s.mean_batch_size) == (5, 5, 1.0)
    assert s.mean_queue_delay_s == pytest.approx((0 + 0.5 + 1.25 + 0 + 1) / 5)
    assert s.utilization == pytest.approx(1.0)  # busy from 0 to 5 without a gap
    assert r.cost_per_hour == pytest.approx(CPU)


def test_lindley_recursion_on_a_random_trace() -> None:
    rng = np.random.default_rng(7)
    arr = np.cumsum(rng.exponential(0.01, 2000))
    s = 0.009
    r = simulate(Pipeline.linear("p", ["a"]), {"a": cfg()}, prof(a={1: s}), arr)
    fin = np.empty_like(arr)
    prev = -np.inf
    for i, a in enumerate(arr):
        prev = max(a, prev) + s  # same float operations as the event loop
        fin[i] = prev
    np.testing.assert_array_equal(r.latencies_s, fin - arr)


def test_batching_takes_everything_queued_up_to_max() -> None:
    # b=3 is not profiled: it costs the latency of b=4
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 1.0, 2: 1.5, 4: 2.0})
    arr = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 2.5])
    r = simulate(p, {"a": cfg(b=4)}, pr, arr)
    # 0: [q0] -> 1.0; 1.0: [q1..q4] -> 3.0; 3.0: [q5] -> 4.0
    close(r.latencies_s, [1.0, 2.9, 2.8, 2.7, 2.6, 1.5])
    assert r.models["a"].batches == 3
    assert r.models["a"].mean_batch_size == 2.0
    r = simulate(p, {"a": cfg(b=4)}, pr, np.array([0.0, 0.1, 0.2, 0.3]))
    close(r.latencies_s, [1.0, 2.9, 2.8, 2.7])  # batch of 3 at 1.0 takes 2.0


# -- DAGs ------------------------------------------------------------------------------------
def diamond() -> Pipeline:
    return Pipeline("d", ("a", "b", "c", "d"), (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")))


def test_fan_out_and_join_wait_for_the_last_parent() -> None:
    pr = prof(a={1: 1.0}, b={1: 1.0}, c={1: 3.0}, d={1: 1.0})
    cf = {m: cfg() for m in "abcd"}
    r = simulate(diamond(), cf, pr, np.array([0.0]))
    close(r.latencies_s, [5.0])  # a 0-1, b 1-2, c 1-4, d 4-5
    r = simulate(diamond(), cf, pr, np.array([0.0, 0.0]))
    # a: q0 0-1, q1 1-2; c: q0 1-4, q1 4-7; d: q0 4-5, q1 7-8
    close(r.latencies_s, [5.0, 8.0])
    assert r.models["d"].mean_queue_delay_s == 0.0


def test_edf_reorders_at_a_downstream_model() -> None:
    # a: 2 replicas, {1: 1, 4: 3}; c: 1 replica, 2 s per query.
    p = Pipeline.linear("p", ["a", "c"])
    pr = prof(a={1: 1.0, 4: 3.0}, c={1: 2.0})
    arr = np.array([0.0, 0.0, 0.5, 0.6])
    r = simulate(p, {"a": cfg(b=4, r=2), "c": cfg()}, pr, arr)
    # a: [q0,q1] 0-3, [q2] 0.5-1.5, [q3] 1.5-2.5
    # c: q2 1.5-3.5; q3 enters at 2.5, q0 and q1 at 3; at 3.5 EDF picks q0 then q1, then q3
    close(r.latencies_s, [5.5, 7.5, 3.0, 8.9])


def test_same_instant_batch_is_handed_on_whole() -> None:
    p = Pipeline.linear("p", ["a", "b"])
    pr = prof(a={8: 1.0}, b={1: 0.5, 8: 2.0})
    r = simulate(p, {"a": cfg(b=8), "b": cfg(b=8)}, pr, np.zeros(8))
    close(r.latencies_s, [3.0] * 8)  # b takes all 8 at t=1, not one
    assert r.models["b"].batches == 1


def test_arrivals_and_completions_apply_before_a_batch_starts() -> None:
    p = Pipeline.linear("p", ["a"])
    r = simulate(p, {"a": cfg(b=2)}, prof(a={1: 1.0, 2: 1.0}), np.array([0.0, 1.0, 1.0]))
    close(r.latencies_s, [1.0, 1.0, 1.0])  # at t=1 the freed replica takes both arrivals
    assert r.models["a"].batches == 2


# -- conditional visits ----------------------------------------------------------------------
def test_conditional_visits_follow_the_seeded_draws() -> None:
    p = Pipeline("c", ("a", "b"), (("a", "b"),), {"b": 0.5})
    arr = np.arange(2000) * 10.0  # no queueing
    pr = prof(a={1: 1.0}, b={1: 1.0})
    r = simulate(p, {"a": cfg(), "b": cfg()}, pr, arr, options=EstimatorOptions(seed=11))
    rng = np.random.default_rng(11)
    rng.random(arr.size)  # draw of the root a
    visits_b = rng.random(arr.size) < 0.5
    close(r.latencies_s, list(np.where(visits_b, 2.0, 1.0)))
    assert r.models["b"].visits == int(visits_b.sum())
    assert 0.45 < visits_b.mean() < 0.55
    vis = draw_visits(p, arr.size, 11)
    np.testing.assert_array_equal(vis[:, 1].astype(bool), visits_b)


def test_root_scale_factor_and_queries_visiting_nothing() -> None:
    p = Pipeline("c", ("a", "b"), (("a", "b"),), {"a": 0.3})
    arr = np.arange(500) * 10.0
    r = simulate(p, {"a": cfg(), "b": cfg()}, prof(a={1: 1.0}, b={1: 1.0}), arr)
    vis = draw_visits(p, arr.size, 0)
    np.testing.assert_array_equal(vis[:, 0], vis[:, 1])  # b's visit probability is 1 given a
    close(r.latencies_s, list(np.where(vis[:, 0], 2.0, 0.0)))


def test_join_with_a_skipped_parent_waits_only_for_visited_ones() -> None:
    p = Pipeline(
        "j", ("a", "b", "c"), (("a", "b"), ("a", "c"), ("b", "c")), {"b": 0.5}
    )  # c joins a and the conditional b
    arr = np.arange(200) * 10.0
    pr = prof(a={1: 1.0}, b={1: 2.0}, c={1: 1.0})
    r = simulate(p, {m: cfg() for m in "abc"}, pr, arr, options=EstimatorOptions(seed=2))
    vb = draw_visits(p, arr.size, 2)[:, 1].astype(bool)
    assert 0 < vb.sum() < arr.size
    close(r.latencies_s, list(np.where(vb, 4.0, 2.0)))


# -- options ---------------------------------------------------------------------------------
def test_hop_overhead_before_every_queue() -> None:
    p = Pipeline.linear("p", ["a", "b"])
    r = simulate(
        p,
        {"a": cfg(), "b": cfg()},
        prof(a={1: 1.0}, b={1: 1.0}),
        np.array([0.0]),
        options=EstimatorOptions(hop_overhead_s=0.25),
    )
    close(r.latencies_s, [2.5])  # a 0.25-1.25, b 1.5-2.5
    assert r.models["b"].mean_queue_delay_s == 0.0


def test_batch_wait_until_full_or_oldest_waited() -> None:
    p = Pipeline.linear("p", ["a"])
    opt = EstimatorOptions(batch_wait_s={"a": 0.5})
    pr = prof(a={4: 1.0})
    arr = np.array([0.0, 0.1, 0.2, 0.3, 2.0, 5.0])
    r = simulate(p, {"a": cfg(b=4)}, pr, arr, options=opt)
    # fills at 0.3 -> 1.3; q4 waits 2.0-2.5 -> 3.5; q5 5.5 -> 6.5
    close(r.latencies_s, [1.3, 1.2, 1.1, 1.0, 1.5, 1.5])
    r = simulate(p, {"a": cfg(b=4)}, pr, np.array([0.0, 0.4]), options=opt)
    close(r.latencies_s, [1.5, 1.1])  # the oldest (q0) has waited 0.5 at t=0.5
    # the timer counts from entering the queue, while the replica is busy too
    arr = np.array([0.0, 0.1, 0.2, 0.3, 0.35, 1.6])
    r = simulate(p, {"a": cfg(b=4)}, pr, arr, options=opt)
    # [q0..q3] 0.3-1.3; q4 (entered 0.35) has waited past 0.5 when the replica frees at 1.3
    close(r.latencies_s, [1.3, 1.2, 1.1, 1.0, 1.95, 1.7])  # q5 waits for 2.3


def test_schedule_with_activation_delay_and_cost() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 1.0})
    opt = EstimatorOptions(activation_delay_s=1.0)
    arr = np.array([0.0, 0.1, 0.2, 0.3, 10.0])
    r = simulate(p, {"a": cfg()}, pr, arr, options=opt, schedule=[(0.5, "a", 2)])
    # second replica requested at 0.5, serves from 1.5: q0 0-1, q1 1-2, q2 1.5-2.5, q3 2-3
    close(r.latencies_s, [1.0, 1.9, 2.3, 2.7, 1.0])
    assert r.replica_timeline == ((0.0, "a", 1), (1.5, "a", 2))
    # billed: one replica over [0, 10] plus one from 0.5 to 10
    assert r.cost_per_hour == pytest.approx(CPU * (10 + 9.5) / 10)


def test_scale_down_lets_the_busy_replica_finish_its_batch() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 2.0})
    arr = np.array([0.0, 0.0, 0.5, 0.6, 10.0])
    r = simulate(p, {"a": cfg(r=2)}, pr, arr, schedule=[(1.0, "a", 1)])
    # both batches started before 1.0 finish at 2; then one replica: q2 2-4, q3 4-6
    close(r.latencies_s, [2.0, 2.0, 3.5, 5.4, 2.0])
    assert r.replica_timeline == ((0.0, "a", 2), (1.0, "a", 1))
    # the retired replica is billed until its batch ends at 2
    assert r.cost_per_hour == pytest.approx(CPU * (10 + 2) / 10)


def test_scale_down_retires_the_replica_finishing_soonest_and_idle_first() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 2.0})
    arr = np.array([0.0, 0.5, 0.6])
    r = simulate(p, {"a": cfg(r=2)}, pr, arr, schedule=[(1.0, "a", 1)])
    # r1 0-2 (retired at 1.0, finishing soonest), r2 0.5-2.5 then q2 2.5-4.5
    close(r.latencies_s, [2.0, 2.0, 3.9])
    # with an idle replica, that one goes first: q2 then waits for r1 (free at 2), q3 for r2
    arr = np.array([0.0, 0.5, 1.5, 1.6])
    r = simulate(p, {"a": cfg(r=3)}, pr, arr, schedule=[(1.0, "a", 2)])
    close(r.latencies_s, [2.0, 2.0, 2.5, 2.9])


def test_cancel_pending_replica_before_it_activates() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 1.0})
    opt = EstimatorOptions(activation_delay_s=2.0)
    arr = np.array([0.0, 0.1, 10.0])
    r = simulate(p, {"a": cfg()}, pr, arr, options=opt, schedule=[(0.5, "a", 2), (1.0, "a", 1)])
    close(r.latencies_s, [1.0, 1.9, 1.0])
    assert r.replica_timeline == ((0.0, "a", 1),)  # never served
    assert r.cost_per_hour == pytest.approx(CPU * (10 + 0.5) / 10)


def test_starved_model_gives_infinite_latency_until_replicas_arrive() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 1.0})
    arr = np.array([0.0, 1.0])
    r = simulate(p, {"a": cfg(r=0)}, pr, arr, schedule=[(5.0, "a", 1)])
    close(r.latencies_s, [6.0, 6.0])
    r = simulate(p, {"a": cfg(r=1)}, pr, arr, schedule=[(0.5, "a", 0)])
    assert r.latencies_s[0] == 1.0 and np.isinf(r.latencies_s[1])
    assert r.miss_rate(10.0) == 0.5


# -- controller ------------------------------------------------------------------------------
class Recorder:
    interval_s = 0.5

    def __init__(self) -> None:
        self.calls: list[tuple[float, list[float], SystemState]] = []

    def observe(self, now_s: float, new_arrivals: np.ndarray, state: SystemState):  # type: ignore[no-untyped-def]
        self.calls.append((now_s, list(new_arrivals), state))
        return {"a": 2} if now_s == 1.0 else None


def test_controller_sees_state_and_its_decisions_apply() -> None:
    p = Pipeline.linear("p", ["a"])
    ctl = Recorder()
    opt = EstimatorOptions(activation_delay_s=0.5)
    arr = np.array([0.0, 0.5, 1.0, 2.5])
    r = simulate(p, {"a": cfg()}, prof(a={1: 3.0}), arr, options=opt, controller=ctl)
    # q0 0-3 on r1; r2 serves from 1.5: q1 1.5-4.5; q2 3-6 on r1; q3 4.5-7.5 on r2
    close(r.latencies_s, [3.0, 4.0, 5.0, 5.0])
    times = [c[0] for c in ctl.calls]
    assert times == [0.5 * k for k in range(1, 16)]  # stops once every query finished (7.5)
    by_t = {c[0]: c for c in ctl.calls}
    _, new, s = by_t[0.5]
    assert new == [0.0]  # the arrival at 0.5 itself is not applied yet
    assert (s.queued["a"], s.in_service["a"], s.in_system) == (0, 1, 1)
    _, new, s = by_t[1.0]
    assert new == [0.5]
    assert (s.queued["a"], s.in_service["a"], s.active_replicas["a"], s.pending_replicas["a"]) == (
        1,
        1,
        1,
        0,
    )
    _, new, s = by_t[1.5]
    assert new == [1.0] and s.pending_replicas["a"] == 1 and s.active_replicas["a"] == 1
    assert s.queued["a"] == 2
    _, new, s = by_t[2.0]
    assert new == [] and s.active_replicas["a"] == 2 and s.pending_replicas["a"] == 0
    assert (s.queued["a"], s.in_service["a"], s.in_system) == (1, 2, 3)
    _, new, s = by_t[3.0]
    assert new == [2.5] and (s.queued["a"], s.in_service["a"], s.in_system) == (2, 2, 4)
    assert r.replica_timeline == ((0.0, "a", 1), (1.5, "a", 2))
    assert s.now_s == 3.0


def test_controller_bad_model_name_is_a_validation_error() -> None:
    class Bad:
        interval_s = 1.0

        def observe(self, now_s, new_arrivals, state):  # type: ignore[no-untyped-def]
            return {"zzz": 1}

    with pytest.raises(ValidationError, match="zzz"):
        simulate(
            Pipeline.linear("p", ["a"]),
            {"a": cfg()},
            prof(a={1: 1.0}),
            np.arange(5.0),
            controller=Bad(),
        )


# -- validation, formats ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("configs", "arr", "field"),
    [
        ({}, [0.0], "configs.a"),
        ({"a": ModelConfig("cpu", 4, 1)}, [0.0], "configs.a.max_batch_size"),
        ({"a": ModelConfig("tpu", 1, 1)}, [0.0], "configs.a.hardware"),
        ({"a": ModelConfig("gpu-k80", 1, 1)}, [0.0], "configs.a.hardware"),
        ({"a": ModelConfig("cpu", 1, 0)}, [0.0], "configs.a.replicas"),
        ({"a": ModelConfig("cpu", 1, 1), "x": cfg()}, [0.0], "configs"),
        ({"a": ModelConfig("cpu", 1, 1)}, [1.0, 0.5], "arrivals"),
        ({"a": ModelConfig("cpu", 1, 1)}, [0.0, float("nan")], "arrivals"),
    ],
)
def test_validation_names_the_field(configs, arr, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as e:
        simulate(Pipeline.linear("p", ["a"]), configs, prof(a={1: 1.0, 2: 1.5}), np.array(arr))
    assert e.value.field == field


def test_validation_of_options_and_schedule() -> None:
    p = Pipeline.linear("p", ["a"])
    pr = prof(a={1: 1.0})
    with pytest.raises(ValidationError) as e:
        simulate(p, {"a": cfg()}, pr, np.zeros(1), options=EstimatorOptions(batch_wait_s={"b": 1}))
    assert e.value.field == "options.batch_wait_s"
    with pytest.raises(ValidationError) as e:
        simulate(p, {"a": cfg()}, pr, np.zeros(1), schedule=[(1.0, "b", 1)])
    assert e.value.field == "schedule[0][1]"
    with pytest.raises(ValidationError) as e:
        EstimatorOptions(hop_overhead_s=-1)
    assert e.value.field == "hop_overhead_s"
    # zero replicas with no traffic is fine
    q = Pipeline("q", ("a", "b"), (("a", "b"),), {"b": 0.01})
    r = simulate(q, {"a": cfg(), "b": cfg(r=0)}, prof(a={1: 1.0}, b={1: 1.0}), np.zeros(3))
    assert r.models["b"].visits == 0


def test_round_trips_and_summary_is_json() -> None:
    o = EstimatorOptions(0.001, {"a": 0.002}, 0.5, 3)
    assert EstimatorOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    st = ModelSimStats(3, 2, 1.5, 0.25, 0.01, 0.02)
    assert ModelSimStats.from_dict(json.loads(json.dumps(st.to_dict()))) == st
    p = Pipeline.linear("p", ["a"])
    r = simulate(p, {"a": cfg()}, prof(a={1: 1.0}), np.array([0.0, 0.5, 0.75, 3.0, 3.0]))
    s = json.loads(json.dumps(r.summary(1.5, 99.0)))
    assert set(s) == {"latency_p99_s", "slo_miss_rate", "cost_per_hour", "queries", "models"}
    assert s["latency_p99_s"] == pytest.approx(np.percentile([1.0, 1.5, 2.25, 1.0, 2.0], 99))
    assert s["slo_miss_rate"] == 0.4 and s["queries"] == 5
    assert "latency_p99.9_s" in r.summary(1.0, 99.9)
    plan = Plan("p", 1.0, {"a": cfg()})
    r2 = simulate_plan(p, plan, prof(a={1: 1.0}), np.array([0.0, 0.5, 0.75, 3.0, 3.0]))
    np.testing.assert_array_equal(r.latencies_s, r2.latencies_s)


def test_empty_trace() -> None:
    r = simulate(Pipeline.linear("p", ["a"]), {"a": cfg()}, prof(a={1: 1.0}), np.zeros(0))
    assert r.latencies_s.size == 0 and r.percentile() == 0.0 and r.miss_rate(1.0) == 0.0
