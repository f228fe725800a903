"""Planning at scale (issue 48): screening on part of the trace, confirmed on the whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
)
from inferline.core.estimator import simulate
from inferline.core.planning._parallel import PARALLEL_MIN_QUERIES
from inferline.core.planning._screen import build_screen

SLO_S = 0.3


def _case() -> tuple[Pipeline, Profiles, np.ndarray]:
    p = Pipeline.linear("c3", ["a", "b", "c"])
    rng = np.random.default_rng(48)
    table = {}
    for m in p.models:
        ka, kb = rng.uniform(0.004, 0.010), rng.uniform(0.0004, 0.0012)
        ca, cb = rng.uniform(0.0005, 0.002), rng.uniform(0.010, 0.030)
        table[m] = {
            "gpu-k80": {b: ka + kb * b for b in (1, 2, 4, 8, 16, 32)},
            "cpu": {b: ca + cb * b for b in (1, 2, 4, 8)},
        }
    trace = np.asarray(gamma_trace(150.0, 2.0, 240.0, np.random.default_rng(7)))
    return p, Profiles.from_latencies(table), trace


def test_screen_takes_the_busiest_windows_and_weighs_the_sample() -> None:
    trace = np.asarray(gamma_trace(200.0, 2.0, 1200.0, np.random.default_rng(1)))
    s = build_screen(trace, 99.0, seed=3)
    assert np.all(np.diff(s.trace) >= 0) and s.trace.size == s.weights.size
    assert 0.03 * trace.size < s.trace.size < 0.2 * trace.size
    # the weights estimate the whole trace's size (busy windows 1, the sample scaled up)
    assert 0.7 * trace.size < s.weights.sum() < 1.3 * trace.size
    assert np.any(s.weights == 0.0) and np.any(s.weights == 1.0)  # warm-ups, busy windows
    # the busiest 30 s window is in whole, with weight 1
    counts = np.diff(np.searchsorted(trace, trace[0] + 30.0 * np.arange(41)))
    assert np.count_nonzero(s.weights == 1.0) >= counts.max()
    # the weighted percentile and miss share agree on which side of an SLO they are
    lat = np.random.default_rng(2).exponential(0.05, s.trace.size)
    v = s.value(lat)
    assert s.miss_share(lat, v * 1.001) <= s.allowance < s.miss_share(lat, v * 0.999) + 1e-9
    assert build_screen(trace, 99.0, seed=3).trace.tobytes() == s.trace.tobytes()


def test_screened_plan_matches_the_exact_search() -> None:
    """Screening forced on a small case: the plan costs at most 1.01x the exact search's and
    is feasible on the whole trace by the exact estimator."""
    p, prof, trace = _case()
    exact = Planner(p, prof, trace, SLO_S, options=PlannerOptions(screen=False))
    ref = exact.plan()
    pl = Planner(p, prof, trace, SLO_S, options=PlannerOptions(screen_min_queries=2))
    plan = pl.plan()
    assert pl.screened > 0 and pl.confirmed > 0
    assert exact.screened == 0
    assert plan.cost_per_hour <= 1.01 * ref.cost_per_hour
    # feasible on the whole (margin-compressed) trace the search judges on
    assert simulate(p, plan.models, prof, pl.trace).percentile(99.0) <= SLO_S
    sample = simulate(p, plan.models, prof, trace).percentile(99.0)
    assert plan.estimated_latency_s == pytest.approx(sample)  # exact, on the sample


def test_a_plan_failing_confirmation_turns_screening_off() -> None:
    p, prof, trace = _case()
    pl = Planner(p, prof, trace, SLO_S, options=PlannerOptions(screen_min_queries=2))
    bad = {m: ModelConfig("cpu", 1, 1) for m in p.models}  # far too little capacity
    good = {m: ModelConfig("gpu-k80", 8, 4) for m in p.models}
    assert pl.confirm(pl._key(good))
    assert pl._screen is not None
    pl.latency(bad)
    assert not pl.confirm(pl._key(bad))
    assert pl._screen is None and not pl.feasible(bad) and pl.feasible(good)
    assert set(pl._cache) == set(pl._exact)  # screen verdicts forgotten


def test_screen_options_round_trip_and_validate() -> None:
    assert "screen" not in PlannerOptions().to_dict()  # documents from before stay the same
    for o in (PlannerOptions(), PlannerOptions(screen=False, screen_margin=0.2)):
        assert PlannerOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    for kw, field in (
        ({"screen": "yes"}, "screen"),
        ({"screen_margin": -1}, "screen_margin"),
        ({"screen_min_queries": 1}, "screen_min_queries"),
    ):
        with pytest.raises(ValidationError, match=field):
            PlannerOptions(**kw)
    # admission judges every candidate on the whole trace
    p, prof, trace = _case()
    o = PlannerOptions(screen_min_queries=2, admission=True)
    assert Planner(p, prof, trace, SLO_S, options=o)._screen is None


def _plan_with_workers(workers: int) -> tuple[dict, dict, int, int, int]:
    p, prof, _ = _case()
    trace = np.asarray(gamma_trace(1000.0, 2.0, 205.0, np.random.default_rng(5)))
    assert trace.size >= PARALLEL_MIN_QUERIES
    o = PlannerOptions(screen_min_queries=2, workers=workers)
    pl = Planner(p, prof, trace, SLO_S, options=o)
    plan = pl.plan()
    return plan.to_dict(), pl.stats(), pl.screened, pl.confirmed, pl.taken


def test_workers_do_not_change_the_plan() -> None:
    """Candidates evaluated ahead in forked workers: the same plan, estimate and counters as
    one process (the search takes their results in its own order). Run in a fresh process:
    the planner does not fork from a process with other threads (forking one can deadlock),
    and earlier tests of a suite leave threads behind, so in-process it would test nothing."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_planning_scale as t; "
        "print(json.dumps([t._plan_with_workers(1), t._plan_with_workers(3)], default=repr))"
    )
    here = str(Path(__file__).resolve().parent)
    r = subprocess.run(
        [sys.executable, "-c", code, here], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    one, three = json.loads(r.stdout.strip().splitlines()[-1])
    assert one[4] == 0 and three[4] > 0  # the workers' results were taken
    assert one[:4] == three[:4]
    assert PlannerOptions.from_dict({"workers": 3}).workers == 3
    with pytest.raises(ValidationError, match="workers"):
        PlannerOptions(workers=0)
