"""Round-trip time of one preformed batch through the TF Serving adapter, REST vs gRPC.

Runs against the real ``tensorflow_model_server`` when one is on PATH (or
``$TENSORFLOW_MODEL_SERVER``), else the STAND-IN of ``integration/tfserving_standin`` (the
table says which). The model is a 64-32-10 dense digits classifier; the figure is the median
and P99 of ``ReplicaHandle.predict_batch`` (what inferline's queue sees as a replica's busy
time). Reproduce: ``.venv/bin/python benchmarks/tfserving_adapter.py [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from tfserving_standin import TFServer, export_model, server_kind

from inferline.adapters.tfserving import ServedModel, TFServingBackend, grpc_available


async def measure(url: str, sizes: list[int], reps: int) -> dict[int, tuple[float, float]]:
    b = TFServingBackend(url)
    try:
        await b.adopt("mlp")
        h = b.replicas("mlp")[0]
        rng = np.random.default_rng(0)
        out = {}
        for n in sizes:
            xs = list(rng.random((n, 64), dtype=np.float32))
            for _ in range(3):
                await h.predict_batch(xs)
            lat = []
            for _ in range(reps):
                t0 = time.perf_counter()
                await h.predict_batch(xs)
                lat.append(time.perf_counter() - t0)
            out[n] = (float(np.median(lat)), float(np.percentile(lat, 99)))
        return out
    finally:
        await b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="30 batches per point instead of 200")
    ap.add_argument("--smoke", action="store_true", help="the same as --quick (a few seconds)")
    args = ap.parse_args()
    args.quick |= args.smoke
    reps = 30 if args.quick else 200
    sizes = [1, 8, 32]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        layers = [
            (rng.normal(size=(64, 32)), np.zeros(32)),
            (rng.normal(size=(32, 10)), np.zeros(10)),
        ]
        export_model(Path(d) / "mlp", 1, layers)
        with TFServer(Path(d) / "srv", [ServedModel("mlp", str(Path(d) / "mlp"))]) as s:
            rows = {"rest": asyncio.run(measure(f"tfserving://{s.rest}", sizes, reps))}
            if grpc_available():
                rows["grpc"] = asyncio.run(measure(f"tfserving+grpc://{s.grpc}", sizes, reps))
    print(f"TF Serving adapter, server: {server_kind()} ({reps} batches per point)")
    print(f"{'protocol':<9}" + "".join(f"{f'batch {n} p50/p99 ms':>26}" for n in sizes))
    for proto, res in rows.items():
        print(
            f"{proto:<9}"
            + "".join(f"{res[n][0] * 1e3:>15.2f} / {res[n][1] * 1e3:>7.2f}" for n in sizes)
        )
    print(
        "reproduce: .venv/bin/python benchmarks/tfserving_adapter.py"
        + (" --smoke" if args.smoke else " --quick" if args.quick else "")
    )


if __name__ == "__main__":
    main()
