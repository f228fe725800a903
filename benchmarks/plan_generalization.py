"""Does a plan made on one sample hold the SLO on other traffic of the same process?

The planner (InferLine Algorithms 1-2 plus our extensions) returns the cheapest configuration
whose P99 on the *sample* meets the SLO. The sample is one realization of the arrival process,
and the cheapest configuration for it can sit so close to saturation that another realization
(same rate, same CV, same length) misses the SLO: a burst the sample did not have builds a
queue that a model at 95% utilization drains for tens of seconds.

For each pipeline of ``_pipelines.py``, CV and SLO, this plans on ``--seeds`` independent
samples with each ``--margins`` value of ``PlannerOptions.rate_margin`` (configurations judged
on the sample sped up by ``1 + margin``; ``auto``, the default, sizes it from the sample's
windowed rates, ``core/planning/_margin.py``) and runs every plan on ``--fresh`` new
realizations. Printed per (pipeline, margin): the mean margin used, mean cost and its change
from margin 0, mean and largest miss rate on the fresh traces, and how many fresh runs missed
the SLO (miss rate above ``100 - percentile`` = 1%); then the same over all pipelines.

    .venv/bin/python benchmarks/plan_generalization.py           # about 10 minutes, 2 cores
    .venv/bin/python benchmarks/plan_generalization.py --quick   # about 10 s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _pipelines import PIPELINES, add_grid_arguments
from rich.progress import Progress

from inferline.core import InfeasibleError, PlannerOptions, gamma_trace, plan_inferline, simulate
from inferline.core.planning import AUTO_MARGIN, auto_rate_margin


def run(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    jobs = [
        (name, cv, slo, seed)
        for name in args.pipelines
        for cv in args.cvs
        for slo in args.slos
        for seed in args.seeds
    ]
    with Progress(transient=True) as bar:
        task = bar.add_task("planning", total=len(jobs) * len(args.margins))
        for name, cv, slo, seed in jobs:
            pipeline, profiles = PIPELINES[name]()
            rng = np.random.default_rng([seed, int(cv * 10), int(slo * 1000)])
            sample = gamma_trace(args.rate, cv, args.duration_s, rng)
            fresh = [gamma_trace(args.rate, cv, args.duration_s, rng) for _ in range(args.fresh)]
            for margin in args.margins:
                bar.update(task, description=f"{name} cv {cv:g} slo {slo:g} seed {seed} m {margin}")
                try:
                    plan = plan_inferline(
                        pipeline, profiles, sample, slo, options=PlannerOptions(rate_margin=margin)
                    )
                except InfeasibleError:
                    bar.advance(task)
                    continue
                misses = [
                    simulate(pipeline, plan.models, profiles, t).miss_rate(slo) for t in fresh
                ]
                rows.append(
                    {
                        "pipeline": name,
                        "cv": cv,
                        "slo_s": slo,
                        "seed": seed,
                        "margin": margin,
                        "margin_used": auto_rate_margin(sample)
                        if margin == AUTO_MARGIN
                        else margin,
                        "cost_per_hour": plan.cost_per_hour,
                        "sample_miss": simulate(pipeline, plan.models, profiles, sample).miss_rate(
                            slo
                        ),
                        "fresh_miss": misses,
                        "models": {m: c.to_dict() for m, c in plan.models.items()},
                    }
                )
                bar.advance(task)
    return rows


def summarize(rows: list[dict], margins: list[float | str]) -> None:
    print(
        f"{'pipeline':<17} {'margin':>6} {'used':>6} {'plans':>5} {'mean $/h':>9} {'vs m=0':>7} "
        f"{'fresh mean miss':>15} {'max':>7} {'fresh runs > 1%':>15}"
    )
    names = list(dict.fromkeys(r["pipeline"] for r in rows))
    for name in [*names, "all"] if len(names) > 1 else names:
        # compare margins on the cells every margin could plan
        mine = [r for r in rows if name in ("all", r["pipeline"])]
        cells = {(r["pipeline"], r["cv"], r["slo_s"], r["seed"]) for r in mine}
        for m in margins:
            cells &= {
                (r["pipeline"], r["cv"], r["slo_s"], r["seed"]) for r in mine if r["margin"] == m
            }
        base = None
        for m in margins:
            rs = [
                r
                for r in mine
                if r["margin"] == m and (r["pipeline"], r["cv"], r["slo_s"], r["seed"]) in cells
            ]
            if not rs:
                continue
            cost = float(np.mean([r["cost_per_hour"] for r in rs]))
            base = cost if base is None else base
            used = float(np.mean([r["margin_used"] for r in rs]))
            miss = np.array([x for r in rs for x in r["fresh_miss"]])
            shown = m if isinstance(m, str) else f"{m:.2f}"
            print(
                f"{name:<17} {shown:>6} {used:>6.3f} {len(rs):>5} {cost:>9.3f} "
                f"{cost / base - 1:>+7.1%} "
                f"{miss.mean() * 100:>14.2f}% {miss.max() * 100:>6.2f}% "
                f"{int((miss > 0.01).sum()):>7} / {miss.size:<5}"
            )


def _margin(text: str) -> float | str:
    return AUTO_MARGIN if text == AUTO_MARGIN else float(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_grid_arguments(ap)
    ap.add_argument(
        "--rate",
        type=float,
        default=150.0,
        help="mean arrival rate, queries/s (default %(default)s)",
    )
    ap.add_argument(
        "--slos",
        nargs="+",
        type=float,
        default=[0.2, 0.3],
        help="latency SLOs, seconds (default 0.2 0.3)",
    )
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        help="seeds of the planning samples, one each (default 0 1 2)",
    )
    ap.add_argument(
        "--margins",
        nargs="+",
        type=_margin,
        default=[0.0, 0.05, 0.1, AUTO_MARGIN],
        help="rate margins to plan with, numbers or auto; 0 is always added "
        "(default 0 0.05 0.1 auto)",
    )
    ap.add_argument("--fresh", type=int, default=4, help="fresh realizations per plan")
    ap.add_argument("--duration-s", type=float, default=300.0, help="every trace's length")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("out"),
        help="folder for plan_generalization.json (default %(default)s)",
    )
    ap.add_argument("--quick", action="store_true", help="two pipelines, CV 1, one SLO, 120 s")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: image processing, CV 1, one SLO and seed, margins 0 and auto, two "
        "fresh 20 s traces",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.pipelines = ["image-processing", "social-media"]
        args.cvs, args.slos, args.seeds, args.fresh = [1.0], [0.3], [0, 1], 3
        args.duration_s = 120.0
    if args.smoke:
        args.pipelines, args.cvs, args.slos, args.seeds = ["image-processing"], [1.0], [0.3], [0]
        args.margins, args.fresh, args.duration_s = [0.0, AUTO_MARGIN], 2, 20.0
    if 0.0 not in args.margins:
        args.margins = [0.0, *args.margins]
    print(
        f"plans on a {args.duration_s:g} s sample at {args.rate:g} q/s (CV {args.cvs}, SLO "
        f"{args.slos} s, seeds {args.seeds}), each run on {args.fresh} fresh realizations of "
        "the same process; miss = SLO miss rate (P99 target: at most 1%)"
    )
    t0 = time.monotonic()
    rows = run(args)
    summarize(rows, args.margins)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "plan_generalization.json"
    path.write_text(json.dumps(rows, indent=1))
    print(f"rows: {path}; {time.monotonic() - t0:.0f} s")
    print(
        "reproduce: .venv/bin/python benchmarks/plan_generalization.py "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
