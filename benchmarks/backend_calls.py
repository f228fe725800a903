"""Client CPU and round trip of one backend inference call, before and after issue 44 item 2
(requests written straight to grpcio's aio stubs, channels reused, one RPC per batch).

- Triton (real server from ``integration/triton_harness``, an identity Python-backend model,
  FP32 [64] in and out): *before* is the call the replica made until now (tritonclient's
  gRPC aio client: ``InferInput.set_data_from_numpy``, ``infer`` under ``asyncio.wait_for``,
  ``InferResult.as_numpy``); *after* is ``GrpcInfer`` (the model's constant request part
  serialized once, raw tensor bytes, one ``grpc.aio`` channel).
- TF Serving (``integration/tfserving_standin``, or the real server on PATH): *before* builds
  each ``TensorProto`` apart and copies it into the request, with a new stub per call;
  *after* is ``TFServingClient.predict`` (tensors written in place, stubs kept per channel).

One client call at a time (concurrency 1), both variants interleaved in rounds on the same
server. CPU is this process's CPU time (``time.process_time``: the event loop and grpc's own
threads) per call; the server runs in another process and is not counted. Reproduce:
``.venv/bin/python benchmarks/backend_calls.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

DIM = 64
_MODEL = """
import os, sys
_site = os.environ.get("INFERLINE_TRITON_SITE")
if _site and _site not in sys.path:
    sys.path.insert(0, _site)
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
            )
            for r in requests
        ]
"""
_CONFIG = f"""name: "ident"
backend: "python"
max_batch_size: 8
input [ {{ name: "x", data_type: TYPE_FP32, dims: [{DIM}] }} ]
output [ {{ name: "y", data_type: TYPE_FP32, dims: [{DIM}] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

Call = Callable[[np.ndarray], Awaitable[Any]]


async def _measure(calls: dict[str, Call], sizes: list[int], n: int, rounds: int) -> list[tuple]:
    """Per (variant, batch): median and P99 round trip (ms) and client CPU per call (ms),
    the variants interleaved in ``rounds`` blocks of ``n // rounds`` calls."""
    rng = np.random.default_rng(0)
    rows = []
    for b in sizes:
        x = rng.random((b, DIM), dtype=np.float32)
        lat: dict[str, list[float]] = {k: [] for k in calls}
        cpu: dict[str, float] = dict.fromkeys(calls, 0.0)
        for call in calls.values():  # warm: channels up, model loaded
            for _ in range(20):
                await call(x)
        for _ in range(rounds):
            for name, call in calls.items():
                c0 = time.process_time()
                for _ in range(n // rounds):
                    t0 = time.perf_counter()
                    await call(x)
                    lat[name].append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
        for name in calls:
            v = np.asarray(lat[name]) * 1e3
            per = cpu[name] / len(v) * 1e3
            rows.append((name, b, float(np.median(v)), float(np.percentile(v, 99)), per))
    return rows


async def _triton(address: str, sizes: list[int], n: int, rounds: int) -> list[tuple]:
    import tritonclient.grpc.aio as tg

    from inferline.adapters.triton import GrpcInfer

    old = tg.InferenceServerClient(address)
    new = GrpcInfer(address, {})

    async def before(x: np.ndarray) -> Any:
        i = tg.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = await asyncio.wait_for(
            old.infer("ident", [i], model_version="", outputs=[tg.InferRequestedOutput("y")]),
            60.0,
        )
        return r.as_numpy("y")

    async def after(x: np.ndarray) -> Any:
        return (await new.infer("ident", {"x": (x, "FP32")}, ["y"], "", 60.0, None))["y"]

    try:
        np.testing.assert_array_equal(await before(np.ones((2, DIM), np.float32)), 1.0)
        np.testing.assert_array_equal(await after(np.ones((2, DIM), np.float32)), 1.0)
        return await _measure({"before": before, "after": after}, sizes, n, rounds)
    finally:
        await old.close()
        await new.close()


def triton_rows(sizes: list[int], n: int, rounds: int) -> list[tuple]:
    from triton_harness import TritonServer, ensure_installed

    with tempfile.TemporaryDirectory() as d:
        mdir = Path(d) / "models" / "ident"
        (mdir / "1").mkdir(parents=True)
        (mdir / "1" / "model.py").write_text(_MODEL)
        (mdir / "config.pbtxt").write_text(_CONFIG)
        with TritonServer(ensure_installed(), Path(d) / "models", load=["ident"]) as s:
            return asyncio.run(_triton(f"127.0.0.1:{s.grpc_port}", sizes, n, rounds))


async def _tfserving(address: str, sizes: list[int], n: int, rounds: int) -> list[tuple]:
    from inferline.adapters.tfserving import TFServingClient
    from inferline.adapters.tfserving._protos import from_tensor_proto, stubs, to_tensor_proto

    st = stubs()
    client = TFServingClient(None, address, "grpc")

    async def before(x: np.ndarray) -> Any:  # the request as built until now
        req = st.predict_pb2.PredictRequest()
        req.model_spec.name = "mlp"
        req.model_spec.signature_name = "serving_default"
        req.inputs["x"].CopyFrom(to_tensor_proto(x, st))
        stub = st.prediction_service_pb2_grpc.PredictionServiceStub(client._grpc_channel())
        resp = await stub.Predict(req, timeout=60.0)
        return {k: from_tensor_proto(tp) for k, tp in resp.outputs.items()}

    async def after(x: np.ndarray) -> Any:
        return await client.predict("mlp", {"x": x}, timeout_s=60.0)

    try:
        return await _measure({"before": before, "after": after}, sizes, n, rounds)
    finally:
        await client.close()


def tfserving_rows(sizes: list[int], n: int, rounds: int) -> tuple[str, list[tuple]]:
    from tfserving_standin import TFServer, export_model, server_kind

    from inferline.adapters.tfserving import ServedModel, grpc_available

    if not grpc_available():
        return "no tensorflow-serving-api", []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        layers = [
            (rng.normal(size=(DIM, 32)), np.zeros(32)),
            (rng.normal(size=(32, 10)), np.zeros(10)),
        ]
        export_model(Path(d) / "mlp", 1, layers)
        with TFServer(Path(d) / "srv", [ServedModel("mlp", str(Path(d) / "mlp"))]) as s:
            return server_kind(), asyncio.run(_tfserving(s.grpc, sizes, n, rounds))


def _table(title: str, rows: list[tuple]) -> None:
    print(title)
    print(f"{'variant':<8}{'batch':>6}{'p50 ms':>9}{'p99 ms':>9}{'client CPU ms/call':>20}")
    for name, b, p50, p99, cpu in rows:
        print(f"{name:<8}{b:>6}{p50:>9.3f}{p99:>9.3f}{cpu:>20.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="600 calls per point instead of 3000")
    ap.add_argument("--smoke", action="store_true", help="100 calls per point, one round")
    ap.add_argument("--no-tfserving", action="store_true", help="Triton only")
    args = ap.parse_args()
    n, rounds, sizes = (3000, 5, [1, 8])
    if args.quick or args.smoke:
        n, rounds = (100, 1) if args.smoke else (600, 3)
    _table(
        f"Triton gRPC ModelInfer, identity FP32[{DIM}] ({n} calls per point)",
        triton_rows(sizes, n, rounds),
    )
    if not args.no_tfserving:
        kind, rows = tfserving_rows(sizes, n, rounds)
        print()
        _table(f"TF Serving gRPC Predict, {kind} ({n} calls per point)", rows)
    print(
        "reproduce: .venv/bin/python benchmarks/backend_calls.py"
        + (" --smoke" if args.smoke else " --quick" if args.quick else "")
        + (" --no-tfserving" if args.no_tfserving else "")
    )


if __name__ == "__main__":
    main()
