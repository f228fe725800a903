"""A real uvicorn server on 127.0.0.1 in a thread, for the frontend tests (a uniquely named
module: several test folders have a conftest.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from inferline.server import bind_socket, serve_app


@dataclass
class Running:
    """A server started by :func:`serving`: its port, and a way to stop it (as SIGTERM does)."""

    port: int
    loop: asyncio.AbstractEventLoop
    stop_event: asyncio.Event
    thread: threading.Thread

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)


@contextmanager
def serving(app: Any, **serve_kw: Any) -> Iterator[Running]:
    """Serve ``app`` (``serve_app``'s keywords) until the block ends or ``stop()``."""
    sock = bind_socket("127.0.0.1", 0)
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve_app(app, sock, ready=ready.set, stop=stop, **serve_kw))

    # uvicorn installs signal handlers only in the main thread; here it just serves.
    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(20)
    running = Running(sock.getsockname()[1], loop, stop, t)
    try:
        yield running
    finally:
        running.stop()
        t.join(10)
        assert not t.is_alive()
        loop.close()


@contextmanager
def served(app: Any, **serve_kw: Any) -> Iterator[int]:
    """Serve ``app`` (``serve_app``'s keywords) until the block ends; yields the port."""
    with serving(app, **serve_kw) as running:
        yield running.port


@contextmanager
def serving_deployment(dep: Any, grpc_port: int | None) -> Iterator[dict[str, Any]]:
    """``inferline.deploy.serve(dep)`` on any free port (and ``grpc_port``) in a thread,
    without the tuner; yields what it reported once serving (``url``, ``grpc``, ...)."""
    from inferline.deploy import serve

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    got: dict[str, Any] = {}
    ready = threading.Event()
    failed: list[BaseException] = []

    def on_ready(info: dict[str, Any]) -> None:
        got.update(info)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(
                serve(dep, port=0, grpc_port=grpc_port, ready=on_ready, stop=stop, tuner=None)
            )
        except BaseException as e:  # reported below
            failed.append(e)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(60)
    if failed:
        raise failed[0]
    try:
        yield got
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(30)
        assert not t.is_alive()
        loop.close()
