"""One model over a fleet of 1, 2 and 3 real Triton servers on this machine, and a server kill.

Each Triton server (the harness: 2.51 from the nvidia-pytriton wheel, gRPC) holds one instance
of ``digits_knn`` (a 3-nearest-neighbour digit classifier in the Python backend, features ->
label), loaded through a fleet backend (``open_backend`` of the servers' URLs); every server,
its model process included, is pinned to its share of this machine's cores (the cores split
evenly over the servers; more servers than cores share them round-robin). inferline's queue
(one EDF queue, ``FixedBatching(--batch)``) sends batches to the replicas on every server.

- **Scaling**: closed-loop load (``--clients`` concurrent queries) for ``--seconds`` per fleet
  size: throughput (answered queries per second) and P99 latency.
- **Kill**: two servers, open-loop Poisson load at ``--kill-load`` of the two-server
  throughput, ``SIGKILL`` of one server after ``--kill-after-s``: failed batches, retried
  queries (``max_retries`` 2), queries failed or expired, how long until the kill was
  noticed (the dead server's replica left the published set), and how long until the P99 of
  each ``--window-s`` window of queries is back under the SLO (``--slo-ms``) for good.

    .venv/bin/python benchmarks/fleet.py           # 1, 2, 3 servers, 6 s each; kill run of 10 s
    .venv/bin/python benchmarks/fleet.py --smoke   # 1 and 2 servers, 2 s each; kill run of 5 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "integration"))

from triton_harness import SetupError, TritonServer, build_repository, ensure_installed  # noqa: E402

MODEL = "digits_knn"


@dataclass(frozen=True)
class Point:
    servers: int
    cores: str
    answered: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int

    @property
    def throughput(self) -> float:
        return self.answered / self.seconds


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Triton's Python-backend stubs are its children)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid``'s process tree onto ``cores``."""
    for p in _tree(pid):
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                os.sched_setaffinity(int(tid), cores)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def shares(n: int) -> list[set[int]]:
    """The cores of each of ``n`` servers: this process's cores split evenly, round-robin
    when there are more servers than cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if n >= len(cpus):
        return [{cpus[i % len(cpus)]} for i in range(n)]
    k = len(cpus) // n
    return [set(cpus[i * k : (i + 1) * k]) for i in range(n)]


async def _fleet(servers: list[TritonServer], batch: int) -> Any:
    from inferline.core import ModelConfig, ModelSpec
    from inferline.deploy import open_backend, plugin_host

    urls = [f"{s.grpc_url}?oversubscribe=1&recovery_timeout_s=60" for s in servers]
    b = open_backend(plugin_host(), urls if len(urls) > 1 else urls[0])
    await b.deploy(ModelSpec("knn", source=MODEL), ModelConfig("cpu", batch, len(urls)))
    for s, cores in zip(servers, shares(len(servers)), strict=True):
        assert s.pid is not None
        pin(s.pid, cores)  # after the load: the model's stub process is pinned too
    return b


async def _closed_loop(d: Any, xs: np.ndarray, clients: int, seconds: float) -> list[float]:
    lat: list[float] = []
    errors = [0]
    end = time.monotonic() + seconds

    async def client(c: int) -> None:
        i = c
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                await d.submit("knn", xs[i % len(xs)], deadline=t + 10.0)
                lat.append(time.monotonic() - t)
            except Exception:  # counted: a benchmark reports failures, it does not stop
                errors[0] += 1
            i += clients

    await asyncio.gather(*(client(c) for c in range(clients)))
    lat.append(-float(errors[0]))  # carried out as a negative last entry
    return lat


async def scaling_point(
    servers: list[TritonServer], xs: np.ndarray, a: argparse.Namespace
) -> Point:
    from inferline.queueing import Dispatcher, FixedBatching

    b = await _fleet(servers, a.batch)
    d = Dispatcher()
    try:
        d.add_model("knn", batching=FixedBatching(a.batch), max_retries=2)
        d.attach(b)
        await _closed_loop(d, xs, a.clients, 0.5)  # warm-up
        lat = await _closed_loop(d, xs, a.clients, a.seconds)
    finally:
        await d.close()
        await b.remove("knn")
        await b.close()
    errors = int(-lat.pop())
    ms = np.asarray(lat) * 1e3
    cores = " ".join(",".join(map(str, sorted(c))) for c in shares(len(servers)))
    return Point(
        len(servers),
        cores,
        len(lat),
        a.seconds,
        float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        errors,
    )


@dataclass
class KillRun:
    rate: float
    queries: int
    failed_batches: int
    retried: int
    failed: int
    expired: int
    noticed_s: float
    recovered_s: float | None
    windows: list[tuple[float, float, int]]  # window start (s from the kill), P99 ms, queries


async def kill_run(
    servers: list[TritonServer], xs: np.ndarray, rate: float, a: argparse.Namespace
) -> KillRun:
    from inferline.queueing import Dispatcher, FixedBatching

    b = await _fleet(servers, a.batch)
    d = Dispatcher()
    out: list[tuple[float, float | None]] = []  # submitted, latency (None: failed)
    tasks: list[asyncio.Task[None]] = []

    async def one(x: np.ndarray) -> None:
        t = time.monotonic()
        try:
            await d.submit("knn", x, deadline=t + a.deadline_s)
            out.append((t, time.monotonic() - t))
        except Exception:  # an explicit error or an expired deadline: counted below
            out.append((t, None))

    try:
        d.add_model("knn", batching=FixedBatching(a.batch), max_retries=2)
        d.attach(b)
        # Poisson arrivals, sent in 2 ms ticks: a sleep per query cannot keep up at this rate
        gaps = np.random.default_rng(0).exponential(1.0 / rate, int(rate * a.kill_seconds * 2))
        arrivals = np.cumsum(gaps)
        arrivals = arrivals[arrivals < a.kill_seconds]
        t0 = time.monotonic()
        t_kill, killed, noticed, i = t0 + a.kill_after_s, False, None, 0
        while i < len(arrivals):
            now = time.monotonic() - t0
            while i < len(arrivals) and arrivals[i] <= now:
                tasks.append(asyncio.create_task(one(xs[i % len(xs)])))
                i += 1
            if not killed and now >= a.kill_after_s:
                servers[-1].kill()
                t_kill, killed = time.monotonic(), True
            if killed and noticed is None and len(b.replicas("knn")) < len(servers):
                noticed = time.monotonic() - t_kill
            await asyncio.sleep(0.002)
        await asyncio.gather(*tasks)
        st = d.stats("knn")
    finally:
        await d.close()
        await b.close()
    return _kill_figures(out, t_kill, noticed, st, rate, a)


def _kill_figures(
    out: list[tuple[float, float | None]],
    t_kill: float,
    noticed: float | None,
    st: Any,
    rate: float,
    a: argparse.Namespace,
) -> KillRun:
    """Per window of submit times: P99 (a failed query counts as over the SLO); recovered
    when every window from there on is under the SLO."""
    first = min(t for t, _ in out)
    edges = np.arange(first - t_kill, max(t for t, _ in out) - t_kill, a.window_s)
    windows = []
    for w in edges:
        lat = [x for t, x in out if w <= t - t_kill < w + a.window_s]
        ms = [1e9 if x is None else x * 1e3 for x in lat]
        if ms:
            windows.append((float(w), float(np.percentile(ms, 99)), len(ms)))
    # the end of the last window over the SLO that holds queries sent after the kill (0: none
    # was over); None: still over at the end of the run
    bad = [w for w, p99, _ in windows if w + a.window_s > 0 and p99 > a.slo_ms]
    recovered = max(bad) + a.window_s if bad else 0.0
    if windows and windows[-1][1] > a.slo_ms:
        recovered = None
    return KillRun(
        rate,
        len(out),
        st.failed_batches,
        st.retried,
        st.failed,
        st.expired,
        float("nan") if noticed is None else noticed,
        recovered,
        windows,
    )


def print_report(points: list[Point], k: KillRun, a: argparse.Namespace, argv: list[str]) -> None:
    print(f"Fleet of Triton servers: {MODEL}, batch {a.batch}, {a.clients} closed-loop clients")
    print(
        f"{'servers':>7} {'cores':<12} {'queries/s':>10} {'x 1 server':>10} "
        f"{'P50 ms':>8} {'P99 ms':>8} {'errors':>6}"
    )
    base = points[0].throughput if points else 0.0
    for p in points:
        print(
            f"{p.servers:>7} {p.cores:<12} {p.throughput:>10.1f} "
            f"{p.throughput / base if base else 0:>10.2f} {p.p50_ms:>8.1f} {p.p99_ms:>8.1f} "
            f"{p.errors:>6}"
        )
    print()
    print(
        f"Kill of one of 2 servers (SIGKILL at {a.kill_after_s:g} s), open-loop "
        f"{k.rate:.0f} queries/s, SLO {a.slo_ms:g} ms, deadline {a.deadline_s:g} s"
    )
    print(f"{'window s':>9} {'queries':>8} {'P99 ms':>8}")
    for w, p99, n in k.windows:
        shown = "failed" if p99 >= 1e9 else f"{p99:.1f}"
        print(f"{w:>+9.2f} {n:>8} {shown:>8}")
    back = "not within the run" if k.recovered_s is None else f"{k.recovered_s:.2f} s"
    print(
        f"kill: {k.queries} queries, {k.failed_batches} failed batches, {k.retried} queries "
        f"retried, {k.failed} failed, {k.expired} expired; replica gone {k.noticed_s:.2f} s "
        f"after the kill, P99 back under the SLO {back} after it"
    )
    print("reproduce: .venv/bin/python benchmarks/fleet.py " + shlex.join(argv))


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="1 and 2 servers, short runs")
    ap.add_argument("--servers", type=int, default=3, help="largest fleet measured")
    ap.add_argument("--seconds", type=float, default=6.0, help="closed-loop seconds per size")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--deadline-s", type=float, default=2.0)
    ap.add_argument("--kill-load", type=float, default=0.4, help="of the 2-server throughput")
    ap.add_argument("--kill-seconds", type=float, default=10.0)
    ap.add_argument("--kill-after-s", type=float, default=3.0)
    ap.add_argument("--window-s", type=float, default=0.5)
    a = ap.parse_args(argv)
    if a.smoke:
        a.servers, a.seconds, a.kill_seconds, a.kill_after_s = 2, 2.0, 5.0, 2.0
    if a.servers < 2:
        ap.error("--servers: at least 2 (the kill run needs two)")
    return a


async def measure(servers: list[TritonServer], xs: np.ndarray, a: argparse.Namespace) -> Any:
    points = [await scaling_point(servers[:n], xs, a) for n in range(1, a.servers + 1)]
    rate = a.kill_load * points[1].throughput
    return points, await kill_run(servers[:2], xs, rate, a)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    try:
        install = ensure_installed()
    except SetupError as e:
        print(f"no Triton server available: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        repo = Path(tmp) / "models"
        digits = build_repository(repo)
        mdir = repo / "digits_pre" / "1"
        mean, std = np.load(mdir / "mean.npy"), np.load(mdir / "std.npy")
        xs = ((digits.test_images.reshape(-1, 64) - mean) / std).astype(np.float32)
        servers = [
            TritonServer(install, repo, log_path=Path(tmp) / f"triton-{i}.log")
            for i in range(a.servers)
        ]
        try:
            with ThreadPoolExecutor(a.servers) as pool:  # the starts overlap
                list(pool.map(lambda s: s.start(), servers))
            points, k = asyncio.run(measure(servers, xs, a))
        finally:
            for s in servers:
                s.kill()
    print_report(points, k, a, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
