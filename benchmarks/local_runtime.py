"""Measures the bundled runtime: activation delay, RPC round trip, failure detection.

    .venv/bin/python benchmarks/local_runtime.py [--quick | --smoke]

Prints one table. Round trips are client-side (``predict_batch`` on the handle, through gRPC to
the replica process and back), with the replica's own service time alongside, so the
difference is the runtime's per-batch overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from typing import Any

import numpy as np

from inferline.adapters.local import LocalBackend
from inferline.core import ModelConfig, ModelSpec, ReplicaError

EX = "inferline.adapters.local.examples"


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


async def _activation(b: LocalBackend, source: str, params: dict[str, Any], n: int) -> list[float]:
    out = []
    for i in range(n):
        name = f"act{i}-{source.rsplit(':', 1)[1]}"
        await b.deploy(ModelSpec(name, source, params), ModelConfig("cpu", 1, 1))
        st = await b.stats(name)
        out.append(st["replicas"][0]["activation_delay_s"])
        await b.remove(name)
    return out


async def _round_trip(b: LocalBackend, inputs: list[Any], n: int) -> tuple[list[float], float]:
    (r,) = b.replicas("noop")
    for _ in range(min(20, n)):  # warm up the channel
        await r.predict_batch(inputs)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        await r.predict_batch(inputs)
        lat.append(time.perf_counter() - t0)
    after = await b.stats("noop")
    svc = after["replicas"][0]["service_mean_s"] or 0.0
    return lat, svc


async def _failure(b: LocalBackend) -> tuple[float, float]:
    await b.deploy(ModelSpec("slow", f"{EX}:sleep", {"base_s": 10.0}), ModelConfig("cpu", 1, 1))
    (r,) = b.replicas("slow")
    call = asyncio.create_task(r.predict_batch([0]))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    os.kill(r.pid, signal.SIGKILL)
    try:
        await call
    except ReplicaError:
        pass
    detect = time.monotonic() - t0
    while not b.replicas("slow"):
        await asyncio.sleep(0.005)
    back = time.monotonic() - t0
    await b.remove("slow")
    return detect, back


async def main_async(quick: bool, smoke: bool = False) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    n_act = 1 if smoke else 2 if quick else 5
    n_rt = 40 if smoke else 200 if quick else 2000
    b = LocalBackend(oversubscribe=True)
    try:
        act = await _activation(b, f"{EX}:noop", {}, n_act)
        rows.append(
            ("activation delay, noop container (spawn -> first healthy ping)",
             f"mean {statistics.mean(act) * 1e3:.0f} ms, max {max(act) * 1e3:.0f} ms (n={n_act})")
        )  # fmt: skip
        act = await _activation(b, f"{EX}:probe", {"import_torch": True}, max(1, n_act // 2))
        rows.append(
            ("activation delay, container importing torch",
             f"mean {statistics.mean(act) * 1e3:.0f} ms (n={len(act)})")
        )  # fmt: skip
        await b.deploy(ModelSpec("noop", f"{EX}:noop"), ModelConfig("cpu", 1, 1))
        cases = [
            ("batch of 1 int", [1]),
            ("batch of 32 float32[8,8]", [np.ones((8, 8), np.float32)] * 32),
            ("batch of 1 float32[224,224,3] (602 KB)", [np.ones((224, 224, 3), np.float32)]),
            ("batch of 8 float32[224,224,3] (4.8 MB)", [np.ones((224, 224, 3), np.float32)] * 8),
        ]
        for label, inputs in cases:
            n = n_rt if len(inputs) < 8 or inputs[0].size < 1000 else max(20, n_rt // 20)
            lat, svc = await _round_trip(b, inputs, n)
            rows.append(
                (f"round trip, {label}",
                 f"p50 {_pct(lat, 50) * 1e3:.2f} ms, p99 {_pct(lat, 99) * 1e3:.2f} ms "
                 f"(replica service {svc * 1e3:.3f} ms, n={n})")
            )  # fmt: skip
        await b.remove("noop")
        detect, back = await _failure(b)
        rows.append(("kill -9 during a batch -> ReplicaError", f"{detect * 1e3:.0f} ms"))
        rows.append(("kill -9 -> replacement active", f"{back * 1e3:.0f} ms"))
    finally:
        await b.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--smoke", action="store_true", help="fewest samples (seconds)")
    args = ap.parse_args(argv)
    rows = asyncio.run(main_async(args.quick, args.smoke))
    width = max(len(k) for k, _ in rows)
    print(
        f"bundled runtime (local://), {len(os.sched_getaffinity(0))} cores, python {sys.version.split()[0]}"
    )
    print(f"{'measure':<{width}}  value")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    flag = " --smoke" if args.smoke else " --quick" if args.quick else ""
    print(f"reproduce: .venv/bin/python benchmarks/local_runtime.py{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
