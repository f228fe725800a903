"""HTTP API of Velox as a FastAPI router (mounted by the frontend app).

    POST /velox/{model}/predict    {"uid": str, "x": item}                     -> Prediction
    POST /velox/{model}/top_k      {"uid": str, "items": [item], "k": int, "alpha": float?}
    POST /velox/{model}/observe    {"uid": str, "x": item, "y": float}          -> ObserveResult
    POST /velox/{model}/retrain    {"reason": str?, "wait": bool?}              -> RetrainJob (202)
    GET  /velox/{model}/versions                                                -> versions
    POST /velox/{model}/rollback   {"version": int}                             -> VersionRecord
    GET  /velox/{model}/users/{uid} (uid may hold "/"), /stats, /events

An item ``x`` is any JSON value, or a tensor as ``{"dtype", "shape", "b64"}`` (the project wire form)
(base64 raw bytes). Errors have the shape of every inferline route,
``{"detail": message, "error": class, "field"?, "expected"?, ...}``: 400 for a body that is not
JSON, 422 for malformed input (naming the field), 404 for unknown models, users, items or
versions, 421 for a uid that another frontend's partition owns, 413 for an oversized body, 502
when the feature function's backend fails, 504 when it does not answer in time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inferline.core import BodyTooLarge, decode_json, error_body, json_safe, status_for
from inferline.core.errors import InferlineError, NotFoundError, ValidationError

from ._codec import decode_value
from ._partition import WrongPartitionError
from ._service import VeloxService

__all__ = ["VeloxRoutes", "error_response", "make_velox_router"]

log = logging.getLogger(__name__)


def error_response(e: Exception) -> JSONResponse:
    """The JSON error body and status code for an exception raised while serving: the shape
    of every inferline route (``inferline.core.error_body``), plus ``partition``/``owned``
    for a uid that another frontend owns (421)."""
    if isinstance(e, WrongPartitionError):
        body = {**error_body(e), "partition": e.partition, "owned": list(e.owned)}
        return JSONResponse(body, status_code=421)
    if isinstance(e, NotFoundError):
        body = {**error_body(e), "name": json_safe(e.name) if _plain(e.name) else repr(e.name)}
        return JSONResponse(body, status_code=404)
    if isinstance(e, InferlineError | BodyTooLarge):
        return JSONResponse(error_body(e), status_code=status_for(e))
    log.exception("unexpected error in the velox API", exc_info=e)
    return JSONResponse(
        {"detail": "internal error (see the server log)", "error": "InternalError"},
        status_code=500,
    )


def _plain(v: Any) -> bool:
    return isinstance(v, str | int | float) and not isinstance(v, bool)


def _field(body: dict[str, Any], name: str, expected: str, *, default: Any = ...) -> Any:
    if name not in body:
        if default is ...:
            raise ValidationError(name, expected, "missing")
        return default
    return body[name]


def _number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValidationError(name, "a finite number", v)
    try:
        f = float(v)
    except OverflowError:
        raise ValidationError(name, "a finite number", "an integer beyond float range") from None
    if not math.isfinite(f):
        raise ValidationError(name, "a finite number", repr(f))
    return f


class VeloxRoutes:
    """The ``/velox`` routes of one :class:`VeloxService`: one small method per route, each
    parsing its body, calling the service and answering through :meth:`guarded` (errors in
    the shape of every inferline route)."""

    def __init__(self, service: VeloxService, *, max_body_bytes: int = 8 << 20) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes

    def router(self, dependencies: Sequence[Any] = ()) -> APIRouter:
        r = APIRouter(prefix="/velox", tags=["velox"], dependencies=list(dependencies))
        for path, fn, method in (
            ("/{model}/predict", self.predict, "POST"),
            ("/{model}/top_k", self.top_k, "POST"),
            ("/{model}/observe", self.observe, "POST"),
            ("/{model}/retrain", self.retrain, "POST"),
            ("/{model}/versions", self.versions, "GET"),
            ("/{model}/rollback", self.rollback, "POST"),
            ("/{model}/users/{uid:path}", self.user, "GET"),
            ("/{model}/stats", self.stats, "GET"),
            ("/{model}/events", self.events, "GET"),
        ):
            r.add_api_route(path, fn, methods=[method])
        return r

    async def body_of(self, request: Request, allowed: set[str]) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > self.max_body_bytes:
            raise BodyTooLarge(self.max_body_bytes)
        if not raw:
            return {}
        body = decode_json(raw, "a JSON object")
        if not isinstance(body, dict):
            raise ValidationError("body", "a JSON object", type(body).__name__)
        extra = set(body) - allowed
        if extra:
            raise ValidationError(
                sorted(extra)[0], f"only the fields {sorted(allowed)}", "unexpected field"
            )
        return body

    @staticmethod
    async def guarded(fn: Callable[[], Awaitable[Any]], status: int = 200) -> JSONResponse:
        try:
            result = await fn()
        except Exception as e:  # BodyTooLarge from the frontend's guard (chunked) too: 413
            return error_response(e)
        return JSONResponse(_finite(result), status_code=status)

    async def predict(self, model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await self.body_of(request, {"uid", "x"})
            x = decode_value(_field(b, "x", "an item (JSON value or tensor)"), "x")
            uid = _field(b, "uid", "a user id string")
            return (await self.service.predict(model, uid, x)).to_dict()

        return await self.guarded(run)

    async def top_k(self, model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await self.body_of(request, {"uid", "items", "k", "alpha"})
            items = _field(b, "items", "a non-empty list of items")
            if not isinstance(items, list):
                raise ValidationError("items", "a non-empty list of items", type(items).__name__)
            items = [decode_value(x, f"items[{i}]") for i, x in enumerate(items)]
            alpha = b.get("alpha")
            if alpha is not None:
                alpha = _number(alpha, "alpha")
            uid = _field(b, "uid", "a user id string")
            return (await self.service.top_k(model, uid, items, b.get("k", 10), alpha)).to_dict()

        return await self.guarded(run)

    async def observe(self, model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await self.body_of(request, {"uid", "x", "y"})
            x = decode_value(_field(b, "x", "an item (JSON value or tensor)"), "x")
            y = _number(_field(b, "y", "a number (the label)"), "y")
            uid = _field(b, "uid", "a user id string")
            return (await self.service.observe(model, uid, x, y)).to_dict()

        return await self.guarded(run)

    async def retrain(self, model: str, request: Request) -> JSONResponse:
        wait = False

        async def run() -> Any:
            nonlocal wait
            b = await self.body_of(request, {"reason", "wait"})
            reason = b.get("reason", "manual")
            if not isinstance(reason, str) or not reason:
                raise ValidationError("reason", "a non-empty string", reason)
            wait = b.get("wait", False)
            if not isinstance(wait, bool):
                raise ValidationError("wait", "true or false", wait)
            return (await self.service.retrain(model, reason, wait=wait)).to_dict()

        resp = await self.guarded(run, status=202)
        if wait and resp.status_code == 202:
            resp.status_code = 200  # the job has finished (or failed): report, not accept
        return resp

    async def versions(self, model: str) -> JSONResponse:
        async def run() -> Any:
            current = self.service.current_version(model)
            return {
                "model": model,
                "current": current,
                "versions": [
                    {**v.to_dict(), "current": v.version == current}
                    for v in self.service.versions(model)
                ],
                "jobs": [j.to_dict() for j in self.service.jobs(model)],
            }

        return await self.guarded(run)

    async def rollback(self, model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await self.body_of(request, {"version"})
            v = _field(b, "version", "an int (an existing version)")
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValidationError("version", "an int (an existing version)", v)
            rec = await self.service.rollback(model, v)
            return {"model": model, "current": rec.version, "version": rec.to_dict()}

        return await self.guarded(run)

    async def user(self, model: str, uid: str) -> JSONResponse:
        async def run() -> Any:
            return self.service.user(model, uid)

        return await self.guarded(run)

    async def stats(self, model: str) -> JSONResponse:
        async def run() -> Any:
            return self.service.stats(model)

        return await self.guarded(run)

    async def events(self, model: str) -> JSONResponse:
        async def run() -> Any:
            return {"model": model, "events": self.service.events(model)}

        return await self.guarded(run)


def make_velox_router(
    service: VeloxService, *, max_body_bytes: int = 8 << 20, dependencies: Sequence[Any] = ()
) -> APIRouter:
    """Routes under ``/velox`` serving ``service``; ``dependencies`` (e.g. a bearer-token check)
    apply to every route."""
    return VeloxRoutes(service, max_body_bytes=max_body_bytes).router(dependencies)


def _finite(x: Any) -> Any:
    """Non-finite floats as null: JSON has no NaN (a fresh loss average is NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
