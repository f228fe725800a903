"""Planning for a pipeline that calls a model twice per query (``Pipeline.visits``): the
throughput it needs doubles, and so (about) do its replicas."""

from __future__ import annotations

import numpy as np

from inferline.core import (
    ModelConfig,
    Pipeline,
    PlannerOptions,
    Profiles,
    coarse_grained_configs,
    gamma_trace,
    plan_inferline,
    simulate,
    tuner_inputs,
)

# one CPU-only model with no batching gain: throughput 1 / 0.02 = 50 q/s per replica
PROFILES = Profiles.from_latencies(
    {"pre": {"cpu": {1: 0.002}}, "rank": {"cpu": {1: 0.02, 2: 0.04, 4: 0.08}}}
)
ONCE = Pipeline.linear("once", ["pre", "rank"])
TWICE = Pipeline("twice", ONCE.models, ONCE.edges, {}, {"rank": 2})


def _trace() -> np.ndarray:
    return gamma_trace(200.0, 1.0, 60.0, np.random.default_rng(4))


def test_a_two_call_model_gets_about_twice_the_replicas() -> None:
    opts = PlannerOptions(rate_margin=0.0)
    one = plan_inferline(ONCE, PROFILES, _trace(), 0.3, options=opts)
    two = plan_inferline(TWICE, PROFILES, _trace(), 0.3, options=opts)
    r1, r2 = one.models["rank"].replicas, two.models["rank"].replicas
    assert r1 >= 4  # 200 q/s at 50 q/s a replica
    assert 1.7 * r1 <= r2 <= 2.3 * r1
    # the two-call plan really holds the SLO in the estimator; the one-call plan does not
    assert simulate(TWICE, two.models, PROFILES, _trace()).percentile(99) <= 0.3
    assert simulate(TWICE, one.models, PROFILES, _trace()).percentile(99) > 0.3
    # the tuner scales by calls per query
    assert two.tuner is not None and two.tuner.models["rank"].scale_factor == 2.0


def test_baselines_and_tuner_inputs_scale_by_calls() -> None:
    one = coarse_grained_configs(ONCE, PROFILES, 200.0, 0.3)
    two = coarse_grained_configs(TWICE, PROFILES, 200.0, 0.3)
    assert two["rank"].replicas >= 2 * one["rank"].replicas - 1
    cfg = {"pre": ModelConfig("cpu", 1, 1), "rank": ModelConfig("cpu", 1, 8)}
    ti = tuner_inputs(TWICE, PROFILES, cfg, _trace())
    assert ti.models["rank"].scale_factor == 2.0
    assert ti.models["rank"].max_provisioning_ratio > 0.9  # 400 calls/s on 8 x 50/s
