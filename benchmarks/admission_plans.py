"""Plan cost with admission by predicted completion off and on (issue 45 item 3).

The planner judges each candidate with the estimator; with ``PlannerOptions.admission`` the
estimator refuses and drops queries as the live queue does (``queue.admission: "predicted"``,
2 ms buffer), a refusal counts as a miss (a plan is feasible when SLO misses plus refusals
stay within the percentile) and ``max_refused`` also bounds the refusals (docs/deadlines.md,
"The estimator and the planner with admission on"). Cases, on a bursty trace (gamma arrivals,
CV 4, seed 0), P99, the paper's test (no rate margin):

- ``sleep``: ``benchmarks/admission.py``'s model (10 ms per batch plus 1 ms per item, CPU,
  batches up to 8), 100 ms SLO, 900 q/s;
- ``image-processing``: the paper's pipeline (``benchmarks/_pipelines.py``), 150 ms SLO,
  200 q/s.

Rows: admission off; on with no bound on refusals beyond the percentile; on with
``max_refused`` 0, 0.001 and 0.01. Columns: the plan's cost, its configurations, and, from
one estimator run of the plan on the trace with admission on, the share of queries that
missed or were refused and the share refused (for the plan made without admission: what it
does when served with admission on), and the planning time.

Run: ``.venv/bin/python benchmarks/admission_plans.py [--smoke] [--seconds S]`` (``--smoke``:
the sleep case on 10 s of trace).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np
from _pipelines import image_processing

from inferline.core import (
    EstimatorOptions,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    gamma_trace,
    plan_inferline,
    simulate,
)
from inferline.core.estimator import EstimatorAdmission

MODES: tuple[tuple[str, bool, float | None], ...] = (
    ("off", False, None),
    ("on", True, None),
    ("on, max_refused 0", True, 0.0),
    ("on, max_refused 0.001", True, 0.001),
    ("on, max_refused 0.01", True, 0.01),
)


def sleep_case() -> tuple[Pipeline, Profiles]:
    p = Pipeline.linear("sleep", ["m"])
    lat = {b: 0.010 + 0.001 * b for b in range(1, 9)}
    return p, Profiles.from_latencies({"m": {"cpu": lat}})


def _configs(plan: Plan) -> str:
    return " ".join(
        f"{m}={c.hardware}/b{c.max_batch_size}x{c.replicas}" for m, c in plan.models.items()
    )


def _shares(
    pipe: Pipeline, prof: Profiles, plan: Plan, trace: np.ndarray, slo: float
) -> tuple[float, float]:
    """(missed or refused, refused) shares of one run of the plan with admission on."""
    opt = EstimatorOptions(admission=EstimatorAdmission(slo))
    r = simulate(pipe, dict(plan.models), prof, trace, options=opt)
    n = max(1, trace.size)
    return np.count_nonzero(r.latencies_s > slo) / n, np.count_nonzero(r.refused_late) / n


def run_case(
    name: str, pipe: Pipeline, prof: Profiles, slo: float, rate: float, seconds: float
) -> list[str]:
    trace = gamma_trace(rate, 4.0, seconds, np.random.default_rng(0))
    out = []
    for label, on, max_refused in MODES:
        opt = PlannerOptions(rate_margin=0.0, admission=on, max_refused=max_refused)
        t0 = time.perf_counter()
        plan = plan_inferline(pipe, prof, trace, slo, options=opt)
        took = time.perf_counter() - t0
        miss, refused = _shares(pipe, prof, plan, trace, slo)
        out.append(
            f"{name:<18} {label:<22} {plan.cost_per_hour:>8.3f} {miss * 100:>9.2f} "
            f"{refused * 100:>9.2f} {took:>7.1f}  {_configs(plan)}"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the sleep case on 10 s of trace")
    ap.add_argument("--seconds", type=float, default=60.0, help="trace length (default 60)")
    args = ap.parse_args(argv)
    seconds = 10.0 if args.smoke else args.seconds
    print(f"Plan cost with admission off and on: gamma trace CV 4, {seconds:g} s, P99")
    print(
        f"{'case':<18} {'admission':<22} {'$/h':>8} {'miss+ref%':>9} {'refused%':>9} "
        f"{'plan s':>7}  configs"
    )
    p, prof = sleep_case()
    rows = run_case("sleep (100 ms)", p, prof, 0.100, 900.0, seconds)
    if not args.smoke:
        p2, prof2 = image_processing()
        rows += run_case("image-proc (150ms)", p2, prof2, 0.150, 200.0, seconds)
    for r in rows:
        print(r)
    print(
        "miss+ref% and refused%: one estimator run of the plan on the trace with admission on "
        "(the off row: its plan served with admission)"
    )
    cmd = " --smoke" if args.smoke else f" --seconds {seconds:g}"
    print(f"reproduce: .venv/bin/python benchmarks/admission_plans.py{cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
