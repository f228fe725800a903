"""A SIGTERM does not wait without end for queries stuck on a hung backend: after the grace
period they get a 503 ``ShuttingDown`` and the server stops (uvicorn's default waited
forever; 31.5 s was measured, past Kubernetes' 30 s grace)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from inferline._app import bind_socket, create_app, serve_app
from inferline._service import App, Service


async def _stuck(x, slo):
    await asyncio.sleep(120)  # a backend that never answers
    return x


def test_running_requests_get_a_503_after_the_grace_period() -> None:
    app = create_app(Service([App("stuck", _stuck, 300.0)]))
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(
            serve_app(app, sock, ready=ready.set, stop=stop, shutdown_grace_s=1.0)
        )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(20)
    answers: list[httpx.Response] = []

    def ask() -> None:
        answers.append(
            httpx.post(f"http://127.0.0.1:{port}/apps/stuck/predict", json={"input": 1}, timeout=30)
        )

    client = threading.Thread(target=ask)
    client.start()
    time.sleep(0.5)  # the request is running
    t0 = time.monotonic()
    loop.call_soon_threadsafe(stop.set)
    client.join(15)
    t.join(15)
    took = time.monotonic() - t0
    loop.close()
    assert not t.is_alive() and not client.is_alive()
    (r,) = answers
    assert r.status_code == 503 and r.json()["error"] == "ShuttingDown", r.text
    assert took < 5, took
