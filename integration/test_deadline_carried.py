"""What is left of a batch's deadline goes with the backend call (issue 45 item 4), against real
servers: a query behind a busy model is answered at its deadline plus the queue's grace, not
when the model is done, and the replica counts the late call.

- Triton (2.51, Python backend): a model with a dynamic batcher whose queue policy allows the
  timeout override (Triton 2.51 applies a request's ``timeout`` only under a nonzero
  ``default_timeout_microseconds``: with 0 the request waits as long as it takes). Triton itself drops a queued request at the ``timeout`` the request carries
  (microseconds, as we encode it); through the dispatcher, a query with a short deadline queued
  behind a long batch is answered ``DeadlineExceededError`` at its deadline plus the grace and
  counted in the backend's ``late_calls``.
- The bundled runtime: the replica's gRPC call is cancelled at the deadline, counted in the
  replica's ``late_calls``; the replica keeps serving.
- TF Serving (the stand-in): the Predict call's gRPC deadline, counted the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferline.core import DeadlineExceededError, ModelConfig, ModelSpec
from inferline.queueing import Dispatcher, FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GRACE_S = 0.05
SLOW_S = 0.8  # one batch of the slow models


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton')")
    from triton_harness import SetupError, TritonServer, ensure_installed, write_sleep_model

    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root = tmp_path_factory.mktemp("triton_deadline")
    # a request's own timeout needs the override and a nonzero default (10 s)
    write_sleep_model(
        root / "models", "slow", base_s=SLOW_S, timeout_us=10_000_000, allow_timeout_override=True
    )
    server = TritonServer(install, root / "models", load=["slow"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _x(v: float) -> dict[str, tuple[np.ndarray, str]]:
    return {"x": (np.full((1, 1), v, dtype=np.float32), "FP32")}


def test_triton_drops_a_queued_request_at_the_timeout_it_carries(triton: Any) -> None:
    """Observed through Triton: the request's ``timeout`` parameter as we encode it, with a
    call deadline far away, is what ends the queued request (Triton's own answer)."""
    from inferline.adapters.triton import GrpcInfer, TritonModelMissing

    async def main() -> None:
        g = GrpcInfer(f"127.0.0.1:{triton.grpc_port}", {})
        try:
            busy = asyncio.ensure_future(g.infer("slow", _x(1.0), ["y"], "", 10.0, None))
            await asyncio.sleep(0.15)  # the first request holds the one instance
            t0 = time.monotonic()
            with pytest.raises(Exception, match=r"(?i)timeout expired"):
                await g.infer("slow", _x(2.0), ["y"], "", 10.0, 100_000)  # 100 ms
            waited = time.monotonic() - t0
            out = await busy
            assert float(out["y"].reshape(-1)[0]) == 1.0
            # dropped when the instance freed (Triton checks the queue lazily), well before
            # the call's own 10 s deadline
            assert waited < SLOW_S + 1.0, waited
            # without a timeout the same queued request is served
            busy = asyncio.ensure_future(g.infer("slow", _x(3.0), ["y"], "", 10.0, None))
            await asyncio.sleep(0.1)
            out = await g.infer("slow", _x(4.0), ["y"], "", 10.0, None)
            assert float(out["y"].reshape(-1)[0]) == 4.0
            await busy
            # Triton's "unknown model" over the raw stub is a missing model (recovery's
            # work after a restart), as it was through tritonclient
            with pytest.raises(TritonModelMissing):
                await g.infer("no_such_model", _x(0.0), ["y"], "", 10.0, None)
        finally:
            await g.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_triton_batch_call_cut_at_the_deadline_and_counted(triton: Any) -> None:
    from inferline.adapters.triton import TritonBackend

    async def main() -> None:
        b = TritonBackend(triton.grpc_url)
        d = Dispatcher(expire_grace_s=GRACE_S)
        try:
            await b.adopt("slow")
            d.add_model("slow", batching=FixedBatching(8), expire_late=True)
            d.attach(b)
            # another client holds the instance: our batch waits in Triton's queue
            busy = asyncio.ensure_future(b.client.infer("slow", _x(1.0), ["y"]))
            await asyncio.sleep(0.15)
            t0 = d.clock()
            with pytest.raises(DeadlineExceededError):
                await d.submit("slow", np.float32(2.0), deadline=t0 + 0.1)
            took = d.clock() - t0
            assert took < 0.5, took  # deadline + grace, not the rest of the busy batch (>= 0.65 s)
            assert (await b.stats("slow"))["late_calls"] == 1
            await busy
            # a query with time to spare is served by the same replica
            out = await d.submit("slow", np.float32(3.0), deadline=d.clock() + 5.0)
            assert float(np.asarray(out).reshape(-1)[0]) == 3.0
            assert (await b.stats("slow"))["late_calls"] == 1
        finally:
            await d.close()
            await b.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_local_replica_call_cancelled_at_the_deadline_and_counted() -> None:
    from types import SimpleNamespace

    from inferline.adapters.local import LocalBackend
    from inferline.server import ServiceMetrics

    async def main() -> None:
        b = LocalBackend(oversubscribe=True)
        d = Dispatcher(expire_grace_s=GRACE_S)
        try:
            spec = ModelSpec("slow", "inferline.adapters.local.examples:sleep", {"base_s": SLOW_S})
            await b.deploy(spec, ModelConfig("cpu", 4, 1))
            d.add_model("slow", batching=FixedBatching(4), expire_late=True)
            d.attach(b)
            # the server's metrics, watching this dispatcher as ``inferline serve``'s do
            metrics = ServiceMetrics(
                SimpleNamespace(models=["slow"], dispatcher=d, backend=b, cache=None)
            )
            metrics.watch(d)
            t0 = d.clock()
            with pytest.raises(DeadlineExceededError):
                await d.submit("slow", 1, deadline=t0 + 0.1)
            took = d.clock() - t0
            assert took < 0.5, took  # deadline + grace (0.15 s), not the whole batch (0.8 s)
            (rep,) = (await b.stats("slow"))["replicas"]
            assert rep["late_calls"] == 1 and rep["late_items"] == 1
            text = metrics.render().decode()
            assert 'inferline_late_calls_total{model="slow"} 1.0' in text, text
            assert 'inferline_late_items_total{model="slow"} 1.0' in text
            # the replica serves on (its next batch waits for the cut one to finish there)
            out = await d.submit("slow", 2, deadline=d.clock() + 5.0)
            assert out["x"] == 2
        finally:
            await d.close()
            await b.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_tfserving_call_cut_at_the_deadline_and_counted(tmp_path: Path) -> None:
    """TF Serving (the stand-in, or the real server on PATH): the gRPC Predict call carries
    the batch's deadline. STAND-IN ONLY: ``cost.json`` makes each run take ``SLOW_S``."""
    from tfserving_standin import TFServer, export_model

    from inferline.adapters.tfserving import ServedModel, TFServingBackend, grpc_available

    if not grpc_available():
        pytest.skip("tensorflow-serving-api not installed")
    rng = np.random.default_rng(0)
    export_model(tmp_path / "mlp", 1, [(rng.normal(size=(4, 3)), np.zeros(3))])
    (tmp_path / "mlp" / "1" / "cost.json").write_text(f'{{"base_ms": {SLOW_S * 1e3}}}')

    async def main(address: str) -> None:
        b = TFServingBackend(f"tfserving+grpc://{address}")
        d = Dispatcher(expire_grace_s=GRACE_S)
        try:
            await b.adopt("mlp")
            d.add_model("mlp", batching=FixedBatching(4), expire_late=True)
            d.attach(b)
            x = np.ones(4, dtype=np.float32)
            t0 = d.clock()
            with pytest.raises(DeadlineExceededError):
                await d.submit("mlp", x, deadline=t0 + 0.1)
            took = d.clock() - t0
            assert took < 0.5, took  # deadline + grace (0.15 s), not the whole run (0.8 s)
            assert (await b.stats("mlp"))["late_calls"] == 1
            out = await d.submit("mlp", x, deadline=d.clock() + 5.0)
            assert out is not None
        finally:
            await d.close()
            await b.close()

    with TFServer(tmp_path / "srv", [ServedModel("mlp", str(tmp_path / "mlp"))]) as s:
        asyncio.run(asyncio.wait_for(main(s.grpc), 60))
