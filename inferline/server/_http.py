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
import json
import logging
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from inferline.core import (
    BodyTooLarge,
    InferlineError,
    MalformedJSON,
    decode_json,
    error_body,
    status_for,
)
from inferline.server._guard import Guard, json_exempt
from inferline.server._predict import handle_predict, http_answer
from inferline.server._predict_route import PredictRoute
from inferline.server._replies import INTERNAL_ERROR, too_large
from inferline.server._service import Service

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "AppRoutes",
    "MalformedJSON",
    "RouterSource",
    "create_app",
    "decode_json",
    "error_body",
    "handle_predict",
    "status_for",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 20
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
    status, body, headers = http_answer(exc)  # 429 + Retry-After for a predicted-late refusal
    return _json_response(status, body, headers)


# ---------------------------------------------------------------- the ASGI guard


# ---------------------------------------------------------------- OpenAPI descriptions


class PredictRequest(BaseModel):
    """One query (``input``) or several (``input_batch``), with an optional per-query SLO."""

    input: Any = Field(
        None,
        description="The query: JSON, or an array as {dtype, shape, b64} / {dtype, data}",
    )
    input_batch: list[Any] | None = Field(None, description="Several queries, answered in order")
    latency_slo_ms: float | None = Field(
        None, gt=0, description="Shorten the app's SLO for this query (the app's is the cap)"
    )
    priority: int | None = Field(
        None,
        ge=-100,
        le=100,
        description="Priority class: higher is served first, EDF within a class (default 0)",
    )


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
    s: {"model": ErrorResponse} for s in (400, 401, 404, 413, 422, 429, 502, 503, 504)
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_JSON_ERROR = {"content": {_JSON: {"schema": _ERROR_REF}}}
# What the guard may answer on any operation, before the route runs.
_GUARD_RESPONSES: dict[str, dict[str, Any]] = {
    "401": {"description": "Missing or wrong bearer token", **_JSON_ERROR},
    "421": {"description": "A Host header outside the server's allowlist", **_JSON_ERROR},
}
_BODY_RESPONSES: dict[str, dict[str, Any]] = {
    "400": {"description": "Bad Content-Length header or malformed body", **_JSON_ERROR},
    "413": {"description": "Request body over the server's limit", **_JSON_ERROR},
}
_JSON_ONLY_RESPONSES: dict[str, dict[str, Any]] = {
    "415": {"description": "The body is not JSON (Content-Type)", **_JSON_ERROR},
}


# ---------------------------------------------------------------- request parsing


# ---------------------------------------------------------------- the app


async def _on_inferline_error(_req: Request, exc: Exception) -> Response:
    return _error_response(exc)


async def _on_too_large(_req: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyTooLarge)
    return _json_response(413, too_large(exc.limit))


async def _on_unexpected(_req: Request, exc: Exception) -> Response:
    # A bug, not a bad request: a JSON 500 like every other error (the guard logs the
    # traceback once and keeps the connection, which uvicorn would otherwise close).
    return _json_response(500, INTERNAL_ERROR)


async def _on_request_validation(_req: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
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


async def _on_http(req: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = exc.headers
    if exc.status_code == 405:  # every method of the path, not only the first route's
        headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(req))}
    return _json_response(
        exc.status_code, {"detail": str(exc.detail), "error": "HTTPError"}, headers
    )


def _allowed_methods(req: Request) -> list[str]:
    methods: set[str] = set()
    for route in req.app.router.routes:
        match, _ = route.matches(req.scope)  # PARTIAL: the path, not the method
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)


_EXCEPTION_HANDLERS: tuple[tuple[type[Exception], Any], ...] = (
    (InferlineError, _on_inferline_error),
    (BodyTooLarge, _on_too_large),
    (Exception, _on_unexpected),
    (RequestValidationError, _on_request_validation),
    (StarletteHTTPException, _on_http),
)


_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}


class AppRoutes:
    """The built-in routes over a ``Service``: predict, the app list, health and metrics."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def router(self) -> APIRouter:
        r = APIRouter()
        r.add_api_route(
            "/apps/{app_name}/predict",
            self.predict,
            methods=["POST"],
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
        r.add_api_route("/apps", self.list_apps, methods=["GET"], summary="List applications")
        r.add_api_route(
            "/healthz",
            self.healthz,
            methods=["GET"],
            summary="Liveness and replica counts",
            responses={
                200: {"description": "Serving", "content": {_JSON: {"schema": _HEALTH}}},
                503: {
                    "description": "Closing or a model down",
                    "content": {_JSON: {"schema": _HEALTH}},
                },
            },
        )
        r.add_api_route(
            "/metrics",
            self.metrics,
            methods=["GET"],
            summary="Prometheus metrics",
            response_class=PlainTextResponse,
        )
        return r

    async def predict(self, app_name: str, request: Request) -> Response:
        status, data, headers = await handle_predict(self.service, app_name, await request.body())
        return Response(data, status_code=status, media_type=_JSON, headers=headers)

    async def list_apps(self) -> dict[str, Any]:
        return {
            "apps": {
                a.name: {
                    "slo_ms": a.slo_s * 1e3,
                    "has_default": a.has_default,
                    "input": None if a.input_spec is None else a.input_spec.to_dict(),
                    "models": list(a.models),
                    "description": a.description,
                }
                for a in self.service.apps.values()
            }
        }

    async def healthz(self) -> Response:
        h = self.service.health()
        return _json_response(200 if h["status"] == "ok" else 503, h)

    async def metrics(self) -> Response:
        return Response(self.service.metrics.render(), media_type="text/plain; version=0.0.4")


def create_app(
    service: Service,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    routers: Sequence[RouterSource] = (),
    close_service_on_shutdown: bool = True,
    title: str = "inferline",
    allowed_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The ASGI app serving ``service``. ``token``: require ``Authorization: Bearer <token>``
    on every endpoint. ``routers``: extra routers or ``service -> APIRouter`` factories.
    ``allowed_hosts``: the ``Host`` names it answers to (None: the address a connection
    reached and the localhost names; ``*``: any)."""

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
    for exc, handler in _EXCEPTION_HANDLERS:
        app.add_exception_handler(exc, handler)
    app.include_router(AppRoutes(service).router())
    fast_paths = []
    for r in routers:
        router = r if isinstance(r, APIRouter) else r(service)
        app.include_router(router)
        fast_paths += getattr(router, "inferline_fast_paths", [])
    # add_middleware puts the last one outermost: the guard checks every request, then the
    # predict route answers the data path (native and protocol doors' inference routes)
    # before FastAPI's routing.
    app.add_middleware(
        PredictRoute, service=service, max_body_bytes=max_body_bytes, fast_paths=fast_paths
    )
    # what door worker processes (``_workers``) need to guard and answer the same way
    app.state.door = {
        "token": token,
        "max_body_bytes": max_body_bytes,
        "allowed_hosts": None if allowed_hosts is None else list(allowed_hosts),
        "fast_paths": fast_paths,
    }
    app.add_middleware(
        Guard,
        token=token,
        max_body_bytes=max_body_bytes,
        allowed_hosts=None if allowed_hosts is None else tuple(allowed_hosts),
    )
    _finish_openapi(app, token_required=bool(token))
    return app


BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "The server's token (inferline serve --token or $INFERLINE_TOKEN), on every "
    "endpoint when the server has one",
}


def _finish_openapi(app: FastAPI, *, token_required: bool) -> None:
    """What the route declarations cannot say: the bearer scheme (``components.
    securitySchemes`` and the top-level ``security``: required when the server has a token,
    else optional) and the guard's answers on every operation (401, 421; 400/413 where a body
    is read; 415 on mutating routes that take JSON only)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            comps = doc.setdefault("components", {})
            comps.setdefault("securitySchemes", {})["bearer"] = BEARER_SCHEME
            comps.setdefault("schemas", {}).setdefault(
                "ErrorResponse", ErrorResponse.model_json_schema()
            )
            doc["security"] = [{"bearer": []}] if token_required else [{}, {"bearer": []}]
            for path, item in doc.get("paths", {}).items():
                for method, op in item.items():
                    extra = dict(_GUARD_RESPONSES)
                    if method in ("post", "put", "patch", "delete"):
                        extra.update(_BODY_RESPONSES)
                        if not json_exempt(path):
                            extra.update(_JSON_ONLY_RESPONSES)
                    responses = op.setdefault("responses", {})
                    for code, resp in extra.items():
                        responses.setdefault(code, resp)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
