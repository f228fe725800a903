"""The Triton row of ``benchmarks/admission.py``: the same model in real Triton (2.51, Python
backend, 10 ms per batch plus 1 ms per item, one instance, dynamic batching up to 8) with
``default_queue_policy`` ``REJECT`` at the SLO, driven by the same Poisson load over gRPC
(tritonclient's asyncio client, one request per query). Triton checks a request's timeout
lazily (when a batch is formed; Triton #7512), so its refusals come at the timeout, not at
arrival. Skipped, with the reason printed, where no Triton server can be had."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


async def _drive(url: str, row: Any, rate: float, seconds: float, slo_s: float) -> None:
    from tritonclient.grpc.aio import InferenceServerClient, InferInput

    client = InferenceServerClient(url)
    rng = np.random.default_rng(45)
    n = int(rate * seconds * 1.2) + 10
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    times = times[times < seconds]

    async def one(i: int) -> None:
        x = InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.full((1, 1), float(i), dtype=np.float32))
        t = time.perf_counter()
        try:
            await client.infer("sleep", [x], client_timeout=10 * slo_s)
        except Exception as e:  # REJECT: "Request timeout expired" (UNAVAILABLE)
            if "timeout" in str(e).lower():
                row.refused.append(time.perf_counter() - t)
            else:
                row.errors += 1
            return
        row.ok.append(time.perf_counter() - t)

    try:
        for k in range(20):  # warm: the first batches of a Python model are slow
            await one(-k)
        row.ok.clear()
        row.refused.clear()
        row.errors = 0
        tasks = []
        t0 = time.perf_counter()
        i = 0
        while i < len(times):
            now = time.perf_counter() - t0
            while i < len(times) and times[i] <= now:
                tasks.append(asyncio.ensure_future(one(i)))
                i += 1
            if i < len(times):
                await asyncio.sleep(max(0.0, times[i] - (time.perf_counter() - t0)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    row.offered_qps = len(times) / seconds
    row.seconds = seconds


def triton_rows(
    factors: list[float], seconds: float, capacity_qps: float, slo_s: float, make_row: Any
) -> tuple[list[Any], str]:
    """One row per load factor, and "" (or why no rows: no Triton here)."""
    sys.path.insert(0, str(REPO / "integration"))
    try:
        from triton_harness import SetupError, TritonServer, ensure_installed, write_sleep_model

        install = ensure_installed()
    except (ImportError, SetupError) as e:
        return [], f"not run: no Triton server available ({e})"
    rows = []
    with tempfile.TemporaryDirectory(prefix="inferline-admission-triton-") as tmp:
        # the bundled sleep model's cost: 10 ms per batch plus 1 ms per item
        write_sleep_model(
            Path(tmp, "models"),
            "sleep",
            base_s=0.010,
            per_item_s=0.001,
            timeout_us=int(slo_s * 1e6),
        )
        server = TritonServer(install, Path(tmp, "models"), load=["sleep"])
        server.start()
        try:
            url = f"127.0.0.1:{server.grpc_port}"
            for f in factors:
                row = make_row("triton REJECT", f)
                asyncio.run(_drive(url, row, f * capacity_qps, seconds, slo_s))
                rows.append(row)
                time.sleep(0.3)  # let the backlog drain between rates
        finally:
            server.stop()
    return rows, ""
