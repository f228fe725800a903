"""Scale-out on Ray: the per-batch cost of the Ray hop next to ``local://``'s gRPC hop, and the
throughput and P99 of a CPU-bound pipeline as nodes are added.

What is measured:

* **Hop overhead.** ``predict_batch`` on one replica of the ``noop`` container (returns its
  inputs, so the same bytes travel back) through ``local://`` (a replica process over gRPC on
  127.0.0.1) and through ``ray://`` (an actor on a node of the cluster), in the same process,
  interleaved in rounds: the median of every timed call, for float32 vectors of 8 values at
  batch sizes 1 and 8 (``--quick``: 1 only) and, without ``--quick``, 224x224x3 images.
  Target: the Ray hop costs at most 1.5x the gRPC hop.
* **Scale-out.** A one-stage CPU-bound pipeline (``sleep`` with ``spin=True``: 4 ms of CPU per
  query, batches of up to 4) served through ``PipelineRunner`` + ``Dispatcher`` from ``n``
  replicas spread over ``n`` one-CPU nodes, for ``n`` = 1 .. ``--max-nodes``, under a closed
  loop of ``8 n`` clients for ``--seconds``: completed queries per second, P99 latency, and
  the throughput as a fraction of ``n`` times the one-node throughput (target: >= 0.8).

Without ``--address`` the cluster is started on this machine (``ray.cluster_utils``: a head and
``max_nodes - 1`` workers, one CPU each, loopback only), so ``--max-nodes`` defaults to the
cores this process may use: past that the "nodes" share cores and cannot scale. With
``--address HOST:PORT`` an existing cluster is used (one replica per node as placed by
``spread``). Run: ``.venv/bin/python benchmarks/ray_scaleout.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from inferline.core import ModelConfig, ModelSpec

EX = "inferline.adapters.local.examples"
SPIN_S = 0.004  # CPU seconds per query of the pipeline's model
BATCH = 4
# batch sizes of the --crossover sweep (bytes): where Ray's object store overtakes the port
CROSSOVER_BYTES = tuple(sorted({1 << k for k in range(10, 25)} | {3 << 17, 3 << 18, 3 << 19}))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# -- hop overhead ----------------------------------------------------------------------------


class _Path:
    """One way to send a batch: a handle, and for ``ray://`` the data path it is held to."""

    def __init__(self, handle: Any, min_bytes: int | None = None) -> None:
        self.handle = handle
        self.min_bytes = min_bytes

    async def __call__(self, batch: list[Any]) -> None:
        if self.min_bytes is not None:  # the same replica, held to one path
            self.handle.object_store_min_bytes = self.min_bytes
        await self.handle.predict_batch(batch)


async def _interleaved(paths: dict[str, _Path], batch: list[Any], rounds: int) -> dict[str, float]:
    """The median ms of each path, timed in turns (``rounds`` x 40 calls each)."""
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, send in paths.items():
            for _ in range(5):  # warm this path up again after the other ones
                await send(batch)
            for _ in range(40):
                t = time.perf_counter()
                await send(batch)
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


async def hop_overhead(
    ray_url: str,
    payloads: list[tuple[str, np.ndarray]],
    batches: tuple[int, ...],
    rounds: int,
    crossover: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """Rows of median ms per batch: ``local_ms`` (``local://``), ``ray_ms`` (``ray://`` as
    configured: the gRPC port below ``object_store_min_bytes``), ``store_ms`` (the same actor
    held to Ray's object store, the path every batch took before the direct path). With
    ``crossover`` (sizes in bytes), also rows ``payload="crossover"`` of one random float32
    vector of each size: ``grpc_ms`` (held to the port) and ``store_ms``."""
    from inferline.adapters.local import LocalBackend
    from inferline.adapters.ray import RayBackend

    local = LocalBackend(oversubscribe=True)
    ray_b = RayBackend(ray_url)
    spec = ModelSpec("noop", f"{EX}:noop")
    rows: list[dict[str, Any]] = []
    try:
        await local.deploy(spec, ModelConfig("cpu", max(batches), 1))
        await ray_b.deploy(spec, ModelConfig("cpu", max(batches), 1))
        r = ray_b.replicas("noop")[0]
        default = r.object_store_min_bytes  # type: ignore[attr-defined]
        paths = {
            "local": _Path(local.replicas("noop")[0]),
            "ray": _Path(r, default),
            "store": _Path(r, 0),
        }
        for label, x in payloads:
            for b in batches:
                ms = await _interleaved(paths, [x] * b, rounds)
                rows.append(
                    {"payload": label, "batch": b, "local_ms": ms["local"], "ray_ms": ms["ray"]}
                    | {"store_ms": ms["store"]}
                )
        held = {"grpc": _Path(r, 1 << 62), "store": _Path(r, 0)}
        rng = np.random.default_rng(1)
        for size in crossover:  # random values: zeros would be served from the zero page
            x = rng.random(max(1, size // 4), dtype=np.float32)
            ms = await _interleaved(held, [x], rounds)
            rows.append(
                {"payload": "crossover", "bytes": size} | {f"{k}_ms": v for k, v in ms.items()}
            )
        r.object_store_min_bytes = default  # type: ignore[attr-defined]
    finally:
        await local.close()
        await ray_b.close()
    return rows


# -- scale-out -------------------------------------------------------------------------------


async def _closed_loop(runner: Any, clients: int, seconds: float) -> tuple[int, list[float]]:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    stop = loop.time() + seconds

    async def client(i: int) -> None:
        while loop.time() < stop:
            t = loop.time()
            await runner.run(i)
            latencies.append(loop.time() - t)

    t0 = loop.time()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = loop.time() - t0
    return round(len(latencies) / elapsed), latencies


async def scale_out(ray_url: str, max_nodes: int, seconds: float) -> list[dict[str, Any]]:
    from inferline.adapters.ray import RayBackend
    from inferline.queueing import Dispatcher, FixedBatching, PipelineRunner

    b = RayBackend(ray_url)
    d = Dispatcher()
    rows: list[dict[str, Any]] = []
    spec = ModelSpec("spin", f"{EX}:sleep", {"base_s": 0.0, "per_item_s": SPIN_S, "spin": True})

    async def pipeline(x: Any, ctx: Any) -> Any:
        return await ctx.predict("spin", x)

    try:
        await b.deploy(spec, ModelConfig("cpu", BATCH, 1))
        d.add_model("spin", batching=FixedBatching(BATCH), max_queue=100_000)
        d.attach(b)
        runner = PipelineRunner(d, pipeline, slo_s=60.0)
        for n in range(1, max_nodes + 1):
            await b.scale("spin", n)
            while len(b.replicas("spin")) < n:
                await asyncio.sleep(0.05)
            nodes = (await b.stats("spin"))["nodes"]
            await _closed_loop(runner, 8 * n, min(1.0, seconds / 2))  # warm-up
            qps, lat = await _closed_loop(runner, 8 * n, seconds)
            rows.append(
                {
                    "nodes": len(nodes),
                    "replicas": n,
                    "qps": qps,
                    "p99_ms": float(np.percentile(lat, 99)) * 1e3,
                }
            )
    finally:
        await d.close()
        await b.close()
    base = rows[0]["qps"] if rows else 0
    for r in rows:
        r["vs_linear"] = r["qps"] / (r["replicas"] * base) if base else 0.0
    return rows


# -- driver ----------------------------------------------------------------------------------


def _local_cluster(nodes: int) -> Any:
    # Loopback only: Ray reads this when it is imported and when its processes start.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray import cluster_utils

    c = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(nodes - 1):
        c.add_node(num_cpus=1)
    return c


def print_tables(
    hops: list[dict[str, Any]], scale: list[dict[str, Any]], seconds: float, ray_version: str
) -> None:
    print(
        f"{platform.processor() or platform.machine()}, {_cores()} cores, Python "
        f"{sys.version.split()[0]}, Ray {ray_version}"
    )
    print("\nper-batch round trip, noop container (median ms); target ray/local <= 1.5x")
    print(
        f"{'payload':>12} {'batch':>5} {'local:// gRPC':>14} {'ray:// actor':>13} {'ratio':>6} "
        f"{'ray:// object store':>20} {'ratio':>6}"
    )
    for r in hops:
        if r["payload"] == "crossover":
            continue
        print(
            f"{r['payload']:>12} {r['batch']:>5} {r['local_ms']:>14.3f} {r['ray_ms']:>13.3f} "
            f"{r['ray_ms'] / r['local_ms']:>5.2f}x {r['store_ms']:>20.3f} "
            f"{r['store_ms'] / r['local_ms']:>5.2f}x"
        )
    cross = [r for r in hops if r["payload"] == "crossover"]
    if cross:
        print("\nray:// data path by batch size, one float32 vector (median ms)")
        print(f"{'bytes':>9} {'gRPC port':>10} {'object store':>13} {'store/gRPC':>11}")
        for r in cross:
            print(
                f"{r['bytes']:>9} {r['grpc_ms']:>10.3f} {r['store_ms']:>13.3f} "
                f"{r['store_ms'] / r['grpc_ms']:>10.2f}x"
            )
    if not scale:
        return
    print(
        f"\nCPU-bound pipeline ({SPIN_S * 1e3:g} ms CPU per query, batch {BATCH}, closed loop "
        f"of 8 clients per replica, {seconds:g} s); target >= 0.80 of linear"
    )
    print(f"{'nodes':>5} {'replicas':>8} {'queries/s':>10} {'P99 ms':>8} {'vs linear':>10}")
    for r in scale:
        print(
            f"{r['nodes']:>5} {r['replicas']:>8} {r['qps']:>10} {r['p99_ms']:>8.1f} "
            f"{r['vs_linear']:>10.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 1 only, 1..2 nodes, 2 s each")
    ap.add_argument(
        "--smoke", action="store_true", help="--quick with 0.5 s per node count, one round"
    )
    ap.add_argument(
        "--max-nodes",
        type=int,
        default=None,
        help="largest node count (default: this process's cores; --quick: at most 2)",
    )
    ap.add_argument("--seconds", type=float, default=None, help="load per node count (default 5)")
    ap.add_argument(
        "--address",
        default=None,
        help="an existing cluster's GCS address HOST:PORT (default: start one on this machine)",
    )
    ap.add_argument(
        "--crossover",
        action="store_true",
        help="also time ray://'s gRPC port against its object store from 1 KiB to 16 MiB",
    )
    ap.add_argument("--hops-only", action="store_true", help="skip the scale-out part")
    args = ap.parse_args(argv)
    args.quick |= args.smoke
    max_nodes = args.max_nodes or (min(2, _cores()) if args.quick else _cores())
    seconds = args.seconds or (0.5 if args.smoke else 2.0 if args.quick else 5.0)
    batches = (1,) if args.quick else (1, 8)
    rng = np.random.default_rng(0)
    payloads = [("float32[8]", rng.random(8, dtype=np.float32))]
    if not args.quick:
        payloads.append(("224x224x3", rng.random((224, 224, 3), dtype=np.float32)))
    rounds = 1 if args.smoke else 3 if args.quick else 8

    cluster = None if args.address else _local_cluster(max_nodes)
    url = f"ray://{args.address or cluster.address}"  # type: ignore[union-attr]
    try:
        cross = CROSSOVER_BYTES if args.crossover else ()
        hops = asyncio.run(hop_overhead(url, payloads, batches, rounds, cross))
        scale = [] if args.hops_only else asyncio.run(scale_out(url, max_nodes, seconds))
    finally:
        if cluster is not None:
            cluster.shutdown()

    import ray

    print_tables(hops, scale, seconds, ray.__version__)
    cmd = "reproduce: .venv/bin/python benchmarks/ray_scaleout.py" + (
        " --smoke" if args.smoke else " --quick" if args.quick else ""
    )
    cmd += " --crossover" * args.crossover + " --hops-only" * args.hops_only
    if args.max_nodes:
        cmd += f" --max-nodes {args.max_nodes}"
    if args.seconds:
        cmd += f" --seconds {args.seconds:g}"
    if args.address:
        cmd += f" --address {args.address}"
    print(cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
