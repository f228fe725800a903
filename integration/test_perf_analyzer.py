"""NVIDIA's ``perf_analyzer`` (2.51, from the ``tritonclient==2.51.0`` wheel, through the Triton
test harness) against inferline's own KServe v2 door, over HTTP and gRPC.

perf_analyzer reads the model-configuration extension (``/v2/models/{m}/config``, gRPC
``ModelConfig``) before it sends load and the statistics extension (``/stats``,
``ModelStatistics``) for its server-side columns; without them it stops at "failed to get
model config". The app is pure Python, so nothing but perf_analyzer has to be fetched; the
test skips, naming it, only when the harness cannot provide it (no network, not Linux).
"""

from __future__ import annotations

import asyncio
import csv
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton') not installed")

from triton_harness import SetupError, ensure_installed
from triton_harness.perf_analyzer import PerfAnalyzer, ensure_perf_analyzer

from inferline.server import App, InputSpec, Service, bind_socket, create_app, serve_app
from inferline.server.frontdoors import FrontDoor, FrontDoorGrpc, make_kserve_router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WIDTH = 8


async def double(x: Any, slo: float) -> Any:
    return np.asarray(x, dtype=np.float32) * 2


@dataclass
class Served:
    http_port: int
    grpc_port: int
    door: FrontDoor


@pytest.fixture(scope="module")
def perf_analyzer() -> PerfAnalyzer:
    try:
        return ensure_perf_analyzer(ensure_installed())
    except SetupError as e:
        pytest.skip(f"no perf_analyzer {e}")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """A pure-Python app behind the KServe HTTP routes and the gRPC door, in a thread."""
    svc = Service([App("dbl", double, 1.0, input_spec=InputSpec("float32", (None,)))])
    door = FrontDoor(svc, max_rows=64)
    app = create_app(svc, routers=[make_kserve_router(door)])
    sock = bind_socket("127.0.0.1", 0)
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ports: dict[str, int] = {}

    async def main() -> None:
        g = FrontDoorGrpc(door, protocols=("kserve",))
        ports["grpc"] = await g.start()
        try:
            await serve_app(app, sock, ready=ready.set, stop=stop)
        finally:
            await g.stop()

    t = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    t.start()
    assert ready.wait(20)
    try:
        yield Served(sock.getsockname()[1], ports["grpc"], door)
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(10)
        loop.close()


def test_config_and_stats_routes(served: Served) -> None:
    base = f"http://127.0.0.1:{served.http_port}"
    cfg = httpx.get(f"{base}/v2/models/dbl/config").json()
    assert cfg["max_batch_size"] == 64
    assert cfg["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [-1]}]
    assert cfg["output"][0]["data_type"] == "TYPE_FP32"
    assert httpx.get(f"{base}/v2/models/nope/config").status_code == 400
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "data": [0] * 6}]}
    assert httpx.post(f"{base}/v2/models/dbl/infer", json=body).status_code == 200
    (st,) = httpx.get(f"{base}/v2/models/dbl/stats").json()["model_stats"]
    assert st["name"] == "dbl" and st["inference_stats"]["success"]["count"] >= 1
    assert st["inference_stats"]["success"]["ns"] > 0 and st["inference_count"] >= 2
    assert "model_configuration" in httpx.get(f"{base}/v2").json()["extensions"]


def test_grpc_model_config_and_statistics(served: Served) -> None:
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(f"127.0.0.1:{served.grpc_port}")
    cfg = c.get_model_config("dbl", as_json=True)["config"]
    assert cfg["max_batch_size"] == 64
    assert cfg["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": ["-1"]}]
    st = c.get_inference_statistics("", as_json=True)["model_stats"]
    assert [m["name"] for m in st] == ["dbl"] and st[0]["version"] == "1"
    c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_against_the_kserve_door(
    perf_analyzer: PerfAnalyzer, served: Served, protocol: str, tmp_path: Path
) -> None:
    port = served.http_port if protocol == "http" else served.grpc_port
    out = tmp_path / "out.csv"
    before = served.door.stats.get("dbl")
    count0 = before.success_count if before else 0
    cmd = [
        str(perf_analyzer.binary),
        "-m",
        "dbl",
        "-u",
        f"127.0.0.1:{port}",
        "-i",
        protocol,
        "--shape",
        f"input:{WIDTH}",
        "--concurrency-range=2:2:1",
        "--measurement-interval=500",
        "--stability-percentage=999",  # a shared noisy machine never looks "stable"
        "--max-trials=3",
        "--input-data=random",
        "-f",
        str(out),
    ]
    proc = subprocess.run(
        cmd, env=perf_analyzer.env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and float(rows[0]["Inferences/Second"]) > 0, rows
    print(f"perf_analyzer {protocol}: {rows[0]['Inferences/Second']} infer/s")
    # the door counted perf_analyzer's requests (what its server-side columns read)
    assert served.door.stats["dbl"].success_count > count0
