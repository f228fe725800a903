"""Triton's ``perf_analyzer`` (C++ load generator) as an outside reference for benchmarks.

The binary ships in the ``tritonclient==2.51.0`` wheel (newer wheels lack it or need glibc
2.38). It links ``libb64.so.0d`` and ``libcudart.so.12``; instead of the Debian package and the
CUDA runtime wheel, this module points it at the copies the ``nvidia-pytriton`` wheel already
carries (same Triton release), through symlinks in a private library folder. Everything lives
under ``<repo>/.cache/triton`` next to the server, in its own folder (the project itself uses a
current ``tritonclient``).
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .setup_server import Install, SetupError, _locked, repo_root

__all__ = ["PA_VERSION", "PerfAnalyzer", "ensure_perf_analyzer"]

PA_VERSION = "2.51.0"


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    lib_dir: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env

    def run_request_rates(
        self,
        model: str,
        grpc_address: str,
        rates: Sequence[int],
        *,
        window_ms: int,
        out_csv: Path,
        max_trials: int = 3,
        timeout_s: float = 600.0,
    ) -> list[dict[str, Any]]:
        """Open-loop Poisson load at each rate (batch 1, async gRPC); one row per rate with
        ``rate``, ``throughput``, ``p50_ms``, ``p99_ms`` (client-side latency)."""
        rows: list[dict[str, Any]] = []
        for rate in rates:
            cmd = [
                str(self.binary),
                "-m",
                model,
                "-u",
                grpc_address,
                "-i",
                "grpc",
                "-b",
                "1",
                "--async",
                f"--request-rate-range={int(rate)}:{int(rate)}:1",
                "--request-distribution=poisson",
                f"--measurement-interval={int(window_ms)}",
                "--stability-percentage=100",  # a shared noisy machine never looks "stable"
                f"--max-trials={int(max_trials)}",
                "--percentile=99",
                "--input-data=random",
                "-f",
                str(out_csv),
            ]
            proc = subprocess.run(
                cmd, env=self.env(), capture_output=True, text=True, timeout=timeout_s, check=False
            )
            if proc.returncode != 0 or not out_csv.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"perf_analyzer failed at {rate}/s: {' | '.join(tail)}")
            with open(out_csv, newline="") as fh:
                for r in csv.DictReader(fh):
                    rows.append(
                        {
                            "rate": float(r["Request Rate"]),
                            "throughput": float(r["Inferences/Second"]),
                            "p50_ms": float(r["p50 latency"]) / 1e3,
                            "p99_ms": float(r["p99 latency"]) / 1e3,
                        }
                    )
            out_csv.unlink()
        return rows


def _link(lib_dir: Path, name: str, candidates: Sequence[Path]) -> None:
    dst = lib_dir / name
    if dst.exists():
        return
    for c in candidates:
        if c.exists():
            dst.symlink_to(c)
            return
    raise SetupError(
        f"perf_analyzer needs {name}; none found (looked at {[str(c) for c in candidates]})"
    )


def ensure_perf_analyzer(install: Install, cache_root: Path | None = None) -> PerfAnalyzer:
    """Fetch (once) ``perf_analyzer`` from ``tritonclient==2.51.0`` and make it runnable.

    Raises ``SetupError`` naming what is missing when it cannot run here."""
    if sys.platform != "linux":
        raise SetupError("perf_analyzer from tritonclient 2.51.0 runs on Linux only")
    cache = Path(cache_root) if cache_root else repo_root() / ".cache" / "triton"
    home = cache / f"perf_analyzer-{PA_VERSION}"
    binary = home / "bin" / "perf_analyzer"
    lib_dir = home / "lib"
    with _locked(cache / ".lock"):
        if not binary.exists():
            wheels = cache / "wheels"
            pattern = f"tritonclient-{PA_VERSION}-*.whl"
            found = sorted(wheels.glob(pattern))
            if not found:
                wheels.mkdir(parents=True, exist_ok=True)
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--disable-pip-version-check",
                        "-q",
                        "-d",
                        str(wheels),
                        f"tritonclient=={PA_VERSION}",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                found = sorted(wheels.glob(pattern))
                if proc.returncode != 0 or not found:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
                    raise SetupError(f"pip download tritonclient=={PA_VERSION} failed: {tail}")
            member = f"tritonclient-{PA_VERSION}.data/data/bin/perf_analyzer"
            binary.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(found[0]) as zf:
                try:
                    with zf.open(member) as src, open(binary.with_suffix(".partial"), "wb") as dst:
                        shutil.copyfileobj(src, dst)
                except KeyError:
                    raise SetupError(f"{found[0].name} has no {member}") from None
            os.chmod(binary.with_suffix(".partial"), 0o755)
            binary.with_suffix(".partial").rename(binary)
        lib_dir.mkdir(parents=True, exist_ok=True)
        libs = install.root / "nvidia_pytriton.libs"
        _link(
            lib_dir,
            "libb64.so.0d",
            [Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d"), *sorted(libs.glob("libb64-*.so.0d"))],
        )
        _link(lib_dir, "libcudart.so.12", sorted(libs.glob("libcudart-*.so.12*")))
    pa = PerfAnalyzer(binary, lib_dir)
    proc = subprocess.run(
        [str(binary), "--version"], env=pa.env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise SetupError(f"perf_analyzer does not start: {tail}")
    return pa
