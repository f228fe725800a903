"""Triton's Model Analyzer (``triton-model-analyzer``) for ``benchmarks/steer_vs_analyzer.py``:
its own virtual environment, its profile of the ensemble against the running server (remote
launch mode, quick search, ``cpu_only``, a P99 constraint), and its pick.

Model Analyzer profiles an ensemble with quick search only: it generates configurations of the
composing models (instances, max batch size, dynamic batching on), loads each combination into
the running server and measures the ensemble with closed-loop perf_analyzer concurrency sweeps.
Its pick is the highest-throughput configuration that meets the constraint.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MA_VERSION", "AnalyzerError", "AnalyzerRun", "ensure_model_analyzer", "run_analyzer"]

MA_VERSION = "1.58.0"
REPO = Path(__file__).resolve().parents[1]


class AnalyzerError(RuntimeError):
    """Model Analyzer could not be installed or did not produce a pick; ``command`` is what
    was run and the message holds its error."""

    def __init__(self, command: str, error: str) -> None:
        super().__init__(f"{command}: {error}")
        self.command = command
        self.error = error


def ensure_model_analyzer(venv: Path | None = None) -> Path:
    """The ``model-analyzer`` executable of its own venv (created on first use, ~20 s), kept
    apart from the project's environment: it pins its own tritonclient and protobuf."""
    venv = Path(venv) if venv else REPO / ".cache" / "model-analyzer-venv"
    exe = venv / "bin" / "model-analyzer"
    if exe.exists():
        return exe
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"triton-model-analyzer=={MA_VERSION}",
        ],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise AnalyzerError(" ".join(cmd), tail or f"exit {proc.returncode}")
    if not exe.exists():
        raise AnalyzerError(" ".join(steps[-1]), f"installed, but {exe} is missing")
    return exe


@dataclass(frozen=True)
class AnalyzerRun:
    """What Model Analyzer chose: per composing model its config.pbtxt text (names restored
    to the served models), the measured row it chose on, and how long the profile took."""

    configs: dict[str, str]
    variant: str
    row: dict[str, str]
    measured: int  # configurations it measured
    elapsed_s: float
    command: str


def _yaml(
    *,
    repo: Path,
    work: Path,
    app: str,
    steps: tuple[str, ...],
    endpoints: dict[str, str],
    pa_path: Path,
    slo_ms: float,
    input_data: Path,
    quick_caps: dict[str, int],
) -> str:
    """Its profile config (YAML is a superset of JSON: written as JSON)."""
    cfg: dict[str, Any] = {
        "model_repository": str(repo),
        "triton_launch_mode": "remote",
        "triton_http_endpoint": endpoints["http"],
        "triton_grpc_endpoint": endpoints["grpc"],
        "triton_metrics_url": endpoints["metrics"],
        "client_protocol": "grpc",
        "perf_analyzer_path": str(pa_path),
        # its default 80% kills perf_analyzer on a busy 2-core machine
        "perf_analyzer_cpu_util": 400,
        "dcgm_disable": True,
        "override_output_model_repository": True,
        "output_model_repository_path": str(work / "output_model_repository"),
        "export_path": str(work / "export"),
        "checkpoint_directory": str(work / "checkpoints"),
        "run_config_search_mode": "quick",
        "cpu_only_composing_models": list(steps),
        "perf_analyzer_flags": {"input-data": str(input_data)},
        "profile_models": {
            app: {"constraints": {"perf_latency_p99": {"max": int(slo_ms)}}},
        },
        **{f"run_config_search_{k}": v for k, v in quick_caps.items()},
    }
    return json.dumps(cfg, indent=2)


def _pick(export: Path, app: str) -> tuple[dict[str, str], int]:
    """Its best row that meets the constraint (its table lists configurations best first by
    its objective, throughput) and the number of configurations it measured."""
    path = export / "results" / "metrics-model-inference.csv"
    if not path.exists():
        raise FileNotFoundError(f"no {path}")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("Model") == app]
    ok = [r for r in rows if r.get("Satisfies Constraints", "").strip().lower() == "yes"]
    if not ok:
        raise ValueError(f"{path}: no configuration of {app!r} meets the constraint")
    return ok[0], len({r.get("Model Config Path") for r in rows})


def _configs(out_repo: Path, variant: str, steps: tuple[str, ...]) -> dict[str, str]:
    """Composing configs of the chosen ensemble variant (``"app_config_1: pre_config_0,
    wide_config_1"``), renamed to the served models."""
    out: dict[str, str] = {}
    for used in (v.strip() for v in variant.split(":", 1)[-1].split(",")):
        base = next((s for s in steps if used.startswith(f"{s}_config_")), None)
        if base is None:
            raise ValueError(f"{variant}: composing model {used!r} is none of {steps}")
        text = (out_repo / used / "config.pbtxt").read_text()
        out[base] = re.sub(r'(?m)^name:\s*"[^"]*"', f'name: "{base}"', text)
    if set(out) != set(steps):
        raise ValueError(f"{variant}: expected configs of {steps}")
    return out


def run_analyzer(
    exe: Path,
    *,
    repo: Path,
    work: Path,
    app: str,
    steps: tuple[str, ...],
    endpoints: dict[str, str],
    pa: Any,
    slo_ms: float,
    input_data: Path,
    quick_caps: dict[str, int],
    timeout_s: float,
) -> AnalyzerRun:
    """``model-analyzer profile`` against the running server; raises ``AnalyzerError``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cfg = work / "ma.yaml"
    cfg.write_text(
        _yaml(
            repo=repo,
            work=work,
            app=app,
            steps=steps,
            endpoints=endpoints,
            pa_path=pa.binary,
            slo_ms=slo_ms,
            input_data=input_data,
            quick_caps=quick_caps,
        )
    )
    cmd = [str(exe), "profile", "-f", str(cfg)]
    shown = f"{exe.name} profile -f ma.yaml (config: {cfg})"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=work, env=pa.env(), capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise AnalyzerError(shown, f"no result within {timeout_s:.0f} s") from None
    elapsed = time.monotonic() - t0
    (work / "model-analyzer.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise AnalyzerError(shown, f"exit {proc.returncode}: {tail}"[:600])
    try:
        row, measured = _pick(work / "export", app)
        variant = row.get("Model Config Path", "")
        configs = _configs(work / "output_model_repository", variant, steps)
    except (OSError, ValueError) as e:
        raise AnalyzerError(shown, f"no usable pick: {e}") from None
    return AnalyzerRun(configs, variant, row, measured, elapsed, shown)
