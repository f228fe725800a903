"""Front doors under oversized requests: what one request can cost the server.

Each scenario starts a fresh server process (a pure-Python app behind the KServe v2 and TF
Serving doors, HTTP and gRPC, 1 MiB body limit), sends one request and reports its status and
time, the worst ``/healthz`` latency while it ran, and the server's RSS growth (peak RSS over
the RSS before the request):

* ``kserve-150k``: a KServe v2 JSON request of 150,000 rows (about 600 KB, under the limit);
* ``kserve-200k``: the same with 200,000 rows;
* ``tfs-grpc-huge-shape``: a 41-byte TF Serving gRPC ``Predict`` whose tensor declares
  100,000,000 floats in TF's "fill" form (one value);
* ``kserve-256``: a request at the row cap, for scale.

Reproduce: ``.venv/bin/python benchmarks/frontdoor_limits.py`` (``--only NAME`` for one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

REPRODUCE = ".venv/bin/python benchmarks/frontdoor_limits.py"


# ---------------------------------------------------------------- the server process


def _serve() -> None:
    import numpy as np

    from inferline.server import App, InputSpec, Service, bind_socket, create_app, serve_app
    from inferline.server.frontdoors import (
        FrontDoor,
        FrontDoorGrpc,
        Signature,
        TensorInfo,
        make_kserve_router,
        make_tfserving_router,
    )

    async def double(x: Any, slo: float) -> Any:
        return np.asarray(x) * 2

    svc = Service([App("m", double, 1.0, input_spec=InputSpec("float32", (1,)))])
    sig = Signature((TensorInfo("x", "float32", (1,)),), (TensorInfo("output", "float32", (1,)),))
    door = FrontDoor(svc, {"m": sig})
    app = create_app(svc, routers=[make_kserve_router(door), make_tfserving_router(door)])
    sock = bind_socket("127.0.0.1", 0)

    async def main() -> None:
        g = FrontDoorGrpc(door)
        gport = await g.start()
        print(json.dumps({"http": sock.getsockname()[1], "grpc": gport}), flush=True)
        await serve_app(app, sock)

    asyncio.run(main())


def _rss_kb(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- the client side


def _kserve_body(rows: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 1], "data": [0.5] * rows}]}
    ).encode()


def _send_kserve(port: int, rows: int) -> tuple[str, float]:
    import httpx

    body = _kserve_body(rows)
    t = time.perf_counter()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/m/infer",
            content=body,
            headers={"content-type": "application/json"},
            timeout=180,
        )
        status = str(r.status_code)
    except httpx.HTTPError as e:
        status = type(e).__name__
    return status, time.perf_counter() - t


def _send_tfs_huge(gport: int) -> tuple[str, float]:
    import grpc

    from inferline.adapters.tfserving._protos import stubs

    st = stubs()
    req = st.predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    tp = req.inputs["x"]
    tp.dtype = 1  # DT_FLOAT
    tp.tensor_shape.dim.add().size = 100_000_000
    tp.float_val.append(1.0)
    t = time.perf_counter()
    with grpc.insecure_channel(f"127.0.0.1:{gport}") as ch:
        rpc = ch.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        try:
            rpc(req, timeout=180)
            status = "OK"
        except grpc.RpcError as e:
            status = e.code().name
    return f"{status} ({req.ByteSize()} B)", time.perf_counter() - t


def _scenario(name: str) -> dict[str, Any]:
    import httpx

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ports = json.loads(proc.stdout.readline())
        port = ports["http"]
        for _ in range(50):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        rss0 = _rss_kb(proc.pid)
        peak = [rss0]
        worst = [0.0]
        done = threading.Event()

        def watch() -> None:
            with httpx.Client(timeout=180) as c:
                while not done.is_set():
                    t = time.perf_counter()
                    try:
                        c.get(f"http://127.0.0.1:{port}/healthz")
                    except httpx.HTTPError:
                        pass
                    worst[0] = max(worst[0], time.perf_counter() - t)
                    peak[0] = max(peak[0], _rss_kb(proc.pid))
                    time.sleep(0.05)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        time.sleep(0.2)
        if name == "tfs-grpc-huge-shape":
            status, took = _send_tfs_huge(ports["grpc"])
        else:
            rows = {"kserve-150k": 150_000, "kserve-200k": 200_000, "kserve-256": 256}[name]
            status, took = _send_kserve(port, rows)
        time.sleep(0.2)
        done.set()
        w.join(200)
        peak[0] = max(peak[0], _rss_kb(proc.pid, "VmHWM"))
    finally:
        proc.terminate()
        try:
            _out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
        tracebacks = err.count("Traceback")
    return {
        "scenario": name,
        "status": status,
        "time_s": round(took, 2),
        "worst_healthz_s": round(worst[0], 3),
        "rss_mb_before": round(rss0 / 1024),
        "rss_mb_growth": round((peak[0] - rss0) / 1024),
        "tracebacks_logged": tracebacks,
    }


SCENARIOS = ("kserve-256", "kserve-150k", "kserve-200k", "tfs-grpc-huge-shape")
SMOKE = ("kserve-150k", "tfs-grpc-huge-shape")  # one oversized request per protocol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=SCENARIOS, action="append")
    ap.add_argument("--smoke", action="store_true", help=f"only {', '.join(SMOKE)} (a few seconds)")
    args = ap.parse_args()
    if args.serve:
        _serve()
        return
    rows = [_scenario(s) for s in args.only or (SMOKE if args.smoke else SCENARIOS)]
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    flag = " --smoke" if args.smoke else ""
    print(
        f"\nreproduce: {REPRODUCE}{flag}   (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
