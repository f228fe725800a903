"""Model-Switching live: the two Azure traces replayed through ``inferline serve`` (docs/variants.md).

Variants: random forests of 200, 100 and 30 trees on scikit-learn's digits
(``benchmarks/_digits.py``), trained at start inside their replica processes. Queries are
the held-out 30% of the digits with Gaussian pixel noise (sigma 5 on 0..16), so the variants
differ in accuracy. Measured at start through a real ``inferline serve`` per variant (two
replicas; the three servers side by side, ``--rounds`` interleaved rounds with the order
rotated, each figure the variant's median over the rounds): its accuracy on the 540 held-out
images, its cost at saturation (four closed-loop callers; 2 x elapsed / queries, which sets
the replay's rate) and its replicas' median batch service time meanwhile, the profile the
effective-accuracy table is estimated from (the quantity the live table measures while
serving). That server's SLO is 30 s so no answer expires. ``--seeds N`` replays N
consecutive slices of each trace (other image orders) and pools the effective accuracy.

Then, per trace (Azure LLM inference 2023 ``conv`` and ``code``; a contiguous slice from the
start, time compressed so its mean rate is ``--load`` x the most accurate variant's measured
capacity, or ``--mean-qps``), one server per run on the same replay: ``--switching model-switching`` over
the three variants, and each variant alone (the same switching file with only that variant:
same replicas, same code path). Core budget 2 (two replicas, one thread each, batch size 1, as
in the paper); warm spares keep two replicas, so a switch is a route change and a priority
change. Queries whose deadline passes in a queue expire (``expire_late``) in every run.

Effective accuracy (Zhang et al., eq. 1, counted per query): the share of queries answered
with the right label within the deadline; a query answered late, with an error or not at all
counts as wrong. Deadline = the app's SLO (``--slo-ms``).

Run: ``.venv/bin/python benchmarks/switching_live.py [--quick]``. Traces: Azure LLM inference
2023 (Patel et al., Splitwise, ISCA 2024; CC-BY 4.0, Azure Public Dataset).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data, distort
from inferline.core import load_csv_trace, peak_rate
from inferline.measure import ServerProcess, encode_bodies, replay

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
TREES = {"f200": 200, "f100": 100, "f30": 30}
# One setting for both traces. The live table: a first rebuild 2 s into a 20 s replay (it
# was 10 s) from the last 5 s of batches (at ~28 q/s, ~140 batches: rebuild_min_batches 10
# is met on the serving variant), the spares scaled by its factor (rebuild_unobserved
# "common"). The dwell stays 0.5 s: 2 s was tried on `code` (interleaved with 0.5 s, seeds 0
# and 1) and lost (0.5444 vs 0.7556, 0.7722 vs 0.7750): it holds f200 into a burst.
LIVE_TABLE = {
    "rebuild_s": 2.0,
    "rebuild_window_s": 5.0,
    "rebuild_min_batches": 10,
    "rebuild_unobserved": "common",
    "min_dwell_s": 0.5,
}


def held_out(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The held-out split (never trained on) with pixel noise: inputs and labels."""
    _, _, xte, yte = digits_data()
    return distort(xte, "noise:5", seed).astype(np.float32), yte


def deployment(variants: list[str], apps: dict[str, str], slo_ms: float) -> dict[str, Any]:
    """Models ``variants`` (forests) and apps ``{app: stage}`` (one-stage pipelines)."""
    return {
        "format": "inferline.deployment/1",
        "name": "switching-live",
        "backend": "local://?oversubscribe=1",
        "models": [
            {"name": v, "source": SRC, "params": {"kind": "forest", "trees": TREES[v]}}
            for v in variants
        ],
        "apps": {
            a: {
                "pipeline": "inferline.demo.simple:passthrough",
                "pipeline_params": {"model": stage},
                "slo_ms": slo_ms,
                "input": {"dtype": "float32", "shape": [64]},
            }
            for a, stage in apps.items()
        },
        # a query past its deadline is wrong anyway: expire it instead of serving it late
        "queue": {"max_queue": 100000, "expire_late": True},
    }


def label_of(body: bytes) -> int:
    try:
        d = json.loads(body)
    except ValueError:
        return -1
    out = d.get("output", d) if isinstance(d, dict) else d
    while isinstance(out, list) and out:
        out = out[0]
    return int(out) if isinstance(out, (int, float)) else -1


async def run_replay(
    url: str, app: str, times: np.ndarray, xs: np.ndarray, slo_s: float
) -> tuple[Any, np.ndarray]:
    """Replay ``times``; query i carries image ``i % len(xs)``. Returns (result, labels)."""
    n = times.size
    labels = np.full(n, -1)

    def got(i: int, status: int, body: bytes) -> None:
        if status == 200:
            labels[i] = label_of(body)

    bodies = encode_bodies([xs[i % len(xs)] for i in range(n)])
    res = await replay(times, url, app, bodies, slo_s=slo_s, on_answer=got)
    return res, labels


async def closed_loop(
    url: str, app: str, xs: np.ndarray, clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """``clients`` callers, each sending its next query when the previous one is answered:
    (labels, latencies) in the order of ``xs``."""
    import httpx

    labels = np.full(len(xs), -1)
    lat = np.zeros(len(xs))

    async def caller(c: Any, idx: range) -> None:
        for i in idx:
            t0 = time.perf_counter()
            r = await c.post(f"/apps/{app}/predict", json={"input": xs[i].tolist()})
            lat[i] = time.perf_counter() - t0
            labels[i] = label_of(r.content) if r.status_code == 200 else -1

    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        await asyncio.gather(*(caller(c, range(k, len(xs), clients)) for k in range(clients)))
    return labels, lat


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The variants' order in each measurement round: rotated by one each round, so no
    variant is always measured first or last (a load that comes and goes hits them alike)."""
    k = len(names)
    return [names[r % k :] + names[: r % k] for r in range(rounds)]


def median_of_rounds(per_round: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's median over its rounds (one round slowed by a passing load is out-voted)."""
    return {v: float(np.median(xs)) for v, xs in per_round.items()}


def replica_p50(url: str, variant: str) -> float:
    """The median batch service time of ``variant``'s replicas over the server's live-table
    window (``GET /admin/switching``): what the live table measures while serving."""
    import httpx

    snap = httpx.get(f"{url}/admin/switching", timeout=30).json()
    return float(snap["window"]["timings"][variant]["1"]["p50_s"])


def measure_variants(
    tmp: Path, slo_ms: float, queries: int | None = None, rounds: int = 3
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per variant, through ``inferline serve`` as it will be served (two replicas): accuracy
    on the held-out split; its cost at saturation, four closed-loop callers keeping both
    replicas busy: 2 x elapsed / queries (what one query costs the two cores, the server's
    and the caller's share included: sets the replay's rate); and its replicas' median batch
    service time meanwhile (the profile: the quantity the live table measures, so that the
    live factors of all variants compare). The three servers run side by side (idle ones cost
    nothing) and are measured in ``rounds`` interleaved rounds, the order rotated each round;
    each figure is the variant's median over the rounds (one variant after another, once
    each, put a loaded minute on one of them: f200 measured faster than f100). Returns
    (accuracy, cost, service). ``queries``: measure on the first ones only (``--smoke``)."""
    xs, ys = held_out()
    xs, ys = xs[:queries], ys[:queries]
    right = {v: 0 for v in TREES}
    cost: dict[str, list[float]] = {v: [] for v in TREES}
    svc: dict[str, list[float]] = {v: [] for v in TREES}
    guess = {v: 1e-4 * n for v, n in TREES.items()}  # only orders the options; one here
    with contextlib.ExitStack() as stack:
        urls = {}
        for v in TREES:
            dep = tmp / f"measure-{v}.json"
            # a deadline nobody reaches: an expired answer would count as a wrong label and
            # cut the measured service time short (both seen on the loaded machine)
            dep.write_text(json.dumps(deployment([v], {"digits": v}, max(slo_ms, 30_000.0))))
            sw = switching_file(tmp, [v], {v: 1.0}, guess)
            args = ["--switching", "model-switching", "--switching-config", str(sw)]
            urls[v] = stack.enter_context(ServerProcess(dep, extra_args=args)).url
        for v in TREES:
            asyncio.run(closed_loop(urls[v], "digits", xs[:40], 4))  # warm-up
        for r, order in enumerate(round_orders(list(TREES), rounds)):
            for v in order:
                t0 = time.perf_counter()
                labels, _ = asyncio.run(closed_loop(urls[v], "digits", xs, 4))
                cost[v].append(2 * (time.perf_counter() - t0) / len(xs))
                svc[v].append(replica_p50(urls[v], v))
                right[v] += int(np.sum(labels == ys))
            print(
                f"  round {r + 1} ({' '.join(order)}): "
                + ", ".join(
                    f"{v} {cost[v][-1] * 1e3:.1f} ms (replica {svc[v][-1] * 1e3:.1f})"
                    for v in order
                ),
                flush=True,
            )
    acc = {v: right[v] / (rounds * len(xs)) for v in TREES}
    return acc, median_of_rounds(cost), median_of_rounds(svc)


def trace_slice(name: str, mean_qps: float, seconds: float, seed: int = 0) -> np.ndarray:
    """``mean_qps x seconds`` consecutive arrivals of a trace, time compressed (shape kept) to
    last ``seconds``: seed 0 the first ones, seed s the s-th slice after them."""
    raw = load_csv_trace(TRACES / f"azure_llm_2023_{name}.csv")
    n = int(mean_qps * seconds)
    start = seed * (n + 1)
    if start + n + 1 > len(raw):
        raise SystemExit(f"trace {name}: {len(raw)} arrivals, too few for seed {seed}")
    t = np.asarray(raw[start : start + n + 1], dtype=float)
    t = (t - t[0]) * (seconds / (t[-1] - t[0]))
    return t[:n]


def switching_file(
    tmp: Path,
    variants: list[str],
    acc: dict[str, float],
    lat: dict[str, float],
    cv: float = 2.0,
    queue: str = "shared",
    rate_window: int = 24,
) -> Path:
    prof = tmp / "profiles.json"
    from inferline.core import Profiles

    prof.write_text(
        json.dumps(Profiles.from_latencies({v: {"cpu": {1: lat[v]}} for v in lat}).to_dict())
    )
    path = tmp / f"switching-{'-'.join(variants)}.json"
    cfg = {
        "format": "inferline.switching/1",
        "app": "digits",
        "stage": variants[0],
        "variants": [{"name": v, "accuracy": round(acc[v], 4)} for v in variants],
        "profiles": str(prof),
        "core_budget": 2,
        "warm_replicas": 2,
        "rate_window": rate_window,  # arrivals the rate is estimated from (tuned offline)
        "cv": cv,  # burstiness the table assumes (the compressed traces are bursty)
        "interval_s": 0.1,
        **LIVE_TABLE,
        "queue": queue,  # the stage's one queue (default) or one per variant
    }
    path.write_text(json.dumps(cfg))
    return path


def serve_and_replay(
    tmp: Path, variants: list[str], sw: Path, times: np.ndarray, slo_ms: float, seed: int = 0
) -> dict[str, Any]:
    xs, ys = held_out()
    if seed:  # another order of the same held-out images
        order = np.random.default_rng(seed).permutation(len(ys))
        xs, ys = xs[order], ys[order]
    dep = tmp / f"dep-{'-'.join(variants)}.json"
    dep.write_text(json.dumps(deployment(variants, {"digits": variants[0]}, slo_ms)))
    log = tmp / f"serve-{'-'.join(variants)}.log"
    args = ["--switching", "model-switching", "--switching-config", str(sw)]
    with ServerProcess(dep, extra_args=args, log_path=log) as srv:
        res, labels = asyncio.run(run_replay(srv.url, "digits", times, xs, slo_ms / 1e3))
    truth = ys[np.arange(times.size) % len(ys)]
    right = labels == truth
    on_time = res.ok & (res.latency_s <= slo_ms / 1e3)
    switches = re.findall(
        r"model switching: (.*?) -> (SwitchOption\(variant='(\w+)')", log.read_text()
    )
    return {
        "n": int(times.size),
        "good": int(np.sum(right & on_time)),
        "effective_accuracy": float(np.mean(right & on_time)),
        "accuracy_answered": float(np.mean(right[res.ok])) if res.ok.any() else 0.0,
        "deadline_met": float(np.mean(on_time)),
        "p99_ms": res.percentile(99) * 1e3,
        "switches": len(switches),
        "to": [s[2] for s in switches],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 s per replay (a few minutes)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: variants measured on 80 images, the conv trace only, 3 s, the "
        "switching server only (no single-variant runs)",
    )
    ap.add_argument(
        "--seconds", type=float, default=None, help="replay length (default 60, quick 20)"
    )
    ap.add_argument(
        "--mean-qps",
        type=float,
        default=None,
        help="mean replay rate (default 0.9 x the most accurate variant's capacity)",
    )
    ap.add_argument(
        "--load",
        type=float,
        default=0.35,
        help="mean rate over the most accurate variant's measured capacity (default 0.35)",
    )
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--traces", nargs="*", default=["conv", "code"])
    ap.add_argument("--cv", type=float, default=2.0, help="CV the switching table assumes")
    ap.add_argument(
        "--rate-window",
        type=int,
        default=24,
        help="arrivals the switching controller's rate is estimated from (the paper's "
        "event-based window, tuned offline; default 24)",
    )
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="replays per trace: seed s takes the s-th slice of the trace and another order "
        "of the images; effective accuracy is pooled over the seeds (default 1)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of the start-up service-time measurement, the variants' "
        "order rotated each round; each variant's figure is its median (default 3)",
    )
    ap.add_argument(
        "--queue",
        choices=["shared", "per_variant"],
        default="shared",
        help="the switching server's queue: the stage's one queue (default) or one per variant",
    )
    return ap.parse_args(argv)


def run_trace(
    tmp: Path,
    args: argparse.Namespace,
    name: str,
    seed: int,
    mean_qps: float,
    seconds: float,
    acc: dict[str, float],
    profile_s: dict[str, float],
) -> dict[str, dict[str, Any]]:
    """One seed of one trace: the switching server and (unless ``--smoke``) each variant
    alone, on the same replay; prints its table. ``profile_s``: each variant's service
    time in the switching file's profiles."""
    times = trace_slice(name, mean_qps, seconds, seed)
    info = (
        f"{times.size} queries over {seconds:.0f} s, mean {times.size / seconds:.1f} q/s, "
        f"peak(1 s) {peak_rate(times, 1.0):.0f} q/s"
    )
    sw = switching_file(tmp, list(TREES), acc, profile_s, args.cv, args.queue, args.rate_window)
    runs = {"switching": serve_and_replay(tmp, list(TREES), sw, times, args.slo_ms, seed)}
    for v in () if args.smoke else TREES:
        one = switching_file(tmp, [v], acc, profile_s, args.cv)
        runs[v] = serve_and_replay(tmp, [v], one, times, args.slo_ms, seed)
    print(f"\n{name} seed {seed}: {info}")
    print(
        f"  {'server':<10} {'eff. acc':>8} {'acc(answered)':>13} {'met':>6} {'P99 ms':>7} "
        f"{'switches':>8}"
    )
    for k, r in runs.items():
        print(
            f"  {k:<10} {r['effective_accuracy']:>8.4f} {r['accuracy_answered']:>13.4f} "
            f"{r['deadline_met']:>6.3f} {r['p99_ms']:>7.0f} {r['switches']:>8}",
            flush=True,
        )
    return runs


def pooled_verdict(name: str, per_seed: list[dict[str, dict[str, Any]]]) -> bool:
    """Effective accuracy pooled over the seeds (queries answered right and in time over all
    queries); prints and returns whether switching is at least the best single variant."""
    pool = {
        k: sum(r[k]["good"] for r in per_seed) / sum(r[k]["n"] for r in per_seed)
        for k in per_seed[0]
    }
    best_v = max(TREES, key=lambda v: pool[v])
    ok = pool["switching"] >= pool[best_v]
    print(
        f"{name} pooled over {len(per_seed)} seeds: switching {pool['switching']:.4f}, "
        + ", ".join(f"{v} {pool[v]:.4f}" for v in TREES)
        + f": switching {'>=' if ok else '<'} best single variant ({best_v})",
        flush=True,
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_all = time.perf_counter()
    if args.smoke:
        args.traces = ["conv"] if args.traces == ["conv", "code"] else args.traces
    seconds = args.seconds or (3.0 if args.smoke else 20.0 if args.quick else 60.0)
    verdicts = {}
    with tempfile.TemporaryDirectory(prefix="switching-live-") as d:
        tmp = Path(d)
        print("cost at saturation per round (interleaved, order rotated; replica median service):")
        acc, lat, svc = measure_variants(tmp, args.slo_ms, 80 if args.smoke else None, args.rounds)
        print(
            "variants (measured through inferline serve, 2 replicas, 4 closed-loop callers, "
            f"held-out noisy digits, n={80 if args.smoke else len(held_out()[1])}, median of "
            f"{args.rounds} rounds):"
        )
        for v in TREES:
            print(
                f"  {v:<5} {TREES[v]:>3} trees  accuracy {acc[v]:.4f}  cost at saturation "
                f"{lat[v] * 1e3:.1f} ms  replica service time (profile) {svc[v] * 1e3:.1f} ms"
            )
        cap = 2 / lat["f200"]
        mean_qps = args.mean_qps or args.load * cap
        for name in args.traces:
            if not (TRACES / f"azure_llm_2023_{name}.csv").exists():
                print(f"trace {name} missing under {TRACES}: skipped")
                continue
            per_seed = [
                run_trace(tmp, args, name, s, mean_qps, seconds, acc, svc)
                for s in range(args.seeds)
            ]
            if not args.smoke:
                verdicts[name] = pooled_verdict(name, per_seed)
    if verdicts:
        met = all(verdicts.values())
        print(
            f"\ntarget (>= best single variant, pooled, on every trace): {'met' if met else 'NOT met'}"
        )
    print(
        f"\ncapacity of f200 R2 (2/latency): {cap:.0f} q/s; mean rate {mean_qps:.1f} q/s; "
        f"deadline {args.slo_ms:.0f} ms; queue {args.queue}; cv {args.cv}"
    )
    print(
        "traces: Azure LLM inference 2023 (Patel et al., Splitwise, ISCA 2024; CC-BY 4.0, "
        "Azure Public Dataset)"
    )
    cmd = " ".join(["benchmarks/switching_live.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"({time.perf_counter() - t_all:.0f} s) reproduce: .venv/bin/python {cmd}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
