"""Plans on calibrated profiles, measured live: does a plan called feasible meet its SLO?

For tight SLOs on the demo pipeline (bundled runtime, this machine), per (SLO, rate):

1. plan on the profiles, as ``inferline plan`` does (per-hop overhead measured at low load),
   apply the plan to the running server and replay a fresh trace;
2. calibrate the profiles to that replay's live service times (``inferline calibrate``);
3. re-plan on the calibrated profiles with ``--service-spread`` (overhead refitted with them),
   apply, and replay another fresh trace;
4. plan on the profiles with the replicas pinned to this machine's cores as the runtime
   places them (``--pinned-cores``, what ``inferline serve`` and the demo do; no calibration),
   apply, and replay another fresh trace.

Printed per point and plan: the plan, its cost, the planner's estimated P99 on the replayed
trace, the measured P99 and SLO miss rate. A plan "holds" when its measured P99 is within the
SLO; an infeasible answer is an honest one when the first plan did not hold.

    .venv/bin/python benchmarks/calibrated_plans.py [--quick | --smoke] [--profiles out/fidelity/profiles.json]
        [--pipeline out/fidelity/pipeline.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fidelity import demo_arguments, demo_setup, lengths, low_load_hop, plan_str

from inferline.core import (
    EstimatorOptions,
    InfeasibleError,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    gamma_trace,
    plan_inferline,
)
from inferline.demo.pipeline import test_inputs
from inferline.measure import (
    ServerProcess,
    calibrate_profiles,
    encode_bodies,
    estimate,
    hop_overhead_from,
    live_service_from_admin,
    replay,
)
from inferline.server import run_loop

POINTS = [(20.0, 50.0), (20.0, 100.0), (25.0, 150.0)]
# --smoke: one looser point, which short profiles still find feasible, so that the
# calibrate and re-plan steps run too
SMOKE_POINTS = [(40.0, 50.0)]


async def _serve_plan(
    client: httpx.AsyncClient,
    url: str,
    bodies: list[bytes],
    pipeline: Pipeline,
    profiles: Profiles,
    opts: EstimatorOptions,
    plan: Plan,
    rate: float,
    slo_s: float,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Apply ``plan``, warm it up, replay a fresh trace; estimate that trace as planned."""
    (await client.put(f"{url}/admin/plan", json=plan.to_dict())).raise_for_status()
    n = lengths(args)
    await replay(gamma_trace(rate, 1.0, n.calibration, rng), url, "digits", bodies)
    fresh = gamma_trace(rate, 1.0, n.replay, rng)
    meas = await replay(fresh, url, "digits", bodies, slo_s=slo_s)
    sim = estimate(
        pipeline,
        plan,
        profiles,
        fresh,
        hop_overhead_s=opts.hop_overhead_s,
        service_spread=opts.service_spread,
        base=opts,
    )
    return {
        "plan": {m: c.to_dict() for m, c in plan.models.items()},
        "cost_per_hour": plan.cost_per_hour,
        "estimated_p99_ms": sim.percentile(99) * 1e3,
        "measured_p99_ms": meas.percentile(99) * 1e3,
        "measured_miss_rate": meas.miss_rate(),
        "errors": int((meas.status != 200).sum()),
        "admin": (await client.get(f"{url}/admin/models")).json(),
    }


def _plan(
    pipeline: Pipeline,
    profiles: Profiles,
    opts: EstimatorOptions,
    rate: float,
    slo_s: float,
    rng: np.random.Generator,
    sample_s: float = 60.0,
) -> Plan | str:
    sample = gamma_trace(rate, 1.0, sample_s, rng)
    try:
        return plan_inferline(
            pipeline, profiles, sample, slo_s, options=PlannerOptions(estimator=opts)
        )
    except InfeasibleError as e:
        return str(e)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out, pipeline, profiles, rng = await demo_setup(args)
    xt, _ = test_inputs()
    bodies = encode_bodies(list(xt))
    rows = []
    base = {m: ModelConfig("cpu", 1, 1) for m in pipeline.models}
    with ServerProcess(out / "deployment.json", log_path=out / "server.log") as srv:
        hop, _, _, low = await low_load_hop(
            srv.url, bodies, pipeline, profiles, rng, lengths(args).low
        )
        raw = EstimatorOptions(hop_overhead_s=hop)
        pin = EstimatorOptions(pinned_cores={"cpu": len(os.sched_getaffinity(0))})
        pin = replace(
            pin, hop_overhead_s=hop_overhead_from(low, pipeline, base, profiles, base=pin)
        )
        async with httpx.AsyncClient(timeout=600) as client:
            for slo_ms, rate in SMOKE_POINTS if args.smoke else POINTS:
                slo_s = slo_ms / 1e3
                row: dict[str, Any] = {"slo_ms": slo_ms, "rate": rate}
                sample_s = lengths(args).sample
                first = _plan(pipeline, profiles, raw, rate, slo_s, rng, sample_s)
                if isinstance(first, str):
                    row["profiled"] = {"infeasible": first}
                    rows.append(row)
                    continue
                a = await _serve_plan(
                    client, srv.url, bodies, pipeline, profiles, raw, first, rate, slo_s, args, rng
                )
                hw = {m: c.hardware for m, c in first.models.items()}
                cal, cal_rows = calibrate_profiles(
                    profiles, hw, live_service_from_admin(a.pop("admin")), args.min_batches
                )
                hop_c = hop_overhead_from(low, pipeline, base, cal, service_spread=True)
                opts_c = replace(raw, hop_overhead_s=hop_c, service_spread=True)
                row["profiled"] = a
                row["factors"] = {
                    c.model: [round(c.p50_factor, 2), round(c.p99_factor, 2)] for c in cal_rows
                }
                for kind, prof, opts in (("calibrated", cal, opts_c), ("pinned", profiles, pin)):
                    again = _plan(pipeline, prof, opts, rate, slo_s, rng, sample_s)
                    if isinstance(again, str):
                        row[kind] = {"infeasible": again}
                        continue
                    b = await _serve_plan(
                        client, srv.url, bodies, pipeline, prof, opts, again, rate, slo_s,
                        args, rng,
                    )  # fmt: skip
                    b.pop("admin")
                    row[kind] = b
                rows.append(row)
                print(json.dumps(row))
    return rows


def main() -> int:
    ap = demo_arguments(__doc__)
    ap.add_argument("--duration-s", type=float, default=30.0, help="measured replay, s")
    ap.add_argument("--seed", type=int, default=3, help="seed of the arrival traces")
    ap.add_argument("--min-batches", type=int, default=20, help="calibrate --min-batches")
    ap.add_argument("--out", default="out/calibrated_plans", help="output folder")
    args = ap.parse_args()
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    rows = run_loop(run(args))
    Path(args.out, "calibrated_plans.json").write_text(json.dumps(rows, indent=2) + "\n")
    print()
    print(
        "plans on profiled vs calibrated profiles vs profiled with pinned cores, digits "
        "pipeline on the bundled runtime"
    )
    print(
        f"{'SLO ms':>7}{'q/s':>6}  {'profiles':<11}{'plan':<28}{'$/h':>7}{'est P99':>9}"
        f"{'meas P99':>9}{'miss':>7}  {'holds':<6}"
    )
    for r in rows:
        for kind in ("profiled", "calibrated", "pinned"):
            x = r.get(kind)
            if x is None:
                continue
            head = f"{r['slo_ms']:>7.0f}{r['rate']:>6.0f}  {kind:<11}"
            if "infeasible" in x:
                print(f"{head}infeasible: {x['infeasible'][:80]}")
                continue
            holds = x["measured_p99_ms"] <= r["slo_ms"]
            print(
                f"{head}{plan_str(x['plan']):<28}{x['cost_per_hour']:>7.3f}"
                f"{x['estimated_p99_ms']:>9.1f}{x['measured_p99_ms']:>9.1f}"
                f"{x['measured_miss_rate']:>7.2%}  {'yes' if holds else 'NO':<6}"
            )
        if "factors" in r:
            print(f"{'':>15}calibration factors (p50, p99): {r['factors']}")
    print(
        f"load average at start {load0:.1f} on {os.cpu_count()} cores; "
        f"{time.perf_counter() - t0:.0f} s in all; details in {args.out}/calibrated_plans.json"
    )
    print(
        "reproduce: .venv/bin/python benchmarks/calibrated_plans.py"
        f"{' --smoke' if args.smoke else ' --quick' if args.quick else ''}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
