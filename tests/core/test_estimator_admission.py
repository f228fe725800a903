"""The estimator with admission by predicted completion (``EstimatorOptions.admission``):
a hand-computed trace, the kernel's prediction against the live queue's pure function, and
exact agreement with the SimPy reference given the same rules (``_simpy_admission.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _simpy_admission import admission_reference

from inferline.core import (
    PIPELINE_FORMAT,
    ModelConfig,
    Pipeline,
    Profiles,
    ValidationError,
    simulate,
)
from inferline.core.estimator import (
    EarlyStop,
    EstimatorAdmission,
    EstimatorOptions,
    miss_allowance,
    predict_completion,
)
from inferline.core.estimator._estimator_kernel import predict_done


def _prof(models: list[str], base: float, per: float, top: int = 8) -> Profiles:
    sizes = [b for b in (1, 2, 4, 8, 16) if b <= top]
    return Profiles.from_latencies(
        {
            m: {"cpu": {b: base * (1 + 0.3 * k) + per * b for b in sizes}}
            for k, m in enumerate(models)
        }
    )


def test_a_hand_computed_trace() -> None:
    # one replica, 1 s per query, SLO 2.5 s, no buffer; four queries at 0: q0 runs (idle,
    # nothing queued), q1 is predicted at 2 (admitted), q2 and q3 at 3 and 4 (refused)
    p = Pipeline.linear("p", ["a"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: 1.0}}})
    opt = EstimatorOptions(admission=EstimatorAdmission(2.5, 0.0))
    r = simulate(p, {"a": ModelConfig("cpu", 1, 1)}, prof, np.zeros(4), options=opt)
    np.testing.assert_array_equal(r.latencies_s, [1.0, 2.0, np.inf, np.inf])
    np.testing.assert_array_equal(r.refused_late, [False, False, True, True])
    with np.errstate(invalid="ignore"):  # the percentile of infs
        assert r.summary(2.5)["refused_late_queries"] == 2
    off = simulate(p, {"a": ModelConfig("cpu", 1, 1)}, prof, np.zeros(4))
    np.testing.assert_array_equal(off.latencies_s, [1.0, 2.0, 3.0, 4.0])
    assert "refused_late_queries" not in off.summary(2.5)


def test_a_hand_computed_dispatch_drop() -> None:
    # 1 s for one query, 2 s for two (max 2), SLO 2.5 s: q0 runs at 0 (done 1); q1 (0.1) is
    # predicted at 1 + 1 = 2; q2 (0.9) behind it in a batch of two at 1 + 2 = 3 <= 3.4.
    # At 1 the cut of two takes 2 s: q1 (deadline 2.6 < 3) is dropped, q2 runs alone to 2.
    p = Pipeline.linear("p", ["a"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: 1.0, 2: 2.0}}})
    opt = EstimatorOptions(admission=EstimatorAdmission(2.5, 0.0))
    arr = np.array([0.0, 0.1, 0.9])
    r = simulate(p, {"a": ModelConfig("cpu", 2, 1)}, prof, arr, options=opt)
    np.testing.assert_allclose(r.latencies_s, [1.0, np.inf, 1.1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(r.refused_late, [False, True, False])


def test_the_kernels_prediction_is_the_live_queues() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        lat = np.concatenate([[0.0], np.sort(rng.uniform(0.001, 0.05, 8))])
        nf = int(rng.integers(0, 4))
        free = rng.uniform(-0.02, 0.1, nf)
        queued = int(rng.integers(1, 40))
        pos = int(rng.integers(0, queued))
        mb = int(rng.integers(1, 9))
        now = float(rng.uniform(0, 0.05))
        want = predict_completion(now, pos, queued, list(free), mb, lambda b, t=lat: float(t[b]))
        got = predict_done(now, pos, queued, free.copy(), nf, mb, lat)
        assert (want is None and got == -1.0) or got == want


def test_options_round_trip_and_refusals() -> None:
    o = EstimatorOptions(admission=EstimatorAdmission(0.1, 0.003))
    assert EstimatorOptions.from_dict(o.to_dict()) == o
    assert "admission" not in EstimatorOptions().to_dict()
    with pytest.raises(ValidationError, match=r"admission\.slo_s"):
        EstimatorAdmission(0.0)
    with pytest.raises(ValidationError, match=r"admission\.buffer_s"):
        EstimatorOptions.from_dict({"admission": {"slo_s": 0.1, "buffer_s": -1}})
    with pytest.raises(ValidationError, match=r"options\.admission"):
        simulate(
            Pipeline.linear("p", ["a"]),
            {"a": ModelConfig("cpu", 1, 1)},
            _prof(["a"], 0.01, 0.001),
            np.zeros(3),
            options=EstimatorOptions(admission=EstimatorAdmission(0.1), batch_wait_s={"a": 0.01}),
        )


def _cases() -> list[tuple[Pipeline, list[str]]]:
    fan = Pipeline.from_dict(
        {
            "format": PIPELINE_FORMAT,
            "name": "fan",
            "models": ["a", "b", "c"],
            "edges": [["a", "b"], ["a", "c"]],
        }
    )
    return [
        (Pipeline.linear("one", ["a"]), ["a"]),
        (Pipeline.linear("two", ["a", "b"]), ["a", "b"]),
        (Pipeline.linear("three", ["a", "b", "c"]), ["a", "b", "c"]),
        (fan, ["a", "b", "c"]),
    ]


def _random_case(rng: np.random.Generator, p: Pipeline, models: list[str]) -> tuple[Any, ...]:
    """An overload (batch sizes 1-8, 1-3 replicas): configs, profiles, arrivals, options."""
    base, per = float(rng.uniform(0.004, 0.02)), float(rng.uniform(0.0005, 0.003))
    prof = _prof(models, base, per)
    cfg = {
        m: ModelConfig("cpu", int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 4)))
        for m in models
    }
    cap = min(
        c.replicas * c.max_batch_size / (base * 1.6 + per * c.max_batch_size) for c in cfg.values()
    )
    arr = np.cumsum(rng.exponential(1 / (cap * rng.uniform(0.8, 3.0)), 300))
    adm = EstimatorAdmission(float(rng.uniform(2, 6)) * (base + 8 * per) * len(models), 0.002)
    opt = EstimatorOptions(admission=adm, hop_overhead_s=float(rng.choice([0.0, 0.001])))
    return cfg, prof, arr, adm, opt


def _agree(p: Pipeline, case: tuple[Any, ...], doom: bool = True) -> tuple[bool, int]:
    """Whether the kernel agrees with the reference (latencies to 1e-9 s, refusals), and how
    many the reference refused."""
    cfg, prof, arr, adm, opt = case
    got = simulate(p, cfg, prof, arr, options=opt)
    ref = admission_reference(p, cfg, prof, arr, options=opt, admission=adm, doom=doom)
    want = ref.run()
    same = bool(np.allclose(got.latencies_s, want, rtol=0, atol=1e-9, equal_nan=True))
    same = same and np.flatnonzero(got.refused_late).tolist() == sorted(ref.refused)
    return same, len(ref.refused)


@pytest.mark.parametrize("k", range(4))
def test_agrees_with_the_simpy_reference(k: int) -> None:
    """Random overloads (batch sizes 1-8, 1-3 replicas, 1-3 models): the same latencies to
    1e-9 s and the same refusals."""
    rng = np.random.default_rng(100 + k)
    refused = 0
    for p, models in _cases():
        same, n = _agree(p, _random_case(rng, p, models))
        assert same
        refused += n
    assert refused > 0  # the overloads do refuse


def test_doomed_queries_are_dropped_as_the_live_queue_does() -> None:
    """Queries doomed in the queue (``drop_doomed``: they cannot make it even in the next
    batch) go before anything arriving later is predicted, and after each batch start. In a
    pipeline a query reaching a later model out of index order moves ahead of queued ones,
    which then miss what their admission predicted; these seeds are cases where the rule
    changes the outcome (the reference without it disagrees) and the kernel still agrees."""
    changed = 0
    for seed in (2, 4, 5, 10, 11):
        rng = np.random.default_rng(seed)
        for p, models in _cases()[1:]:  # one model: arrivals in index order, none doomed
            case = _random_case(rng, p, models)
            assert _agree(p, case)[0], (seed, p.name)
            changed += not _agree(p, case, doom=False)[0]
    assert changed >= 5, changed


def test_early_stop_stays_exact_with_refusals() -> None:
    p = Pipeline.linear("p", ["a", "b"])
    prof = _prof(["a", "b"], 0.01, 0.002)
    rng = np.random.default_rng(5)
    arr = np.cumsum(rng.exponential(1 / 420, 3000))
    cfg = {"a": ModelConfig("cpu", 8, 2), "b": ModelConfig("cpu", 4, 2)}
    opt = EstimatorOptions(admission=EstimatorAdmission(0.08))
    full = simulate(p, cfg, prof, arr, options=opt)
    n_ref = int(full.refused_late.sum())
    assert 10 < n_ref < arr.size // 2
    for limit in (n_ref // 2, n_ref - 1, n_ref, n_ref + 5):
        r = simulate(p, cfg, prof, arr, options=opt, stop=EarlyStop(0.08, 0.0, max_refused=limit))
        if r.stopped_early:  # only ever when the full run refused more
            assert n_ref > limit and r.certain_misses is not None
        else:  # the full run, bit for bit
            np.testing.assert_array_equal(r.latencies_s, full.latencies_s)
        assert r.stopped_early or limit >= n_ref - 1  # the last refusals may end the run
    # refusals are misses for the percentile: a stop there agrees with the full run
    misses = int(np.count_nonzero(full.latencies_s > 0.08))
    for pct in (50.0, 90.0, 99.0, 99.9):
        r = simulate(p, cfg, prof, arr, options=opt, stop=EarlyStop(0.08, pct))
        assert r.stopped_early == (misses > miss_allowance(arr.size, pct))
