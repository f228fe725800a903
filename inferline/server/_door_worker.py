"""A door worker process (``inferline serve --door-workers N``): it accepts HTTP connections
on the server's port (its own ``SO_REUSEPORT`` socket; the kernel spreads connections over
the workers), runs the same guard (Host, token, content type, body limit) and, for KServe v2
``/infer``, the same decode and encode as the single process; the decoded tensors go to the
queue process over the local channel (``_frames``), which runs the EDF queue and answers
with the output tensors. The native predict route is parsed and checked here too
(``parse_predict``, with each app's ``AppRules`` from the config) and only its checked inputs
travel (a ``native`` frame); rules the queue process finds changed since come back
``stale`` with the new ones, and that request travels whole. Every other request (TF
Serving, admin, metadata) travels whole over the same channel and is answered by the queue
process's app, so every answer is the single process's. When the server has a gRPC port, the worker also
serves it (``frontdoors._grpc_worker``: ``ModelInfer`` decoded and encoded here, the other
RPCs answered by the queue process's handlers).

Started and stopped by ``_workers.DoorWorkers`` as
``python -m inferline.server._door_worker SOCKET_PATH INDEX``; its settings come over the
channel (the token is never on a command line). When the queue process goes away the
requests waiting on it get a 503 and the worker exits: no orphans.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from starlette.types import Receive, Scope, Send

from inferline.core import BodyTooLarge, InferlineError
from inferline.server._frames import FrameChannel, pack_tensors, unpack_tensors
from inferline.server._guard import Guard
from inferline.server._predict import AppRules, PredictRequest, error_answer, parse_predict
from inferline.server._predict_route import predict_app_name, read_body, send_answer
from inferline.server._replies import INTERNAL_ERROR, send_json, too_large
from inferline.server._run import bind_socket, run_loop, serve_app
from inferline.server.frontdoors import (
    decode_off_loop,
    encode_answer,
    header_length,
    infer_model,
    kserve_decode,
    kserve_error,
    requested_outputs,
    start_worker_grpc,
)

__all__ = ["QUEUE_GONE", "QueueLink", "WorkerApp", "main"]

log = logging.getLogger(__name__)

QUEUE_GONE = {
    "detail": "the server's queue process is gone (exiting or failed)",
    "error": "ShuttingDown",
}


class QueueGone(ConnectionError):
    """The channel to the queue process closed while a request waited on it."""


class QueueLink:
    """This worker's end of the channel: numbered requests, each answered by one frame."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.pending: dict[int, asyncio.Future[tuple[dict[str, Any], memoryview]]] = {}
        self.next_id = 0
        self.gone = asyncio.Event()
        self.config: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.channel = FrameChannel(self.on_frame, self.on_close)

    def on_frame(self, header: dict[str, Any], payload: memoryview) -> None:
        if header.get("k") == "config":
            if not self.config.done():
                self.config.set_result(header["config"])
            return
        fut = self.pending.pop(header.get("id", -1), None)
        if fut is not None and not fut.done():
            fut.set_result((header, payload))

    def on_close(self, exc: Exception | None) -> None:
        self.gone.set()
        if not self.config.done():
            self.config.set_exception(QueueGone("the queue process closed the channel"))
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(QueueGone("the queue process closed the channel"))
        self.pending.clear()

    async def request(
        self, header: dict[str, Any], payload: list[Any]
    ) -> tuple[dict[str, Any], memoryview]:
        if self.channel.closed:
            raise QueueGone("the queue process closed the channel")
        rid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        try:
            self.channel.send({**header, "id": rid}, payload)
            return await fut
        finally:
            self.pending.pop(rid, None)


def _latin(pairs: Any) -> list[list[str]]:
    return [[k.decode("latin-1"), v.decode("latin-1")] for k, v in pairs]


class WorkerApp:
    """The worker's ASGI app, behind ``Guard``: KServe ``/infer`` decoded and encoded here,
    everything else forwarded whole to the queue process's app."""

    def __init__(self, link: QueueLink, config: dict[str, Any]) -> None:
        self.link = link
        self.limit = int(config["max_body_bytes"])
        self.max_rows = int(config["max_rows"])
        self.kserve = bool(config["kserve"])
        self.rules: dict[str, AppRules] = {}
        self.set_rules(config.get("apps") or [])

    def set_rules(self, apps: list[dict[str, Any]]) -> None:
        """Each app's parse rules, as the queue process has them now (``AppRules``)."""
        self.rules = {r.name: r for r in map(AppRules.from_dict, apps)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: no route serves them
        try:
            raw = await read_body(receive, self.limit)
        except BodyTooLarge:
            await send_json(send, 413, too_large(self.limit))
            return
        if raw is None:
            return  # it left before its body arrived: nobody to answer
        try:
            model = infer_model(scope["path"]) if self.kserve else None
            post = scope["method"] == "POST" and _has_length(scope)
            app = predict_app_name(scope["path"]) if post else None
            if model is not None and post:
                await self._infer(model, raw, scope, send)
            elif app is not None and app in self.rules:
                await self._native(self.rules[app], raw, scope, send)
            else:  # an app it has no rules for yet asks for them with the answer
                await self._forward(scope, raw, send, "post" if post else "asgi", app is not None)
        except QueueGone:
            await send_json(send, 503, QUEUE_GONE, [(b"retry-after", b"1")])
        except Exception:
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            await send_json(send, 500, INTERNAL_ERROR)

    async def _infer(self, model: str, raw: bytes, scope: Scope, send: Send) -> None:
        """KServe v2 infer: decode here, queue there, encode here (``answer_infer``'s steps)."""
        hl = None
        for k, v in scope["headers"]:
            if k == b"inference-header-content-length":
                hl = v.decode("latin-1")
                break
        try:
            req, tensors = await decode_off_loop(
                len(raw), kserve_decode, raw, header_length(hl, len(raw)), self.max_rows
            )
            meta, bufs = pack_tensors(tensors)
        except InferlineError as e:
            await send_answer(send, *kserve_error(e))
            return
        head = {
            "k": "kserve",
            "model": model,
            "params": req.get("parameters"),
            "wanted": requested_outputs(req),
            "t": meta,
        }
        reply, payload = await self.link.request(head, bufs)
        if "t" not in reply:  # refused or failed there: the whole answer came back
            await send_answer(send, reply["st"], bytes(payload), reply["media"], reply.get("h"))
            return
        try:
            answer = encode_answer(model, req, unpack_tensors(reply["t"], payload))
        except InferlineError as e:
            answer = kserve_error(e)
        await send_answer(send, *answer)

    async def _native(self, rules: AppRules, raw: bytes, scope: Scope, send: Send) -> None:
        """The native route: parsed and checked here with the app's rules, queued there.
        The queue process answers ``stale`` when the app's rules changed since (or the app is
        gone): the worker takes the new rules and forwards this request whole."""
        try:
            req = parse_predict(rules, raw)
        except InferlineError as e:
            self.link.channel.send({"k": "invalid", "app": rules.name})  # counted there
            status, body, extra = error_answer(e)
            await send_answer(send, status, body, "application/json", extra)
            return
        head = native_head(req, rules)
        if head is None:  # inputs the channel cannot carry as they are: parsed there
            await self._forward(scope, raw, send, "post")
            return
        head, bufs = head
        reply, payload = await self.link.request(head, bufs)
        if reply.get("stale"):
            self.set_rules(reply["apps"])
            await self._forward(scope, raw, send, "post")
            return
        await send_answer(send, reply["st"], bytes(payload), reply["media"], reply.get("h"))

    async def _forward(
        self, scope: Scope, raw: bytes, send: Send, kind: str, ask: bool = False
    ) -> None:
        """The whole request to the queue process: ``post`` (a POST with a length: answered
        as ``PredictRoute`` answers it, guarded here) or ``asgi`` (through its app)."""
        head = {
            "k": kind,
            "m": scope["method"],
            "p": scope["path"],
            "rp": (scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
            "q": scope.get("query_string", b"").decode("latin-1"),
            "h": _latin(scope["headers"]),
            "s": list(scope["server"]) if scope.get("server") else None,
            "c": list(scope["client"]) if scope.get("client") else None,
            "sc": scope.get("scheme", "http"),
            "v": scope.get("http_version", "1.1"),
            "ask": ask,
        }
        reply, payload = await self.link.request(head, [raw])
        if "apps" in reply:  # a predict route's app this worker did not know: rules now
            self.set_rules(reply["apps"])
        if "media" in reply:  # an answer function's (status, body, media, extra headers)
            await send_answer(send, reply["st"], bytes(payload), reply["media"], reply.get("h"))
            return
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply["h"]]
        await send({"type": "http.response.start", "status": reply["st"], "headers": headers})
        await send({"type": "http.response.body", "body": bytes(payload)})


def native_head(req: PredictRequest, rules: AppRules) -> tuple[dict[str, Any], list[Any]] | None:
    """A parsed native request as a ``native`` frame: checked inputs as tensors (an app with
    an input spec) or plain JSON (none, and the body held no tagged value); else None."""
    head: dict[str, Any] = {
        "k": "native",
        "r": rules.to_dict(),  # the rules it was checked with: the queue process compares
        "slo": req.slo_s,
        "b": req.is_batch,
        "prio": req.priority,
    }
    if rules.input_spec is not None:
        if not all(
            getattr(x, "dtype", None) is not None and x.dtype.kind in "biufc" for x in req.inputs
        ):
            return None
        meta, bufs = pack_tensors({str(i): x for i, x in enumerate(req.inputs)})
        head["t"] = meta
        return head, bufs
    if not req.plain:
        return None
    head["j"] = req.inputs
    return head, []


def _has_length(scope: Scope) -> bool:
    return any(k == b"content-length" for k, _ in scope["headers"])


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _serve(path: str, index: int) -> None:
    loop = asyncio.get_running_loop()
    link = QueueLink()
    await loop.create_unix_connection(lambda: link.channel, path)
    link.channel.send({"k": "hello", "worker": index, "pid": os.getpid()})
    config = await link.config
    sock = bind_socket(config["host"], int(config["port"]), reuse_port=True)
    app = Guard(
        WorkerApp(link, config),
        token=config["token"],
        max_body_bytes=int(config["max_body_bytes"]),
        allowed_hosts=config["allowed_hosts"],
    )
    grace = float(config["shutdown_grace_s"])
    grpc = None
    if config.get("grpc"):  # the gRPC port too (listening before "ready" is sent)
        grpc = await start_worker_grpc(
            link, config["grpc"], config["token"], int(config["max_rows"])
        )
    try:
        await serve_app(
            app,
            sock,
            log_level=config.get("log_level", "warning"),
            ready=lambda: link.channel.send({"k": "ready", "worker": index}),
            stop=link.gone,
            read_timeout_s=float(config["read_timeout_s"]),
            shutdown_grace_s=grace,
        )
    finally:
        if grpc is not None:  # its calls in flight finish (the queue process still answers)
            await grpc.stop(0 if link.gone.is_set() else grace)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m inferline.server._door_worker SOCKET_PATH INDEX", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="door worker %(process)d: %(message)s")
    try:
        run_loop(_serve(argv[1], int(argv[2])))
    except QueueGone:
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
