"""How close InferLine's greedy planner gets to the exhaustive optimum on small random cases.

For each case (a random 2- or 3-model pipeline, random profiles on cpu / gpu-k80 / gpu-v100,
a gamma trace with random rate and CV, a random SLO) it plans with the planner and searches the
whole space (hardware x batch-size ladder x replicas 1..R per model) in increasing cost order
with the same estimator; the first feasible configuration is the optimum. It prints the ratio
plan cost / optimum per case and over the set, for the full planner and for the paper's
Algorithms 1-2 alone (``PlannerOptions(escape=False, widen=False)``).

    .venv/bin/python benchmarks/planner_optimality.py [--cases 30] [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    InfeasibleError,
    ModelConfig,
    Pipeline,
    Planner,
    PlannerOptions,
    Profiles,
    gamma_trace,
)

HARDWARE = ("cpu", "gpu-k80", "gpu-v100")


@dataclass
class Case:
    pipeline: Pipeline
    profiles: Profiles
    trace: np.ndarray
    slo_s: float
    rate: float
    cv: float


def random_case(rng: np.random.Generator, duration_s: float) -> Case:
    """A small random pipeline whose exhaustive space is a few thousand configurations."""
    n = int(rng.integers(2, 4))
    names = [f"m{i}" for i in range(n)]
    shape = rng.choice(["linear", "fanout"]) if n == 3 else "linear"
    if shape == "linear":
        edges = tuple(itertools.pairwise(names))
        scale = {}
    else:
        edges = (("m0", "m1"), ("m0", "m2"))
        scale = {"m2": float(rng.choice([0.3, 0.5, 1.0]))}
    pipeline = Pipeline(f"case-{shape}-{n}", tuple(names), edges, scale)
    table: dict[str, dict[str, dict[int, float]]] = {}
    for m in names:
        hw: dict[str, dict[int, float]] = {}
        # a GPU model (batching helps) or a CPU-friendly one (no batching benefit on CPU)
        base = float(rng.uniform(0.004, 0.02))
        hw["gpu-v100"] = {b: base + base * 0.15 * b for b in (1, 2, 4, 8)}
        hw["gpu-k80"] = {b: 2.2 * base + 2.2 * base * 0.3 * b for b in (1, 2, 4, 8)}
        if rng.random() < 0.6:
            cpu = base * float(rng.uniform(1.5, 6.0))
            hw["cpu"] = {b: cpu * b for b in (1, 2, 4, 8)}
        table[m] = hw
    profiles = Profiles.from_latencies(table)
    rate = float(rng.choice([20.0, 40.0, 80.0]))
    cv = float(rng.choice([1.0, 2.0, 4.0]))
    trace = gamma_trace(rate, cv, duration_s, rng)
    # an SLO between 1.5x and 6x the fastest service time
    fastest = pipeline.critical_path(
        {m: min(profiles.latency(m, h, 1) for h in profiles.hardware_for(m)) for m in names}
    )[0]
    slo = round(fastest * float(rng.uniform(1.5, 6.0)), 4)
    return Case(pipeline, profiles, trace, slo, rate, cv)


def exhaustive_optimum(case: Case, planner: Planner, max_replicas: int) -> tuple[float, dict]:
    """Cheapest feasible configuration: enumerate all in increasing cost, stop at the first
    feasible one (the planner's cached, bound-pruned estimator does the judging)."""
    per_model = []
    for m in case.pipeline.models:
        opts = []
        for h in case.profiles.hardware_for(m):
            price = DEFAULT_CATALOG.cost(h)
            ladder = [1]
            while (nb := planner.next_batch(m, h, ladder[-1])) is not None:
                ladder.append(nb)
            for b in ladder:
                for r in range(1, max_replicas + 1):
                    opts.append((r * price, ModelConfig(h, b, r)))
        per_model.append(opts)
    combos = []
    for combo in itertools.product(*per_model):
        combos.append((sum(c for c, _ in combo), tuple(mc for _, mc in combo)))
    combos.sort(key=lambda t: t[0])
    for cost, cfgs in combos:
        configs = dict(zip(case.pipeline.models, cfgs, strict=True))
        if planner.feasible(configs):
            return cost, configs
    return math.inf, {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--cases",
        type=int,
        default=30,
        help="random cases the planner finds feasible (default %(default)s)",
    )
    ap.add_argument(
        "--duration-s",
        type=float,
        default=60.0,
        help="each case's trace length, seconds (default %(default)s)",
    )
    ap.add_argument("--max-replicas", type=int, default=6, help="exhaustive search bound")
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of the random cases (default %(default)s)"
    )
    ap.add_argument("--quick", action="store_true", help="8 cases on 30 s traces")
    ap.add_argument("--smoke", action="store_true", help="1 case on a 10 s trace, up to 3 replicas")
    args = ap.parse_args(argv)
    if args.quick:
        args.cases, args.duration_s = 8, 30.0
    if args.smoke:
        args.cases, args.duration_s, args.max_replicas = 1, 10.0, 3
    rng = np.random.default_rng(args.seed)
    rows = []
    print(
        f"{'case':>4} {'pipeline':<16} {'rate':>5} {'cv':>3} {'slo_s':>7} {'plan $/h':>9} "
        f"{'opt $/h':>9} {'ratio':>6} {'plan_s':>7} {'paper $/h':>9} {'ratio':>6}"
    )
    paper_rows = []
    done = 0
    attempts = 0
    while done < args.cases and attempts < args.cases * 5:
        attempts += 1
        case = random_case(rng, args.duration_s)
        t0 = time.perf_counter()
        planner = Planner(case.pipeline, case.profiles, case.trace, case.slo_s)
        try:
            plan = planner.plan()
        except InfeasibleError:
            continue
        plan_s = time.perf_counter() - t0
        paper = Planner(
            case.pipeline,
            case.profiles,
            case.trace,
            case.slo_s,
            options=PlannerOptions(escape=False, widen=False),
        ).plan()
        top = max(
            args.max_replicas,
            *(c.replicas for c in plan.models.values()),
            *(c.replicas for c in paper.models.values()),
        )
        opt, _ = exhaustive_optimum(case, planner, top)
        ratio = plan.cost_per_hour / opt
        pratio = paper.cost_per_hour / opt
        done += 1
        rows.append(ratio)
        paper_rows.append(pratio)
        print(
            f"{done:>4} {case.pipeline.name:<16} {case.rate:>5.0f} {case.cv:>3.0f} "
            f"{case.slo_s:>7.4f} {plan.cost_per_hour:>9.4f} {opt:>9.4f} {ratio:>6.3f} "
            f"{plan_s:>7.2f} {paper.cost_per_hour:>9.4f} {pratio:>6.3f}",
            flush=True,
        )
    print()
    for label, vals in (("planner", rows), ("paper Alg. 1-2 only", paper_rows)):
        r = np.array(vals)
        print(
            f"{label:<20} {len(r)} cases: mean ratio {r.mean():.3f} "
            f"(geometric {np.exp(np.log(r).mean()):.3f}), median {np.median(r):.3f}, "
            f"max {r.max():.3f}, optimal in {np.mean(r <= 1 + 1e-9) * 100:.0f}%, "
            f"within 1.2x in {np.mean(r <= 1.2 + 1e-9) * 100:.0f}%"
        )
    print("target: within 1.2x of the exhaustive optimum, aim 1.05x")
    print(
        f"reproduce: .venv/bin/python benchmarks/planner_optimality.py {' '.join(argv or sys.argv[1:])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
