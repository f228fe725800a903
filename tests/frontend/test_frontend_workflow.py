"""The per-hop overhead calibration and the estimate the demo and fidelity benchmark use."""

from __future__ import annotations

import numpy as np
import pytest

from inferline.core import ModelConfig, Pipeline, Profiles, ValidationError
from inferline.measure import ReplayResult, estimate, hop_overhead_from


def _setup():
    pipe = Pipeline.linear("p", ["a", "b", "c"])
    prof = Profiles.from_latencies({m: {"cpu": {1: 0.002, 2: 0.003}} for m in ("a", "b", "c")})
    configs = {m: ModelConfig("cpu", 2, 1) for m in ("a", "b", "c")}
    return pipe, prof, configs


def _result(arrivals, latencies, status=None):
    n = len(arrivals)
    return ReplayResult(
        scheduled_s=np.asarray(arrivals, float),
        sent_s=np.asarray(arrivals, float),
        done_s=np.asarray(arrivals, float) + np.asarray(latencies, float),
        status=np.full(n, 200, dtype=np.int32) if status is None else np.asarray(status),
        default=np.zeros(n, dtype=bool),
    )


def test_hop_overhead_recovers_a_known_per_hop_cost():
    pipe, prof, configs = _setup()
    arrivals = np.arange(200) * 0.05  # no queueing: 3 models x 2 ms each
    true_hop = 0.0015
    sim = estimate(pipe, configs, prof, arrivals, hop_overhead_s=true_hop)
    assert sim.percentile(50) == pytest.approx(0.006 + 3 * true_hop)
    jitter = np.random.default_rng(0).normal(0, 1e-4, arrivals.size)
    measured = _result(arrivals, sim.latencies_s + jitter)
    assert hop_overhead_from(measured, pipe, configs, prof) == pytest.approx(true_hop, abs=1e-4)


def test_hop_overhead_ignores_errors_and_is_never_negative():
    pipe, prof, configs = _setup()
    arrivals = np.arange(50) * 0.05
    status = np.full(50, 200)
    status[:10] = 503
    lat = np.full(50, 0.004)  # faster than the profiles say: clamp to 0
    assert hop_overhead_from(_result(arrivals, lat, status), pipe, configs, prof) == 0.0
    with pytest.raises(ValidationError):
        hop_overhead_from(_result(arrivals[:3], lat[:3]), pipe, configs, prof)
