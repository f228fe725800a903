"""Early stop (``simulate(stop=EarlyStop(...))``, core/estimator/_stop.py): the allowance is
numpy's percentile threshold exactly; on random systems (the generators of the estimator's
property and server-batcher tests) the verdict equals the full run's, a run that does not stop
is the full run bit for bit, and a run that stops has counted more misses than allowed, all of
them misses of the full run, and agrees with it on every query finished before the stop."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_estimator_props import GRID, systems
from test_server_batchers import systems as server_systems

from inferline.core import EstimatorOptions, ModelConfig, Pipeline, Profiles, ValidationError
from inferline.core.estimator import EarlyStop, SimResult, miss_allowance, simulate

PCTS = st.one_of(st.sampled_from([0.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]), st.floats(0, 100))


def _slo(full: SimResult, u: float, nudge: int) -> float:
    """An SLO near a latency of the full run (ties included), so verdicts are close calls."""
    fin = np.sort(full.latencies_s[np.isfinite(full.latencies_s)])
    base = float(fin[int(u * (fin.size - 1))]) if fin.size else 0.1
    return max(0.0, base + nudge / (4 * GRID))


def _same(a: SimResult, b: SimResult) -> None:
    np.testing.assert_array_equal(a.latencies_s, b.latencies_s)
    assert a.models == b.models and a.cost_per_hour == b.cost_per_hour
    assert a.replica_timeline == b.replica_timeline
    np.testing.assert_array_equal(a.rejected, b.rejected)
    np.testing.assert_array_equal(a.refused, b.refused)


def _check(full: SimResult, es: SimResult, slo: float, pct: float, static: bool = True) -> None:
    """The early-stopped run ``es`` against the full run (drops are misses)."""
    feasible = full.percentile(pct) <= slo
    assert (es.percentile(pct) <= slo) == feasible
    misses = int(np.count_nonzero(full.latencies_s > slo))
    allow = miss_allowance(full.latencies_s.size, pct)
    assert es.certain_misses is not None and es.certain_misses <= misses
    if not es.stopped_early:
        assert es.stopped_at_s is None
        _same(es, full)
        return
    assert not feasible and allow < es.certain_misses
    # it stopped no later than the full run's last event (static and without drops: the last
    # arrival or finish), and agrees on what finished before
    assert es.stopped_at_s is not None
    if static and not (full.rejected.any() or full.refused.any()):
        fin = full.latencies_s + full.arrivals_s
        last = max(full.arrivals_s[-1], float(fin[np.isfinite(fin)].max(initial=0.0)))
        assert es.stopped_at_s <= last
    done = np.isfinite(es.latencies_s)
    np.testing.assert_array_equal(es.latencies_s[done], full.latencies_s[done])
    assert np.all(es.latencies_s[done] + es.arrivals_s[done] <= es.stopped_at_s)
    assert math.isinf(es.percentile(pct))


@pytest.mark.parametrize("pct", [0.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0, 37.3])
def test_allowance_is_numpy_s_threshold(pct: float) -> None:
    """With ``allowance + 1`` misses the percentile is above the SLO whatever the other
    latencies; with ``allowance`` misses it can be within it (so no smaller stop is exact)."""
    rng = np.random.default_rng(0)
    slo = 1.0
    for n in [1, 2, 3, 7, 99, 100, 101, 1000, 1050, 4321, 100_000]:
        a = miss_allowance(n, pct)
        assert 0 <= a <= n - 1
        if a + 1 <= n:  # the rest as close to the SLO as can be, the misses just above
            lat = np.concatenate([np.full(n - a - 1, slo), np.full(a + 1, np.nextafter(slo, 2))])
            assert np.percentile(rng.permutation(lat), pct) > slo
        lat = np.concatenate([np.zeros(n - a), np.full(a, np.nextafter(slo, 2))])
        assert np.percentile(rng.permutation(lat), pct) <= slo
    # floor((1 - p / 100) * n) is not it: at n = 1050, 11 misses can still meet a P99 SLO
    assert miss_allowance(1050, 99.0) == 11


def test_allowance_grows_with_the_queries() -> None:
    """Needed with drops not counted: the served queries' allowance is at most all of them."""
    for pct in (50.0, 90.0, 99.0, 99.9, 99.99, 12.345):
        a = [miss_allowance(n, pct) for n in range(1, 20_000)]
        assert all(x <= y for x, y in itertools.pairwise(a))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    systems(),
    st.sampled_from([0.0, 1 / GRID]),
    st.sampled_from([0.0, 3 / GRID]),
    PCTS,
    st.floats(0, 1),
    st.integers(-2, 2),
)
def test_random_systems_same_verdict(system, hop, wait, pct, u, nudge) -> None:  # type: ignore[no-untyped-def]
    p, prof, configs, arr, seed = system
    opt = EstimatorOptions(
        hop_overhead_s=hop, batch_wait_s={m: wait for m in p.models[::2]}, seed=seed
    )
    full = simulate(p, configs, prof, arr, options=opt)
    slo = _slo(full, u, nudge)
    es = simulate(p, configs, prof, arr, options=opt, stop=EarlyStop(slo, pct))
    _check(full, es, slo, pct)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    systems(grid=True),
    st.lists(st.tuples(st.integers(0, 64), st.sampled_from("abcd"), st.integers(0, 3)), max_size=4),
    st.sampled_from([0.0, 8 / GRID]),
    PCTS,
    st.floats(0, 1),
    st.integers(-2, 2),
)
def test_random_schedules_same_verdict(system, sched, delay, pct, u, nudge) -> None:  # type: ignore[no-untyped-def]
    """The segmented runs (replica schedules, some leaving a model without replicas)."""
    p, prof, configs, arr, seed = system
    schedule = [(t / GRID, m, n) for t, m, n in sched if m in p.models]
    opt = EstimatorOptions(activation_delay_s=delay, seed=seed)
    full = simulate(p, configs, prof, arr, options=opt, schedule=schedule)
    slo = _slo(full, u, nudge)
    es = simulate(p, configs, prof, arr, options=opt, schedule=schedule, stop=EarlyStop(slo, pct))
    _check(full, es, slo, pct, static=not schedule)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(server_systems(), PCTS, st.floats(0, 1), st.integers(-2, 2))
def test_server_batchers_drops_are_misses(system, pct, u, nudge) -> None:  # type: ignore[no-untyped-def]
    p, configs, prof, arr, opt = system
    full = simulate(p, configs, prof, arr, options=opt)
    slo = _slo(full, u, nudge)
    es = simulate(p, configs, prof, arr, options=opt, stop=EarlyStop(slo, pct))
    _check(full, es, slo, pct)


def _served_verdict(res: SimResult, slo: float, pct: float, max_drops: int) -> bool:
    """The planner's judgement with drops not counted as misses (planning/_server.py)."""
    dropped = res.rejected | res.refused
    if np.count_nonzero(dropped) > max_drops:
        return False
    served = res.latencies_s[~dropped]
    return not served.size or float(np.percentile(served, pct)) <= slo


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(server_systems(), PCTS, st.floats(0, 1), st.integers(-2, 2), st.integers(0, 5))
def test_server_batchers_served_percentile(system, pct, u, nudge, max_drops) -> None:  # type: ignore[no-untyped-def]
    p, configs, prof, arr, opt = system
    full = simulate(p, configs, prof, arr, options=opt)
    slo = _slo(full, u, nudge)
    stop = EarlyStop(slo, pct, drops_are_misses=False, max_drops=max_drops)
    es = simulate(p, configs, prof, arr, options=opt, stop=stop)
    if not es.stopped_early:
        _same(es, full)
        return
    assert not _served_verdict(full, slo, pct, max_drops)
    done = np.isfinite(es.latencies_s)
    np.testing.assert_array_equal(es.latencies_s[done], full.latencies_s[done])


def test_an_overloaded_system_stops_early_and_a_feasible_one_is_unchanged() -> None:
    p = Pipeline.linear("p", ["a", "b"])
    prof = Profiles.from_latencies({m: {"cpu": {1: 0.01, 4: 0.02}} for m in p.models})
    arr = np.arange(20_000) * 0.002  # 500 q/s for 40 s
    slo = 0.1
    ok = {m: ModelConfig("cpu", 4, 3) for m in p.models}
    full = simulate(p, ok, prof, arr)
    es = simulate(p, ok, prof, arr, stop=EarlyStop(slo))
    assert full.percentile(99) <= slo and not es.stopped_early
    _same(es, full)
    slow = {"a": ModelConfig("cpu", 4, 3), "b": ModelConfig("cpu", 1, 4)}  # b: 400 q/s
    full = simulate(p, slow, prof, arr)
    es = simulate(p, slow, prof, arr, stop=EarlyStop(slo))
    assert full.percentile(99) > slo and es.stopped_early
    assert es.stopped_at_s is not None and es.stopped_at_s < 2.0  # of a 40 s trace
    assert es.models["b"].batches < full.models["b"].batches / 10
    assert np.isinf(es.latencies_s[arr > es.stopped_at_s]).all()


def test_validation() -> None:
    with pytest.raises(ValidationError, match="slo_s"):
        EarlyStop(-1.0)
    with pytest.raises(ValidationError, match="percentile"):
        EarlyStop(0.1, 101.0)
    with pytest.raises(ValidationError, match="max_drops"):
        EarlyStop(0.1, 99.0, max_drops=3)
    p = Pipeline.linear("p", ["a"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.01}}})
    with pytest.raises(ValidationError, match="stop"):
        simulate(p, {"a": ModelConfig("cpu")}, prof, np.arange(3.0), stop=0.1)  # type: ignore[arg-type]
