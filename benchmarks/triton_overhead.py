"""Triton's own dynamic batcher vs. inferline's KServe door in front of the same Triton, under the
same client: NVIDIA's perf_analyzer (2.51, C++), open-loop Poisson load, rates up to saturation.

One real Triton server (2.51, from the nvidia-pytriton wheel), one model (a k-nearest-neighbour
digit classifier in the Python backend, trained at setup time), loaded twice under two names
with the same instance count and maximum batch size:

- ``triton``: ``knn_native``, Triton's dynamic batcher on; perf_analyzer sends to Triton directly;
- ``inferline``: ``knn_inferline``, Triton's batcher off; an ``inferline attach triton://...``
  server process adopts it (inferline's queue batching, one batch in flight per instance) and
  perf_analyzer sends to that process's KServe v2 door, over HTTP and gRPC.

At each rate the sides alternate (order rotated), so that noise from other work on the machine
hits both alike. Each point is perf_analyzer's average over three measurement windows. The
headline, per protocol, is the highest throughput each side sustains with P99 at or under the
target (``--p99-ms``) and at least 90% of the offered rate answered (perf_analyzer itself sends
~5% under the asked rate); and their ratio. The CPU
columns (per answered request, from /proc) say where the time goes.

    .venv/bin/python benchmarks/triton_overhead.py            # full sweep
    .venv/bin/python benchmarks/triton_overhead.py --quick    # about three minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "integration"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _triton_pa import (  # noqa: E402
    RAY_SERVE_PY,
    DoorProcess,
    Point,
    RayServeProcess,
    Target,
    run_point,
)
from triton_harness import SetupError, TritonServer, build_repository, ensure_installed  # noqa: E402
from triton_harness.perf_analyzer import ensure_perf_analyzer  # noqa: E402

NATIVE, QUEUED = "knn_native", "knn_inferline"
SIDES = ("triton", "inferline")
RAY = "ray-serve"  # the peer column: HTTP only (a FastAPI ingress speaks no gRPC)
PEER_FACTOR = 4.0  # issue 44: the door at least 4x the Ray Serve ingress's throughput
log = logging.getLogger("triton_overhead")


def deploy_models(server: TritonServer, args: argparse.Namespace) -> None:
    """Both names with the same instance count and max batch size; Triton's dynamic batcher
    on ``knn_native`` only. The backend leaves them loaded when it closes."""
    from inferline.adapters.triton import TritonBackend
    from inferline.core import ModelConfig, ModelSpec

    async def main() -> None:
        b = TritonBackend(server.http_url, oversubscribe=True)
        try:
            cfg = ModelConfig("cpu", args.max_batch, args.instances)
            batcher = {"max_queue_delay_us": args.delay_us}
            await b.deploy(
                ModelSpec("native", source=NATIVE, params={"dynamic_batching": batcher}), cfg
            )
            await b.deploy(ModelSpec("queued", source=QUEUED), cfg)
        finally:
            await b.close()

    asyncio.run(main())


def best(points: Sequence[Point], side: str, protocol: str, p99_ms: float) -> Point | None:
    ok = [p for p in points if p.side == side and p.protocol == protocol and p.meets(p99_ms)]
    return max(ok, key=lambda p: p.throughput) if ok else None


def sweep(args: argparse.Namespace, pa: Any, targets: dict[str, Target], work: Path) -> list[Point]:
    """Every (rate, protocol, side) until each side has missed ``stop_after`` rates in a row."""
    window = int(args.window_ms)
    sides = tuple(targets)
    for side in sides:  # warm-up, not recorded (the first batches of a Python model are slow)
        for proto in args.protocols:
            if proto in targets[side].addresses:
                run_point(pa, targets[side], proto, args.rates[0], 500, work)
    points: list[Point] = []
    # a side without the protocol (Ray Serve over gRPC) starts as saturated: never run
    misses = {
        (s, p): 0 if p in targets[s].addresses else args.stop_after
        for s in sides
        for p in args.protocols
    }
    for k, rate in enumerate(args.rates):
        for j, proto in enumerate(args.protocols):
            order = sides if (k + j) % 2 == 0 else sides[::-1]
            for side in order:
                if misses[side, proto] >= args.stop_after:
                    continue  # saturated: higher rates only pile up its queue
                p = run_point(pa, targets[side], proto, rate, window, work)
                points.append(p)
                misses[side, proto] = 0 if p.meets(args.p99_ms) else misses[side, proto] + 1
                log.info(
                    "%6.0f/s %-4s %-9s thr %7.1f/s p50 %7s p99 %8s ms  cpu/req door %s triton %s%s",
                    rate,
                    proto,
                    side,
                    p.throughput,
                    _fmt(p.p50_ms),
                    _fmt(p.p99_ms),
                    _fmt(p.door_cpu_ms, ".2f"),
                    _fmt(p.triton_cpu_ms, ".2f"),
                    f"  ({p.error})" if p.error else "",
                )
        if all(m >= args.stop_after for m in misses.values()):
            break
    return points


def _fmt(x: float | None, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return format(x, spec)


def _cells(p: Point | None, p99_ms: float) -> list[str]:
    if p is None:
        return ["-"] * 5
    mark = "" if p.meets(p99_ms) else "*"
    cpu = p.triton_cpu_ms if p.door_cpu_ms is None else p.door_cpu_ms + (p.triton_cpu_ms or 0)
    return [f"{p.throughput:.1f}{mark}", _fmt(p.p50_ms), _fmt(p.p99_ms), _fmt(cpu, ".2f"), ""]


def headline(args: argparse.Namespace, points: Sequence[Point]) -> dict[str, Any]:
    """Per protocol: each side's best sustained point, their ratio, and which side was still
    sustaining at the highest rate tried (not driven to saturation)."""
    out: dict[str, Any] = {}
    for proto in args.protocols:
        bt = best(points, "triton", proto, args.p99_ms)
        bq = best(points, "inferline", proto, args.p99_ms)
        br = best(points, RAY, proto, args.p99_ms)
        ratio = bq.throughput / bt.throughput if bt and bq else None
        top = max((p.rate for p in points if p.protocol == proto), default=0.0)
        ran_ray = any(p.side == RAY and p.protocol == proto for p in points)
        vs_ray = bq.throughput / br.throughput if bq and br else None
        if bq and ran_ray and br is None:
            vs_ray = math.inf  # the ingress sustained no rate tried at all
        out[proto] = {
            "unsaturated": [b.side for b in (bt, bq, br) if b is not None and b.rate >= top],
            "triton": bt.to_dict() if bt else None,
            "inferline": bq.to_dict() if bq else None,
            "ratio": ratio,
            "target_met": None if ratio is None else ratio >= 0.7,  # issue 44: 0.7x Triton
            "ray_serve": br.to_dict() if br else None,
            "vs_ray_serve": vs_ray if ran_ray else None,
            "vs_ray_serve_met": None if not ran_ray or vs_ray is None else vs_ray >= PEER_FACTOR,
        }
    return out


def print_table(args: argparse.Namespace, points: Sequence[Point], proto: str) -> None:
    by = {(p.side, p.rate): p for p in points if p.protocol == proto}
    ray = any(side == RAY for side, _ in by)
    head = (
        f"{proto:>4} rate/s | {'triton thr/s':>12} {'p50':>6} {'p99 ms':>8} {'cpu ms':>6} | "
        f"{'inferline thr/s':>15} {'p50':>6} {'p99 ms':>8} {'cpu ms':>6} {'(door)':>6}"
        + (f" | {'ray-serve thr/s':>15} {'p50':>6} {'p99 ms':>8} {'cpu ms':>6}" if ray else "")
    )
    print()
    print(head)
    print("-" * len(head))
    for rate in sorted({rate for _, rate in by}):
        t = _cells(by.get(("triton", rate)), args.p99_ms)
        q = by.get(("inferline", rate))
        c = _cells(q, args.p99_ms)
        door = _fmt(q.door_cpu_ms, ".2f") if q else "-"
        r = _cells(by.get((RAY, rate)), args.p99_ms)
        print(
            f"{rate:>11.0f} | {t[0]:>12} {t[1]:>6} {t[2]:>8} {t[3]:>6} | "
            f"{c[0]:>15} {c[1]:>6} {c[2]:>8} {c[3]:>6} {door:>6}"
            + (f" | {r[0]:>15} {r[1]:>6} {r[2]:>8} {r[3]:>6}" if ray else "")
        )


def _say(p: dict[str, Any] | None) -> str:
    return f"{p['throughput']:.1f}/s (P99 {p['p99_ms']:.1f} ms)" if p else "none"


def print_headline(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    print(f"Highest throughput with P99 <= {args.p99_ms:g} ms (same perf_analyzer client):")
    for proto, s in summary.items():
        verdict = "-"
        if s["ratio"] is not None:
            met = "met" if s["target_met"] else "NOT met"
            verdict = f"{s['ratio']:.2f}x -> target 0.7x {met}"
        if s["unsaturated"]:
            verdict += f" (not saturated at the highest rate tried: {', '.join(s['unsaturated'])})"
        print(
            f"  {proto:>4}: Triton direct {_say(s['triton'])}, inferline door "
            f"{_say(s['inferline'])}; inferline/Triton = {verdict}"
        )
        if s.get("vs_ray_serve") is not None:
            met = "met" if s["vs_ray_serve_met"] else "NOT met"
            x = s["vs_ray_serve"]
            ratio = f"{x:.1f}x" if math.isfinite(x) else "unbounded (it sustained no rate tried)"
            print(
                f"        Ray Serve ingress {_say(s['ray_serve'])}; inferline/Ray Serve = "
                f"{ratio} -> target {PEER_FACTOR:.0f}x {met}"
            )


def report(args: argparse.Namespace, points: list[Point], door_info: dict[str, Any]) -> dict:
    print()
    print(
        f"perf_analyzer 2.51 (C++, async, Poisson, batch 1) -> Triton direct vs inferline's KServe "
        f"door | model digits_knn (Python backend), {args.instances} CPU instances, max batch "
        f"{args.max_batch} (inferline queue {args.door_max_batch}, door -> Triton over "
        f"{args.door_to_triton}), Triton batcher max_queue_delay {args.delay_us} us, P99 target "
        f"{args.p99_ms:g} ms, 3 x {args.window_ms} ms windows per point. Shared 2-core machine: "
        "other work ran alongside."
        + (
            f" Ray Serve column: Ray Serve 2.60, a FastAPI ingress forwarding each request to "
            f"{NATIVE} over HTTP (aiohttp), HTTP only; its cpu ms counts all Ray's processes."
            if args.ray_serve
            else ""
        )
    )
    for proto in args.protocols:
        print_table(args, points, proto)
    print("(* = not sustained: P99 over target, under 90% of the rate answered, or an error;")
    print(" cpu ms = CPU per answered request, Triton's processes plus, for inferline, the door's)")
    print()
    summary = headline(args, points)
    print_headline(args, summary)
    print()
    print(
        "reproduce:",
        shlex.join([".venv/bin/python", "benchmarks/triton_overhead.py", *sys.argv[1:]]),
    )
    return {
        "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()},
        "door": door_info,
        "points": [p.to_dict() for p in points],
        "headline": summary,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rates, shorter windows")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="seconds of load: HTTP only (unless --protocols), one rate (100/s), 500 ms windows",
    )
    p.add_argument(
        "--protocols",
        default=None,
        help="comma-separated: http, grpc (default http,grpc; --smoke: http)",
    )
    p.add_argument("--instances", type=int, default=2, help="CPU instances under each name")
    p.add_argument("--max-batch", type=int, default=32, help="both models' max batch size")
    p.add_argument(
        "--door-max-batch",
        type=int,
        default=None,
        help="inferline queue's batch size (default: --max-batch)",
    )
    p.add_argument(
        "--door-to-triton",
        choices=("http", "grpc"),
        default="grpc",
        help="protocol of the door process's own requests to Triton (default %(default)s)",
    )
    p.add_argument("--delay-us", type=int, default=0, help="Triton batcher max_queue_delay")
    p.add_argument(
        "--p99-ms",
        type=float,
        default=50.0,
        help="P99 target, ms; also the door's SLO (default %(default)s)",
    )
    p.add_argument("--rates", default=None, help="comma-separated requests/s")
    p.add_argument("--window-ms", type=int, default=None, help="perf_analyzer window (x3)")
    p.add_argument("--stop-after", type=int, default=None, help="a side stops after N misses")
    p.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of the model processes (0: library default; default %(default)s)",
    )
    p.add_argument(
        "--door-workers",
        type=int,
        default=0,
        help="the door's HTTP worker processes (inferline attach --door-workers; default 0: "
        "one process; their CPU is counted as the door's)",
    )
    p.add_argument(
        "--ray-serve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the Ray Serve column (a FastAPI ingress forwarding to the same Triton, in "
        ".cache/ray-serve-venv; HTTP only); default on when that venv exists, off with --smoke",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.ray_serve is None:
        args.ray_serve = RAY_SERVE_PY.exists() and not args.smoke
    elif args.ray_serve and not RAY_SERVE_PY.exists():
        p.error(f"--ray-serve: needs {RAY_SERVE_PY} (`make .venv/.installed-test` makes it)")
    if args.protocols is None:
        args.protocols = "http" if args.smoke else "http,grpc"
    args.protocols = tuple(x for x in args.protocols.split(",") if x)
    if not args.protocols or set(args.protocols) - {"http", "grpc"}:
        p.error(f"--protocols: expected http and/or grpc, got {args.protocols}")
    if args.rates:
        args.rates = tuple(float(r) for r in args.rates.split(","))
    elif args.smoke:
        args.rates = (100.0,)
    elif args.quick:
        args.rates = (100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0)
    else:
        args.rates = tuple(
            float(r) for r in (50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200, 4800)
        )
    args.window_ms = args.window_ms or (500 if args.smoke else 1000 if args.quick else 2000)
    args.stop_after = args.stop_after or 2
    args.door_max_batch = args.door_max_batch or args.max_batch
    return args


def start_door(server: TritonServer, args: argparse.Namespace, work: Path) -> DoorProcess:
    door = DoorProcess(
        server.grpc_url if args.door_to_triton == "grpc" else server.http_url,
        QUEUED,
        max_batch=args.door_max_batch,
        replicas=args.instances,
        slo_ms=args.p99_ms,
        workdir=work,
        door_workers=args.door_workers,
    )
    info = door.start()
    log.info("inferline attach pid %d: HTTP %s, gRPC %s", door.pid, info["url"], info["grpc"])
    return door


def make_targets(
    server: TritonServer, door: DoorProcess, ray: RayServeProcess | None = None
) -> dict[str, Target]:
    host, info = "127.0.0.1", door.info
    direct = {"http": f"{host}:{server.http_port}", "grpc": f"{host}:{server.grpc_port}"}
    via = {"http": info["url"].split("//")[1], "grpc": info["grpc"]}
    pgid = server.pid or 0  # the harness starts Triton as its own process group's leader
    targets = {
        "triton": Target("triton", NATIVE, direct, f"http://{direct['http']}", pgid, None),
        "inferline": Target("inferline", QUEUED, via, info["url"], pgid, door.pid),
    }
    if ray is not None:  # forwards to the natively batched model, as a user's ingress would
        http = {"http": ray.address}
        targets[RAY] = Target(RAY, NATIVE, http, f"http://{ray.address}", pgid, ray.pid)
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.blas_threads > 0:
        # set before Triton starts (its Python-backend stubs inherit it): idle OpenBLAS threads
        # spin after each matrix product and take a 2-core machine's CPU from both sides
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.blas_threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        install = ensure_installed()
        pa = ensure_perf_analyzer(install)
    except SetupError as e:
        print(f"cannot run: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="inferline-triton-bench-") as tmp:
        work = Path(tmp)
        build_repository(work / "models", aliases={NATIVE: "digits_knn", QUEUED: "digits_knn"})
        server = TritonServer(install, work / "models")
        server.start()
        door = ray = None
        try:
            deploy_models(server, args)
            door = start_door(server, args, work)
            if args.ray_serve and "http" in args.protocols:
                ray = RayServeProcess(f"http://127.0.0.1:{server.http_port}", NATIVE, work)
                log.info("Ray Serve ingress on %s", ray.start())
            points = sweep(args, pa, make_targets(server, door, ray), work)
        finally:
            if ray is not None:
                ray.stop()
            if door is not None:
                door.stop()
            server.stop()
        result = report(args, points, {"command": door.cmd[2:], **door.info})
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
