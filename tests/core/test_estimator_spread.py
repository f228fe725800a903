"""The service spread (``EstimatorOptions.service_spread``): each batch's service time is drawn
from a log-normal through the profile's p50 and p99 for its size, clipped, seeded."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from inferline.core import (
    BatchProfile,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    plan_inferline,
    simulate,
)
from inferline.core.estimator import SPREAD_Z_CLIP, spread_floor, spread_params
from inferline.core.planning import PlannerCore

ONE = Pipeline("one", ("a",), ())
CFG = {"a": ModelConfig("cpu", 1, 1)}
SPREAD = EstimatorOptions(service_spread=True)


def prof(p50: float = 0.010, p99: float = 0.020, latency: float = 0.012) -> Profiles:
    return Profiles({"a": {"cpu": {1: BatchProfile(latency, p50_s=p50, p99_s=p99)}}})


def spaced(n: int, gap: float = 1.0) -> np.ndarray:
    """Arrivals far enough apart that no query waits: each latency is one service time."""
    return np.arange(n, dtype=float) * gap


def test_off_by_default_and_latency_s_is_what_a_batch_takes() -> None:
    res = simulate(ONE, CFG, prof(), spaced(50))
    assert np.allclose(res.latencies_s, 0.012, rtol=0, atol=1e-12)
    assert EstimatorOptions().service_spread is False


def test_draws_follow_the_profiled_median_and_p99() -> None:
    res = simulate(ONE, CFG, prof(), spaced(20_000), options=SPREAD)
    lat = res.latencies_s
    assert np.median(lat) == pytest.approx(0.010, rel=0.02)
    assert np.percentile(lat, 99) == pytest.approx(0.020, rel=0.05)
    # clipped at the 0.1th and 99.9th percentiles of the log-normal
    sigma = math.log(2.0) / NormalDist().inv_cdf(0.99)
    assert lat.min() >= 0.010 * math.exp(-SPREAD_Z_CLIP * sigma) * (1 - 1e-9)
    assert lat.max() <= 0.010 * math.exp(SPREAD_Z_CLIP * sigma) * (1 + 1e-9)
    assert lat.max() > 0.010 * math.exp(0.95 * SPREAD_Z_CLIP * sigma)  # the clip is reached
    # mean service 0.010 * exp(sigma^2 / 2), one query a second: the busy time says so too
    assert res.models["a"].utilization == pytest.approx(0.010 * math.exp(sigma**2 / 2), rel=0.02)


def test_seeded_and_a_different_seed_draws_differently() -> None:
    a = simulate(ONE, CFG, prof(), spaced(200), options=SPREAD).latencies_s
    b = simulate(ONE, CFG, prof(), spaced(200), options=SPREAD).latencies_s
    c = simulate(
        ONE, CFG, prof(), spaced(200), options=EstimatorOptions(service_spread=True, seed=1)
    ).latencies_s
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_one_draw_per_batch() -> None:
    """Two queries arriving together in one batch of 2 finish together."""
    p = Profiles(
        {"a": {"cpu": {1: BatchProfile(0.01, p50_s=0.01, p99_s=0.02)}}}
        | {"a": {"cpu": {2: BatchProfile(0.015, p50_s=0.015, p99_s=0.03)}}}
    )
    arr = np.repeat(spaced(100), 2)
    res = simulate(ONE, {"a": ModelConfig("cpu", 2, 1)}, p, arr, options=SPREAD)
    lat = res.latencies_s.reshape(-1, 2)
    assert np.array_equal(lat[:, 0], lat[:, 1])
    assert np.median(lat[:, 0]) == pytest.approx(0.015, rel=0.15)
    assert res.models["a"].mean_batch_size == 2.0


def test_sizes_without_both_quantiles_keep_latency_s() -> None:
    """Batch 1 has both quantiles, batch 2 only a p50: pairs take latency_s, singles draw."""
    p = Profiles(
        {
            "a": {
                "cpu": {
                    1: BatchProfile(0.01, p50_s=0.01, p99_s=0.02),
                    2: BatchProfile(0.015, p50_s=0.014),
                }
            }
        }
    )
    cfg = {"a": ModelConfig("cpu", 2, 1)}
    pairs = simulate(ONE, cfg, p, np.repeat(spaced(100), 2), options=SPREAD).latencies_s
    assert np.allclose(pairs, 0.015, rtol=0, atol=1e-12)
    singles = simulate(ONE, cfg, p, spaced(100), options=SPREAD).latencies_s
    assert np.unique(np.round(singles, 9)).size > 90
    assert spread_params(BatchProfile(0.01, p50_s=0.02, p99_s=0.02)) is None  # no spread


def test_profiles_without_quantiles_simulate_as_before() -> None:
    p = Profiles.from_latencies({"a": {"cpu": {1: 0.01, 2: 0.012}}})
    arr = gamma_trace(120.0, 2.0, 10.0, np.random.default_rng(0))
    cfg = {"a": ModelConfig("cpu", 2, 1)}
    a = simulate(ONE, cfg, p, arr).latencies_s
    b = simulate(ONE, cfg, p, arr, options=SPREAD).latencies_s
    assert np.array_equal(a, b)


def test_conditional_visits_do_not_change_with_the_spread() -> None:
    pipe = Pipeline("cond", ("a", "b"), (("a", "b"),), {"b": 0.3})
    p = Profiles.from_latencies({"a": {"cpu": {1: 0.001}}, "b": {"cpu": {1: 0.002}}})
    cfg = {m: ModelConfig("cpu", 1, 1) for m in ("a", "b")}
    arr = spaced(400, 0.05)
    off = simulate(pipe, cfg, p, arr)
    on = simulate(pipe, cfg, p, arr, options=SPREAD)
    assert np.array_equal(off.latencies_s, on.latencies_s)  # no quantiles: nothing drawn
    assert on.models["b"].visits == off.models["b"].visits


def test_options_round_trip_and_validation() -> None:
    o = EstimatorOptions(seed=2, service_spread=True)
    assert EstimatorOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    d = o.to_dict()
    del d["service_spread"]
    assert EstimatorOptions.from_dict(d).service_spread is False  # older files
    with pytest.raises(ValidationError, match="service_spread"):
        EstimatorOptions(service_spread="yes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="service_spread"):
        EstimatorOptions.from_dict({**o.to_dict(), "service_spread": 1})


def test_spread_floor_lowers_latency_to_the_shortest_draw() -> None:
    p = prof(p50=0.010, p99=0.020, latency=0.012)
    low = spread_floor(p).latency("a", "cpu", 1)
    sigma = math.log(2.0) / NormalDist().inv_cdf(0.99)
    assert low == pytest.approx(0.010 * math.exp(-SPREAD_Z_CLIP * sigma))
    assert spread_floor(Profiles.from_latencies({"a": {"cpu": {1: 0.01}}})).latency(
        "a", "cpu", 1
    ) == pytest.approx(0.01)


def test_planner_bound_does_not_prune_what_the_spread_serves() -> None:
    """latency_s 10 ms (100 q/s a replica) but a median of 4 ms: at 150 q/s one replica is
    enough with the spread. The bound on latency_s would rule it out; the planner's must not."""
    p = prof(p50=0.004, p99=0.008, latency=0.010)
    arr = gamma_trace(150.0, 1.0, 30.0, np.random.default_rng(3))
    one = {"a": ModelConfig("cpu", 1, 1)}
    off = PlannerCore(ONE, p, arr, 0.1)
    assert off.bound.infeasible(one)  # on latency_s it is hopeless
    on = PlannerCore(ONE, p, arr, 0.1, options=PlannerOptions(estimator=SPREAD))
    assert not on.bound.infeasible(one)
    assert on.feasible(one)
    plan = plan_inferline(ONE, p, arr, 0.1, options=PlannerOptions(estimator=SPREAD))
    assert plan.models["a"].replicas == 1
    assert plan_inferline(ONE, p, arr, 0.1).models["a"].replicas == 2
