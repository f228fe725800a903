"""Pieces of ``benchmarks/triton_overhead.py``: one perf_analyzer point, the CPU each process
spends on it, and inferline's KServe door as its own server process (``inferline attach``).

perf_analyzer (2.51, C++) comes from the Triton test harness (``ensure_perf_analyzer``); it is
run here with its own command line because the harness's helper speaks gRPC only.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DoorProcess",
    "Point",
    "Target",
    "cpu_seconds",
    "group_pids",
    "run_point",
    "success_count",
]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Point:
    """One perf_analyzer run: ``side`` (triton | inferline) over ``protocol`` at ``rate``/s."""

    side: str
    protocol: str
    rate: float
    throughput: float
    p50_ms: float
    p99_ms: float
    requests: int  # answered by the server during the run (its statistics extension)
    door_cpu_ms: float | None  # inferline process CPU per request (None: no door involved)
    triton_cpu_ms: float | None  # Triton's CPU (server + Python-backend stubs) per request
    error: str | None = None

    def meets(self, p99_ms: float) -> bool:
        """Sustained: perf_analyzer finished, P99 within target, and at least 95% of the
        offered rate came back answered."""
        return self.error is None and self.p99_ms <= p99_ms and self.throughput >= 0.9 * self.rate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        return cls(**d)


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Each live process's pid and its ``/proc/PID/stat`` fields after the command name
    (``[0]`` state, ``[1]`` parent, ``[2]`` process group); one that ends meanwhile is
    passed over."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), fields


def group_pids(pgid: int) -> list[int]:
    """Every live process in process group ``pgid`` (Triton and its Python-backend stubs)."""
    return [pid for pid, fields in _stats() if int(fields[2]) == pgid]


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (the door process and its door workers)."""
    parents = {p: int(fields[1]) for p, fields in _stats()}
    out, frontier = [pid], [pid]
    while frontier:
        kids = [c for c, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (those still alive)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def success_count(http_base: str, model: str) -> int:
    """Successful requests so far, from the KServe statistics extension (Triton and the door
    both serve it)."""
    with urllib.request.urlopen(f"{http_base}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"]
    return int(sum(s["inference_stats"]["success"]["count"] for s in stats))


def pa_command(
    binary: Path, model: str, address: str, protocol: str, rate: float, window_ms: int, out: Path
) -> list[str]:
    return [
        str(binary),
        "-m",
        model,
        "-u",
        address,
        "-i",
        protocol,
        "-b",
        "1",
        "--async",
        f"--request-rate-range={int(rate)}:{int(rate)}:1",
        "--request-distribution=poisson",
        f"--measurement-interval={int(window_ms)}",
        # three windows, always "stable": a shared noisy machine never looks stable, and the
        # row is then the average over the three windows
        "--stability-percentage=999",
        "--max-trials=3",
        "--percentile=99",
        "--input-data=random",
        "-f",
        str(out),
    ]


@dataclass(frozen=True)
class Target:
    """Where one side's perf_analyzer sends load, and whose CPU is counted."""

    side: str
    model: str
    addresses: dict[str, str]  # protocol -> host:port
    stats_base: str  # HTTP base URL of the statistics extension
    triton_pgid: int
    door_pid: int | None


def run_point(
    pa: Any, target: Target, protocol: str, rate: float, window_ms: int, workdir: Path
) -> Point:
    """One perf_analyzer run; a failed run is a ``Point`` with ``error`` set, never raised."""
    out = workdir / f"pa-{target.side}-{protocol}.csv"
    out.unlink(missing_ok=True)
    cmd = pa_command(
        pa.binary, target.model, target.addresses[protocol], protocol, rate, window_ms, out
    )
    tpids = group_pids(target.triton_pgid)
    c0 = success_count(target.stats_base, target.model)
    t0 = cpu_seconds(tpids)
    dpids = tree_pids(target.door_pid) if target.door_pid else []  # + its door workers
    d0 = cpu_seconds(dpids)
    err: str | None = None
    try:
        proc = subprocess.run(
            cmd,
            env=pa.env(),
            capture_output=True,
            text=True,
            timeout=30 + 6 * window_ms / 1e3,
            check=False,
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
            err = f"perf_analyzer exit {proc.returncode}: {' | '.join(tail)}"[:300]
    except subprocess.TimeoutExpired:
        err = "perf_analyzer timed out"
    time.sleep(0.2)  # let the last answers land before counting
    n = max(success_count(target.stats_base, target.model) - c0, 1)
    t_cpu = cpu_seconds(tpids) - t0
    d_cpu = cpu_seconds(dpids) - d0 if target.door_pid else None
    row = {"throughput": 0.0, "p50_ms": float("inf"), "p99_ms": float("inf")}
    if err is None:
        with open(out, newline="") as fh:
            r = list(csv.DictReader(fh))[-1]
        row = {
            "throughput": float(r["Inferences/Second"]),
            "p50_ms": float(r["p50 latency"]) / 1e3,
            "p99_ms": float(r["p99 latency"]) / 1e3,
        }
    return Point(
        side=target.side,
        protocol=protocol,
        rate=rate,
        requests=n,
        door_cpu_ms=None if d_cpu is None else 1e3 * d_cpu / n,
        triton_cpu_ms=1e3 * t_cpu / n,
        error=err,
        **row,
    )


class ServerProcess:
    """A server run as a child process with its output in ``log_path``: started by
    ``_spawn``, which waits for the file it writes once it serves, stopped by SIGTERM (then
    SIGKILL after ``timeout_s``). ``new_session``: its own process group, so that what it
    forks can be killed with it."""

    what = "server"  # names it in the error when it does not start

    def __init__(self, cmd: list[str], log_path: Path, *, new_session: bool = False) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, ready: Path, timeout_s: float) -> None:
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=self.new_session
            )
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                self.stop()
                raise RuntimeError(f"{self.what} did not start:\n{tail}")
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class DoorProcess(ServerProcess):
    """``inferline attach triton://...`` serving one model of the running Triton through
    inferline's queue and its KServe v2 doors (HTTP, and gRPC on a free port), in its own
    process, as an operator would start it."""

    what = "inferline attach"

    def __init__(
        self,
        triton_http: str,
        model: str,
        *,
        max_batch: int,
        replicas: int,
        slo_ms: float,
        workdir: Path,
        max_request_rows: int = 256,
        door_workers: int = 0,
    ) -> None:
        self.workdir = workdir
        pipe = workdir / "door-pipeline.json"
        plan = workdir / "door-plan.json"
        pipe.write_text(
            json.dumps(
                {"format": "inferline.pipeline/1", "name": model, "models": [model], "edges": []}
            )
        )
        # the plan pins the queue's batch size and the replica count (what the Triton model
        # already has) instead of profiling and planning at start
        plan.write_text(
            json.dumps(
                {
                    "format": "inferline.plan/1",
                    "pipeline": model,
                    "slo_s": slo_ms / 1e3,
                    "percentile": 99,
                    "cost_per_hour": 0.0,
                    "estimated_latency_s": slo_ms / 2e3,
                    "strategy": "inferline",
                    "models": {
                        model: {
                            "hardware": "cpu",
                            "max_batch_size": max_batch,
                            "replicas": replicas,
                        }
                    },
                }
            )
        )
        self.ready_file = workdir / "door-ready.json"
        cmd = [
            sys.executable,
            "-m",
            "inferline",
            "attach",
            triton_http,
            "--models",
            model,
            "--no-profile",
            "--pipeline",
            str(pipe),
            "--plan",
            str(plan),
            "--slo-ms",
            f"{slo_ms:g}",
            "--port",
            "0",
            "--grpc-port",
            "0",
            "--max-request-rows",
            str(max_request_rows),
            "--ready-file",
            str(self.ready_file),
        ]
        if door_workers > 0:  # HTTP parsed and encoded in worker processes (docs/serving.md)
            cmd += ["--door-workers", str(door_workers)]
        super().__init__(cmd, workdir / "door.log")
        self.info: dict[str, Any] = {}

    def start(self, timeout_s: float = 90.0) -> dict[str, Any]:
        self.ready_file.unlink(missing_ok=True)
        self._spawn(self.ready_file, timeout_s)
        self.info = json.loads(self.ready_file.read_text())
        return self.info


RAY_SERVE_PY = Path(__file__).resolve().parents[1] / ".cache" / "ray-serve-venv" / "bin" / "python"


class RayServeProcess(ServerProcess):
    """Ray Serve 2.60 (its own venv) with a FastAPI ingress forwarding KServe v2 to Triton
    over HTTP (``_ray_serve_kserve.py``): the peer column. Its own session, so that Ray's
    processes (GCS, raylet, workers) are its descendants and go down with it."""

    what = "Ray Serve"

    def __init__(self, triton_http: str, model: str, workdir: Path) -> None:
        self.port_file = workdir / "ray-serve-port"
        cmd = [
            str(RAY_SERVE_PY),
            str(Path(__file__).resolve().parent / "_ray_serve_kserve.py"),
            "--triton",
            triton_http,
            "--model",
            model,
            "--port-file",
            str(self.port_file),
        ]
        super().__init__(cmd, workdir / "ray-serve.log", new_session=True)
        self.address = ""

    def start(self, timeout_s: float = 120.0) -> str:
        self._spawn(self.port_file, timeout_s)
        self.address = f"127.0.0.1:{self.port_file.read_text().strip()}"
        return self.address

    def stop(self, timeout_s: float = 30.0) -> None:
        super().stop(timeout_s)
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):  # whatever Ray left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
