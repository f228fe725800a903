"""Door worker processes (``inferline serve --door-workers N``): more cores for the HTTP and
gRPC doors without a second queue.

The queue process (this one) keeps the service, the EDF queue and the replicas; it holds the
port bound (``SO_REUSEPORT``, not listening) and starts N workers
(``inferline.server._door_worker``), each listening on the port with its own socket. A worker
parses, guards, decodes and encodes; it hands KServe v2 tensors and the native predict
route's checked inputs (``answer_native``: the queue part only; a worker's rules checked
against the app's now) and every other request, whole (TF Serving's by the same answer
functions as ``PredictRoute``, the rest by the app) to this process over a Unix socket in a private directory, in batched length-prefixed
frames (``_frames``), and gets the outputs back the same way. The gRPC port, when served,
goes to the workers too: the gRPC door here stops listening and holds the port
(``FrontDoorGrpc.hand_over``); a worker's decoded ``ModelInfer`` and its other RPCs are
answered here by ``GrpcRelay``.

Lifecycle: the workers start with the server (it is ready once all of them listen) and stop
with it: SIGTERM/SIGINT (or ``stop``) sends them SIGTERM, their running requests finish
within the grace period while this process still answers them, then the app's lifespan
shutdown closes the service. A worker that dies is reported (an error in the log) and
restarted; the queries it had in flight here are cancelled (its clients' connections died
with it). A worker whose queue process dies answers its waiting requests 503 and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from inferline.core import InferlineError
from inferline.server._frames import FrameChannel, pack_tensors, unpack_tensors
from inferline.server._predict import AppRules, PredictRequest, handle_predict, run_predict
from inferline.server._predict_route import predict_app_name
from inferline.server._replies import INTERNAL_ERROR
from inferline.server.frontdoors import GrpcRelay, InferFastPath, grpc_door_of, kserve_error

__all__ = ["DoorWorkerError", "DoorWorkers", "serve_with_workers"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
_MAX_BACKOFF_S = 10.0


class DoorWorkerError(InferlineError):
    """The door workers (or the app they serve) could not start."""


class Lifespan:
    """The ASGI lifespan of ``app`` (what uvicorn runs around serving): startup, shutdown."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.state: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None

    async def _next(self) -> dict[str, Any]:
        assert self.task is not None
        get = asyncio.ensure_future(self.outbox.get())
        await asyncio.wait([get, self.task], return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        self.task.result()  # raises what the app raised
        raise DoorWorkerError("the app's lifespan ended without an answer")

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        self.task = asyncio.ensure_future(self.app(scope, self.inbox.get, self.outbox.put))
        await self.inbox.put({"type": "lifespan.startup"})
        msg = await self._next()
        if msg["type"] != "lifespan.startup.complete":
            raise DoorWorkerError(f"the app failed to start: {msg.get('message', '')}")

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await self._next()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self.task, 5.0)


class _Peer:
    """One worker's connection: its requests run as tasks, cancelled if it goes away."""

    def __init__(self, pool: DoorWorkers) -> None:
        self.pool = pool
        self.index = -1
        self.tasks: set[asyncio.Task[None]] = set()
        self.channel = FrameChannel(self.on_frame, self.on_close)

    def on_frame(self, header: dict[str, Any], payload: memoryview) -> None:
        kind = header.get("k")
        if kind == "kserve":
            self._spawn(self.pool.answer_kserve(header, payload))
        elif kind == "native":
            self._spawn(self.pool.answer_native(header, payload))
        elif kind == "invalid":  # a native request the worker refused: counted as here
            self.pool.invalid(str(header.get("app", "")))
        elif kind == "post":
            self._spawn(self.pool.answer_post(header, payload))
        elif kind == "asgi":
            self._spawn(self.pool.answer_asgi(header, payload))
        elif kind == "grpc_infer" and self.pool.relay is not None:
            self._spawn(self.pool.relay.answer_infer(header, payload))
        elif kind == "rpc" and self.pool.relay is not None:
            self._spawn(self.pool.relay.answer_rpc(header, payload))
        elif kind == "overloaded" and self.pool.relay is not None:
            self.pool.relay.overloaded(header)
        elif kind == "hello":
            self.index = int(header["worker"])
            config = {**self.pool.config, "apps": self.pool.app_rules()}
            self.channel.send({"k": "config", "config": config})
        elif kind == "ready":
            self.pool.listening(self.index)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(self._reply(coro))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reply(self, coro: Any) -> None:
        header, payload = await coro
        if not self.channel.closed:
            self.channel.send(header, payload)

    def on_close(self, exc: Exception | None) -> None:
        for t in list(self.tasks):
            t.cancel()  # the queue skips a cancelled query's future


class DoorWorkers:
    """``n`` door worker processes for ``app`` on ``sock``'s port; ``start``, then ``stop``."""

    def __init__(
        self,
        app: Any,
        sock: Any,
        n: int,
        *,
        log_level: str,
        read_timeout_s: float,
        shutdown_grace_s: float,
        state: dict[str, Any] | None = None,
    ) -> None:
        door = getattr(app.state, "door", None) if hasattr(app, "state") else None
        if door is None:
            raise DoorWorkerError("door workers need an app made by create_app")
        self.app = app
        self.n = n
        self.grace_s = shutdown_grace_s
        self.state = state if state is not None else {}
        host, port = sock.getsockname()[:2]
        self.service = app.state.service
        self.fast_paths = tuple(door["fast_paths"])
        infer = [f for f in self.fast_paths if isinstance(f, InferFastPath)]
        self.kserve = infer[0].routes if infer else None
        self.config = {
            "host": host,
            "port": port,
            "token": door["token"],
            "max_body_bytes": door["max_body_bytes"],
            "allowed_hosts": door["allowed_hosts"],
            "max_rows": self.kserve.door.max_rows if self.kserve is not None else 1,
            "kserve": self.kserve is not None,
            "read_timeout_s": read_timeout_s,
            "shutdown_grace_s": shutdown_grace_s,
            "log_level": log_level,
            "grpc": None,  # FrontDoorGrpc.worker_config's, once the port is handed over
        }
        front = grpc_door_of(self.service)
        self.relay = GrpcRelay(front) if front is not None else None
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.ready: dict[int, asyncio.Event] = {}
        self.restarts = 0
        # native requests answered from a worker's parse, and forwarded whole (parsed here)
        self.native_decoded = 0
        self.native_whole = 0
        self.stopping = False
        self._dir = ""
        self._server: asyncio.AbstractServer | None = None
        self._supervisors: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start every worker; return once all of them listen (a worker that exits first, or
        a start past ``START_TIMEOUT_S``: ``ServerError``, and the others are stopped)."""
        self._dir = tempfile.mkdtemp(prefix="inferline-door-")  # 0700: this user only
        path = os.path.join(self._dir, "queue.sock")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Peer(self).channel, path)
        try:
            if self.relay is not None:  # the workers serve the gRPC port too
                await self.relay.front.hand_over()
                self.config["grpc"] = self.relay.front.worker_config(self.n)
            for i in range(self.n):
                await self._spawn(i)
            await self._wait_listening()
        except BaseException:
            await self.stop()
            raise
        self._supervisors = [asyncio.ensure_future(self._supervise(i)) for i in range(self.n)]

    async def _wait_listening(self) -> None:
        ready = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in self.ready.values())))
        exits = {asyncio.ensure_future(p.wait()): i for i, p in self.procs.items()}
        done, _ = await asyncio.wait(
            [ready, *exits], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        for t in exits:
            t.cancel()
        if ready in done:
            return
        ready.cancel()
        with contextlib.suppress(BaseException):
            await ready
        dead = [f"{i} (status {self.procs[i].returncode})" for t, i in exits.items() if t in done]
        raise DoorWorkerError(
            f"door workers did not start: {', '.join(dead) or 'timed out'} (see their log)"
        )

    async def _spawn(self, i: int) -> None:
        self.ready[i] = asyncio.Event()
        path = os.path.join(self._dir, "queue.sock")
        self.procs[i] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "inferline.server._door_worker",
            path,
            str(i),
            # its own session: a Ctrl-C in the terminal reaches this process only, which
            # stops the workers in order (they still exit when this process dies: EOF)
            start_new_session=True,
        )

    def listening(self, i: int) -> None:
        if i in self.ready:
            self.ready[i].set()

    async def _supervise(self, i: int) -> None:
        """Restart worker ``i`` whenever it exits while serving (backing off if it keeps
        dying at once)."""
        delay = 0.5
        loop = asyncio.get_running_loop()
        while not self.stopping:
            started = loop.time()
            proc = self.procs[i]
            rc = await proc.wait()
            if self.stopping:
                return
            self.restarts += 1
            log.error(
                "door worker %d (pid %d) exited with status %s; its requests in flight were "
                "dropped; restarting it",
                i,
                proc.pid,
                rc,
            )
            delay = 0.5 if loop.time() - started > 30 else min(delay * 2, _MAX_BACKOFF_S)
            await asyncio.sleep(delay)
            if not self.stopping:
                await self._spawn(i)

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them (their grace period, plus a margin), SIGKILL
        what is left; then close the channel."""
        self.stopping = True
        for t in self._supervisors:
            t.cancel()
        procs = [p for p in self.procs.values() if p.returncode is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        if procs:
            waits = asyncio.gather(*(p.wait() for p in procs))
            try:
                await asyncio.wait_for(waits, self.grace_s + 5.0)
            except TimeoutError:
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
                await asyncio.gather(*(p.wait() for p in procs))
        if self._server is not None:
            self._server.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------ answering the workers

    async def answer_kserve(
        self, h: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        """A decoded KServe request: the output tensors, or the whole refusal."""
        rid = h["id"]
        if self.kserve is None:  # the worker only sends these when the door is served
            return _whole(rid, 500, INTERNAL_ERROR)
        try:
            tensors = unpack_tensors(h["t"], payload)
            outs = await self.kserve.run_decoded(
                h["model"], h.get("params"), tensors, list(h.get("wanted") or [])
            )
            meta, bufs = pack_tensors(outs)
        except InferlineError as e:
            status, body, media, extra = kserve_error(e)
            return {"id": rid, "st": status, "media": media, "h": extra}, [body]
        except Exception:
            log.exception("unexpected error serving a KServe request for %r", h.get("model"))
            return _whole(rid, 500, INTERNAL_ERROR)
        return {"id": rid, "t": meta}, bufs

    def app_rules(self) -> list[dict[str, Any]]:
        """Every app's parse rules now: what a worker needs to parse the native route."""
        return [AppRules.of(a).to_dict() for a in list(self.service.apps.values())]

    def invalid(self, app: str) -> None:
        self.service.metrics.rejected(app if app in self.service.apps else "-", "invalid")

    async def answer_native(
        self, h: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        """A native request parsed and checked by the worker: only the queue part runs here.
        Rules that changed since the worker got them (an app replaced or removed): ``stale``,
        with the rules now; the worker forwards that request whole."""
        rid = h["id"]
        rules = h["r"]
        app = self.service.apps.get(rules["name"])
        if app is None or AppRules.of(app).to_dict() != rules:
            return {"id": rid, "stale": True, "apps": self.app_rules()}, []
        if "t" in h:
            inputs = list(unpack_tensors(h["t"], payload).values())
        else:
            inputs = list(h["j"])
        req = PredictRequest(app.name, inputs, float(h["slo"]), bool(h["b"]), int(h["prio"]), True)
        self.native_decoded += 1
        status, data, extra = await run_predict(self.service, req)
        return {"id": rid, "st": status, "media": "application/json", "h": extra}, [data]

    async def answer_post(
        self, h: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        """A POST with a length, guarded by the worker: the native predict route and the
        fast paths answered as ``PredictRoute`` answers them, anything else by the app."""
        path = h["p"]
        name = predict_app_name(path)
        if name is not None:
            self.native_whole += 1
            status, data, extra = await handle_predict(self.service, name, bytes(payload))
            reply = {"id": h["id"], "st": status, "media": "application/json", "h": extra}
            if h.get("ask") and name in self.service.apps:  # it parses the next ones itself
                reply["apps"] = self.app_rules()
            return reply, [data]
        for fp in self.fast_paths:
            key = fp.match(path)
            if key is None:
                continue
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in h["h"]]
            try:
                status, body, media, extra = await fp.answer(key, bytes(payload), headers)
            except Exception:
                log.exception("unexpected error serving POST %s", path)
                return _whole(h["id"], 500, INTERNAL_ERROR)
            return {"id": h["id"], "st": status, "media": media, "h": extra}, [body]
        return await self.answer_asgi(h, payload)

    async def answer_asgi(
        self, h: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], list[Any]]:
        """A whole request, through the app (guard, routes): its status, headers, body."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": h["v"],
            "method": h["m"],
            "scheme": h["sc"],
            "path": h["p"],
            "raw_path": h["rp"].encode("latin-1"),
            "query_string": h["q"].encode("latin-1"),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in h["h"]],
            "server": None if h["s"] is None else tuple(h["s"]),
            "client": None if h["c"] is None else tuple(h["c"]),
            "state": dict(self.state),
        }
        body = bytes(payload)
        sent = False
        forever = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await forever.wait()  # no disconnect while the request runs
            return {"type": "http.disconnect"}

        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                start.update(msg)
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))

        await self.app(scope, receive, send)
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in start.get("headers", [])]
        return {"id": h["id"], "st": start.get("status", 500), "h": headers}, [b"".join(chunks)]


def _whole(rid: int, status: int, body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    import json

    return {"id": rid, "st": status, "media": "application/json", "h": None}, [
        json.dumps(body).encode()
    ]


async def serve_with_workers(
    app: Any,
    sock: Any,
    n: int,
    *,
    log_level: str,
    ready: Callable[[], None] | None,
    stop: asyncio.Event | None,
    read_timeout_s: float,
    shutdown_grace_s: float,
) -> None:
    """Run ``app``'s lifespan here and ``n`` door workers on ``sock``'s port until SIGINT/
    SIGTERM (main thread) or ``stop``; SIGINT ends in ``KeyboardInterrupt`` (as ``serve_app``)."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    caught: list[int] = []
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, lambda s=sig: (caught.append(s), ended.set()))
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            pass
    life = Lifespan(app)
    pool = DoorWorkers(
        app,
        sock,
        n,
        log_level=log_level,
        read_timeout_s=read_timeout_s,
        shutdown_grace_s=shutdown_grace_s,
        state=life.state,
    )
    try:
        await life.startup()
        await pool.start()
        if ready is not None:
            ready()
        waits = [asyncio.ensure_future(ended.wait())]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    finally:
        await pool.stop()
        await life.shutdown()
        for sig in installed:
            loop.remove_signal_handler(sig)
    if signal.SIGINT in caught:
        raise KeyboardInterrupt
