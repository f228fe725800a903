"""One ASGI guard in front of every HTTP route: the bearer token and the body limit checked before any route code runs, and the predict route answered at the ASGI level (the data path)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferline.core._http_errors import (
    BodyTooLarge,
    error_body,
)
from inferline.server._predict import handle_predict
from inferline.server._service import Service

__all__ = ["INTERNAL_ERROR", "Guard", "too_large"]

log = logging.getLogger(__name__)

_JSON = "application/json"


class Guard:
    """Bearer token and body size limit, for every HTTP route (mounted routers included).

    It also answers ``POST /apps/{app}/predict`` itself, straight at the ASGI level: that one
    route is the data path, and FastAPI's per-request routing and dependency machinery would
    cost more CPU than the rest of the frontend together. The FastAPI route of the same path
    (same ``handle_predict``) documents it in the OpenAPI schema and serves it when the guard
    is bypassed.
    """

    def __init__(
        self, app: ASGIApp, token: str | None, max_body_bytes: int, service: Service | None = None
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.limit = max_body_bytes
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        auth = None
        for k, v in scope["headers"]:
            if k == b"content-length":
                length = v
            elif k == b"authorization":
                auth = v
        if self.token is not None and not (
            auth is not None
            and auth[:7].lower() == b"bearer "
            and hmac.compare_digest(auth[7:].strip(), self.token)
        ):
            await _send_plain(
                send,
                401,
                {"detail": "missing or wrong bearer token", "error": "Unauthorized"},
                [(b"www-authenticate", b"Bearer")],
            )
            return
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n < 0:
                await _send_plain(
                    send, 400, {"detail": "bad Content-Length header", "error": "BadRequest"}
                )
                return
            if n > self.limit:
                await _send_plain(send, 413, too_large(self.limit))
                return
            if self.service is not None and scope["method"] == "POST":
                path: str = scope["path"]
                if path.startswith("/apps/") and path.endswith("/predict"):
                    name = path[6:-8]
                    if name and "/" not in name:
                        await self._predict(name, receive, send)
                        return
            await self._call_app(scope, receive, send)
            return
        # No length given (chunked): count as the body arrives.
        seen = 0
        limit = self.limit

        async def counting_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return msg

        await self._call_app(scope, counting_receive, send)

    async def _call_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            started = True
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # it left (or timed out) before its body arrived: nobody to answer
        except Exception:
            # Starlette has answered with the JSON 500 (create_app's handler) and re-raised
            # for the server to log: log it here and end the request normally instead.
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            if not started:
                await _send_plain(send, 500, INTERNAL_ERROR)

    async def _predict(self, name: str, receive: Receive, send: Send) -> None:
        assert self.service is not None
        chunks = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > self.limit:  # a client that sent more than its Content-Length said
                await _send_plain(send, 413, too_large(self.limit))
                return
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            status, data, extra = await handle_predict(self.service, name, raw)
        except asyncio.CancelledError:
            # A forced exit (a second Ctrl-C) cancels the requests still running: each gets
            # an explicit 503 instead of uvicorn's plain-text 500 and a logged traceback.
            with contextlib.suppress(Exception):
                await _send_plain(
                    send, 503, {"detail": "the server is exiting", "error": "ShuttingDown"}
                )
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ]
        if extra:
            headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


INTERNAL_ERROR = {"detail": "internal error (see the server log)", "error": "InternalError"}


def too_large(limit: int) -> dict[str, Any]:
    return error_body(BodyTooLarge(limit))


async def _send_plain(
    send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", _JSON.encode()), (b"content-length", str(len(data)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": data})
