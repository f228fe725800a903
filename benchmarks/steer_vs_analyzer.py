"""Steering Triton's own batcher and instances: inferline ``attach --steer`` vs Triton's Model
Analyzer vs the operator's starting configuration, on one real Triton (issue 43).

One Triton server (2.51, the harness's, explicit model control) serves ``digits_app``, an
ensemble of two Python-backend models that do real work (``digits_pre`` standardizes an 8x8
digit image; ``digits_wide``, a wide random-feature network with a trained readout, classifies
it; see ``benchmarks/_steer_models.py``). Three rows, each a configuration of the composing
models chosen its own way and then loaded into that same server:

- ``operator start``: one CPU instance per model, no dynamic batching (as built);
- ``Model Analyzer``: ``triton-model-analyzer`` 1.58 in its own venv, remote launch mode
  against the same server, quick search (the only search it runs on an ensemble), composing
  models ``cpu_only``, constraint ``perf_latency_p99`` <= the SLO; its best pick that meets
  the constraint is loaded;
- ``inferline --steer``: ``inferline attach URL --steer --dry-run --app digits_app --slo-ms S
  --trace PLAN`` plans from the planning trace and applies the plan through Triton's API.

The arrival trace is Azure's LLM inference trace 2023 (conversation; Patel et al., ISCA 2024,
CC-BY 4.0), rescaled to ``--rate``: the first half of its requests is the planning trace, the
second half the fresh trace every configuration is then driven by, open loop, straight at
Triton (perf_analyzer ``--request-intervals``). A closed-loop saturation run of each
configuration gives its maximum throughput.

    .venv/bin/python benchmarks/steer_vs_analyzer.py            # full run (Model Analyzer: minutes)
    .venv/bin/python benchmarks/steer_vs_analyzer.py --smoke    # ~30 s, Model Analyzer skipped
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "integration"))
sys.path.insert(0, str(REPO / "benchmarks"))

import _steer_models as sm  # noqa: E402
from _steer_load import (  # noqa: E402
    Replay,
    replay_trace,
    saturate,
    server_figures,
    triton_counters,
    warm_up,
)
from _steer_ma import AnalyzerError, ensure_model_analyzer, run_analyzer  # noqa: E402
from triton_harness import SetupError, TritonServer, ensure_installed  # noqa: E402
from triton_harness.perf_analyzer import ensure_perf_analyzer  # noqa: E402

TRACES = REPO.parent / "shared" / "data" / "traces"
log = logging.getLogger("steer_vs_analyzer")


@dataclass
class Row:
    """One configuration: how it was chosen, what it is, and what it measured."""

    name: str
    settings: dict[str, str] = field(default_factory=dict)  # model -> its setting, in words
    instances: int | None = None
    choose_s: float | None = None
    est_p99_ms: float | None = None
    replay: Replay | None = None
    max_qps: float | None = None
    max_at: int | None = None  # the concurrency it was reached at
    max_refused: float = 0.0  # share of the closed-loop requests refused there
    server: dict[str, dict[str, float]] = field(default_factory=dict)  # Triton's, over the replay
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["replay"] = self.replay.to_dict() if self.replay else None
        return d


@dataclass
class Bench:
    """The running server and what every row shares."""

    args: argparse.Namespace
    server: TritonServer
    pa: Any
    work: Path
    plan_trace: Path
    fresh: np.ndarray
    input_data: Path  # perf_analyzer's (Model Analyzer's) input: real digit images
    images: np.ndarray  # the replay's inputs: the same images

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"


def split_trace(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Planning and fresh traces: the two halves of the Azure trace, time rescaled so the
    whole trace's mean rate is ``args.rate`` (each half keeps its own ups and downs). The
    smoke run takes ``args.requests`` arrivals from the start of each half."""
    from inferline.core import load_csv_trace

    t = load_csv_trace(TRACES / f"azure_llm_2023_{args.trace}.csv")
    t = t * ((t.size - 1) / float(t[-1])) / args.rate
    half = t.size // 2
    plan, fresh = t[:half], t[half:]
    if args.requests:
        plan, fresh = plan[: args.requests], fresh[: args.requests]
    return plan - plan[0], fresh - fresh[0]


def read_row_config(b: Bench, row: Row) -> None:
    """What the server runs now, as it reports it (not what a tool says it set)."""
    row.instances = 0
    for m in sm.STEPS:
        s = sm.read_setting(sm.model_config(b.base, m))
        row.settings[m] = s.describe()
        row.instances += s.instances


def apply_operator(b: Bench) -> None:
    for m in sm.STEPS:
        sm.write_setting(b.server.repository, m, sm.ModelSetting())
    reload_all(b)


def reload_all(b: Bench) -> None:
    for m in (*sm.STEPS, sm.APP):
        sm.load_model(b.base, m)


def measure(b: Bench, row: Row) -> None:
    """The fresh trace, open loop, then the closed-loop maximum, on what is loaded now."""
    read_row_config(b, row)
    a = b.args
    warm_up(b.grpc, sm.APP, b.images)
    before = triton_counters(b.server.metrics_url)
    row.replay = r = replay_trace(b.grpc, sm.APP, b.fresh, b.images, slo_ms=a.slo_ms)
    row.server = server_figures(before, triton_counters(b.server.metrics_url), [sm.APP, *sm.STEPS])
    row.max_qps, row.max_at, row.max_refused = saturate(
        b.grpc, sm.APP, b.images, ladder=a.ladder, requests=a.max_requests
    )
    log.info(
        "%s: %s | P99 %.1f ms, over SLO %.2f%%, served %.1f/s of %.1f/s, max %.1f/s, errors %s",
        row.name,
        row.settings,
        r.p99_ms,
        100 * r.over_slo,
        r.served_qps,
        r.offered_qps,
        row.max_qps,
        r.errors,
    )


def operator_row(b: Bench) -> Row:
    row = Row("operator start", note="as built: hand-set, nothing chosen")
    apply_operator(b)
    measure(b, row)
    return row


def analyzer_row(b: Bench) -> Row:
    """Model Analyzer's profile from the operator's configuration; its pick, loaded."""
    row = Row("Model Analyzer")
    a = b.args
    if a.smoke:
        row.note = (
            "skipped in --smoke: its quick search loads and measures configurations one by "
            "one with perf_analyzer sweeps (minutes); the full run has it"
        )
        return row
    apply_operator(b)
    try:
        exe = ensure_model_analyzer()
        ma = run_analyzer(
            exe,
            repo=b.server.repository,
            work=b.work / "model-analyzer",
            app=sm.APP,
            steps=sm.STEPS,
            endpoints={
                "http": f"127.0.0.1:{b.server.http_port}",
                "grpc": b.grpc,
                "metrics": b.server.metrics_url,
            },
            pa=b.pa,
            slo_ms=a.slo_ms,
            input_data=b.input_data,
            quick_caps={
                "max_instance_count": a.max_instances,
                "max_model_batch_size": sm.MAX_BATCH,
                "max_concurrency": a.ma_max_concurrency,
            },
            timeout_s=a.ma_timeout_s,
        )
    except AnalyzerError as e:
        row.note = f"cannot run: `{e.command}` -> {e.error}"
        log.warning("Model Analyzer: %s", row.note)
        reload_all(b)  # it may have left models unloaded
        return row
    row.choose_s = ma.elapsed_s
    for m, text in ma.configs.items():
        (b.server.repository / m / "config.pbtxt").write_text(text)
    reload_all(b)
    p99 = ma.row.get("p99 Latency (ms)", "?")
    row.note = (
        f"profiled the ensemble ({ma.measured} ensemble configurations measured); "
        f"picked {ma.variant}: its own P99 {p99} ms at concurrency "
        f"{ma.row.get('Concurrency', ma.row.get('Request Concurrency', '?'))}"
    )
    measure(b, row)
    return row


def steer_available() -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "inferline", "attach", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return "--steer" in proc.stdout


def steer_command(b: Bench, plan_out: Path) -> list[str]:
    a = b.args
    cmd = [
        sys.executable,
        "-m",
        "inferline",
        "attach",
        b.server.http_url,
        "--steer",
        "--dry-run",
        "--app",
        sm.APP,
        "--slo-ms",
        f"{a.slo_ms:g}",
        "--trace",
        str(b.plan_trace),
        "--plan-out",
        str(plan_out),
        "--snapshot",  # its default is a file in the working directory
        str(plan_out.with_name("steer-snapshot.json")),
    ]
    return cmd + (["--quick"] if a.smoke else [])


def _estimate_ms(plan_out: Path, stdout: str) -> float | None:
    """The plan's estimated P99: its JSON (``estimated_latency_s``), else the printed line."""
    try:
        plan = json.loads(plan_out.read_text())
        return float(plan["estimated_latency_s"]) * 1e3
    except (OSError, ValueError, KeyError, TypeError):
        pass
    m = re.search(r"estimated[^\n]*?P99[^\n]*?([\d.]+)\s*ms", stdout, re.IGNORECASE)
    return float(m.group(1)) if m else None


def steer_row(b: Bench, run: int = 1) -> Row:
    row = Row("inferline --steer" + (f" (run {run})" if run > 1 else ""))
    if not steer_available():
        row.note = "not available: attach --steer missing"
        return row
    apply_operator(b)  # it starts where the operator is
    plan_out = b.work / "steer-plan.json"
    cmd = steer_command(b, plan_out)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=b.args.steer_timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        row.note = f"`{shlex.join(cmd[1:])}` gave no answer in {b.args.steer_timeout_s:g} s"
        return row
    row.choose_s = time.monotonic() - t0
    (b.work / "steer.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        row.note = f"`{shlex.join(cmd[1:])}` exit {proc.returncode}: {tail}"[:600]
        return row
    row.est_p99_ms = _estimate_ms(plan_out, proc.stdout)
    row.note = (
        f"ran `inferline attach TRITON_URL --steer --dry-run --app {sm.APP} --slo-ms "
        f"{b.args.slo_ms:g} --trace PLAN_TRACE{' --quick' if b.args.smoke else ''}`"
    )
    measure(b, row)  # no reload here: one from the repository would undo what it applied
    return row


def _f(x: float | None, spec: str = ".1f", none: str = "-") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, spec)


def table_lines(rows: list[Row], slo_ms: float) -> list[str]:
    """The table, one line per row (markdown-compatible pipes)."""
    best = max((r.max_qps or 0.0 for r in rows), default=0.0)
    head = (
        "| configuration | instances | P99 ms | over SLO | time to choose | est. P99 ms | "
        "served / offered | max thr/s (x best) |"
    )
    out = [head, "|" + "---|" * 8]
    for r in rows:
        rp = r.replay
        if rp is None:
            out.append(f"| {r.name} | - | - | - | - | - | - | - |")
            continue
        ratio = f" ({r.max_qps / best:.2f}x, c={r.max_at})" if r.max_qps and best else ""
        choose = "hand-set" if r.name == "operator start" else f"{_f(r.choose_s)} s"
        out.append(
            f"| {r.name} | {r.instances} | {_f(rp.p99_ms)} | {100 * rp.over_slo:.2f}% | "
            f"{choose} | {_f(r.est_p99_ms)} | {rp.served_qps:.1f} / {rp.offered_qps:.1f} | "
            f"{_f(r.max_qps)}{ratio} |"
        )
    return out


def target_lines(rows: list[Row]) -> list[str]:
    """Issue 43's targets, checked on these rows (a row that did not run says so)."""
    steer = [r for r in rows if r.name.startswith("inferline --steer") and r.replay]
    ma = next((r for r in rows if r.name == "Model Analyzer" and r.replay), None)
    if not steer:
        return ["targets: no steer row measured"]
    s = steer[0]
    out = [
        "targets (issue 43):",
        "- steer rows over SLO <= 1% on the fresh trace: "
        + ", ".join(f"{100 * r.replay.over_slo:.2f}%" for r in steer if r.replay),
    ]
    if ma and ma.replay and s.instances is not None and ma.instances is not None:
        ok = ma.replay.over_slo <= 0.01
        out.append(
            f"- cost <= Model Analyzer's pick that also meets it: steer {s.instances} vs "
            f"Model Analyzer {ma.instances} instances (its pick "
            f"{'meets' if ok else 'does not meet'} the SLO on the fresh trace)"
        )
        if s.choose_s and ma.choose_s:
            out.append(f"- chosen >= 50x faster: {ma.choose_s / s.choose_s:.1f}x")
    est = [
        f"{r.est_p99_ms:.1f} vs {r.replay.p99_ms:.1f} ms ({r.est_p99_ms / r.replay.p99_ms:.2f}x)"
        for r in steer
        if r.est_p99_ms and r.replay and math.isfinite(r.replay.p99_ms)
    ]
    out.append("- estimated vs measured P99 within 10%: " + ("; ".join(est) or "no estimate"))
    return out


def _argv() -> list[str]:
    """This run's options less where it wrote its outputs."""
    out, skip = [], False
    for x in sys.argv[1:]:
        if skip or x.startswith(("--json=", "--md=")):
            skip = False
            continue
        skip = x in ("--json", "--md")
        if not skip:
            out.append(x)
    return out


def _server_words(fig: dict[str, dict[str, float]]) -> str:
    out = []
    for m, f in fig.items():
        if m == sm.APP:
            out.append(f"{m} {f['request_ms']:.1f} ms per request (mean, in the server)")
        else:
            out.append(
                f"{m} mean batch {f['mean_batch']:.2f}, queued {f['queue_ms']:.2f} ms, "
                f"computing {f['compute_ms']:.2f} ms per request"
            )
    return "; ".join(out)


def print_report(b: Bench, rows: list[Row], acc: float, plan: np.ndarray) -> list[str]:
    a = b.args
    lines = [
        f"steer vs Model Analyzer vs operator start: Triton 2.51 ensemble {sm.APP} "
        f"({' -> '.join(sm.STEPS)}, Python backend, CPU; digits_wide held-out accuracy "
        f"{acc:.3f}), SLO P99 <= {a.slo_ms:g} ms",
        f"trace: Azure LLM 2023 {a.trace} rescaled to {a.rate:g}/s mean; planned on "
        f"{plan.size} arrivals ({plan[-1]:.1f} s), replayed on a fresh {b.fresh.size} "
        f"({b.fresh[-1]:.1f} s), open loop, gRPC straight at Triton",
        "",
        *table_lines(rows, a.slo_ms),
        "",
        "settings (as the server reports them after each row was applied):",
        "",
    ]
    for r in rows:
        cfg = "; ".join(f"{m} {s}" for m, s in r.settings.items()) or "-"
        lines.append(f"- {r.name}: {cfg}")
        if r.note:
            lines.append(f"  - note: {r.note}")
        if r.replay:
            rp = r.replay
            lines.append(
                f"  - replay: {rp.answered}/{rp.sent} answered, client send lag P99 "
                f"{rp.send_lag_p99_ms:.1f} ms (P99 from the actual send "
                f"{rp.p99_from_send_ms:.1f} ms), errors {rp.errors or 'none'}; closed loop: "
                f"{100 * r.max_refused:.1f}% refused at c={r.max_at}"
            )
        if r.server:
            lines.append(f"  - in Triton over the replay: {_server_words(r.server)}")
    lines += [
        "",
        *target_lines(rows),
        "",
        "over SLO: share of the fresh trace's requests answered after the SLO or not at all; "
        "served / offered: answers per second during the replay vs the trace's rate; max thr/s: "
        f"the highest closed-loop rate of answered requests over concurrencies {list(a.ladder)} "
        f"({a.max_requests} requests each, same client) on the row's configuration, its ratio to "
        "the best row's (the server's maximum here) and the concurrency c it came at.",
        "",
        "reproduce: "
        + shlex.join([".venv/bin/python", "benchmarks/steer_vs_analyzer.py", *_argv()]),
    ]
    print("\n".join(lines))
    return lines


_METHOD = """\
## How each row is chosen and measured

- One Triton 2.51 (the harness's, explicit model control) serves the ensemble `digits_app`:
  `digits_pre` (standardizes an 8x8 digit image) then `digits_wide` (a random-feature network,
  64 -> 4096 -> 4096 ReLU layers and a trained ridge readout, 98% held-out accuracy; one request
  is a memory-bound matrix-vector product, a batch reads the 64 MB layer once), both Python
  backend on CPU. Every row's configuration is loaded into that same server and read back from
  it (`GET /v2/models/{m}/config`): the settings printed are what the server runs.
- **operator start**: one CPU instance per model, no dynamic batching (as built).
- **Model Analyzer** 1.58 (its own venv, `.cache/model-analyzer-venv`): `model-analyzer profile`
  in remote launch mode against the same server, `run_config_search_mode: quick` (the only
  search it runs on an ensemble: it profiles the ensemble itself, generating configurations of
  the composing models and measuring the ensemble end to end with closed-loop perf_analyzer
  concurrency sweeps), `cpu_only_composing_models` both steps, constraint `perf_latency_p99`
  <= the SLO, perf_analyzer fed real digit images. Its pick is its best (highest-throughput)
  configuration that meets the constraint; the composing configs it wrote are loaded. Time to
  choose is the `profile` run (its venv, created once in ~20 s, not counted).
- **inferline --steer**: `inferline attach triton://... --steer --dry-run --app digits_app
  --slo-ms S --trace PLAN` (profiles through the server, plans the batchers and instances,
  applies them through Triton's load API and exits); time to choose is the whole command;
  est. P99 is the plan's `estimated_latency_s`.
- The trace is the Azure LLM inference trace 2023 (conversation), time rescaled so its mean
  rate is `--rate`: the first half of its requests is the planning trace (`--trace`), the second
  half the fresh trace every configuration is driven by. The replay is open loop, one request
  per arrival at its time, over gRPC straight at Triton (an asyncio `tritonclient` client:
  perf_analyzer stops at the first refused request, which a steered server's queue policy
  produces by design, and inferline's replay client speaks only inferline's own route); latency
  counts from the scheduled arrival; a refused or failed request counts as over the SLO.
"""


def write_markdown(path: Path, lines: list[str]) -> None:
    text = [
        "# steer vs Model Analyzer vs the operator's start (issue 43)",
        "",
        "Written by `benchmarks/steer_vs_analyzer.py` on the shared 2-core machine (other work "
        "ran alongside: single runs, noisy).",
        "",
        *(f"reproduce: `{x[11:]}`" if x.startswith("reproduce: ") else x for x in lines),
        "",
        _METHOD,
        "Trace: Azure LLM inference trace 2023 (Azure Public Dataset, CC-BY 4.0), from Patel et "
        'al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.',
        "",
    ]
    path.write_text("\n".join(text))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help="under a minute: short traces, Model Analyzer skipped (reason printed)",
    )
    p.add_argument("--rate", type=float, default=300.0, help="mean arrivals/s (default 300)")
    p.add_argument("--slo-ms", type=float, default=100.0, help="P99 SLO, ms (default 100)")
    p.add_argument("--trace", choices=("conv", "code"), default="conv")
    p.add_argument("--requests", type=int, default=None, help="arrivals per trace half")
    p.add_argument("--max-instances", type=int, default=3, help="Model Analyzer's cap")
    p.add_argument("--ma-max-concurrency", type=int, default=64, help="Model Analyzer's cap")
    p.add_argument("--ma-timeout-s", type=float, default=2400.0)
    p.add_argument("--steer-timeout-s", type=float, default=None)
    p.add_argument("--steer-runs", type=int, default=None, help="steer rows (default 3; --smoke 1)")
    p.add_argument("--ladder", default=None, help="closed-loop concurrencies, e.g. 4,8,16,32")
    p.add_argument("--max-requests", type=int, default=None, help="per closed-loop run")
    p.add_argument("--md", type=Path, default=None, help="write the table here (markdown)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.requests is None and args.smoke:
        args.requests = 400
    # --smoke: 200 requests per closed-loop step (the operator's start serves ~90/s, so 400
    # took ~10 s of the row for a figure the smoke run does not judge)
    args.max_requests = args.max_requests or (200 if args.smoke else 3000)
    ladder = args.ladder or ("8,32" if args.smoke else "4,8,16,32,64")
    args.ladder = tuple(int(c) for c in ladder.split(","))
    args.steer_runs = args.steer_runs or (1 if args.smoke else 3)
    args.steer_timeout_s = args.steer_timeout_s or (40.0 if args.smoke else 600.0)
    if args.md is None and not args.smoke:
        args.md = REPO / "docs" / "results" / "steer_vs_analyzer.md"
    return args


def run(b: Bench) -> list[Row]:
    """The three rows; the steer row ``--steer-runs`` times (each from the operator's start,
    each planned and replayed anew: estimated vs measured P99 over several runs)."""
    makers = [operator_row, analyzer_row, steer_row]
    makers += [lambda b, k=k: steer_row(b, k) for k in range(2, b.args.steer_runs + 1)]
    rows = []
    for make in makers:
        t0 = time.monotonic()
        rows.append(make(b))
        log.info("%s: row done in %.1f s", rows[-1].name, time.monotonic() - t0)
        if rows[-1].name == "inferline --steer" and rows[-1].replay is None:
            break  # not available or failed: no point in repeating it
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # before Triton starts (its stubs inherit it): idle BLAS threads spin on 2 cores
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (TRACES / f"azure_llm_2023_{args.trace}.csv").exists():
        print(f"cannot run: no Azure trace under {TRACES}", file=sys.stderr)
        return 2
    try:
        install = ensure_installed()
        pa = ensure_perf_analyzer(install)
    except SetupError as e:
        print(f"cannot run: {e}", file=sys.stderr)
        return 2
    plan, fresh = split_trace(args)
    with tempfile.TemporaryDirectory(prefix="inferline-steer-bench-") as tmp:
        work = Path(tmp)
        acc = sm.build_app_repository(work / "models")
        from inferline.core import save_trace

        save_trace(plan, work / "plan-trace.txt")
        server = TritonServer(install, work / "models", load=(*sm.STEPS, sm.APP))
        server.start()
        try:
            b = Bench(
                args,
                server,
                pa,
                work,
                work / "plan-trace.txt",
                fresh,
                sm.input_data_file(work / "input.json"),
                sm.test_images(),
            )
            rows = run(b)
            lines = print_report(b, rows, acc, plan)
        finally:
            server.stop()
    if args.md:
        write_markdown(args.md, lines)
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in rows], indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
