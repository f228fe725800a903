"""Rafiki's actor-critic ensemble selector live in ``inferline serve``, against its baselines.

Three digits classifiers (``benchmarks/_digits.py``: logistic regression, MLP and SVM on
disjoint random 12-pixel subsets, trained at start in their replicas, so their errors differ
and ensembles gain) serve one selection app, one replica each, max batch 8. Each model also
sleeps per batch (``delay_s + per_item_s x batch``) so that the machine's two cores can drive
it past the all-models capacity: the batch latency profile the policy is given is that sleep
plus a few ms of compute. Subset accuracies (majority vote, ties to the first model, as
``combine_votes`` breaks them) are measured in this process on the held-out split with the
same seeds and features.

The replay is open-loop on the paper's noisy sine (Eqs. 8-9, ``sine_arrivals``): the rate
peaks at 1.1 ``r_ref`` and is above ``r_ref`` for 20% of each cycle. The same arrivals go to
three servers in turn: ``rafiki`` (pretrained in the simulator on that sine from the profile),
``all`` (every model on every query; Rafiki's synchronous baseline) and ``fastest`` (the
fastest model alone; the one-model baseline). Per policy: models per query at low rate (the
lowest third of the sine's range) and at high rate (the top third), accuracy, overdue
fraction (late, default or failed answers) and the Eq. 7 reward summed over queries,
``sum a_i (1 - beta x overdue_i)``, with ``a_i`` whether the answer was right (the realized
accuracy of the subset that answered).

    .venv/bin/python benchmarks/rafiki_live.py --quick     # one 60 s cycle per policy
    .venv/bin/python benchmarks/rafiki_live.py             # two 120 s cycles per policy
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks._* when run as a script

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data, fit_classifier
from inferline.measure import ServerProcess, encode_bodies, replay
from inferline.selection import sine_arrivals, sine_rate

# name, kind, delay_s per batch, per_item_s; the first is the fastest (the one-model baseline)
# and wins a vote's ties
MODELS = (("mlp", "mlp", 0.04, 0.020), ("svc", "svc", 0.06, 0.025), ("lr", "logreg", 0.08, 0.030))
SIZES = (1, 2, 4, 8)
PIXELS = 12  # per model: weak members whose majority vote gains ~10 points, as in Rafiki
COMPUTE_MS = 3.0  # a batch's compute besides the sleep (digits models: about a millisecond)


def features(seed: int) -> list[list[int]]:
    perm = np.random.default_rng(seed).permutation(64)
    return [perm[i * PIXELS : (i + 1) * PIXELS].tolist() for i in range(len(MODELS))]


def subset_accuracy(seed: int) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """Majority-vote accuracy of every subset (ties: the first model's vote, in MODELS order),
    plus the held-out inputs and labels."""
    _, _, xte, yte = digits_data()
    preds = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for (_, kind, *_), f in zip(MODELS, features(seed), strict=True):
            est = fit_classifier(kind, 0, f)
            preds.append(est.predict((xte / 16.0)[:, f]).astype(int))
    out: dict[str, float] = {}
    for r in range(1, len(MODELS) + 1):
        for sub in itertools.combinations(range(len(MODELS)), r):
            right = 0
            for i in range(len(yte)):
                votes: dict[int, int] = {}
                for m in sub:  # insertion order: the first model's label wins a tie
                    votes[int(preds[m][i])] = votes.get(int(preds[m][i]), 0) + 1
                right += max(votes, key=votes.__getitem__) == yte[i]
            out["+".join(MODELS[m][0] for m in sub)] = float(right / len(yte))
    return out, xte.astype(np.float32), yte


def latency_ms() -> dict[str, dict[str, float]]:
    return {
        name: {str(b): (delay + per * b) * 1e3 + COMPUTE_MS for b in SIZES}
        for name, _, delay, per in MODELS
    }


def selection_block(policy: str, args: argparse.Namespace, acc: dict[str, float]) -> dict:
    names = [m[0] for m in MODELS]
    if policy == "all":
        return {"policy": "static", "models": names, "params": {"use": names}}
    if policy == "fastest":
        return {"policy": "static", "models": names, "params": {"use": [names[0]]}}
    params = {
        "latency_ms": latency_ms(),
        "subset_accuracy": acc,
        "tau_ms": args.slo_ms,
        "beta": args.beta,
        "rate_ref": args.r_ref,
        "train_updates": args.train_updates,
        "seed": args.seed,
    }
    return {"policy": "rafiki", "models": names, "params": params}


def deployment(policy: str, args: argparse.Namespace, acc: dict[str, float]) -> dict:
    return {
        "format": "inferline.deployment/1",
        "name": "rafiki-live",
        "backend": "local://?oversubscribe=1",
        "models": [
            {
                "name": name,
                "source": SRC,
                "params": {"kind": kind, "features": f, "delay_s": d, "per_item_s": p},
            }
            for (name, kind, d, p), f in zip(MODELS, features(args.seed), strict=True)
        ],
        "apps": {
            "vote": {
                "slo_ms": args.slo_ms,
                "default_output": -1,
                "input": {"dtype": "float32", "shape": [64]},
                "selection": {**selection_block(policy, args, acc), "combine_margin_ms": 5},
            }
        },
        "queue": {"max_queue": 100_000},
    }


def plan() -> dict:
    cfg = {"hardware": "cpu", "max_batch_size": max(SIZES), "replicas": 1}
    return {
        "format": "inferline.plan/1",
        "pipeline": "rafiki-live",
        "slo_s": 1.0,
        "percentile": 99,
        "cost_per_hour": 0.0,
        "estimated_latency_s": 0.1,
        "strategy": "inferline",
        "models": {m[0]: dict(cfg) for m in MODELS},
    }


def run_policy(
    policy: str, args: argparse.Namespace, acc: dict[str, float], data: tuple, work: Path
) -> dict[str, Any]:
    """Serve ``policy``, replay the sine, return per-query (selected, correct, overdue)."""
    xte, yte, times = data
    dp, pp = work / f"{policy}.json", work / "plan.json"
    dp.write_text(json.dumps(deployment(policy, args, acc)))
    pp.write_text(json.dumps(plan()))
    n = times.size
    sel, lab, dflt = np.zeros(n, int), np.full(n, -2), np.ones(n, bool)

    def got(i: int, status: int, body: bytes) -> None:
        if status != 200:
            return
        out = json.loads(body).get("output")
        if isinstance(out, dict):
            sel[i], lab[i] = int(out.get("models_selected", 0)), int(out.get("output", -2))
            dflt[i] = bool(out.get("default", False))

    xs = [xte[i % len(xte)] for i in range(n)]
    t0 = time.perf_counter()
    with ServerProcess(dp, pp, log_path=work / f"{policy}.log", start_timeout_s=600) as srv:
        start_s = time.perf_counter() - t0
        warm = encode_bodies(xs[:20])
        asyncio.run(replay(np.arange(20) / 10.0, srv.url, "vote", warm, slo_s=args.slo_ms / 1e3))
        res = asyncio.run(
            replay(
                times, srv.url, "vote", encode_bodies(xs), slo_s=args.slo_ms / 1e3, on_answer=got
            )
        )
        status = _get(srv.url + "/apps/vote/selection")
    truth = np.array([yte[i % len(yte)] for i in range(n)])
    correct = (lab == truth) & ~dflt
    overdue = ~(res.ok & (res.latency_s <= args.slo_ms / 1e3)) | dflt
    return {
        "selected": sel,
        "correct": correct,
        "overdue": overdue,
        "start_s": start_s,
        "status": status,
        "p99_ms": float(np.percentile(res.latency_s[np.isfinite(res.latency_s)], 99) * 1e3),
    }


def _get(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def summarize(r: dict[str, Any], rate: np.ndarray, beta: float) -> dict[str, float]:
    lo_cut = rate.min() + (rate.max() - rate.min()) / 3
    hi_cut = rate.max() - (rate.max() - rate.min()) / 3
    sel = r["selected"].astype(float)
    a, od = r["correct"].astype(float), r["overdue"].astype(float)
    return {
        "queries": int(sel.size),
        "models_low_rate": float(sel[rate <= lo_cut].mean()),
        "models_high_rate": float(sel[rate >= hi_cut].mean()),
        "accuracy": float(a.mean()),
        "overdue": float(od.mean()),
        "p99_ms": r["p99_ms"],
        "reward_eq7": float((a * (1 - beta * od)).sum()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one 60 s cycle per policy")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: the rafiki policy only (unless --policies), one 4 s cycle, the agent "
        "pretrained 10 updates",
    )
    ap.add_argument("--r-ref", type=float, default=40.0, help="the sine's r_ref (q/s)")
    ap.add_argument("--slo-ms", type=float, default=500.0, help="tau, the latency SLO")
    ap.add_argument("--beta", type=float, default=1.0, help="Eq. 7's overdue weight")
    ap.add_argument("--train-updates", type=int, default=200, help="actor-critic updates")
    ap.add_argument("--period-s", type=float, default=None, help="sine period (60; 120)")
    ap.add_argument("--cycles", type=int, default=None, help="cycles per policy (1; 2)")
    ap.add_argument("--policies", default=None, help="comma list (default rafiki,all,fastest)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.quick, args.period_s, args.train_updates = True, args.period_s or 4.0, 10
        args.policies = args.policies or "rafiki"
    args.policies = args.policies or "rafiki,all,fastest"
    period = args.period_s or (60.0 if args.quick else 120.0)
    cycles = args.cycles or (1 if args.quick else 2)
    acc, xte, yte = subset_accuracy(args.seed)
    # start at the trough so the cycle shows low, rising, high and falling rates
    times = sine_arrivals(
        args.r_ref,
        1.0,
        period * cycles,
        np.random.default_rng(args.seed),
        period_s=period,
        start_s=-period / 4,
    )
    times = times - times[0] + 0.5
    rate = np.array([sine_rate(args.r_ref, t - 0.5 - period / 4, period) for t in times])
    res: dict[str, Any] = {"subset_accuracy": acc, "queries": int(times.size)}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for pol in args.policies.split(","):
            r = run_policy(pol, args, acc, (xte, yte, times), Path(d))
            s = summarize(r, rate, args.beta)
            res[pol] = {**s, "start_s": r["start_s"], "status": r["status"]}
            rows.append((pol, s))
            print(f"{pol}: {s} (server start {r['start_s']:.0f} s)", file=sys.stderr)
    cmd = "benchmarks/rafiki_live.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\nRafiki live: {cmd.strip()}")
    print(
        f"r_ref {args.r_ref:g} q/s, period {period:g} s x {cycles}, tau {args.slo_ms:g} ms, "
        f"beta {args.beta:g}, {times.size} queries; subset accuracy "
        + ", ".join(f"{k}={v:.3f}" for k, v in acc.items())
    )
    print(
        "| policy | models/query low rate | high rate | accuracy | overdue | P99 ms | reward (Eq. 7) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for pol, s in rows:
        print(
            f"| {pol} | {s['models_low_rate']:.2f} | {s['models_high_rate']:.2f} | "
            f"{s['accuracy']:.4f} | {s['overdue']:.4f} | {s['p99_ms']:.0f} | {s['reward_eq7']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
