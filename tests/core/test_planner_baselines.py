"""CG-Mean and CG-Peak: one batch size for the whole pipeline, replicated as a unit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferline.core import (
    InfeasibleError,
    NotFoundError,
    Pipeline,
    Profiles,
    coarse_grained_configs,
    gamma_trace,
    make_plan,
    mean_rate,
    peak_rate,
    simulate,
)

PIPE = Pipeline("p", ("pre", "cls", "rare"), (("pre", "cls"), ("cls", "rare")), {"rare": 0.25})
PROF = Profiles.from_latencies(
    {
        "pre": {"cpu": {b: 0.005 * b for b in (1, 2, 4, 8)}},
        "cls": {
            "gpu-v100": {b: 0.01 + 0.002 * b for b in (1, 2, 4, 8, 16)},
            "gpu-k80": {b: 0.03 + 0.006 * b for b in (1, 2, 4, 8, 16)},
        },
        "rare": {"gpu-k80": {b: 0.02 + 0.01 * b for b in (1, 2, 4, 8)}},
    }
)


def test_batch_is_the_largest_whose_service_time_meets_the_slo():
    # service(b) = 0.005 b + (0.01 + 0.002 b) + (0.02 + 0.01 b) = 0.03 + 0.017 b
    cfg = coarse_grained_configs(PIPE, PROF, 0.12, 10.0)
    assert {c.max_batch_size for c in cfg.values()} == {4}  # 0.098 <= 0.12 < 0.166
    assert cfg["cls"].hardware == "gpu-v100"  # lowest latency
    assert cfg["pre"].hardware == "cpu" and cfg["rare"].hardware == "gpu-k80"
    assert {c.max_batch_size for c in coarse_grained_configs(PIPE, PROF, 1.0, 10.0).values()} == {
        8  # capped by the smallest largest-profiled batch size
    }


def test_units_cover_the_rate_of_the_slowest_stage():
    cfg = coarse_grained_configs(PIPE, PROF, 0.12, 300.0)
    # unit throughput at b=4: min(4/0.02, 4/0.018, 4/0.06/0.25) = 200 q/s
    assert {c.replicas for c in cfg.values()} == {math.ceil(300.0 / 200.0)}


def test_mean_versus_peak_rate():
    trace = gamma_trace(150.0, 4.0, 60.0, np.random.default_rng(0))
    mean = make_plan("cg-mean", PIPE, PROF, trace, 0.12)
    peak = make_plan("cg-peak", PIPE, PROF, trace, 0.12)
    unit = 200.0
    assert mean.models["cls"].replicas == math.ceil(mean_rate(trace) / unit)
    assert peak.models["cls"].replicas == math.ceil(peak_rate(trace, 0.12) / unit)
    assert peak.cost_per_hour > mean.cost_per_hour
    res = simulate(PIPE, peak.models, PROF, trace)
    assert peak.estimated_latency_s == pytest.approx(res.percentile(99))
    assert mean.tuner is not None and peak.strategy == "cg-peak"


def test_infeasible_and_unknown_strategy():
    trace = gamma_trace(10.0, 1.0, 10.0, np.random.default_rng(0))
    with pytest.raises(InfeasibleError) as ei:
        make_plan("cg-mean", PIPE, PROF, trace, 0.04)
    assert ei.value.best_latency_s == pytest.approx(0.047)
    with pytest.raises(NotFoundError, match="cg-magic"):
        make_plan("cg-magic", PIPE, PROF, trace, 0.1)
