"""The planner's default rate margin, ``"auto"``: sized from the sample's own variability."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    plan_inferline,
)
from inferline.core.planning import AUTO_MARGIN, auto_rate_margin, resolve_margin
from inferline.core.planning._margin import FLOOR


def _margins(cv: float, duration_s: float) -> np.ndarray:
    return np.array(
        [
            auto_rate_margin(gamma_trace(100.0, cv, duration_s, np.random.default_rng(s)))
            for s in range(10)
        ]
    )


def test_auto_margin_follows_the_samples_variability() -> None:
    """0.03 + about 2 x sqrt(2) x CV / sqrt(N): 5.6% for 120 s of Poisson traffic at 100 q/s,
    13% at CV 4; a longer sample, a smaller margin."""
    poisson, bursty = _margins(1.0, 120.0), _margins(4.0, 120.0)
    assert 0.045 < poisson.mean() < 0.07
    assert 0.10 < bursty.mean() < 0.16
    assert _margins(4.0, 480.0).mean() < 0.75 * bursty.mean()
    assert auto_rate_margin(np.arange(1000) / 100.0) == FLOOR  # evenly spaced: no spread
    assert auto_rate_margin(np.array([1.0])) == FLOOR


def test_auto_margin_is_capped_for_a_sample_with_a_trend() -> None:
    ramp = np.cumsum(np.repeat([0.1, 0.01, 0.001], 1000))  # 10 q/s, then 100, then 1000
    assert auto_rate_margin(ramp) == 0.5


def test_default_is_auto_and_round_trips() -> None:
    assert PlannerOptions().rate_margin == AUTO_MARGIN
    for opts in (PlannerOptions(), PlannerOptions(rate_margin=0.0)):
        assert PlannerOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    assert PlannerOptions.from_dict({}).rate_margin == AUTO_MARGIN
    assert PlannerOptions(rate_margin=0).rate_margin == 0.0
    for bad in ("5%", "Auto", -0.1, 11):
        with pytest.raises(ValidationError, match="rate_margin"):
            PlannerOptions(rate_margin=bad)


def test_planner_resolves_auto_on_its_sample() -> None:
    trace = gamma_trace(100.0, 4.0, 120.0, np.random.default_rng(1))
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.005, 2: 0.008}}})
    pipe = Pipeline.linear("p", ["a"])
    planner = Planner(pipe, prof, trace, 0.2)
    assert planner.options.rate_margin == pytest.approx(auto_rate_margin(trace))
    assert planner.trace[-1] - planner.trace[0] < trace[-1] - trace[0]  # judged sped up
    paper = Planner(pipe, prof, trace, 0.2, options=PlannerOptions(rate_margin=0.0))
    assert paper.options.rate_margin == 0.0 and paper.trace is not None
    explicit = resolve_margin(PlannerOptions(rate_margin=0.25), trace)
    assert explicit.rate_margin == 0.25


def test_auto_plan_keeps_the_slack_the_sample_asks_for() -> None:
    """A CPU model at 90% of one replica's capacity at the sample's rate: the margin-0 plan
    takes one replica fewer than the auto plan, which covers the sample sped up by its
    margin."""
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.02}}})
    pipe = Pipeline.linear("p", ["a"])
    trace = gamma_trace(180.0, 4.0, 120.0, np.random.default_rng(3))
    paper = plan_inferline(pipe, prof, trace, 0.5, options=PlannerOptions(rate_margin=0.0))
    auto = plan_inferline(pipe, prof, trace, 0.5)
    assert auto.cost_per_hour >= paper.cost_per_hour
    assert auto.models["a"].replicas >= paper.models["a"].replicas
    assert isinstance(auto.models["a"], ModelConfig)


def test_auto_margin_is_exactly_the_documented_formula() -> None:
    """The module doc's formula on a hand-made sample, computed here with numpy alone:
    ``min(0.5, 0.03 + 2 * sqrt(2) * std(counts, ddof=1) / sqrt(K) / mean(counts))`` over
    ``K = max(8, span // 5 s)`` equal windows. Fails if the formula is changed by any
    factor (e.g. the ``sqrt(2)`` dropped, ~25% smaller; ``ddof=0``; the floor or ``Z``
    changed), which the range checks above accept."""
    counts = np.array([12, 18, 9, 15, 21, 10, 17, 6])  # 8 windows of 5 s over 40 s
    times = [0.0]  # the first arrival opens the first window, the last closes the last
    for i, c in enumerate(counts):
        n = c - (i == 0) - (i == len(counts) - 1)
        times.extend(i * 5.0 + (j + 1) * 5.0 / (n + 1) for j in range(n))
    times.append(40.0)
    sample = np.array(sorted(times))
    assert sample.size == counts.sum()
    expected = 0.03 + 2.0 * np.sqrt(2.0) * counts.std(ddof=1) / np.sqrt(8) / counts.mean()
    assert 0.3 < expected < 0.5  # under the cap: the formula decides it
    assert auto_rate_margin(sample) == pytest.approx(expected, rel=1e-12)
    assert auto_rate_margin(sample) == pytest.approx(0.407705, abs=1e-6)
