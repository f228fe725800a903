"""The HTTP frontend: a FastAPI app over a ``Service``.

Endpoints: ``POST /apps/{app}/predict`` (one input or ``input_batch``), ``GET /apps``,
``GET /healthz``, ``GET /metrics`` (Prometheus text), and FastAPI's ``/openapi.json`` and
``/docs``. Every endpoint, including mounted routers, sits behind one ASGI guard that checks
the optional bearer token and the request body limit (413) before any route code runs.

Other subsystems add endpoints by passing routers (or factories ``service -> APIRouter``)
to ``create_app``, e.g. ``create_app(service, routers=[make_velox_router])``; their handlers
reach the service as ``request.app.state.service`` and may raise inferline's errors, which
render here with the same status codes and JSON shape as the built-in routes.

The predict route parses the body itself (one ``json.loads``, no pydantic on the hot path):
pydantic models below only describe the API in the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferline.core import InferlineError, ValidationError
from inferline.core._http_errors import (
    BodyTooLarge,
    MalformedJSON,
    decode_json,
    error_body,
    status_for,
)

from ._service import Prediction, Service, json_default

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MalformedJSON",
    "RouterSource",
    "bind_socket",
    "create_app",
    "decode_json",
    "error_body",
    "handle_predict",
    "run_loop",
    "run_server",
    "serve_app",
    "status_for",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20
# Headers, then body, each within this (408 otherwise): slow-loris clients hold no socket.
DEFAULT_READ_TIMEOUT_S = 30.0
MAX_SLO_MS = 3_600_000.0
RouterSource = APIRouter | Callable[[Service], APIRouter]
_JSON = "application/json"


# ---------------------------------------------------------------- errors -> HTTP


def _json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":"), allow_nan=False).encode(),
        status_code=status,
        media_type=_JSON,
        headers=headers,
    )


def _error_response(exc: BaseException) -> Response:
    status = status_for(exc)
    headers = {"Retry-After": "1"} if status == 503 else None
    return _json_response(status, error_body(exc), headers)


# ---------------------------------------------------------------- the ASGI guard


class _Guard:
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
                await _send_plain(send, 413, _too_large(self.limit))
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
                await _send_plain(send, 500, _INTERNAL)

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
                await _send_plain(send, 413, _too_large(self.limit))
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


_INTERNAL = {"detail": "internal error (see the server log)", "error": "InternalError"}


def _too_large(limit: int) -> dict[str, Any]:
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


# ---------------------------------------------------------------- OpenAPI descriptions


class PredictRequest(BaseModel):
    """One query (``input``) or several (``input_batch``), with an optional per-query SLO."""

    input: Any = Field(
        None,
        description="The query: JSON, or an array as {dtype, shape, b64} / {dtype, data}",
    )
    input_batch: list[Any] | None = Field(None, description="Several queries, answered in order")
    latency_slo_ms: float | None = Field(None, gt=0, description="Override the app's SLO")


class PredictResponse(BaseModel):
    query_id: str
    output: Any
    default: bool = Field(description="True when the output is the app's default output")
    default_explanation: str | None = None


class BatchItem(BaseModel):
    query_id: str | None = None
    output: Any = None
    default: bool | None = None
    default_explanation: str | None = None
    error: str | None = Field(None, description="Error class when this item failed")
    detail: str | None = None
    status: int | None = None


class BatchResponse(BaseModel):
    results: list[BatchItem]


class ErrorResponse(BaseModel):
    detail: str
    error: str
    field: str | None = None
    expected: str | None = None


_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 422, 502, 503, 504)
}


# ---------------------------------------------------------------- request parsing


def _parse_request(
    service: Service, app_name: str, raw: bytes
) -> tuple[Any, list[Any], float, bool]:
    """Returns ``(app, inputs, slo_s, is_batch)``."""
    app = service.app(app_name)
    if not raw:
        raise ValidationError("body", 'a JSON object like {"input": ...}', "an empty body")
    body = decode_json(raw, 'a JSON object like {"input": ...}')
    if not isinstance(body, dict):
        raise ValidationError("body", 'a JSON object like {"input": ...}', type(body).__name__)
    # Only JSON objects can carry tagged values ({"dtype", "b64"}, {"bytes_b64"}); a body
    # whose only "{" is its own opening needs no decoding pass over the input.
    plain = raw.count(b"{") == 1
    # A scan of the bytes (fast) spares the walk for booleans and strings over every input
    # list: with no true/false and no quotes but the keys', the inputs hold only numbers.
    non_numbers = b"true" in raw or b"false" in raw or raw.count(b'"') > 2 * len(body)
    extra = set(body) - {"input", "input_batch", "latency_slo_ms"}
    if extra:
        raise ValidationError("body", "only keys input, input_batch, latency_slo_ms", sorted(extra))
    slo_s = app.slo_s
    if "latency_slo_ms" in body and body["latency_slo_ms"] is not None:
        v = body["latency_slo_ms"]
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or not 0 < v <= MAX_SLO_MS
        ):
            raise ValidationError("latency_slo_ms", f"a number in (0, {MAX_SLO_MS:.0f}]", v)
        slo_s = float(v) / 1e3
    has_one = "input" in body
    has_batch = "input_batch" in body
    if has_one == has_batch:
        raise ValidationError("body", "exactly one of 'input' or 'input_batch'", sorted(body))
    if has_one:
        x = service.check_input(app, body["input"], "input", plain=plain, non_numbers=non_numbers)
        return app, [x], slo_s, False
    batch = body["input_batch"]
    if not isinstance(batch, list) or not batch:
        raise ValidationError("input_batch", "a non-empty JSON array of inputs", _brief(batch))
    if len(batch) > app.max_batch_inputs:
        raise ValidationError(
            "input_batch", f"at most {app.max_batch_inputs} inputs", f"{len(batch)} inputs"
        )
    inputs = [
        service.check_input(app, x, f"input_batch[{i}]", plain=plain, non_numbers=non_numbers)
        for i, x in enumerate(batch)
    ]
    return app, inputs, slo_s, True


def _brief(v: Any) -> Any:
    r = repr(v)
    return v if len(r) <= 60 else r[:57] + "..."


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False, default=json_default).encode()


class _OutputNotJSON(Exception):
    pass


def _dumps_output(app_name: str, body: Any) -> bytes:
    try:
        return _dumps(body)
    except (ValueError, TypeError, InferlineError) as e:
        raise _OutputNotJSON(f"the output of app {app_name!r} has no JSON form: {e}") from None


async def handle_predict(
    service: Service, app_name: str, raw: bytes
) -> tuple[int, bytes, dict[str, str] | None]:
    """One predict request, start to end: ``(status, JSON body, extra headers)``. Never raises
    for a bad request or a failed query: those become 4xx/5xx answers."""
    if service.closing:
        return 503, _dumps({"detail": "server is shutting down", "error": "Unavailable"}), None
    try:
        try:
            app_, inputs, slo_s, is_batch = _parse_request(service, app_name, raw)
        except InferlineError:
            service.metrics.rejected(app_name if app_name in service.apps else "-", "invalid")
            raise
        if not is_batch:
            pred = await service.predict(app_.name, inputs[0], slo_s)
            return 200, _dumps_output(app_name, pred.to_body()), None
        results = await asyncio.gather(
            *(service.predict(app_.name, x, slo_s) for x in inputs), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, InferlineError):
                raise r
        return 200, _dumps_output(app_name, {"results": [_batch_item(r) for r in results]}), None
    except _OutputNotJSON as e:
        log.error("%s", e)
        return 500, _dumps({"detail": str(e), "error": "OutputError"}), None
    except InferlineError as e:
        status = status_for(e)
        return status, _dumps(error_body(e)), {"Retry-After": "1"} if status == 503 else None
    except Exception as e:  # a bug in a pipeline: answer it, log it, keep serving
        log.exception("app %r failed", app_name)
        return 500, _dumps({"detail": f"{type(e).__name__}: {e}", "error": "InternalError"}), None


def _batch_item(r: Prediction | BaseException) -> dict[str, Any]:
    if isinstance(r, Prediction):
        return r.to_body()
    return {**error_body(r), "status": status_for(r)}


# ---------------------------------------------------------------- the app


def create_app(
    service: Service,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    routers: Sequence[RouterSource] = (),
    close_service_on_shutdown: bool = True,
    title: str = "inferline",
) -> FastAPI:
    """The ASGI app serving ``service``. ``token``: require ``Authorization: Bearer <token>``
    on every endpoint. ``routers``: extra routers or ``service -> APIRouter`` factories."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> Any:
        try:
            yield
        except asyncio.CancelledError:
            # A forced exit (a second Ctrl-C) cancels the lifespan while it waits for the
            # shutdown: end quietly (Starlette would log the cancellation as a traceback).
            # The replicas go with the process (atexit, and their parent-death watch).
            return
        if close_service_on_shutdown:
            await service.close()

    app = FastAPI(
        title=title,
        description="Prediction pipelines served under tail-latency SLOs.",
        lifespan=lifespan,
    )
    app.state.service = service

    @app.exception_handler(InferlineError)
    async def _on_inferline_error(_req: Request, exc: InferlineError) -> Response:
        return _error_response(exc)

    @app.exception_handler(BodyTooLarge)
    async def _on_too_large(_req: Request, exc: BodyTooLarge) -> Response:
        return _json_response(413, _too_large(exc.limit))

    # A bug, not a bad request: a JSON 500 like every other error (the guard logs the
    # traceback once and keeps the connection, which uvicorn would otherwise close).
    @app.exception_handler(Exception)
    async def _on_unexpected(_req: Request, exc: Exception) -> Response:
        return _json_response(500, _INTERNAL)

    @app.exception_handler(RequestValidationError)
    async def _on_request_validation(_req: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        first = errs[0] if errs else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return _json_response(
            422,
            {
                "detail": f"{field}: {first.get('msg', 'invalid')}",
                "error": "ValidationError",
                "field": field,
                "expected": first.get("msg", ""),
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(_req: Request, exc: StarletteHTTPException) -> Response:
        return _json_response(
            exc.status_code, {"detail": str(exc.detail), "error": "HTTPError"}, exc.headers
        )

    @app.post(
        "/apps/{app_name}/predict",
        summary="Predict with an application's pipeline",
        response_model=PredictResponse | BatchResponse,
        responses=_ERRORS,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": PredictRequest.model_json_schema()}},
            }
        },
    )
    async def predict(app_name: str, request: Request) -> Response:
        status, data, headers = await handle_predict(service, app_name, await request.body())
        return Response(data, status_code=status, media_type=_JSON, headers=headers)

    @app.get("/apps", summary="List applications")
    async def list_apps() -> dict[str, Any]:
        return {
            "apps": {
                a.name: {
                    "slo_ms": a.slo_s * 1e3,
                    "has_default": a.has_default,
                    "input": None if a.input_spec is None else a.input_spec.to_dict(),
                    "models": list(a.models),
                    "description": a.description,
                }
                for a in service.apps.values()
            }
        }

    @app.get("/healthz", summary="Liveness and replica counts")
    async def healthz() -> Response:
        h = service.health()
        return _json_response(200 if h["status"] == "ok" else 503, h)

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    for r in routers:
        app.include_router(r if isinstance(r, APIRouter) else r(service))

    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes, service=service)
    return app


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> Any:
    """A listening TCP socket (``port=0``: a free port; read it from ``getsockname()``)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:  # in use, not an address of this machine, privileged port
        sock.close()
        raise ValidationError(
            "--host/--port", "an address this server can listen on", f"{host}:{port} ({e.strerror})"
        ) from None
    sock.listen(2048)
    # Not inheritable (Python's default, said here because it matters): uvloop's subprocess
    # spawn keeps inheritable fds open, and replicas holding the listening socket kept the
    # port accepting connections that nobody would answer after the server stopped.
    sock.set_inheritable(False)
    return sock


DEFAULT_SHUTDOWN_GRACE_S = 20.0  # leaves time to stop replicas within Kubernetes' 30 s


def _server_class() -> type:
    import uvicorn

    class _GracefulServer(uvicorn.Server):  # type: ignore[misc]
        """uvicorn's server, except that a SIGTERM it has shut down for gracefully is not
        raised again afterwards: the process then exits 0, as Triton and TF Serving do, where
        uvicorn's re-raise killed it by the signal (status -15 / 143, which Kubernetes and
        Docker report as an error). SIGINT is still re-raised (KeyboardInterrupt, status 130).
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    # read by uvicorn's capture_signals after this block (uvicorn >= 0.29)
                    caught = getattr(self, "_captured_signals", None)
                    if isinstance(caught, list):
                        caught[:] = [s for s in caught if s != signal.SIGTERM]

    return _GracefulServer


async def serve_app(
    app: FastAPI,
    sock: Any,
    *,
    log_level: str = "warning",
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
) -> None:
    """Serve ``app`` with uvicorn on ``sock`` in the running event loop until SIGINT/SIGTERM
    (main thread) or until ``stop`` is set. ``ready()`` is called once it accepts connections.
    ``read_timeout_s``: how long a request may take to send its headers, and its body (408).
    ``shutdown_grace_s``: how long a SIGTERM waits for running requests; those still running
    then get a 503 ``ShuttingDown``, and the replicas are stopped.
    """
    import uvicorn

    from ._http_timeouts import timed_http_protocol

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
