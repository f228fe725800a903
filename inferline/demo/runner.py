"""``inferline demo``: the whole InferLine loop on a real pipeline, on this machine.

1. Write the deployment (preprocess -> torch MLP -> random forest when the MLP is unsure).
2. Trace the pipeline on sample queries (DAG and scale factors) and profile every model on
   the bundled runtime (one replica, batch sizes 1..N, under contention).
3. Start ``inferline serve`` (a separate process) with one replica per model, and measure the
   live system's per-hop overhead with a low-load replay.
4. Plan for a sample trace and the SLO with that overhead, and apply the plan to the running
   server (``PUT /admin/plan``, what ``inferline deploy PLAN --url`` does).
5. Replay a fresh trace (same rate and burstiness, another seed), and compare the measured P99
   and SLO miss rate with the estimator's for the same trace; print the cost; write a latency
   CDF plot and a JSON report.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    gamma_trace,
    plan_inferline,
    save,
    save_trace,
)

if TYPE_CHECKING:  # for annotations only: the demo imports inferline.deploy when it runs
    from inferline.deploy import Deployment

__all__ = ["DemoOptions", "run_demo", "run_demo_async"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoOptions:
    out_dir: str = "out/demo"
    quick: bool = False
    slo_ms: float | None = None
    rate_qps: float | None = None
    duration_s: float | None = None
    cv: float = 1.0
    seed: int = 0

    @property
    def planning_trace_s(self) -> float:
        """Length of the trace planned for (at ``rate_qps``, as the replayed one)."""
        return 30.0 if self.quick else 60.0

    def resolved(self) -> dict[str, float]:
        return {
            "slo_ms": self.slo_ms or 100.0,
            "rate_qps": self.rate_qps or (60.0 if self.quick else 120.0),
            "duration_s": self.duration_s or (6.0 if self.quick else 25.0),
        }


def _say(msg: str) -> None:
    print(msg, flush=True)


def run_demo(opts: DemoOptions) -> dict[str, Any]:
    from inferline.server import run_loop

    return run_loop(run_demo_async(opts))  # type: ignore[no-any-return]


async def run_demo_async(opts: DemoOptions) -> dict[str, Any]:
    from inferline.adapters.local import detect_cores
    from inferline.demo.pipeline import test_inputs
    from inferline.measure import ServerProcess, encode_bodies, estimate

    t_start = time.perf_counter()
    r = opts.resolved()
    slo_s = r["slo_ms"] / 1e3
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # 1. deployment; 2. trace + profile
    dep = _write_deployment(r["slo_ms"], out)
    profiles, pipeline = await _trace_and_profile(dep, opts.quick, out)

    # 3. serve one replica per model; measure the per-hop overhead at low load
    xt, yt = test_inputs()
    bodies = encode_bodies(list(xt))
    rng = np.random.default_rng(opts.seed)
    report: dict[str, Any] = {"options": asdict(opts), **r}
    t0 = time.perf_counter()
    with ServerProcess(out / "deployment.json", log_path=out / "server.log") as server:
        _say(f"[3/5] serving at {server.url} (started in {time.perf_counter() - t0:.0f} s)")
        base = {m: ModelConfig("cpu", 1, 1) for m in pipeline.models}
        # the server's replicas are pinned to this machine's cores (the bundled runtime's
        # placement): the estimate shares them the same way (on 2 cores, 3 replicas share)
        cores = EstimatorOptions(pinned_cores={"cpu": len(detect_cores())})
        lowres, hop = await _low_load_hop(
            server.url, pipeline, profiles, base, cores, bodies, rng, opts.quick
        )
        # 4. plan and apply; 5. replay a fresh trace
        plan = await _plan_and_apply(server.url, pipeline, profiles, hop, cores, rng, opts, out)
        live = await _replay_fresh(server.url, bodies, slo_s, rng, opts, out)
    sim = estimate(
        pipeline, plan, profiles, live.trace, hop_overhead_s=hop, seed=opts.seed, base=cores
    )
    calibrated = calibrated_estimate(
        pipeline,
        plan,
        profiles,
        live.trace,
        live.models,
        lowres,
        live.measured,
        base,
        cores,
        opts.seed,
    )
    report.update(_results(pipeline, plan, hop, live, sim, calibrated, yt, slo_s, t_start))
    return _finish_report(report, live.measured, sim, calibrated, slo_s, out)


@dataclass(frozen=True)
class _Replay:
    """What step 5's replay of a fresh trace brought back."""

    trace: np.ndarray
    measured: Any  # the replay's per-query results
    labels: dict[int, int]  # query index -> the label the pipeline answered
    models: Any  # the server's ``GET /admin/models`` after the replay


def _write_deployment(slo_ms: float, out: Path) -> Deployment:
    """Step 1: the demo pipeline's deployment, written where ``inferline serve`` reads it."""
    from inferline.demo.pipeline import deployment_dict
    from inferline.deploy import Deployment

    dep_dict = deployment_dict(slo_ms=slo_ms)
    dep = Deployment.from_dict(dep_dict)
    (out / "deployment.json").write_text(json.dumps(dep_dict, indent=2) + "\n")
    _say(
        f"[1/5] deployment {dep.name!r}: models {[m.name for m in dep.models]}, SLO {slo_ms:.0f} ms"
    )
    return dep


async def _trace_and_profile(dep: Deployment, quick: bool, out: Path) -> tuple[Profiles, Pipeline]:
    """Step 2: the pipeline's DAG and scale factors traced on sample queries, and every model
    profiled on the bundled runtime; both written to ``out``."""
    from inferline.measure import ProfilerOptions, print_fits, profile_deployment

    popts = ProfilerOptions(
        max_batch_size=8 if quick else 16,
        warmup=2 if quick else 4,
        min_samples=20 if quick else 40,
        max_samples=40 if quick else 150,
        max_seconds_per_point=0.8 if quick else 2.0,
        contention=not quick,
        wake_samples=8 if quick else 20,
    )
    t0 = time.perf_counter()
    result, pipeline = await profile_deployment(dep, popts, samples=_samples(120))
    profiles = result.profiles
    save(profiles, out / "profiles.json")
    save(pipeline, out / "pipeline.json")
    _say(
        f"[2/5] traced pipeline: edges {list(pipeline.edges)}, scale factors "
        f"{ {m: round(s, 3) for m, s in pipeline.scale_factors.items()} }; profiled in "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print_fits(result)
    return profiles, pipeline


async def _low_load_hop(
    url: str,
    pipeline: Pipeline,
    profiles: Profiles,
    base: dict[str, ModelConfig],
    cores: EstimatorOptions,
    bodies: Any,
    rng: np.random.Generator,
    quick: bool,
) -> tuple[Any, float]:
    """Step 3: the live system's per-hop overhead, fitted to a low-load replay on one replica
    per model; returns that replay and the overhead, s."""
    from inferline.measure import hop_overhead_from, replay

    low = gamma_trace(15.0, 1.0, 3.0 if quick else 6.0, rng)
    warm = await replay(low[:20], url, "digits", bodies)
    del warm  # first queries pay for lazy imports and connection set-up
    lowres = await replay(low, url, "digits", bodies)
    hop = hop_overhead_from(lowres, pipeline, base, profiles, base=cores)
    _say(
        f"      low-load P50 {lowres.percentile(50) * 1e3:.2f} ms -> per-hop overhead "
        f"{hop * 1e3:.2f} ms"
    )
    return lowres, hop


async def _plan_and_apply(
    url: str,
    pipeline: Pipeline,
    profiles: Profiles,
    hop: float,
    cores: EstimatorOptions,
    rng: np.random.Generator,
    opts: DemoOptions,
    out: Path,
) -> Plan:
    """Step 4: plan for a sample trace with the measured overhead and apply the plan to the
    running server (``PUT /admin/plan``, what ``inferline deploy PLAN --url`` does)."""
    import httpx

    r = opts.resolved()
    plan_trace = gamma_trace(r["rate_qps"], opts.cv, opts.planning_trace_s, rng)
    t0 = time.perf_counter()
    plan: Plan = plan_inferline(
        pipeline,
        profiles,
        plan_trace,
        r["slo_ms"] / 1e3,
        catalog=DEFAULT_CATALOG,
        options=PlannerOptions(estimator=replace(cores, hop_overhead_s=hop)),
    )
    save(plan, out / "plan.json")
    save_trace(plan_trace, out / "planning_trace.txt")
    _say(
        f"[4/5] planned in {time.perf_counter() - t0:.1f} s for {r['rate_qps']:.0f} q/s: "
        + ", ".join(
            f"{m}: {c.replicas} x {c.hardware} batch<={c.max_batch_size}"
            for m, c in plan.models.items()
        )
        + f"; cost ${plan.cost_per_hour:.3f}/h"
    )
    async with httpx.AsyncClient(timeout=300) as client:
        resp = await client.put(f"{url}/admin/plan", json=plan.to_dict())
        resp.raise_for_status()
    note = resp.json().get("applied", {}).get("inventory")
    if note:  # 2-core CI: the replica processes, the frontend and this client share them
        _say(
            f"      note: {note.split(': they share')[0]}: they share them; the plan "
            f"and its estimate pin them as the runtime does (--pinned-cores cpu="
            f"{cores.pinned_cores['cpu']})"
        )
    return plan


async def _replay_fresh(
    url: str,
    bodies: Any,
    slo_s: float,
    rng: np.random.Generator,
    opts: DemoOptions,
    out: Path,
) -> _Replay:
    """Step 5: replay a fresh trace (same rate and burstiness, the next draws of ``rng``) on
    the planned server, keeping the answered labels and the server's own service times."""
    import httpx

    from inferline.measure import replay

    r = opts.resolved()
    fresh = gamma_trace(r["rate_qps"], opts.cv, r["duration_s"], rng)
    save_trace(fresh, out / "replay_trace.txt")
    labels: dict[int, int] = {}

    def on_answer(i: int, status: int, body: bytes) -> None:
        if status == 200:
            try:
                labels[i] = int(json.loads(body)["output"]["label"])
            except (ValueError, KeyError, TypeError):
                pass

    measured = await replay(fresh, url, "digits", bodies, slo_s=slo_s, on_answer=on_answer)
    async with httpx.AsyncClient(timeout=60) as client:
        live_models = (await client.get(f"{url}/admin/models")).json()
    return _Replay(fresh, measured, labels, live_models)


def _results(
    pipeline: Pipeline,
    plan: Plan,
    hop: float,
    live: _Replay,
    sim: Any,
    calibrated: dict[str, Any],
    yt: Any,
    slo_s: float,
    t_start: float,
) -> dict[str, Any]:
    """The report's findings: the measured replay against the estimate, cost and accuracy."""
    m_p99 = live.measured.percentile(99)
    e_p99 = sim.percentile(99)
    correct = [live.labels[i] == int(yt[i % len(yt)]) for i in live.labels]
    return {
        "pipeline": pipeline.to_dict(),
        "plan": plan.to_dict(),
        "hop_overhead_ms": hop * 1e3,
        "measured": live.measured.summary(),
        "estimated": {
            "p50_ms": sim.percentile(50) * 1e3,
            "p99_ms": e_p99 * 1e3,
            "slo_miss_rate": sim.miss_rate(slo_s),
        },
        "p99_error": (e_p99 - m_p99) / m_p99 if m_p99 > 0 else float("nan"),
        "calibrated": calibrated,
        "accuracy": float(np.mean(correct)) if correct else float("nan"),
        "cost_per_hour": plan.cost_per_hour,
        "seconds": time.perf_counter() - t_start,
    }


def _finish_report(
    report: dict[str, Any],
    measured: Any,
    sim: Any,
    calibrated: dict[str, Any],
    slo_s: float,
    out: Path,
) -> dict[str, Any]:
    """Judge the run, print the comparison, and write the latency CDF plot and report.json."""
    ms = report["measured"]
    report["ok"] = ms["answered"] == ms["queries"] and ms["ok"] > 0
    _say(f"[5/5] replayed {ms['queries']} queries at {ms['offered_qps']:.0f} q/s")
    _print_report(report, slo_s)
    _say(calibrated["line"])
    for why in calibrated["causes"]:
        _say(f"      - {why}")
    plot = _plot_cdf(measured.latency_s[measured.ok], sim.latencies_s, slo_s, out)
    report["plot"] = str(plot)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    _say(f"wrote {plot} and {out / 'report.json'} ({report['seconds']:.0f} s in all)")
    return report


def _samples(n: int) -> list[Any]:
    from inferline.demo.pipeline import sample_inputs

    return sample_inputs(n)


def _print_report(rep: dict[str, Any], slo_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    ms, es = rep["measured"], rep["estimated"]
    t = Table(title=f"digits pipeline, SLO {slo_s * 1e3:.0f} ms: measured vs estimated")
    t.add_column("")
    t.add_column("measured", justify="right")
    t.add_column("estimated", justify="right")
    t.add_row("P50 latency", f"{ms['p50_ms']:.2f} ms", f"{es['p50_ms']:.2f} ms")
    t.add_row(
        "P99 latency",
        f"{ms['p99_ms']:.2f} ms",
        f"{es['p99_ms']:.2f} ms ({rep['p99_error']:+.0%})",
    )
    t.add_row("SLO miss rate", f"{ms['slo_miss_rate']:.2%}", f"{es['slo_miss_rate']:.2%}")
    t.add_row("errors / defaults", f"{ms['errors']} / {ms['defaults']}", "")
    t.add_row("cost", f"${rep['cost_per_hour']:.4f}/h", "")
    t.add_row("accuracy", f"{rep['accuracy']:.2%}", "")
    t.add_row("per-hop overhead (measured)", f"{rep['hop_overhead_ms']:.2f} ms", "")
    Console().print(t)


def _plot_cdf(measured: np.ndarray, estimated: np.ndarray, slo_s: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for data, label in ((measured, "measured"), (estimated, "estimated")):
        x = np.sort(np.asarray(data)[np.isfinite(data)]) * 1e3
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size, label=label)
    ax.axvline(slo_s * 1e3, color="k", linestyle="--", linewidth=1, label="SLO")
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("CDF")
    ax.set_title("digits pipeline: latency CDF")
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


GAP_OK = 0.10  # how far apart the calibrated estimate and the measured P99 may be


def calibrated_estimate(
    pipeline: Pipeline,
    plan: Plan,
    profiles: Profiles,
    trace: np.ndarray,
    live_models: Any,
    low: Any,
    measured: Any,
    base: dict[str, ModelConfig],
    cores: EstimatorOptions,
    seed: int = 0,
    min_batches: int = 20,
) -> dict[str, Any]:
    """The estimate on the replayed ``trace`` with the profiles calibrated to the live
    server's service times (``GET /admin/models``, what ``inferline calibrate`` does) and
    the per-hop overhead refitted to them on the low-load replay ``low``; its gap to the
    ``measured`` P99, and, when over 10%, the causes that can be named. Also the same with
    the service spread (a log-normal through the live median and P99), as a second figure:
    in ``--quick`` runs on 2 cores that one came out 15-27% high (five runs), the
    one-number estimate -8% to +7% (three)."""
    from inferline.measure import (
        calibrate_profiles,
        estimate,
        hop_overhead_from,
        live_service_from_admin,
    )

    live = live_service_from_admin(live_models)
    hw = {m: c.hardware for m, c in plan.models.items()}
    cal, rows = calibrate_profiles(profiles, hw, live, min_batches)
    hop = hop_overhead_from(low, pipeline, base, cal, base=cores)
    sim = estimate(pipeline, plan, cal, trace, hop_overhead_s=hop, seed=seed, base=cores)
    hop_s = hop_overhead_from(low, pipeline, base, cal, service_spread=True, base=cores)
    spread = estimate(
        pipeline, plan, cal, trace, hop_overhead_s=hop_s, seed=seed, service_spread=True, base=cores
    ).percentile(99)
    m_p99, e_p99 = measured.percentile(99), sim.percentile(99)
    gap = (e_p99 - m_p99) / m_p99 if m_p99 > 0 else float("nan")
    out: dict[str, Any] = {
        "p99_ms": e_p99 * 1e3,
        "measured_p99_ms": m_p99 * 1e3,
        "gap": gap,
        "hop_overhead_ms": hop * 1e3,
        "spread_p99_ms": spread * 1e3,
        "rows": [r.to_dict() for r in rows],
        "causes": [],
    }
    within = abs(gap) <= GAP_OK
    out["line"] = (
        f"calibrated estimate: measured P99 {m_p99 * 1e3:.1f} ms, estimated {e_p99 * 1e3:.1f} ms "
        f"({gap:+.0%}; {'within' if within else 'not within'} {GAP_OK:.0%}; with the service "
        f"spread {spread * 1e3:.1f} ms, {(spread - m_p99) / m_p99 if m_p99 > 0 else 0:+.0%})"
        + ("" if within else ", because:")
    )
    if not within:
        out["causes"] = _gap_causes(pipeline, plan, live_models, rows, measured, hop, cores, gap)
    return out


def _gap_causes(
    pipeline: Pipeline,
    plan: Plan,
    live_models: Any,
    rows: list[Any],
    measured: Any,
    hop: float,
    cores: EstimatorOptions,
    gap: float,
) -> list[str]:
    """What is known to part the estimate from the measurement, largest first."""
    causes: list[str] = []
    for r in rows:
        if not r.calibrated:
            causes.append(f"{r.model} not calibrated ({r.note}): its profile is the offline one")
    for m in plan.models:
        q = (live_models.get(m) or {}).get("queue") or {}
        p50, p99 = q.get("service_s_p50_recent", 0.0), q.get("service_s_p99_recent", 0.0)
        if p50 > 0 and p99 > 2.5 * p50:
            causes.append(
                f"live service-time spread of {m}: P99 {p99 * 1e3:.1f} ms vs median "
                f"{p50 * 1e3:.1f} ms (a few preempted batches; the estimate takes one "
                "calibrated time per batch size)"
            )
    visits = sum(pipeline.scale_factor(m) for m in pipeline.models)
    m_p99 = measured.percentile(99)
    if m_p99 > 0 and hop * visits > 0.1 * m_p99:
        causes.append(
            f"HTTP/RPC overhead: {hop * 1e3:.2f} ms per hop x {visits:.2f} hops is "
            f"{hop * visits / m_p99:.0%} of the P99, fitted to the low-load median only"
        )
    n_cores = sum(cores.pinned_cores.values()) if cores.pinned_cores else 0
    replicas = sum(c.replicas for c in plan.models.values())
    if n_cores and replicas >= n_cores:
        causes.append(
            f"core sharing: {replicas} replicas, the frontend and the load generator on "
            f"{n_cores} cores (the estimate pins the replicas; the rest is not modelled)"
        )
    n = int(measured.ok.sum())
    if n < 2000:
        causes.append(
            f"a short replay: the P99 of {n} answered queries rests on its {max(1, n // 100)} "
            "largest latencies"
        )
    if gap < 0 and not causes:
        causes.append("live times above the calibrated ones (load changed within the replay)")
    return causes or ["none this demo can name"]
