"""Hypothesis properties of the estimator, and agreement with the independent SimPy model."""

from __future__ import annotations

import numpy as np
import pytest
from _simpy_reference import simpy_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.core import (
    BatchProfile,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    WakeProfile,
    draw_visits,
    simulate,
)

SHAPES = {
    "linear": Pipeline.linear("linear", ["a", "b", "c"]),
    "diamond": Pipeline(
        "diamond", ("a", "b", "c", "d"), (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))
    ),
    "conditional": Pipeline(
        "conditional",
        ("a", "b", "c", "d"),
        (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")),
        {"b": 0.6, "c": 0.3},
    ),
    "two-roots": Pipeline("two-roots", ("a", "b", "c"), (("a", "c"), ("b", "c")), {"b": 0.5}),
}
BATCHES = (1, 2, 4, 8)
GRID = 64.0  # times on a 2^-6 s grid make events of different origins coincide


@st.composite
def systems(draw: st.DrawFn, grid: bool = False):  # type: ignore[no-untyped-def]
    """A pipeline, monotone batch profiles, configs and a short trace."""
    p = SHAPES[draw(st.sampled_from(sorted(SHAPES)))]
    table = {}
    configs = {}
    for m in p.models:
        lat1 = draw(st.integers(1, 12)) / GRID
        lats, cur = {}, lat1
        for b in BATCHES:  # non-decreasing in b, sub-linear on average
            cur += draw(st.integers(0, 6)) / GRID if b > 1 else 0.0
            lats[b] = cur
        table[m] = {"cpu": lats}
        configs[m] = ModelConfig("cpu", draw(st.sampled_from(BATCHES)), draw(st.integers(1, 3)))
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.integers(0, 16), min_size=n, max_size=n))
    arr = np.cumsum(np.array(gaps, dtype=np.float64)) / GRID
    if not grid:  # off the grid as well: irregular float times
        arr = arr + draw(st.floats(0.0, 1.0)) * np.arange(n) * 1e-3
    seed = draw(st.integers(0, 2**16))
    return p, Profiles.from_latencies(table), configs, arr, seed


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(systems(), st.sampled_from([0.0, 1 / GRID]))
def test_no_query_beats_its_critical_path(system, hop) -> None:  # type: ignore[no-untyped-def]
    p, prof, configs, arr, seed = system
    opt = EstimatorOptions(hop_overhead_s=hop, seed=seed)
    r = simulate(p, configs, prof, arr, options=opt)
    vis = draw_visits(p, arr.size, seed).astype(bool)
    pos = {m: j for j, m in enumerate(p.topological_order)}
    for i in range(arr.size):
        # longest path through visited models, each costing hop + its batch-1 latency
        best: dict[str, float] = {}
        for m in p.topological_order:
            if not vis[i, pos[m]]:
                continue
            before = max((best[q] for q in p.parents[m] if q in best), default=0.0)
            best[m] = before + hop + prof.latency(m, "cpu", 1)
        bound = max(best.values(), default=0.0)
        assert r.latencies_s[i] >= bound - 1e-12


@FAST
@given(st.lists(st.integers(0, 40), min_size=1, max_size=80), st.integers(1, 4), st.integers(1, 20))
def test_single_model_batch_one_more_replicas_never_later(gaps, replicas, lat) -> None:  # type: ignore[no-untyped-def]
    arr = np.cumsum(np.array(gaps, dtype=np.float64)) / GRID
    p = Pipeline.linear("p", ["a"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: lat / GRID}}})
    fewer = simulate(p, {"a": ModelConfig("cpu", 1, replicas)}, prof, arr).latencies_s
    more = simulate(p, {"a": ModelConfig("cpu", 1, replicas + 1)}, prof, arr).latencies_s
    assert np.all(more <= fewer + 1e-12)


@settings(max_examples=25, deadline=None)
@given(systems())
def test_same_seed_same_result(system) -> None:  # type: ignore[no-untyped-def]
    p, prof, configs, arr, seed = system
    opt = EstimatorOptions(seed=seed, batch_wait_s={"a": 2 / GRID})
    a = simulate(p, configs, prof, arr, options=opt)
    b = simulate(p, configs, prof, arr.copy(), options=opt)
    np.testing.assert_array_equal(a.latencies_s, b.latencies_s)
    assert a.models == b.models and a.cost_per_hour == b.cost_per_hour


def test_different_seeds_change_conditional_visits() -> None:
    p = SHAPES["conditional"]
    prof = Profiles.from_latencies({m: {"cpu": {1: 0.01}} for m in p.models})
    cfg = {m: ModelConfig("cpu", 1, 1) for m in p.models}
    arr = np.arange(200) * 0.1
    a = simulate(p, cfg, prof, arr, options=EstimatorOptions(seed=1))
    b = simulate(p, cfg, prof, arr, options=EstimatorOptions(seed=2))
    assert not np.array_equal(a.latencies_s, b.latencies_s)


# -- agreement with the SimPy model of benchmarks/estimator.py --------------------------------
_bench = simpy_reference


@pytest.mark.parametrize("case", range(10))
def test_benchmark_cases_agree_with_simpy(case: int) -> None:
    bench = _bench()
    r = bench.compare(bench.CASES[case], 8.0)
    assert r["max_abs_diff_s"] <= 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    systems(grid=True),
    st.sampled_from([0.0, 1 / GRID]),
    st.sampled_from([0.0, 3 / GRID]),
    st.sampled_from([0.0, 8 / GRID]),
    st.lists(st.tuples(st.integers(0, 64), st.sampled_from("abcd"), st.integers(0, 3)), max_size=4),
    st.sampled_from([None, WakeProfile((4 / GRID, 32 / GRID), (1 / GRID, 3 / GRID))]),
    st.booleans(),
    st.sampled_from([{}, {}, {"b": 2.0}, {"a": 1.5, "c": 3.0}, {"d": 2.25}]),
)
def test_random_systems_agree_with_simpy(
    system, hop, wait, delay, sched, wake, spread, visits
) -> None:  # type: ignore[no-untyped-def]
    bench = _bench()
    p, prof, configs, arr, seed = system
    visits = {m: v for m, v in visits.items() if m in p.models}  # repeated calls
    p = Pipeline(p.name, p.models, p.edges, p.scale_factors, visits)
    if spread:  # service times drawn between p50 0.7x and p99 1.8x of latency_s (odd models)
        prof = Profiles(
            {
                m: {
                    h: {
                        b: BatchProfile(
                            bp.latency_s, p50_s=0.7 * bp.latency_s, p99_s=1.8 * bp.latency_s
                        )
                        if i % 2
                        else bp
                        for b, bp in bs.items()
                    }
                    for h, bs in prof.models[m].items()
                }
                for i, m in enumerate(p.models)
            }
        )
    if wake is not None:  # every model wakes up slower after idle time
        prof = Profiles(prof.models, {m: {configs[m].hardware: wake} for m in p.models})
    schedule = [(t / GRID, m, n) for t, m, n in sched if m in p.models]
    opt = EstimatorOptions(
        hop_overhead_s=hop,
        batch_wait_s={m: wait for m in p.models[::2]},
        activation_delay_s=delay,
        seed=seed,
        service_spread=spread,
    )
    ours = simulate(p, configs, prof, arr, options=opt, schedule=schedule).latencies_s
    ref = bench.SimpyReference(p, configs, prof, arr, options=opt, schedule=schedule).run()
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
    fin = np.isfinite(ours)
    np.testing.assert_allclose(ours[fin], ref[fin], rtol=0, atol=1e-9)
