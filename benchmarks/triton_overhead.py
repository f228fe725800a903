"""Triton's own dynamic batcher vs. inferline's queue in front of Triton, side by side.

One real Triton server (2.51, from the nvidia-pytriton wheel), one model (a k-nearest-neighbour
digit classifier in the Python backend, trained at setup time), loaded twice under two names
with the same instance count and maximum batch size:

- ``triton``: Triton's dynamic batcher on; every query is its own request, sent directly with
  ``tritonclient``'s asyncio client (what a Triton user does);
- ``inferline``: Triton's batcher off; queries go through inferline's ``Dispatcher`` (EDF queue,
  greedy batches of up to the max batch size, one batch in flight per instance) and the
  ``TritonBackend`` replica handles, which send each batch as one request.

Both are driven open-loop (Poisson arrivals, seeded) at increasing rates, interleaved at each
rate so machine noise hits both alike. Latency is measured from each query's scheduled arrival
to its answer. The headline is the highest throughput each sustains with P99 at or under the
target. Where ``perf_analyzer`` (C++, from tritonclient 2.51.0) runs, its figure for the direct
case is the outside reference (its client costs far less CPU than a Python one).

    .venv/bin/python benchmarks/triton_overhead.py            # full sweep
    .venv/bin/python benchmarks/triton_overhead.py --quick    # two to three minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "integration"))

from triton_harness import SetupError, TritonServer, build_repository, ensure_installed  # noqa: E402
from triton_harness.perf_analyzer import ensure_perf_analyzer  # noqa: E402

from inferline.adapters.triton import TritonBackend  # noqa: E402
from inferline.core import InferlineError, ModelConfig, ModelSpec  # noqa: E402
from inferline.queueing import Dispatcher, FixedBatching  # noqa: E402

NATIVE, QUEUED = "knn_native", "knn_inferline"


@dataclass
class Run:
    mode: str
    rate: float
    offered: int
    completed: int
    errors: int
    late: int  # not answered within the drain limit after the run
    throughput: float
    p50_ms: float
    p99_ms: float
    mean_batch: float | None
    server_queue_ms: float | None

    def meets(self, p99_ms: float) -> bool:
        """Sustained: every query of the window answered, none failed, P99 within target."""
        return (
            self.errors == 0
            and self.late == 0
            and self.completed == self.offered
            and self.p99_ms <= p99_ms
        )


def _arrivals(rate: float, duration_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s * 1.5) + 10
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return t[t < duration_s]


def _summarize(
    mode: str,
    rate: float,
    arrivals: np.ndarray,
    latency: np.ndarray,
    failed: np.ndarray,
    warmup_s: float,
    duration_s: float,
    server: dict[str, Any],
) -> Run:
    sel = arrivals >= warmup_s
    lat = latency[sel]
    done = np.isfinite(lat)
    err = failed[sel]
    window = duration_s - warmup_s
    finite = lat.copy()
    finite[~done] = np.inf
    # "higher": no interpolation between two unanswered (infinite) latencies
    method = "linear" if done.all() else "higher"
    p99 = float(np.percentile(finite, 99, method=method)) * 1e3 if len(finite) else math.inf
    p50 = float(np.percentile(finite, 50, method=method)) * 1e3 if len(finite) else math.inf
    iv = server.get("server", {}).get("interval", {})
    return Run(
        mode=mode,
        rate=rate,
        offered=int(sel.sum()),
        completed=int(done.sum()),
        errors=int(err.sum()),
        late=int((~done & ~err).sum()),
        throughput=float(done.sum()) / window,
        p50_ms=p50,
        p99_ms=p99,
        mean_batch=iv.get("mean_batch_size"),
        server_queue_ms=iv.get("queue_ms_mean"),
    )


async def _open_loop(
    arrivals: np.ndarray, send: Any, drain_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Start ``send(i)`` at each arrival; returns the latency from the scheduled arrival (inf
    if unanswered or failed) and which queries failed with an error."""
    loop = asyncio.get_running_loop()
    latency = np.full(len(arrivals), np.inf)
    failed = np.zeros(len(arrivals), dtype=bool)
    start = loop.time() + 0.05

    async def one(i: int, t_sched: float) -> None:
        try:
            await send(i)
            latency[i] = loop.time() - t_sched
        except (InferlineError, Exception):
            failed[i] = True

    tasks = []
    for i, t in enumerate(arrivals):
        delay = start + t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, start + t)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    return latency, failed


class Bench:
    def __init__(self, args: argparse.Namespace, server: TritonServer, feats: np.ndarray) -> None:
        self.args = args
        self.server = server
        self.feats = feats.astype(np.float32)
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        self.backend = TritonBackend(url, oversubscribe=True)
        self.dispatcher = Dispatcher()
        self.direct: Any = None
        self.mod: Any = None

    async def setup(self) -> None:
        a = self.args
        cfg = ModelConfig("cpu", a.max_batch, a.instances)
        batcher = {"max_queue_delay_us": a.delay_us}
        await self.backend.deploy(
            ModelSpec("native", source=NATIVE, params={"dynamic_batching": batcher}), cfg
        )
        await self.backend.deploy(ModelSpec("queued", source=QUEUED), cfg)
        self.dispatcher.add_model("queued", batching=FixedBatching(a.max_batch))
        self.dispatcher.attach(self.backend)
        if a.protocol == "grpc":
            import tritonclient.grpc.aio as mod

            self.direct = mod.InferenceServerClient(f"127.0.0.1:{self.server.grpc_port}")
        else:
            import tritonclient.http.aio as mod

            self.direct = mod.InferenceServerClient(
                f"127.0.0.1:{self.server.http_port}", conn_limit=2000
            )
        self.mod = mod
        # warm both (the first batches of a Python-backend model are slow)
        for _ in range(3):
            await asyncio.gather(*(self._direct(i) for i in range(32)))
            await asyncio.gather(*(self._queued(i) for i in range(64)))

    async def _direct(self, i: int) -> Any:
        x = self.feats[i % len(self.feats)][None, :]
        inp = self.mod.InferInput("features", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        r = await self.direct.infer(NATIVE, [inp], outputs=[self.mod.InferRequestedOutput("label")])
        return r.as_numpy("label")

    async def _queued(self, i: int) -> Any:
        x = self.feats[i % len(self.feats)]
        return await self.dispatcher.submit(
            "queued", x, deadline=time.monotonic() + self.args.p99_ms / 1e3
        )

    async def run(self, mode: str, rate: float, seed: int) -> Run:
        a = self.args
        arrivals = _arrivals(rate, a.duration_s, seed)
        name = "native" if mode == "triton" else "queued"
        await self.backend.stats(name)  # start a statistics interval
        send = self._direct if mode == "triton" else self._queued
        latency, failed = await _open_loop(arrivals, send, drain_s=a.drain_s)
        server = dict(await self.backend.stats(name))
        return _summarize(mode, rate, arrivals, latency, failed, a.warmup_s, a.duration_s, server)

    async def close(self) -> None:
        await self.dispatcher.close()
        if self.direct is not None:
            await self.direct.close()
        await self.backend.close()


def _fmt(x: float | None, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return format(x, spec)


def _best(runs: Sequence[Run], p99_ms: float) -> Run | None:
    ok = [r for r in runs if r.meets(p99_ms)]
    return max(ok, key=lambda r: r.throughput) if ok else None


class PerfAnalyzerPoints:
    """perf_analyzer on the natively batched model, one rate at a time, or why it cannot."""

    def __init__(self, args: argparse.Namespace, server: TritonServer, workdir: Path) -> None:
        self.args = args
        self.server = server
        self.workdir = workdir
        self.rows: list[dict[str, Any]] = []
        self.pa: Any = None
        if args.no_perf_analyzer:
            self.note = "skipped (--no-perf-analyzer)"
            return
        try:
            self.pa = ensure_perf_analyzer(server.install)
            self.note = "perf_analyzer 2.51.0 (C++ client, gRPC, async, Poisson), batch 1"
        except SetupError as e:
            self.note = f"not run: {e}"

    def meets(self, row: dict[str, Any]) -> bool:
        return row["p99_ms"] <= self.args.p99_ms and row["throughput"] >= 0.95 * row["rate"]

    def point(self, rate: float) -> dict[str, Any] | None:
        if self.pa is None:
            return None
        try:
            (row,) = self.pa.run_request_rates(
                NATIVE,
                f"127.0.0.1:{self.server.grpc_port}",
                [int(rate)],
                window_ms=int((self.args.duration_s - self.args.warmup_s) * 1000),
                out_csv=self.workdir / "pa.csv",
                max_trials=3,
            )
        except Exception as e:  # report it, never hide the main result
            self.note = f"failed at {rate:.0f}/s: {e}"
            self.pa = None
            return None
        self.rows.append(row)
        return row


def _combine(runs: Sequence[Run]) -> Run:
    """Repeats of one point: medians of the latency figures, totals of the counts."""
    if len(runs) == 1:
        return runs[0]

    def med(xs: list[float]) -> float:
        return float(np.median(np.asarray(xs, dtype=float)))

    batches = [r.mean_batch for r in runs if r.mean_batch is not None]
    queues = [r.server_queue_ms for r in runs if r.server_queue_ms is not None]
    return Run(
        mode=runs[0].mode,
        rate=runs[0].rate,
        offered=sum(r.offered for r in runs),
        completed=sum(r.completed for r in runs),
        errors=sum(r.errors for r in runs),
        late=sum(r.late for r in runs),
        throughput=float(np.mean([r.throughput for r in runs])),
        p50_ms=med([r.p50_ms for r in runs]),
        p99_ms=med([r.p99_ms for r in runs]),
        mean_batch=float(np.mean(batches)) if batches else None,
        server_queue_ms=float(np.mean(queues)) if queues else None,
    )


def _combine_pa(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rate": rows[0]["rate"],
        "throughput": float(np.mean([r["throughput"] for r in rows])),
        "p50_ms": float(np.median([r["p50_ms"] for r in rows])),
        "p99_ms": float(np.median([r["p99_ms"] for r in rows])),
        "repeats": len(rows),
    }


async def sweep(
    args: argparse.Namespace, server: TritonServer, feats: np.ndarray, pa: PerfAnalyzerPoints
) -> tuple[list[Run], list[Run], list[dict[str, Any]]]:
    """(per-point results, every single run, per-point perf_analyzer rows)."""
    bench = Bench(args, server, feats)
    points: list[Run] = []
    raw: list[Run] = []
    pa_points: list[dict[str, Any]] = []
    try:
        await bench.setup()
        failing_streak = 0
        for k, rate in enumerate(args.rates):
            got: dict[str, list[Any]] = {"triton": [], "inferline": [], "perf_analyzer": []}
            for rep in range(args.repeats):
                # rotate the order so that no mode always runs first (or last)
                order = ["triton", "inferline", "perf_analyzer"]
                shift = (k + rep) % 3
                for mode in order[shift:] + order[:shift]:
                    if mode == "perf_analyzer":
                        row = await asyncio.to_thread(pa.point, rate)
                        if row is not None:
                            got[mode].append(row)
                            logging.info(
                                "%-13s %6.0f/s: thr %7.1f/s p99 %8s ms",
                                mode,
                                rate,
                                row["throughput"],
                                _fmt(row["p99_ms"]),
                            )
                        continue
                    r = await bench.run(mode, rate, seed=args.seed + 1000 * rep + k)
                    got[mode].append(r)
                    raw.append(r)
                    logging.info(
                        "%-13s %6.0f/s: thr %7.1f/s p99 %8s ms batch %s errors %d late %d",
                        mode,
                        rate,
                        r.throughput,
                        _fmt(r.p99_ms),
                        _fmt(r.mean_batch, ".2f"),
                        r.errors,
                        r.late,
                    )
                    await asyncio.sleep(0.3)
            step = [_combine(got["triton"]), _combine(got["inferline"])]
            points += step
            sustained = any(r.meets(args.p99_ms) for r in step)
            if got["perf_analyzer"]:
                row = _combine_pa(got["perf_analyzer"])
                pa_points.append(row)
                sustained |= pa.meets(row)
            failing_streak = 0 if sustained else failing_streak + 1
            if failing_streak >= args.stop_after:
                break
    finally:
        await bench.close()
    return points, raw, pa_points


def report(
    args: argparse.Namespace, runs: list[Run], pa_rows: list[dict[str, Any]], pa_note: str
) -> dict[str, Any]:
    rates = sorted({r.rate for r in runs})
    by = {(r.mode, r.rate): r for r in runs}
    pa = {row["rate"]: row for row in pa_rows}
    print()
    print(
        f"Triton native dynamic batcher vs inferline queue | model digits_knn (Python backend), "
        f"{args.instances} CPU instances, max batch {args.max_batch}, protocol {args.protocol}, "
        f"Triton batcher max_queue_delay {args.delay_us} us, P99 target {args.p99_ms:g} ms, "
        f"{args.duration_s:g} s per run ({args.warmup_s:g} s warm-up), {args.repeats} run(s) per point"
    )
    head = (
        f"{'rate/s':>7} | {'triton thr/s':>12} {'p99 ms':>8} {'batch':>6} | "
        f"{'inferline thr/s':>15} {'p99 ms':>8} {'batch':>6} | {'perf_analyzer thr/s':>19} {'p99 ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for rate in rates:
        t, q, p = by.get(("triton", rate)), by.get(("inferline", rate)), pa.get(rate)

        def cells(r: Run | None) -> tuple[str, str, str]:
            if r is None:
                return "-", "-", "-"
            mark = "" if r.meets(args.p99_ms) else "*"
            return f"{r.throughput:.1f}{mark}", _fmt(r.p99_ms), _fmt(r.mean_batch, ".2f")

        tc, qc = cells(t), cells(q)
        pc = (f"{p['throughput']:.1f}", _fmt(p["p99_ms"])) if p else ("-", "-")
        print(
            f"{rate:>7.0f} | {tc[0]:>12} {tc[1]:>8} {tc[2]:>6} | {qc[0]:>15} {qc[1]:>8} {qc[2]:>6} | "
            f"{pc[0]:>19} {pc[1]:>8}"
        )
    print("(* = not sustained: P99 over the target, or a query failed or went unanswered)")
    bt = _best([r for r in runs if r.mode == "triton"], args.p99_ms)
    bq = _best([r for r in runs if r.mode == "inferline"], args.p99_ms)
    ok_pa = [
        row
        for row in pa_rows
        if row["p99_ms"] <= args.p99_ms and row["throughput"] >= 0.95 * row["rate"]
    ]
    bp = max(ok_pa, key=lambda row: row["throughput"]) if ok_pa else None
    print()
    print(f"Highest throughput with P99 <= {args.p99_ms:g} ms:")
    print(
        f"  Triton dynamic batcher, Python client : {_fmt(bt.throughput if bt else None)}/s (P99 {_fmt(bt.p99_ms if bt else None)} ms)"
    )
    print(
        f"  inferline queue in front of Triton    : {_fmt(bq.throughput if bq else None)}/s (P99 {_fmt(bq.p99_ms if bq else None)} ms)"
    )
    print(
        "  Triton dynamic batcher, perf_analyzer : "
        + (f"{bp['throughput']:.1f}/s (P99 {bp['p99_ms']:.1f} ms)" if bp else "-")
        + f"  [{pa_note}]"
    )
    verdict = None
    if bt and bq:
        verdict = bq.throughput >= bt.throughput * 0.98  # within measurement noise of a tie
        print(
            f"  inferline / Triton (Python client) = {bq.throughput / bt.throughput:.2f} -> "
            f"target {'met' if verdict else 'NOT met'}"
        )
    if bp and bq:
        print(f"  inferline / Triton (perf_analyzer)   = {bq.throughput / bp['throughput']:.2f}")
    print("  highest rate tried:", f"{max(rates):.0f}/s" if rates else "-")
    print()
    print(
        "reproduce:",
        shlex.join([".venv/bin/python", "benchmarks/triton_overhead.py", *sys.argv[1:]]),
    )
    return {
        "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "runs": [asdict(r) for r in runs],
        "perf_analyzer": {"rows": pa_rows, "note": pa_note},
        "best": {
            "triton": asdict(bt) if bt else None,
            "inferline": asdict(bq) if bq else None,
            "perf_analyzer": bp,
        },
        "inferline_at_least_triton": verdict,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rates, shorter points")
    p.add_argument(
        "--protocol",
        choices=("grpc", "http"),
        default="grpc",
        help="protocol of both paths to Triton (default %(default)s)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=2,
        help="CPU instances of the model under each name (default %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="largest batch size of both batchers (default %(default)s)",
    )
    p.add_argument("--delay-us", type=int, default=0, help="Triton batcher max_queue_delay")
    p.add_argument(
        "--p99-ms",
        type=float,
        default=50.0,
        help="P99 latency target, ms; also the queued queries' deadline (default %(default)s)",
    )
    p.add_argument("--rates", type=str, default=None, help="comma-separated queries/s")
    p.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="length of each run, seconds (default 8; 3 with --quick)",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="first seconds of each run left out of the figures (default 1; 0.5 with --quick)",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=5.0,
        help="wait this long, seconds, for answers after the last arrival; later ones count as late (default %(default)s)",
    )
    p.add_argument(
        "--stop-after", type=int, default=None, help="stop after N rates where both miss"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="base seed of the Poisson arrivals (default %(default)s)",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs per point; the table shows median P99s"
    )
    p.add_argument(
        "--no-perf-analyzer", action="store_true", help="skip the perf_analyzer reference points"
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.rates:
        args.rates = tuple(float(r) for r in args.rates.split(","))
    elif args.quick:
        args.rates = (250.0, 500.0, 1000.0, 1600.0, 2400.0, 3200.0, 4200.0)
    else:
        args.rates = (100.0, 200.0, 400.0, 700.0, 1000.0, 1400.0, 2000.0, 2800.0, 4000.0, 5600.0)
    args.duration_s = args.duration_s or (3.0 if args.quick else 8.0)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (0.5 if args.quick else 1.0)
    args.stop_after = args.stop_after or (1 if args.quick else 2)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("inferline").setLevel(logging.WARNING)
    try:
        install = ensure_installed()
    except SetupError as e:
        print(f"cannot run: no Triton server: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="inferline-triton-bench-") as tmp:
        work = Path(tmp)
        digits = build_repository(
            work / "models", aliases={NATIVE: "digits_knn", QUEUED: "digits_knn"}
        )
        mdir = work / "models" / "digits_pre" / "1"
        mean, std = np.load(mdir / "mean.npy"), np.load(mdir / "std.npy")
        feats = (digits.test_images.reshape(-1, 64) - mean) / std
        server = TritonServer(install, work / "models")
        server.start()
        try:
            pa = PerfAnalyzerPoints(args, server, work)
            runs, raw, pa_points = asyncio.run(sweep(args, server, feats, pa))
        finally:
            server.stop()
        result = report(args, runs, pa_points, pa.note)
        result["single_runs"] = [asdict(r) for r in raw]
        result["perf_analyzer"]["single_runs"] = pa.rows
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
