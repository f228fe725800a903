"""One ASGI guard in front of every HTTP route: the Host allowlist, the bearer token, JSON on mutating routes and the body limit checked before any route code runs, and the predict route answered at the ASGI level (the data path)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Iterable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferline.core import BodyTooLarge, error_body
from inferline.server._predict import handle_predict
from inferline.server._service import Service

__all__ = ["INTERNAL_ERROR", "LOCAL_HOSTS", "Guard", "host_name", "json_exempt", "too_large"]

log = logging.getLogger(__name__)

_JSON = "application/json"
# Names every server answers to, whatever it is bound to: a browser on this machine may call
# it by them, a page from another origin (DNS rebinding) cannot.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_MUTATING = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def host_name(value: str) -> str:
    """A Host header's (or an allowlist entry's) name: lowercase, no port, no IPv6 brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v[1:]
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def json_exempt(path: str) -> bool:
    """Routes whose protocol sets the body's type: the native predict route (any JSON body
    is read as JSON, so curl's default works), KServe v2 (binary tensors travel as
    application/octet-stream) and TF Serving REST. Every other mutating route needs JSON."""
    return path.startswith(("/v2/", "/v1/models/")) or (
        path.startswith("/apps/") and path.endswith("/predict") and path.count("/") == 3
    )


def _is_json(ctype: bytes | None) -> bool:
    if ctype is None:
        return False
    media = ctype.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


class Guard:
    """Host allowlist, bearer token, JSON bodies on mutating routes and the body size limit,
    for every HTTP route (mounted routers included), in that order and before the body is
    read: a foreign ``Host`` gets 421, a missing or wrong token 401, a ``PUT``/``POST``/
    ``DELETE`` body of another content type 415 (not on the protocol routes, whose clients
    send their own types; a request without a body goes on, to 405 or the route's own
    answer), a body over the limit 413.

    ``allowed_hosts``: the ``Host`` names accepted (``*.example.com`` for subdomains, ``*`` for
    any); None: the address the connection reached (the bound one) and the localhost names.

    It also answers ``POST /apps/{app}/predict`` itself, straight at the ASGI level: that one
    route is the data path, and FastAPI's per-request routing and dependency machinery would
    cost more CPU than the rest of the frontend together. The FastAPI route of the same path
    (same ``handle_predict``) documents it in the OpenAPI schema and serves it when the guard
    is bypassed.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        max_body_bytes: int,
        service: Service | None = None,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.limit = max_body_bytes
        self.service = service
        names = [host_name(h) for h in allowed_hosts] if allowed_hosts is not None else None
        self.any_host = names is not None and "*" in names
        self.hosts = frozenset(LOCAL_HOSTS if names is None else names)
        self.suffixes = tuple(h[1:] for h in self.hosts if h.startswith("*."))
        self.default_hosts = names is None

    def host_allowed(self, scope: Scope, host: bytes | None) -> bool:
        if self.any_host or host is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_name(host.decode("latin-1"))
        if name in self.hosts or (self.suffixes and name.endswith(self.suffixes)):
            return True
        server = scope.get("server")
        return bool(self.default_hosts and server and name == host_name(str(server[0])))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        auth = None
        host = None
        ctype = None
        chunked = False
        for k, v in scope["headers"]:
            if k == b"content-length":
                length = v
            elif k == b"authorization":
                auth = v
            elif k == b"host":
                host = v
            elif k == b"content-type":
                ctype = v
            elif k == b"transfer-encoding":
                chunked = True
        if not self.host_allowed(scope, host):
            shown = (host or b"").decode("latin-1")[:100]
            await _send_plain(
                send,
                421,
                {
                    "detail": f"Host {shown!r} is not one this server answers to "
                    "(inferline serve --allowed-hosts)",
                    "error": "MisdirectedRequest",
                },
            )
            return
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
        method = scope["method"]
        if (
            method in _MUTATING
            and (chunked or (length is not None and length != b"0"))
            and not _is_json(ctype)
            and not json_exempt(scope["path"])
        ):
            await _send_plain(
                send,
                415,
                {
                    "detail": f"{method} {scope['path']} takes a JSON body "
                    "(Content-Type: application/json)",
                    "error": "UnsupportedMediaType",
                },
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
            if self.service is not None and method == "POST":
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
