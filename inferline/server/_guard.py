"""One ASGI guard in front of every HTTP route: the Host allowlist, the bearer token, JSON on mutating routes and the body limit, checked before any route code runs. It only guards: the predict route's ASGI-level answer is ``_predict_route.PredictRoute``, inside it."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferline.core import BodyTooLarge
from inferline.server._replies import INTERNAL_ERROR, send_json, too_large

__all__ = ["INTERNAL_ERROR", "LOCAL_HOSTS", "Guard", "host_name", "json_exempt", "too_large"]

log = logging.getLogger(__name__)

# Names every server answers to, whatever it is bound to: a browser on this machine may call
# it by them, a page from another origin (DNS rebinding) cannot.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_MUTATING = frozenset({"POST", "PUT", "DELETE", "PATCH"})

# A refusal: status, JSON body and extra headers.
_Refusal = tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]


def host_name(value: str) -> str:
    """A Host header's (or an allowlist entry's) name: lowercase, no port, no IPv6 brackets."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v[1:]
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def json_exempt(path: str) -> bool:
    """Routes whose protocol sets the body's type: KServe v2 (binary tensors travel as
    application/octet-stream) and TF Serving REST (its clients, curl among them, send any).
    Every other mutating route needs JSON, the native predict route too: a browser on another
    origin may POST text/plain or a form without a preflight, so without a token any page
    could spend the replicas' time (``curl -H 'Content-Type: application/json'``)."""
    return path.startswith(("/v2/", "/v1/models/"))


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
    answer), a body over the limit 413 (by its Content-Length, or counted as it arrives
    when it has none).

    ``allowed_hosts``: the ``Host`` names accepted (``*.example.com`` for subdomains, ``*`` for
    any); None: the address the connection reached (the bound one) and the localhost names.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        max_body_bytes: int,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.limit = max_body_bytes
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
        length, auth, host, ctype, chunked = _request_headers(scope)
        refusal = (
            self._refuse_host(scope, host)
            or self._refuse_token(auth)
            or _refuse_media(scope, length, ctype, chunked)
            or self._refuse_length(length)
        )
        if refusal is not None:
            await send_json(send, *refusal)
            return
        if length is None:  # no length given (chunked): count as the body arrives
            receive = _counting(receive, self.limit)
        await self._call_app(scope, receive, send)

    def _refuse_host(self, scope: Scope, host: bytes | None) -> _Refusal | None:
        if self.host_allowed(scope, host):
            return None
        shown = (host or b"").decode("latin-1")[:100]
        detail = (
            f"Host {shown!r} is not one this server answers to (inferline serve --allowed-hosts)"
        )
        return 421, {"detail": detail, "error": "MisdirectedRequest"}, []

    def _refuse_token(self, auth: bytes | None) -> _Refusal | None:
        if self.token is None or (
            auth is not None
            and auth[:7].lower() == b"bearer "
            and hmac.compare_digest(auth[7:].strip(), self.token)
        ):
            return None
        body = {"detail": "missing or wrong bearer token", "error": "Unauthorized"}
        return 401, body, [(b"www-authenticate", b"Bearer")]

    def _refuse_length(self, length: bytes | None) -> _Refusal | None:
        if length is None:
            return None
        try:
            n = int(length)
        except ValueError:
            n = -1
        if n < 0:
            return 400, {"detail": "bad Content-Length header", "error": "BadRequest"}, []
        if n > self.limit:
            return 413, too_large(self.limit), []
        return None

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
                await send_json(send, 500, INTERNAL_ERROR)


def _request_headers(
    scope: Scope,
) -> tuple[bytes | None, bytes | None, bytes | None, bytes | None, bool]:
    """``(content-length, authorization, host, content-type, chunked)`` in one pass."""
    length = auth = host = ctype = None
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
    return length, auth, host, ctype, chunked


def _refuse_media(
    scope: Scope, length: bytes | None, ctype: bytes | None, chunked: bool
) -> _Refusal | None:
    """415 for a mutating request with a body that is not JSON, but on the protocol routes."""
    method = scope["method"]
    if (
        method in _MUTATING
        and (chunked or (length is not None and length != b"0"))
        and not _is_json(ctype)
        and not json_exempt(scope["path"])
    ):
        detail = f"{method} {scope['path']} takes a JSON body (Content-Type: application/json)"
        return 415, {"detail": detail, "error": "UnsupportedMediaType"}, []
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises ``BodyTooLarge`` once the body so far is over ``limit``."""
    seen = 0

    async def counting_receive() -> Message:
        nonlocal seen
        msg = await receive()
        if msg["type"] == "http.request":
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return msg

    return counting_receive
