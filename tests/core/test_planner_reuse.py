"""Algorithm 2 keeping its infeasible verdicts while the other models only lose slack
(``PlannerOptions.reuse_verdicts``, issue 48): fewer simulations, the same fixed point."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from inferline.core import (
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    gamma_trace,
    simulate,
)

SLO_S = 0.3


def _case() -> tuple[Pipeline, Profiles, np.ndarray]:
    """A 5-model chain with the scale benchmark's synthetic profiles, 60 s at 100 q/s."""
    p = Pipeline.linear("c5", [f"m{i}" for i in range(5)])
    rng = np.random.default_rng(48)
    table = {}
    for m in p.models:
        ka, kb = rng.uniform(0.004, 0.010), rng.uniform(0.0004, 0.0012)
        ca, cb = rng.uniform(0.0005, 0.002), rng.uniform(0.010, 0.030)
        table[m] = {
            "gpu-k80": {b: ka + kb * b for b in (1, 2, 4, 8, 16, 32, 64)},
            "cpu": {b: ca + cb * b for b in (1, 2, 4, 8, 16)},
        }
    trace = np.asarray(gamma_trace(100.0, 2.0, 60.0, np.random.default_rng(5)))
    return p, Profiles.from_latencies(table), trace


def test_reused_verdicts_cut_simulations_and_keep_the_plan() -> None:
    p, prof, trace = _case()
    base = PlannerOptions(rate_margin=0.0, escape=False, widen=False)
    full = Planner(p, prof, trace, SLO_S, options=replace(base, reuse_verdicts=False))
    reuse = Planner(p, prof, trace, SLO_S, options=base)
    a, b = full.plan(), reuse.plan()
    assert reuse.stats().simulations < full.stats().simulations
    assert b.models == a.models
    assert simulate(p, b.models, prof, trace).percentile(99.0) <= SLO_S
    # the final exact sweep: no single action is feasible and cheaper (guarantee 2)
    key = reuse._key(b.models)
    assert reuse._known_bad is None
    assert reuse._best_action(key, None, 0) is None


def test_known_infeasible_counts_skip_the_replica_search() -> None:
    p, prof, trace = _case()
    pl = Planner(p, prof, trace, SLO_S, options=PlannerOptions(rate_margin=0.0))
    key = tuple(ModelConfig("gpu-k80", 1, 2) for _ in p.models)
    pl._known_bad = {("m2", "cpu", b, 0.0): 99 for b in (1, 2, 4, 8, 16)}
    sims = pl.stats().simulations
    assert pl._local(key, "m2", "cpu", [1, 2, 4, 8, 16], 20) is None
    assert pl.stats().simulations == sims  # every count up to the cap known infeasible
    pl._known_bad = {}
    pl._local(key, "m2", "cpu", [1], 6)
    assert pl.stats().simulations > sims
    assert all(n >= 1 for n in pl._known_bad.values())  # the search noted what failed


def test_reuse_verdicts_round_trips_and_is_written_only_when_off() -> None:
    assert "reuse_verdicts" not in PlannerOptions().to_dict()
    off = PlannerOptions(reuse_verdicts=False)
    assert off.to_dict()["reuse_verdicts"] is False
    assert PlannerOptions.from_dict(off.to_dict()) == off
