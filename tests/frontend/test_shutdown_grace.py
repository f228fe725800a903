"""A SIGTERM does not wait without end for queries stuck on a hung backend: after the grace
period they get a 503 ``ShuttingDown`` and the server stops (uvicorn's default waited
forever; 31.5 s was measured, past Kubernetes' 30 s grace)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from _served_app import serving

from inferline.server import App, Service, create_app


async def _stuck(x, slo):
    await asyncio.sleep(120)  # a backend that never answers
    return x


def test_running_requests_get_a_503_after_the_grace_period() -> None:
    app = create_app(Service([App("stuck", _stuck, 300.0)]))
    answers: list[httpx.Response] = []
    with serving(app, shutdown_grace_s=1.0) as server:

        def ask() -> None:
            url = f"http://127.0.0.1:{server.port}/apps/stuck/predict"
            answers.append(httpx.post(url, json={"input": 1}, timeout=30))

        client = threading.Thread(target=ask)
        client.start()
        time.sleep(0.5)  # the request is running
        t0 = time.monotonic()
        server.stop()
        client.join(15)
        server.thread.join(15)
        took = time.monotonic() - t0
    assert not client.is_alive()
    (r,) = answers
    assert r.status_code == 503 and r.json()["error"] == "ShuttingDown", r.text
    assert took < 5, took
