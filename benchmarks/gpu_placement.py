"""GPU-aware planning and placement on the bundled runtime, measured on a real GPU.

The pipeline is ``digits_cnn`` (preprocess -> a CNN trained at start, ``inferline.demo.cnn``).
On a machine with an NVIDIA GPU the benchmark trains the CNN (on the GPU), gives the bundled
runtime ``--cores`` CPU cores and the first GPU, profiles both models on both kinds, then for
three operating points plans within that inventory (the GPU replica's host cores counted),
applies the plan to a running server, replays a fresh trace and compares the estimator's P99
with the measured one, as ``benchmarks/fidelity.py`` does. The points are derived from the
measured profile, so that the cheapest plan differs:

* ``cpu``: a loose SLO at a rate a few CPU cores carry: the CNN should stay on CPU cores;
* ``rate``: the same SLO at 1.3x what all the CPU cores could carry: the CNN needs the GPU;
* ``slo``: an SLO below the CNN's batch-1 latency on a CPU core: only the GPU meets it.

Checks: each plan fits the inventory, replicas sit where the plan says (GPU replicas on the
GPU, CPU replicas on cores of their own), the measured P99 meets the SLO, and the estimate is
within 15% of it.

    .venv/bin/python benchmarks/gpu_placement.py [--quick | --smoke] [--cores 6]

Without a GPU it stops at once, naming what it looked for (``nvidia-smi -L``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from fidelity import measure_points, plan_str, profiler_options, wake_lines

from inferline.adapters.local import detect_gpus
from inferline.cli.profile import add_profiler_arguments
from inferline.core import (
    DEFAULT_CATALOG,
    Hardware,
    HardwareCatalog,
    Plan,
    PlannerOptions,
    save,
)
from inferline.core.planning import over_inventory
from inferline.demo.cnn import cnn_deployment_dict, train_cnn
from inferline.demo.pipeline import sample_inputs
from inferline.deploy import Deployment
from inferline.measure import profile_deployment
from inferline.server import run_loop


def _backend_cores(n: int) -> list[int]:
    """The last ``n`` cores this process may use: the first ones stay for the server and the
    replay client, which the estimator does not model."""
    have = sorted(os.sched_getaffinity(0))
    if not 2 <= n <= len(have):
        raise SystemExit(
            f"--cores {n}: expected 2..{len(have)} (the server starts a CPU replica per model)"
        )
    if n > len(have) - 2:
        print(f"note: --cores {n} of {len(have)} leaves the server and the client no core")
    return have[-n:]


def _profile_table(profiles: Any, kind: str) -> list[str]:
    sizes = sorted(set(profiles.batch_sizes("cnn", "cpu")) | set(profiles.batch_sizes("cnn", kind)))
    lines = [f"{'batch':>6}{'preprocess cpu':>16}{'cnn cpu':>10}{'cnn ' + kind:>14}  (ms)"]
    for b in sizes:
        cells = []
        for m, hw in (("preprocess", "cpu"), ("cnn", "cpu"), ("cnn", kind)):
            known = b in profiles.batch_sizes(m, hw)
            cells.append(f"{profiles.latency(m, hw, b) * 1e3:.2f}" if known else "-")
        lines.append(f"{b:>6}{cells[0]:>16}{cells[1]:>10}{cells[2]:>14}")
    return lines


def _max_rate_on_cpu(profiles: Any, cores: int) -> float:
    """Queries/s the CNN could carry with one replica per core (preprocess on one), at the
    batch size that gives a replica the most throughput: an upper bound."""
    per = max(b / profiles.latency("cnn", "cpu", b) for b in profiles.batch_sizes("cnn", "cpu"))
    return per * max(1, cores - 1)


async def run(args: argparse.Namespace) -> dict[str, Any]:

    gpus = detect_gpus()
    if not gpus:
        raise SystemExit("no NVIDIA GPU: `nvidia-smi -L` lists none (and CUDA_VISIBLE_DEVICES)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    trained = train_cnn(out / "cnn.pt", width=args.width, epochs=args.epochs, seed=args.seed)
    print(f"cnn (width {args.width}) trained: {json.dumps(trained)}")

    cores = _backend_cores(args.cores)
    kind = args.gpu_kind
    url = f"local://?cores={','.join(map(str, cores))}&gpus={gpus[0]}&gpu_kind={kind}"
    dep_d = cnn_deployment_dict(out / "cnn.pt", args.width, backend=url)
    (out / "deployment.json").write_text(json.dumps(dep_d))
    dep = Deployment.from_dict(dep_d)
    catalog = DEFAULT_CATALOG.merged(HardwareCatalog({kind: Hardware("gpu", args.gpu_price)}))
    threads = {s.name: s.threads for s in dep.models}
    inventory = {"cpu": len(cores), kind: 1}

    t0 = time.perf_counter()
    popts = profiler_options(args, max_batch_size=32, warmup=5)
    result, pipeline = await profile_deployment(dep, popts, samples=sample_inputs(120))
    profiles = result.profiles
    save(profiles, out / "profiles.json")
    print(f"profiles ready in {time.perf_counter() - t0:.0f} s")
    table = _profile_table(profiles, kind)
    print("\n".join(table))

    idle = wake_lines(profiles)
    print("\n".join(idle))

    cpu_b1 = profiles.latency("cnn", "cpu", 1)
    cpu_rate = _max_rate_on_cpu(profiles, len(cores))
    points = [
        ("cpu", 100.0, round(min(0.25 * cpu_rate, 200.0))),
        ("rate", 100.0, round(1.3 * cpu_rate)),
        ("slo", round(max(8.0, 0.8 * cpu_b1 * 1e3), 1), 100),
    ]
    print(f"cnn on a CPU core: {cpu_b1 * 1e3:.1f} ms at batch 1; cores carry <= {cpu_rate:.0f} q/s")

    options = PlannerOptions(
        inventory=inventory,
        replica_units=threads,
        gpu_host_units=threads,  # the bundled runtime pins a GPU replica's threads too
    )

    def check(plan: Plan, row: dict[str, Any]) -> None:
        row["fits"] = over_inventory(plan.models, catalog, options) is None
        row["placed_as_planned"] = _placed_as_planned(row, kind)

    at = [(slo_ms, rate) for _, slo_ms, rate in points]
    rows = await measure_points(args, out, pipeline, profiles, at, options, rng, catalog, check)
    for (name, _, _), row in zip(points, rows, strict=True):
        row["point"] = name
    return {
        "trained": trained,
        "inventory": inventory,
        "profile": table,
        "wake_up": idle,
        "rows": rows,
    }


def _placed_as_planned(row: dict[str, Any], kind: str) -> bool:
    """Every model has its planned number of replicas, on the GPU iff planned there, and no
    two replicas share a core."""
    seen: list[str] = []
    for m, cfg in row["plan"].items():
        where = row["placement"].get(m, [])
        on_gpu = [w for w in where if w.startswith("gpu")]
        if len(where) != cfg["replicas"]:
            return False
        if len(on_gpu) != (cfg["replicas"] if cfg["hardware"] == kind else 0):
            return False
        seen += [w for w in where if w.startswith("cores")]
    return len(seen) == len(set(seen))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer profiling samples, 12 s replays")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="under a minute: the CNN trained one epoch, a few profiling batches, 2 s replays; "
        "placement is checked, the SLO and estimate targets are not judged",
    )
    ap.add_argument(
        "--cores", type=int, default=6, help="CPU cores the runtime gets (default %(default)s)"
    )
    ap.add_argument("--width", type=int, default=256, help="CNN width (default %(default)s)")
    ap.add_argument("--epochs", type=int, default=8, help="CNN training epochs (default 8)")
    ap.add_argument(
        "--gpu-kind", default="gpu-h100", help="catalog name of the GPU (default %(default)s)"
    )
    ap.add_argument(
        "--gpu-price",
        type=float,
        default=12.29,
        help="its price per hour (default %(default)s: AWS p5.48xlarge on demand / 8 GPUs)",
    )
    add_profiler_arguments(ap)
    ap.add_argument("--duration-s", type=float, default=20.0, help="each replay (default 20)")
    ap.add_argument("--cv", type=float, default=1.0, help="burstiness of the traces (default 1)")
    ap.add_argument("--seed", type=int, default=1, help="seed of training and traces")
    ap.add_argument("--out", default="out/gpu", help="output folder (default %(default)s)")
    args = ap.parse_args()
    if args.smoke:
        args.epochs = 1
    t0 = time.perf_counter()
    res = run_loop(run(args))
    Path(args.out, "gpu_placement.json").write_text(json.dumps(res, indent=2) + "\n")
    print()
    print(f"GPU-aware planning on the bundled runtime: inventory {res['inventory']}")
    print(
        f"{'point':<6}{'SLO ms':>7}{'q/s':>6}  {'plan':<26}{'$/h':>7}{'est P99':>9}"
        f"{'meas P99':>9}{'error':>8}{'miss':>7}  {'placed':<7}{'meets SLO':<10}{'within 15%':<10}"
        f"{'no wake-up: est':>16}{'error':>7}"
    )
    ok = True
    for r in res["rows"]:
        head = f"{r['point']:<6}{r['slo_ms']:>7}{r['rate']:>6}  "
        if not r["feasible"]:
            print(head + "infeasible: " + r["reason"][:80])
            ok = ok and args.smoke  # short profiles (--smoke) may leave a point infeasible
            continue
        meets = r["measured_p99_ms"] <= r["slo_ms"]
        within = abs(r["error"]) <= 0.15
        placed = r["placed_as_planned"] and r["fits"]
        ok &= placed and (meets or args.smoke)
        print(
            head + f"{plan_str(r['plan']):<26}{r['cost_per_hour']:>7.3f}"
            f"{r['estimated_p99_low_load_hop_ms']:>9.1f}{r['measured_p99_ms']:>9.1f}"
            f"{r['error']:>+8.0%}{r['measured_miss_rate']:>7.2%}  {'yes' if placed else 'NO':<7}"
            f"{'yes' if meets else 'NO':<10}{'yes' if within else 'no':<10}"
            f"{r['estimated_p99_without_wake_ms']:>16.1f}{r['error_without_wake']:>+7.0%}"
        )
    print()
    print("\n".join(res["wake_up"]))
    print()
    print(
        f"{time.perf_counter() - t0:.0f} s in all on {os.cpu_count()} cores; "
        f"details in {args.out}/gpu_placement.json"
    )
    print("reproduce: .venv/bin/python benchmarks/gpu_placement.py " + " ".join(sys.argv[1:]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
