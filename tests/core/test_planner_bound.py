"""The planner's miss bound must be sound: whatever it rejects, the estimator rejects too."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.core import (
    DEFAULT_CATALOG,
    BatchProfile,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    gamma_trace,
    simulate,
)
from inferline.core.estimator import spread_floor
from inferline.core.planning import MissBound

PIPE = Pipeline(
    "diamond",
    ("a", "b", "c", "d"),
    (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")),
    {"c": 0.4},
)
PROF = Profiles.from_latencies(
    {
        m: {
            "cpu": {b: base * 3 * b for b in (1, 2, 4)},
            "gpu-k80": {b: base * (1 + 0.3 * b) for b in (1, 2, 4)},
        }
        for m, base in zip(PIPE.models, (0.004, 0.01, 0.02, 0.006), strict=True)
    }
)
TRACES = {cv: gamma_trace(60.0, cv, 10.0, np.random.default_rng(int(cv))) for cv in (1.0, 4.0)}

config = st.builds(
    ModelConfig,
    st.sampled_from(["cpu", "gpu-k80"]),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 4),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfgs=st.tuples(config, config, config, config),
    cv=st.sampled_from([1.0, 4.0]),
    slo=st.sampled_from([0.03, 0.06, 0.1, 0.2]),
    pct=st.sampled_from([50.0, 90.0, 99.0]),
    seed=st.integers(0, 3),
    hop=st.sampled_from([0.0, 0.004]),
)
def test_bound_never_rejects_a_feasible_configuration(cfgs, cv, slo, pct, seed, hop):
    trace = TRACES[cv]
    configs = dict(zip(PIPE.models, cfgs, strict=True))
    bound = MissBound(PIPE, PROF, trace, slo, pct, seed, DEFAULT_CATALOG, hop_s=hop)
    opts = EstimatorOptions(seed=seed, hop_overhead_s=hop)
    res = simulate(PIPE, configs, PROF, trace, options=opts)
    if bound.infeasible(configs):
        assert res.percentile(pct) > slo
    # the miss count itself is a lower bound on the real misses
    misses = int(np.count_nonzero(res.latencies_s > slo))
    for m in PIPE.models:
        c = configs[m]
        cap = c.replicas * bound.peak_throughput(m, c.hardware, c.max_batch_size)
        assert bound.misses(m, cap) <= misses
    assert bound.best_latency_s(pct) <= res.percentile(pct) + 1e-12


# the same latencies with a wide spread: medians well below latency_s, a long p99
PROF_Q = Profiles(
    {
        m: {
            hw: {
                b: BatchProfile(bp.latency_s, p50_s=0.6 * bp.latency_s, p99_s=1.5 * bp.latency_s)
                for b, bp in by_b.items()
            }
            for hw, by_b in hws.items()
        }
        for m, hws in PROF.models.items()
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfgs=st.tuples(config, config, config, config),
    slo=st.sampled_from([0.05, 0.1, 0.3, 1.0]),
    pct=st.sampled_from([50.0, 90.0, 99.0]),
    seed=st.integers(0, 3),
)
def test_bound_on_the_spread_floor_never_rejects_what_the_spread_serves(cfgs, slo, pct, seed):
    """With drawn service times a batch can run faster than latency_s: the planner bounds on
    ``spread_floor`` profiles, which must stay sound."""
    trace = TRACES[1.0]
    configs = dict(zip(PIPE.models, cfgs, strict=True))
    bound = MissBound(PIPE, spread_floor(PROF_Q), trace, slo, pct, seed, DEFAULT_CATALOG)
    opts = EstimatorOptions(seed=seed, service_spread=True)
    res = simulate(PIPE, configs, PROF_Q, trace, options=opts)
    if bound.infeasible(configs):
        assert res.percentile(pct) > slo
    assert bound.best_latency_s(pct) <= res.percentile(pct) + 1e-12


def test_min_replicas_is_a_lower_bound_and_not_vacuous():
    trace = TRACES[4.0]
    slo = 0.05
    bound = MissBound(PIPE, PROF, trace, slo, 99.0, 0, DEFAULT_CATALOG)
    base = {m: ModelConfig("gpu-k80", 1, 8) for m in PIPE.models}
    r = bound.min_replicas("b", "cpu", 1, 64)
    assert r >= 2  # 60 q/s at 1/0.03 q/s per CPU replica needs at least two
    below = {**base, "b": ModelConfig("cpu", 1, r - 1)}
    res = simulate(PIPE, below, PROF, trace)
    assert res.percentile(99) > slo
    assert bound.min_replicas("b", "cpu", 1, 1) == 2  # over the cap: cap + 1


def test_threshold_matches_numpy_percentile():
    trace = np.arange(1000, dtype=float) * 0.01
    bound = MissBound(
        Pipeline.linear("x", ["a"]),
        Profiles.from_latencies({"a": {"cpu": {1: 0.001}}}),
        trace,
        0.1,
        99.0,
        0,
        DEFAULT_CATALOG,
    )
    # with T misses the 99th percentile (linear interpolation) is above the SLO, not with T-1
    lat = np.zeros(1000)
    lat[: bound.threshold] = 1.0
    assert np.percentile(lat, 99) > 0.1
    # T-1 misses (was T-2, which a threshold one too high also passed)
    lat[: bound.threshold - 1] = 1.0
    lat[bound.threshold - 1 :] = 0.0
    assert np.percentile(lat, 99) <= 0.1
