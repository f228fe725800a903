"""``inferline.attach`` on a running Triton (the real server from the nvidia-pytriton wheel,
started by the Triton engineer's harness): discover, adopt, profile through the live server,
then serve through inferline's queue and answer an unchanged tritonclient (KServe v2) pointed
at inferline."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from triton_harness import SetupError, TritonServer, build_repository, ensure_installed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Any]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root: Path = tmp_path_factory.mktemp("attach-triton")
    digits = build_repository(root / "models")
    server = TritonServer(install, root / "models", load=["digits_pre"])
    server.start()
    try:
        yield server, digits
    finally:
        server.stop()


def test_attach_to_triton_and_serve_a_triton_client(triton: tuple[TritonServer, Any]) -> None:
    import tritonclient.http as httpclient

    import inferline
    from inferline.measure import ProfilerOptions

    server, digits = triton
    x = np.asarray(digits.test_images[:4], dtype=np.float32)

    async def main() -> None:
        att = await inferline.attach(server.http_url, models=["digits_pre"])
        assert att.found["digits_pre"]["state"] == "READY"
        sig = att.signatures["digits_pre"]
        opts = ProfilerOptions(
            max_batch_size=4,
            warmup=1,
            min_samples=4,
            max_samples=6,
            max_seconds_per_point=0.3,
            wake_idle_s=(0.01, 0.05),
            wake_samples=3,
        )
        prof = await inferline.profile_attachment(att, options=opts, samples=8)
        assert set(prof.profiles.models) == {"digits_pre"}
        (hw,) = prof.profiles.models["digits_pre"]
        assert prof.profiles.wake("digits_pre", hw).idle_s == (0.01, 0.05)  # Triton's too
        svc, door = await inferline.start_attachment_service(att, slo_s=1.0)
        stop = asyncio.Event()
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            inferline.serve_attachment(
                svc, door, port=0, grpc_port=None, stop=stop, ready=ready.set_result
            )
        )
        info = await ready
        try:
            direct = httpclient.InferenceServerClient(server.http_url.split("://")[1])
            via = httpclient.InferenceServerClient(info["url"].removeprefix("http://"))
            name = sig.inputs[0].name
            results = []
            for c in (direct, via):
                inp = httpclient.InferInput(name, list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                results.append(await asyncio.to_thread(c.infer, "digits_pre", [inp]))
            out = sig.outputs[0].name
            np.testing.assert_allclose(
                results[1].as_numpy(out), results[0].as_numpy(out), rtol=1e-5
            )
            direct.close()
            via.close()
            st = svc.dispatcher.stats("digits_pre")
            assert st.completed >= 4
            # PUT /admin/plan on an attach server moves the attached model in place (it was
            # a 422 "expected a service started from a deployment")
            import httpx

            plan = {
                "format": "inferline.plan/1",
                "pipeline": "attached",
                "slo_s": 1.0,
                "percentile": 99,
                "cost_per_hour": 0.0,
                "estimated_latency_s": 0.1,
                "strategy": "inferline",
                "models": {"digits_pre": {"hardware": "cpu", "max_batch_size": 2, "replicas": 2}},
            }
            async with httpx.AsyncClient(base_url=info["url"], timeout=60) as c:
                r = await c.put("/admin/plan", json=plan)
                assert r.status_code == 200, r.text
                assert "2 replicas" in r.json()["applied"]["digits_pre"]
                assert len(svc.backend.replicas("digits_pre")) == 2
                assert (await c.get("/admin/plan")).json()["models"]["digits_pre"]["replicas"] == 2
                # a batch the server's model does not take in one request: its configuration
                # follows (before, the queue's batch was split into several Triton requests)
                before = (await svc.backend.client.model_config("digits_pre"))["max_batch_size"]
                plan["models"]["digits_pre"] = {
                    "hardware": "cpu",
                    "max_batch_size": before * 2,
                    "replicas": 1,
                }
                r = await c.put("/admin/plan", json=plan)
                assert r.status_code == 200, r.text
                assert f"-> {before * 2}" in r.json()["applied"]["digits_pre"], r.text
                cfg = await svc.backend.client.model_config("digits_pre")
                assert cfg["max_batch_size"] == before * 2
                assert len(svc.backend.replicas("digits_pre")) == 1
        finally:
            stop.set()
            await task
            await svc.close()

    asyncio.run(main())
