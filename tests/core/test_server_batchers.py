"""The servers' own batchers in the estimator (EstimatorOptions.server_batchers): per-query
latencies and the rejected / refused queries agree exactly with independent SimPy models
(tests/core/_simpy_server_batchers.py) on random systems and on cases made to exercise each
rule; hand-checked small cases; the settings' validation and JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _simpy_server_batchers import server_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.core import (
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    ValidationError,
    WakeProfile,
    simulate,
)
from inferline.core.estimator import TFServingBatcher, TritonBatcher, batcher_from_dict

GRID = 64.0  # times on a 2^-6 s grid make events of different origins coincide
US = 15625  # 1/64 s in microseconds (exact)
SIZES = (1, 2, 3, 4, 6, 8)  # 5 and 7 unprofiled: they cost the next profiled size
SHAPES = {
    "one": Pipeline.linear("one", ["a"]),
    "two": Pipeline.linear("two", ["a", "b"]),
    "diamond": Pipeline(
        "diamond",
        ("a", "b", "c", "d"),
        (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")),
        {"c": 0.5},
    ),
}


def _agree(p, configs, prof, arr, opt, schedule=()):  # type: ignore[no-untyped-def]
    """Simulate with both; assert they agree; return the estimator's result."""
    ours = simulate(p, configs, prof, arr, options=opt, schedule=schedule)
    ref = server_reference()(p, configs, prof, arr, options=opt, schedule=schedule)
    lat = ref.run()
    np.testing.assert_array_equal(np.isinf(ours.latencies_s), np.isinf(lat))
    fin = np.isfinite(lat)
    np.testing.assert_allclose(ours.latencies_s[fin], lat[fin], rtol=0, atol=1e-9)
    assert set(np.flatnonzero(ours.rejected).tolist()) == ref.rejected
    assert set(np.flatnonzero(ours.refused).tolist()) == ref.refused
    return ours


@st.composite
def triton(draw: st.DrawFn) -> TritonBatcher:
    mb = draw(st.integers(1, 8))
    pref = draw(st.lists(st.integers(1, mb), max_size=3, unique=True))
    return TritonBatcher(
        mb,
        tuple(pref),
        draw(st.sampled_from([0, 0, 1, 2, 5])) * US,
        draw(st.sampled_from([0, 0, 2, 4, 9])) * US,
    )


@st.composite
def tfserving(draw: st.DrawFn) -> TFServingBatcher:
    mb = draw(st.integers(1, 8))
    allowed = [*sorted(draw(st.sets(st.integers(1, mb - 1), max_size=3))), mb] if mb > 1 else []
    return TFServingBatcher(
        mb,
        draw(st.sampled_from([0, 1, 3, 6])) * US,
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
        tuple(allowed if draw(st.booleans()) else ()),
    )


@st.composite
def systems(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A pipeline with a server batcher on some models, profiles, configs, options, trace."""
    p = SHAPES[draw(st.sampled_from(sorted(SHAPES)))]
    table, configs, batchers = {}, {}, {}
    for m in p.models:
        cur, lats = draw(st.integers(1, 12)) / GRID, {}
        for b in SIZES:
            cur += draw(st.integers(0, 4)) / GRID if b > 1 else 0.0
            lats[b] = cur
        table[m] = {"cpu": lats}
        configs[m] = ModelConfig("cpu", draw(st.sampled_from(SIZES)), draw(st.integers(1, 3)))
        kind = draw(st.sampled_from(["triton", "tf", "none"]))
        if kind != "none" or (m == p.models[-1] and not batchers):
            batchers[m] = draw(tfserving() if kind == "tf" else triton())
    n = draw(st.integers(1, 80))
    gaps = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    arr = np.cumsum(np.array(gaps, dtype=np.float64)) / GRID
    if draw(st.booleans()):  # off the grid as well: irregular float times
        arr = arr + draw(st.floats(0.0, 1.0)) * np.arange(n) * 1e-3
    waits = {m: 2 / GRID for m in p.models if m not in batchers and draw(st.booleans())}
    opt = EstimatorOptions(
        hop_overhead_s=draw(st.sampled_from([0.0, 1 / GRID])),
        batch_wait_s=waits,
        seed=draw(st.integers(0, 2**16)),
        server_batchers=batchers,
    )
    return p, configs, Profiles.from_latencies(table), arr, opt


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems())
def test_random_systems_agree_with_simpy(system) -> None:  # type: ignore[no-untyped-def]
    _agree(*system)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    systems(),
    st.lists(st.tuples(st.integers(0, 64), st.sampled_from("abcd"), st.integers(0, 3)), max_size=3),
    st.sampled_from([0.0, 8 / GRID]),
    st.booleans(),
    st.sampled_from([{}, {"a": 2}, {"b": 3}]),
)
def test_schedules_wake_ups_and_repeated_calls_agree_with_simpy(
    system, sched, delay, wake, visits
) -> None:  # type: ignore[no-untyped-def]
    """Replica schedules (a retiring TF replica frees its batch thread), activation delay,
    wake-up extras and repeated calls through server-batched models."""
    p, configs, prof, arr, opt = system
    p = Pipeline(
        p.name,
        p.models,
        p.edges,
        p.scale_factors,
        {m: v for m, v in visits.items() if m in p.models},
    )
    if wake:
        w = WakeProfile((4 / GRID, 32 / GRID), (1 / GRID, 3 / GRID))
        prof = Profiles(prof.models, {m: {"cpu": w} for m in p.models})
    opt = EstimatorOptions(
        hop_overhead_s=opt.hop_overhead_s,
        batch_wait_s=opt.batch_wait_s,
        activation_delay_s=delay,
        seed=opt.seed,
        server_batchers=opt.server_batchers,
    )
    schedule = [(t / GRID, m, n) for t, m, n in sched if m in p.models]
    _agree(p, configs, prof, arr, opt, schedule)


# -- each rule exercised, on a busy Poisson-ish trace -----------------------------------------
def _busy(rate: float, n: int, seed: int, grid: bool = True) -> np.ndarray:
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    arr = np.cumsum(gaps)
    return np.round(arr * GRID) / GRID if grid else arr


PROF = Profiles.from_latencies(
    {m: {"cpu": {b: (4 + 2 * b) / GRID for b in (1, 2, 4, 8, 16)}} for m in "ab"}
)
# (batcher, arrivals per second): a replica serves about 25 q/s in batches of 8 or more
CASES = {
    "triton preferred sizes": (TritonBatcher(16, (4, 8), 3 * US), 30.0),
    "triton preferred, no delay": (TritonBatcher(8, (3, 6)), 35.0),
    "triton delay only": (TritonBatcher(16, (), 2 * US), 30.0),
    "triton queue timeouts reject": (TritonBatcher(8, (8,), 4 * US, 6 * US), 70.0),
    "tf padding to allowed sizes": (TFServingBatcher(16, 2 * US, 2, 50, (2, 4, 8, 16)), 35.0),
    "tf full queue refuses": (TFServingBatcher(4, 1 * US, 1, 2, (2, 4)), 40.0),
    "tf several batch threads": (TFServingBatcher(8, 3 * US, 3, 6), 50.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("grid", [True, False])
def test_each_rule_agrees_with_simpy(name: str, grid: bool) -> None:
    b, rate = CASES[name]
    p = Pipeline.linear("one", ["a"])
    replicas = 3 if "several" in name else 2
    cfg = {"a": ModelConfig("cpu", 1, replicas)}
    arr = _busy(rate, 1500, 7, grid)
    r = _agree(p, cfg, PROF, arr, EstimatorOptions(server_batchers={"a": b}))
    if "reject" in name:
        assert 0 < r.rejected.sum() < arr.size and not r.refused.any()
        assert np.all(np.isinf(r.latencies_s[r.rejected]))
    elif "refuses" in name:
        assert 0 < r.refused.sum() < arr.size and not r.rejected.any()
    else:
        assert not r.rejected.any() and not r.refused.any()
        assert np.all(np.isfinite(r.latencies_s))
    assert r.models["a"].mean_batch_size > 1.5  # batches do form
    if "padding" in name:  # padded batches cost more than the ones the greedy estimator forms
        assert r.models["a"].utilization > 0


@pytest.mark.parametrize("grid", [True, False])
def test_two_model_pipeline_triton_then_tf_agrees_with_simpy(grid: bool) -> None:
    p = Pipeline.linear("two", ["a", "b"])
    cfg = {"a": ModelConfig("cpu", 1, 2), "b": ModelConfig("cpu", 1, 3)}  # b: 1 batch thread
    opt = EstimatorOptions(
        hop_overhead_s=1 / GRID,
        server_batchers={
            "a": TritonBatcher(8, (4,), 2 * US, 8 * US),
            "b": TFServingBatcher(8, 2 * US, 1, 3, (2, 4, 8)),
        },
    )
    r = _agree(p, cfg, PROF, _busy(60.0, 2000, 3, grid), opt)
    assert r.rejected.any() and r.refused.any()
    assert not (r.rejected & r.refused).any()  # a query rejected by a never reaches b


# -- hand-checked ------------------------------------------------------------------------------
ONE = Pipeline.linear("one", ["a"])
HAND = Profiles.from_latencies({"a": {"cpu": {1: 0.1, 2: 0.15, 4: 0.2, 8: 0.3}}})
ARR = np.array([0.0, 0.01, 0.02, 0.03, 0.5, 0.51, 2.0])


def _run(b, arr=ARR, replicas=1):  # type: ignore[no-untyped-def]
    opt = EstimatorOptions(server_batchers={"a": b})
    return simulate(ONE, {"a": ModelConfig("cpu", 8, replicas)}, HAND, arr, options=opt)


def test_triton_by_hand() -> None:
    # preferred 2, delay 50 ms: 0 waits; 0.01 makes 2 (sent); 2 and 3 queue behind them and
    # go when the instance frees at 0.16; 4,5 likewise; 6 alone goes after its 50 ms delay
    r = _run(TritonBatcher(8, (2,), 50_000))
    np.testing.assert_allclose(r.latencies_s, [0.16, 0.15, 0.29, 0.28, 0.16, 0.15, 0.15])
    # a 100 ms queue timeout: 2 and 3 have waited 140 and 130 ms at 0.16: rejected
    r = _run(TritonBatcher(8, (2,), 50_000, 100_000))
    assert r.rejected.tolist() == [False, False, True, True, False, False, False]
    assert np.isinf(r.latencies_s[2:4]).all()
    with np.errstate(invalid="ignore"):  # a percentile over inf latencies
        assert r.percentile(50) == pytest.approx(0.16)
        assert r.summary(1.0)["rejected_queries"] == 2


def test_tf_serving_by_hand() -> None:
    # max 4 (allowed 2, 4), timeout 50 ms: 0..3 fill a batch of 4 at 0.03; 4,5 go padded to 2
    # at 0.55; 6 alone at 2.05 is padded to 2 (0.15 s)
    r = _run(TFServingBatcher(4, 50_000, 1, 1, (2, 4)))
    np.testing.assert_allclose(r.latencies_s, [0.23, 0.22, 0.21, 0.2, 0.2, 0.19, 0.2])
    # max 2, one enqueued batch: 0,1 go at once (2 is full); 2,3 wait in the open batch and
    # are full, so 4 finds the one batch it may hold full: refused; 5 waits for 2,3
    arr = np.array([0.0, 0.0, 0.01, 0.01, 0.02, 0.2])
    r = _run(TFServingBatcher(2, 0, 1, 1), arr)
    assert r.refused.tolist() == [False, False, False, False, True, False]
    with np.errstate(invalid="ignore"):  # a percentile over inf latencies
        s = r.summary(1.0)
    assert s["refused_queries"] == 1 and s["rejected_queries"] == 0
    np.testing.assert_allclose(r.latencies_s[[0, 1, 2, 3, 5]], [0.15, 0.15, 0.29, 0.29, 0.2])


def test_without_delays_the_batchers_are_the_estimator_s_greedy_batching() -> None:
    """One model, no delay, no timeout, no padding: FIFO is EDF and both batch greedily."""
    arr = _busy(300.0, 800, 5)
    cfg = {"a": ModelConfig("cpu", 8, 2)}
    plain = simulate(ONE, cfg, PROF, arr).latencies_s
    for b in (TritonBatcher(8), TFServingBatcher(8, 0, 2, 1000)):
        r = simulate(ONE, cfg, PROF, arr, options=EstimatorOptions(server_batchers={"a": b}))
        np.testing.assert_array_equal(r.latencies_s, plain)


# -- settings ------------------------------------------------------------------------------------
def test_round_trip() -> None:
    opt = EstimatorOptions(
        hop_overhead_s=0.001,
        server_batchers={
            "a": TritonBatcher(8, (4, 8), 100, 5000),
            "b": TFServingBatcher(16, 200, 4, 3, (4, 8, 16)),
        },
    )
    d = json.loads(json.dumps(opt.to_dict()))
    assert d["server_batchers"]["a"]["kind"] == "triton"
    assert EstimatorOptions.from_dict(d) == opt
    for b in opt.server_batchers.values():
        assert batcher_from_dict(json.loads(json.dumps(b.to_dict()))) == b
    assert "server_batchers" not in EstimatorOptions().to_dict()  # old documents unchanged


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: TritonBatcher(0), "max_batch_size"),
        (lambda: TritonBatcher(4, (2, 5)), "preferred_batch_size[1]"),
        (lambda: TritonBatcher(4, (0,)), "preferred_batch_size[0]"),
        (lambda: TritonBatcher(4, 2), "preferred_batch_size"),  # type: ignore[arg-type]
        (lambda: TritonBatcher(4, (), -1), "max_queue_delay_microseconds"),
        (lambda: TritonBatcher(4, (), 0, 0.5), "default_timeout_microseconds"),
        (lambda: TFServingBatcher(4, -1), "batch_timeout_micros"),
        (lambda: TFServingBatcher(4, 0, 0), "num_batch_threads"),
        (lambda: TFServingBatcher(4, 0, 1, 0), "max_enqueued_batches"),
        (lambda: TFServingBatcher(8, 0, 1, 1, (4, 2, 8)), "allowed_batch_sizes[1]"),
        (lambda: TFServingBatcher(8, 0, 1, 1, (2, 4)), "allowed_batch_sizes[1]"),
    ],
)
def test_validation_names_the_field(make, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as e:
        make()
    assert e.value.field == field


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"a": {"kind": "triton"}}, "server_batchers.a.max_batch_size"),
        ({"a": {"kind": "onnx", "max_batch_size": 4}}, "server_batchers.a.kind"),
        ({"a": {"max_batch_size": 4}}, "server_batchers.a.kind"),
        ({"a": {"kind": "tfserving", "max_batch_size": 4, "x": 1}}, "server_batchers.a.x"),
        (
            {"a": {"kind": "tfserving", "max_batch_size": 4, "allowed_batch_sizes": [2]}},
            "server_batchers.a.allowed_batch_sizes[0]",
        ),
        (
            {"a": {"kind": "triton", "max_batch_size": 4, "preferred_batch_size": ["x"]}},
            "server_batchers.a.preferred_batch_size[0]",
        ),
        ({"a": 3}, "server_batchers.a"),
    ],
)
def test_documents_name_the_field(doc, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as e:
        EstimatorOptions.from_dict({"server_batchers": doc})
    assert e.value.field == field


def test_simulate_checks_the_batchers_against_the_inputs() -> None:
    cfg = {"a": ModelConfig("cpu", 8, 1)}
    cases = [
        (EstimatorOptions(server_batchers={"z": TritonBatcher(4)}), "options.server_batchers"),
        (
            EstimatorOptions(server_batchers={"a": TritonBatcher(16)}),
            "options.server_batchers.a.max_batch_size",
        ),
        (
            EstimatorOptions(batch_wait_s={"a": 0.01}, server_batchers={"a": TritonBatcher(4)}),
            "options.batch_wait_s.a",
        ),
    ]
    for opt, field in cases:
        with pytest.raises(ValidationError) as e:
            simulate(ONE, cfg, HAND, ARR, options=opt)
        assert e.value.field == field
    with pytest.raises(ValidationError) as e:
        simulate(
            ONE,
            {"a": ModelConfig("cpu", 8, 1, 5.0)},
            HAND,
            ARR,
            options=EstimatorOptions(server_batchers={"a": TritonBatcher(4)}),
        )
    assert e.value.field == "configs.a.batch_wait_ms"
    with pytest.raises(ValidationError) as e:
        EstimatorOptions(server_batchers={"a": {"kind": "triton"}})  # type: ignore[dict-item]
    assert e.value.field == "server_batchers.a"
