"""The data path answered straight at the ASGI level: ``POST /apps/{app}/predict`` and the
protocol doors' inference routes (KServe v2 ``/infer``, TF Serving ``:predict``).

FastAPI's per-request routing and dependency machinery would cost more CPU than the rest of
the frontend together, so ``PredictRoute`` sits between the guard and the FastAPI app and
serves those routes itself: the native one (``handle_predict``) and every ``FastPath`` that
a mounted router carries (``inferline_fast_paths``, set by ``make_kserve_router`` and
``make_tfserving_router``). Everything else goes on to FastAPI, whose routes of the same
paths (same answer functions) document them in the OpenAPI schema and serve them when this
layer is bypassed (a chunked body).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from inferline.core import BodyTooLarge
from inferline.server._predict import handle_predict
from inferline.server._replies import INTERNAL_ERROR, send_json, too_large
from inferline.server._service import Service

__all__ = ["FastPath", "PredictRoute", "predict_app_name", "read_body", "send_answer"]

log = logging.getLogger(__name__)

_EXITING = {"detail": "the server is exiting", "error": "ShuttingDown"}
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


# An answer: status, body, media type and extra headers (as a Starlette ``Response`` takes).
Answer = tuple[int, bytes, str, dict[str, str] | None]


class FastPath(Protocol):
    """A POST route this layer answers: ``match(path)`` is what ``answer`` needs (the model
    name, ...), or None for a path it does not serve; ``answer`` never raises for a bad
    request (a bug raises: a JSON 500, as FastAPI's handler answers)."""

    def match(self, path: str) -> Any | None: ...

    async def answer(self, key: Any, raw: bytes, headers: list[tuple[bytes, bytes]]) -> Answer: ...


class PredictRoute:
    """ASGI layer that answers ``POST /apps/{app}/predict`` for ``service`` and the POST
    routes of ``fast_paths``, and passes every other request to ``app``. The guard in front
    has already checked the request (host, token, content type, declared body size). A body
    sent without a length (chunked) goes on to the FastAPI route, which reads it through
    the guard's counting ``receive``."""

    def __init__(
        self,
        app: ASGIApp,
        service: Service,
        max_body_bytes: int,
        fast_paths: Sequence[FastPath] = (),
    ) -> None:
        self.app = app
        self.service = service
        self.limit = max_body_bytes
        self.fast_paths = tuple(fast_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and _has_length(scope):
            path = scope["path"]
            name = predict_app_name(path)
            if name is not None:
                await self._predict(name, receive, send)
                return
            for fp in self.fast_paths:
                key = fp.match(path)
                if key is not None:
                    await self._fast(fp, key, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _fast(
        self, fp: FastPath, key: Any, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """One request of a ``FastPath``."""
        try:
            raw = await self._body(receive)
        except BodyTooLarge:
            await send_json(send, 413, too_large(self.limit))
            return
        if raw is None:
            return
        try:
            status, body, media, extra = await fp.answer(key, raw, scope["headers"])
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await send_json(send, 503, _EXITING)
            return
        except Exception:
            # as the guard answers a bug in a FastAPI route: logged once, a JSON 500
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            await send_json(send, 500, INTERNAL_ERROR)
            return
        await send_answer(send, status, body, media, extra)

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
                await send_json(send, 503, _EXITING)
            return
        await send_answer(send, status, data, "application/json", extra)

    async def _body(self, receive: Receive) -> bytes | None:
        return await read_body(receive, self.limit)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None on a disconnect; ``BodyTooLarge`` past ``limit`` (a client
    that sent more than its Content-Length said)."""
    chunks = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(body)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _has_length(scope: Scope) -> bool:
    for k, _ in scope["headers"]:
        if k == b"content-length":
            return True
    return False


async def send_answer(
    send: Send, status: int, body: bytes, media: str, extra: dict[str, str] | None
) -> None:
    """The headers a Starlette ``Response`` of the same answer carries, in its order (extra
    headers, length, type): both paths answer alike."""
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]
    headers.append((b"content-length", str(len(body)).encode()))
    headers.append((b"content-type", media.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
