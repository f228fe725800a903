"""Running the HTTP app: a listening socket, uvicorn on the running loop (uvloop), graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI

from inferline.core import ValidationError


def bind_socket(
    host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False, listen: bool = True
) -> Any:
    """A listening TCP socket (``port=0``: a free port; read it from ``getsockname()``).
    ``reuse_port``: ``SO_REUSEPORT``, so that door worker processes bind the same port (the
    kernel spreads connections over the listening ones); ``listen=False``: bound only (the
    queue process holds the port that way while its workers accept: a socket that does not
    listen gets no connections)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections whose
    # protocol says TCP; with 0 every response waited ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:  # in use, not an address of this machine, privileged port
        sock.close()
        raise ValidationError(
            "--host/--port", "an address this server can listen on", f"{host}:{port} ({e.strerror})"
        ) from None
    if listen:
        sock.listen(2048)
    # Not inheritable (Python's default, said here because it matters): uvloop's subprocess
    # spawn keeps inheritable fds open, and replicas holding the listening socket kept the
    # port accepting connections that nobody would answer after the server stopped.
    sock.set_inheritable(False)
    return sock


__all__ = ["bind_socket", "run_loop", "run_server", "serve_app"]

# Headers, then body, each within this (408 otherwise): slow-loris clients hold no socket.
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_SHUTDOWN_GRACE_S = 20.0  # leaves time to stop replicas within Kubernetes' 30 s


def _server_class() -> type:
    import uvicorn

    class _GracefulServer(uvicorn.Server):  # type: ignore[misc]
        """uvicorn's server, except that a SIGTERM it has shut down for gracefully is not
        raised again afterwards: the process then exits 0, as Triton and TF Serving do, where
        uvicorn's re-raise killed it by the signal (status -15 / 143, which Kubernetes and
        Docker report as an error). A SIGINT ends in KeyboardInterrupt (status 130), raised
        by ``serve_app`` once the server is down rather than re-raised as a signal: asyncio's
        own SIGINT handler, back in place by then, only cancels the main task, and a task
        that finished before the cancel reached an ``await`` exited 0 (seen once in a few
        runs of the attach SIGINT test).
        """

        interrupted = False

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    # read by uvicorn's capture_signals after this block (uvicorn >= 0.29)
                    caught = getattr(self, "_captured_signals", None)
                    if isinstance(caught, list):
                        self.interrupted = signal.SIGINT in caught
                        caught[:] = [s for s in caught if s not in (signal.SIGTERM, signal.SIGINT)]

    return _GracefulServer


async def serve_app(
    app: FastAPI | Any,
    sock: Any,
    *,
    log_level: str = "warning",
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
    door_workers: int = 0,
) -> None:
    """Serve ``app`` with uvicorn on ``sock`` in the running event loop until SIGINT/SIGTERM
    (main thread) or until ``stop`` is set. ``ready()`` is called once it accepts connections.
    ``read_timeout_s``: how long a request may take to send its headers, and its body (408).
    ``shutdown_grace_s``: how long a SIGTERM waits for running requests; those still running
    then get a 503 ``ShuttingDown``, and the replicas are stopped. ``door_workers``: that
    many door worker processes accept on ``sock``'s port instead (``_workers``; ``sock``
    bound with ``reuse_port=True, listen=False``) and this process runs the queue.
    """
    if door_workers:
        from inferline.server._workers import serve_with_workers

        await serve_with_workers(
            app,
            sock,
            door_workers,
            log_level=log_level,
            ready=ready,
            stop=stop,
            read_timeout_s=read_timeout_s,
            shutdown_grace_s=shutdown_grace_s,
        )
        return
    import uvicorn

    from inferline.server._http_timeouts import timed_http_protocol

    config = uvicorn.Config(
        app,
        http=timed_http_protocol(read_timeout_s),
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=30,
        # uvicorn waits for running requests without end by default: with queries stuck on a
        # hung backend a SIGTERM took 31.5 s, past Kubernetes' 30 s grace (then SIGKILL, and
        # the replicas were never stopped)
        timeout_graceful_shutdown=shutdown_grace_s,
        backlog=2048,
        lifespan="on",
        # Behind no proxy by default (binds 127.0.0.1); skipping these saves per-request work.
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    server = _server_class()(config)

    async def notify() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.01)
        if server.started and ready is not None:
            ready()

    async def stopper() -> None:
        assert stop is not None
        await stop.wait()
        server.should_exit = True

    tasks = [asyncio.ensure_future(notify())]
    if stop is not None:
        tasks.append(asyncio.ensure_future(stopper()))
    try:
        await server.serve(sockets=[sock])
    finally:
        for t in tasks:
            t.cancel()
    if getattr(server, "interrupted", False):
        raise KeyboardInterrupt


def run_server(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "warning",
    ready: Callable[[int], None] | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> None:
    """Serve ``app`` on a fresh event loop (uvloop when installed) until interrupted.

    ``port=0`` picks a free port; ``ready(port)`` is called once the socket listens.
    """
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    run_loop(
        serve_app(
            app,
            sock,
            log_level=log_level,
            ready=None if ready is None else lambda: ready(bound),
            read_timeout_s=read_timeout_s,
        )
    )


def run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)
