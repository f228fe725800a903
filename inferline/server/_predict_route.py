"""``POST /apps/{app}/predict`` answered straight at the ASGI level: the data path.

FastAPI's per-request routing and dependency machinery would cost more CPU than the rest of
the frontend together, so ``PredictRoute`` sits between the guard and the FastAPI app and
serves that one route itself (``handle_predict``); everything else goes on to FastAPI. The
FastAPI route of the same path (same ``handle_predict``) documents it in the OpenAPI schema
and serves it when this layer is bypassed.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Receive, Scope, Send

from inferline.core import BodyTooLarge
from inferline.server._predict import handle_predict
from inferline.server._replies import send_json, too_large
from inferline.server._service import Service

__all__ = ["PredictRoute", "predict_app_name"]

_PREFIX = "/apps/"
_SUFFIX = "/predict"


def predict_app_name(path: str) -> str | None:
    """The app of a ``/apps/{app}/predict`` path, else None (an empty or nested name too,
    as FastAPI's path parameter would not match them either)."""
    if path.startswith(_PREFIX) and path.endswith(_SUFFIX):
        name = path[len(_PREFIX) : -len(_SUFFIX)]
        if name and "/" not in name:
            return name
    return None


class PredictRoute:
    """ASGI layer that answers ``POST /apps/{app}/predict`` for ``service`` and passes every
    other request to ``app``. The guard in front has already checked the request (host,
    token, declared body size). A body sent without a length (chunked) goes on to the
    FastAPI route, which reads it through the guard's counting ``receive``."""

    def __init__(self, app: ASGIApp, service: Service, max_body_bytes: int) -> None:
        self.app = app
        self.service = service
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            name = predict_app_name(scope["path"])
            if name is not None and _has_length(scope):
                await self._predict(name, receive, send)
                return
        await self.app(scope, receive, send)

    async def _predict(self, name: str, receive: Receive, send: Send) -> None:
        try:
            raw = await self._body(receive)
        except BodyTooLarge:
            await send_json(send, 413, too_large(self.limit))
            return
        if raw is None:
            return  # it left before its body arrived: nobody to answer
        try:
            status, data, extra = await handle_predict(self.service, name, raw)
        except asyncio.CancelledError:
            # A forced exit (a second Ctrl-C) cancels the requests still running: each gets
            # an explicit 503 instead of uvicorn's plain-text 500 and a logged traceback.
            with contextlib.suppress(Exception):
                await send_json(
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

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body, or None on a disconnect; ``BodyTooLarge`` past the limit (a client
        that sent more than its Content-Length said)."""
        chunks = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body = msg.get("body", b"")
            size += len(body)
            if size > self.limit:
                raise BodyTooLarge(self.limit)
            chunks.append(body)
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _has_length(scope: Scope) -> bool:
    for k, _ in scope["headers"]:
        if k == b"content-length":
            return True
    return False
