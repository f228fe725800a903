"""Planning at fleet scale (issue 48): planning time against queries x models, today's planner
with and without the estimator's early stop (``simulate(stop=EarlyStop(slo, percentile))``).

Cases: chains of 2, 5, 10 and 20 models and a 4-model diamond, x gamma traces (CV 2) of 10 min
and 1 h at 100 and 1,000 q/s; synthetic profiles on ``cpu`` and ``gpu-k80`` from a fixed seed,
written to ``OUT/profiles-<pipeline>.json``; SLO 0.3 s at P99. For each case:

* the estimator alone: one run on an infeasible candidate (every model on cpu at batch 1 with
  just enough replicas for its traffic, the middle model one fewer, so it is overloaded by
  at most 1 / replicas), in full and with early stop;
* ``plan_inferline`` (in a child process killed after ``--timeout-s``: 'timeout') as today
  (the full search: no early stop, no screening, no verdict reuse), with early stop, and
  with the defaults ("new": early stop, the infeasible verdicts kept while the other models
  only lose slack, ``PlannerOptions.reuse_verdicts``, and screening on part of the trace,
  confirmed on the whole, ``PlannerOptions.screen``; it screens traces of 500,000 queries
  or more), whether each plan is today's and the new plan's
  cost over today's (the issue's bound: 1.01). With early stop the planner's
  feasibility check passes the stop (``PlannerOptions.early_stop`` where the planner has it,
  else ``SearchSpace``'s estimator call is given it here, as that option would).

It prints the table and the reproduce command, and writes a log-log plot of planning time
against queries x models to ``OUT/planning_scale.png``.

    .venv/bin/python benchmarks/planning_scale.py --cases small,medium   # about 20 min
    .venv/bin/python benchmarks/planning_scale.py --cases all --timeout-s 600
    .venv/bin/python benchmarks/planning_scale.py --smoke                # under a minute
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import (
    InfeasibleError,
    ModelConfig,
    Pipeline,
    PlannerOptions,
    Profiles,
    gamma_trace,
    plan_inferline,
    save,
)
from inferline.core.estimator import EarlyStop, simulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pipelines import linear_latencies

SEED = 48
SLO_S = 0.3
PCT = 99.0
CV = 2.0
GPU_B = (1, 2, 4, 8, 16, 32, 64)
CPU_B = (1, 2, 4, 8, 16)
SHAPES = ("chain2", "chain5", "diamond4", "chain10", "chain20")
DURATIONS = {"10min": 600.0, "1h": 3600.0}
RATES = (100, 1000)
# the case sets: small runs everywhere in minutes, medium in tens of minutes on 2 cores
SETS = {
    "smoke": [("chain2", "10min", 100)],
    "small": [(s, "10min", 100) for s in SHAPES],
    "medium": [
        (s, d, r)
        for s in ("chain2", "chain5", "diamond4")
        for d, r in (("10min", 1000), ("1h", 100))
    ],
}
SETS["all"] = [(s, d, r) for s in SHAPES for d in DURATIONS for r in RATES]


def pipeline_of(shape: str) -> Pipeline:
    if shape.startswith("chain"):
        n = int(shape[5:])
        return Pipeline.linear(shape, [f"m{i}" for i in range(n)])
    return Pipeline(
        shape, ("m0", "m1", "m2", "m3"), (("m0", "m1"), ("m0", "m2"), ("m1", "m3"), ("m2", "m3"))
    )


def profiles_of(p: Pipeline) -> Profiles:
    """Seeded synthetic profiles: a K80 batch costs 4-10 ms plus 0.4-1.2 ms a query, a CPU one
    0.5-2 ms plus 10-30 ms a query (so a CPU replica at batch 1 serves under 100 q/s)."""
    rng = np.random.default_rng(SEED)
    table = {}
    for m in p.models:
        k80 = linear_latencies(rng.uniform(0.004, 0.010), rng.uniform(0.0004, 0.0012), GPU_B)
        cpu = linear_latencies(rng.uniform(0.0005, 0.002), rng.uniform(0.010, 0.030), CPU_B)
        table[m] = {"gpu-k80": k80, "cpu": cpu}
    return Profiles.from_latencies(table)


@dataclass(frozen=True)
class Case:
    shape: str
    duration: str
    rate: int

    @property
    def name(self) -> str:
        return f"{self.shape}-{self.duration}-{self.rate}"


def overloaded(p: Pipeline, prof: Profiles, rate: float) -> dict[str, ModelConfig]:
    """Every model on cpu at batch 1 with ``ceil(traffic * latency)`` replicas, the middle
    one with one fewer: ``r - 1 < traffic * latency``, so it cannot keep up (infeasible)."""
    out = {}
    for m in p.models:
        r = math.ceil(rate * p.calls(m) * prof.latency(m, "cpu", 1))
        out[m] = ModelConfig("cpu", 1, r)
    mid = p.topological_order[len(p.models) // 2]
    out[mid] = ModelConfig("cpu", 1, out[mid].replicas - 1)
    return out


def _timed(f: Any, *a: Any, **kw: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    r = f(*a, **kw)
    return time.perf_counter() - t, r


# today's planner (every candidate in full), with early stop, and the defaults (early stop and
# screening on part of the trace, confirmed on the whole)
MODES = {
    "today": PlannerOptions(early_stop=False, screen=False, reuse_verdicts=False),
    "early": PlannerOptions(screen=False, reuse_verdicts=False),
    "new": PlannerOptions(),
}


def _plan_child(q: Any, p: Pipeline, prof: Profiles, trace: np.ndarray, mode: str) -> None:
    opts = MODES[mode]
    try:
        dt, plan = _timed(plan_inferline, p, prof, trace, SLO_S, percentile=PCT, options=opts)
    except InfeasibleError as e:
        q.put(("infeasible", str(e)))
        return
    models = {m: (c.hardware, c.max_batch_size, c.replicas) for m, c in plan.models.items()}
    q.put(("ok", dt, plan.cost_per_hour, plan.estimated_latency_s, models))


def plan_in_child(
    p: Pipeline, prof: Profiles, trace: np.ndarray, mode: str, timeout_s: float
) -> tuple[Any, ...]:
    """Plan in a forked child (the trace is shared copy-on-write); ('timeout',) past the limit."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_plan_child, args=(q, p, prof, trace, mode))
    proc.start()
    try:
        return tuple(q.get(timeout=timeout_s))
    except Exception:
        return ("timeout",)
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join()


def run_case(c: Case, timeout_s: float, out: str, modes: Sequence[str]) -> dict[str, Any]:
    p = pipeline_of(c.shape)
    prof = profiles_of(p)
    save(prof, os.path.join(out, f"profiles-{c.shape}.json"))
    rng = np.random.default_rng(SEED)
    trace = np.asarray(gamma_trace(c.rate, CV, DURATIONS[c.duration], rng), dtype=np.float64)
    row: dict[str, Any] = {"case": c.name, "queries": int(trace.size), "models": len(p.models)}
    bad = overloaded(p, prof, c.rate)
    simulate(p, bad, prof, trace[:100], stop=EarlyStop(SLO_S, PCT))  # compiled (or loaded) first
    t_full, full = _timed(simulate, p, bad, prof, trace)
    t_stop, es = _timed(simulate, p, bad, prof, trace, stop=EarlyStop(SLO_S, PCT))
    assert (full.percentile(PCT) <= SLO_S) == (es.percentile(PCT) <= SLO_S)
    row |= {"est_full_s": t_full, "est_stop_s": t_stop, "stopped_at_s": es.stopped_at_s}
    del full, es
    for key in modes:
        row[key] = plan_in_child(p, prof, trace, key, timeout_s)
    a = row.get("today", ("skipped",))
    for key in ("early", "new"):
        b = row.get(key, ("skipped",))
        same = "yes" if a[2:] == b[2:] else "NO"
        row[f"same_{key}"] = "-" if "ok" not in (a[0],) or b[0] != "ok" else same
    n = row.get("new", ("skipped",))
    row["ratio"] = n[2] / a[2] if a[0] == "ok" and n[0] == "ok" else None
    return row


def _fmt_plan(r: tuple[Any, ...]) -> tuple[str, str, str]:
    if r[0] == "ok":
        return f"{r[1]:.1f}", f"{r[2]:.3f}", "yes" if r[3] <= SLO_S else "NO"
    return r[0], "-", "-"


def print_table(rows: list[dict[str, Any]]) -> None:
    hdr = (
        f"{'case':<22} {'queries x models':>17} {'est. full s':>11} {'est. stop s':>11} "
        f"{'stop at s':>9} {'plan s today':>12} {'plan s early':>12} {'plan s new':>10} "
        f"{'cost $/h':>9} {'new/today':>9} {'feasible':>8} {'same early':>10} {'same new':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        qm = f"{r['queries']:,} x {r['models']}"
        today, cost, feas = _fmt_plan(r.get("today", ("skipped",)))
        early, cost2, _ = _fmt_plan(r.get("early", ("skipped",)))
        new, cost3, feas3 = _fmt_plan(r.get("new", ("skipped",)))
        cost = cost if cost != "-" else (cost2 if cost2 != "-" else cost3)
        feas = feas if feas != "-" else feas3
        ratio = f"{r['ratio']:.4f}" if r["ratio"] is not None else "-"
        at = f"{r['stopped_at_s']:.1f}" if r["stopped_at_s"] is not None else "no stop"
        print(
            f"{r['case']:<22} {qm:>17} {r['est_full_s']:>11.3f} {r['est_stop_s']:>11.3f} "
            f"{at:>9} {today:>12} {early:>12} {new:>10} {cost:>9} {ratio:>9} {feas:>8} "
            f"{r['same_early']:>10} {r['same_new']:>8}"
        )


def plot(rows: list[dict[str, Any]], timeout_s: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    marks = (("today", "today's planner", "o"), ("early", "with early stop", "s"))
    for key, label, mk in (*marks, ("new", "defaults: early stop, reuse, screening", "^")):
        got = [r for r in rows if key in r]
        x = [r["queries"] * r["models"] for r in got if r[key][0] == "ok"]
        y = [r[key][1] for r in got if r[key][0] == "ok"]
        ax.scatter(x, y, marker=mk, label=label)
        xt = [r["queries"] * r["models"] for r in got if r[key][0] == "timeout"]
        if xt:
            ax.scatter(xt, [timeout_s] * len(xt), marker=mk, facecolors="none", edgecolors="k")
    ax.axhline(timeout_s, color="grey", lw=0.8, ls=":", label=f"timeout ({timeout_s:g} s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("queries x models")
    ax.set_ylabel("planning time (s)")
    ax.set_title("plan_inferline at scale (hollow: timed out)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cases_of(spec: str) -> list[Case]:
    out: list[Case] = []
    for part in spec.split(","):
        if part in SETS:
            out += [Case(*t) for t in SETS[part]]
        else:
            s, d, r = part.rsplit("-", 2)
            out.append(Case(s, d, int(r)))
    return list(dict.fromkeys(out))  # in order, once each


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cases", default="small", help="small, medium, all, or names like chain5-1h-1000"
    )
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per plan (default %(default)s)")
    ap.add_argument("--out", default="out/planning_scale", help="profiles and the plot")
    ap.add_argument("--smoke", action="store_true", help="the smallest case only (under a minute)")
    ap.add_argument(
        "--modes",
        default="today,early,new",
        help="planners to run: today (the full search), early (early stop), new (the defaults)",
    )
    args = ap.parse_args(argv)
    spec = "smoke" if args.smoke else args.cases
    timeout = min(args.timeout_s, 40.0) if args.smoke else args.timeout_s
    os.makedirs(args.out, exist_ok=True)
    cases = cases_of(spec)
    print(
        f"planning at scale: SLO {SLO_S:g} s at P{PCT:g}, gamma CV {CV:g}, seed {SEED}, "
        f"timeout {timeout:g} s a plan; {len(cases)} cases"
    )
    rows = []
    for c in cases:
        rows.append(run_case(c, timeout, args.out, args.modes.split(",")))
        print(f"  done {c.name}", flush=True)
    print()
    print_table(rows)
    same = [r["same_early"] for r in rows] + [r["same_new"] for r in rows]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    print(
        f"plans the same as today's (early stop, new): {same.count('yes')} of {len(same)} "
        f"({same.count('NO')} differ); new cost / today's at most "
        f"{max(ratios, default=float('nan')):.4f}"
    )
    print_differences(rows)
    png = os.path.join(args.out, "planning_scale.png")
    plot(rows, timeout, png)
    print(f"plot: {png}")
    flags = " --smoke" if args.smoke else f" --cases {spec} --timeout-s {timeout:g}"
    flags += f" --modes {args.modes}" if args.modes != "today,early,new" else ""
    print(f"reproduce: .venv/bin/python benchmarks/planning_scale.py{flags}")
    return 0 if all(x <= 1.01 for x in ratios) and feasible_all(rows) else 1


def print_differences(rows: list[dict[str, Any]]) -> None:
    """Where a plan is not today's: the models that differ (hardware, batch, replicas)."""
    for r in rows:
        for key in ("early", "new"):
            if r.get(f"same_{key}") != "NO":
                continue
            a, b = r["today"][4], r[key][4]
            diff = {m: f"{a[m]} -> {b[m]}" for m in a if a[m] != b.get(m)}
            print(f"  {r['case']} {key} differs from today's: {diff}")


def feasible_all(rows: list[dict[str, Any]]) -> bool:
    """Every plan that came back keeps the SLO on the whole sample (its exact estimate)."""
    plans = [r[k] for r in rows for k in ("today", "early", "new") if k in r]
    return all(x[3] <= SLO_S for x in plans if x[0] == "ok")


if __name__ == "__main__":
    sys.exit(main())
