"""HTTP API of Velox as a FastAPI router (mounted by the frontend app).

    POST /velox/{model}/predict    {"uid": str, "x": item}                     -> Prediction
    POST /velox/{model}/top_k      {"uid": str, "items": [item], "k": int, "alpha": float?}
    POST /velox/{model}/observe    {"uid": str, "x": item, "y": float}          -> ObserveResult
    POST /velox/{model}/retrain    {"reason": str?, "wait": bool?}              -> RetrainJob (202)
    GET  /velox/{model}/versions                                                -> versions
    POST /velox/{model}/rollback   {"version": int}                             -> VersionRecord
    GET  /velox/{model}/users/{uid}, /stats, /events

An item ``x`` is any JSON value, or a tensor as ``{"dtype", "shape", "b64"}`` (the project wire form)
(base64 raw bytes). Errors are JSON ``{"error": {"type", "message", "field"?, "expected"?}}``:
422 for malformed input (naming the field), 404 for unknown models, users, items or versions,
421 for a uid that another frontend's partition owns, 413 for an oversized body, 502 when the
feature function's backend fails.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inferline.core.errors import BackendError, InferlineError, NotFoundError, ValidationError

from ._codec import decode_value
from ._partition import WrongPartitionError
from ._service import VeloxService

__all__ = ["error_response", "make_velox_router"]

log = logging.getLogger(__name__)


def error_response(e: Exception) -> JSONResponse:
    """The JSON error body and status code for an exception raised while serving."""
    body: dict[str, Any] = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, ValidationError):
        status = 422
        body.update(field=e.field, expected=e.expected)
    elif isinstance(e, NotFoundError):
        status = 404
        body.update(
            kind=e.kind, name=e.name if isinstance(e.name, (str, int, float)) else repr(e.name)
        )
    elif isinstance(e, WrongPartitionError):
        status = 421
        body.update(partition=e.partition, owned=list(e.owned))
    elif isinstance(e, BackendError):
        status = 502
    elif isinstance(e, InferlineError):
        status = 500
    else:
        log.exception("unexpected error in the velox API", exc_info=e)
        status = 500
        body = {"type": "InternalError", "message": "internal error (see the server log)"}
    return JSONResponse({"error": body}, status_code=status)


def _field(body: dict[str, Any], name: str, expected: str, *, default: Any = ...) -> Any:
    if name not in body:
        if default is ...:
            raise ValidationError(name, expected, "missing")
        return default
    return body[name]


def _number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValidationError(name, "a number", v)
    return float(v)


def make_velox_router(
    service: VeloxService, *, max_body_bytes: int = 8 << 20, dependencies: Sequence[Any] = ()
) -> APIRouter:
    """Routes under ``/velox`` serving ``service``; ``dependencies`` (e.g. a bearer-token check)
    apply to every route."""
    router = APIRouter(prefix="/velox", tags=["velox"], dependencies=list(dependencies))

    async def body_of(request: Request, allowed: set[str]) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > max_body_bytes:
            raise _TooLarge(len(raw), max_body_bytes)
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValidationError("body", "a JSON object", f"invalid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ValidationError("body", "a JSON object", type(body).__name__)
        extra = set(body) - allowed
        if extra:
            raise ValidationError(
                sorted(extra)[0], f"only the fields {sorted(allowed)}", "unexpected field"
            )
        return body

    async def guarded(fn: Callable[[], Awaitable[Any]], status: int = 200) -> JSONResponse:
        try:
            result = await fn()
        except _TooLarge as e:
            return JSONResponse(
                {"error": {"type": "PayloadTooLarge", "message": str(e)}}, status_code=413
            )
        except Exception as e:
            return error_response(e)
        return JSONResponse(_finite(result), status_code=status)

    @router.post("/{model}/predict")
    async def predict(model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await body_of(request, {"uid", "x"})
            x = decode_value(_field(b, "x", "an item (JSON value or tensor)"), "x")
            uid = _field(b, "uid", "a user id string")
            return (await service.predict(model, uid, x)).to_dict()

        return await guarded(run)

    @router.post("/{model}/top_k")
    async def top_k(model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await body_of(request, {"uid", "items", "k", "alpha"})
            items = _field(b, "items", "a non-empty list of items")
            if not isinstance(items, list):
                raise ValidationError("items", "a non-empty list of items", type(items).__name__)
            items = [decode_value(x, f"items[{i}]") for i, x in enumerate(items)]
            alpha = b.get("alpha")
            if alpha is not None:
                alpha = _number(alpha, "alpha")
            res = await service.top_k(
                model, _field(b, "uid", "a user id string"), items, b.get("k", 10), alpha
            )
            return res.to_dict()

        return await guarded(run)

    @router.post("/{model}/observe")
    async def observe(model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await body_of(request, {"uid", "x", "y"})
            x = decode_value(_field(b, "x", "an item (JSON value or tensor)"), "x")
            y = _number(_field(b, "y", "a number (the label)"), "y")
            return (
                await service.observe(model, _field(b, "uid", "a user id string"), x, y)
            ).to_dict()

        return await guarded(run)

    @router.post("/{model}/retrain")
    async def retrain(model: str, request: Request) -> JSONResponse:
        wait = False

        async def run() -> Any:
            nonlocal wait
            b = await body_of(request, {"reason", "wait"})
            reason = b.get("reason", "manual")
            if not isinstance(reason, str) or not reason:
                raise ValidationError("reason", "a non-empty string", reason)
            wait = b.get("wait", False)
            if not isinstance(wait, bool):
                raise ValidationError("wait", "true or false", wait)
            return (await service.retrain(model, reason, wait=wait)).to_dict()

        resp = await guarded(run, status=202)
        if wait and resp.status_code == 202:
            resp.status_code = 200  # the job has finished (or failed): report, not accept
        return resp

    @router.get("/{model}/versions")
    async def versions(model: str) -> JSONResponse:
        async def run() -> Any:
            current = service.current_version(model)
            return {
                "model": model,
                "current": current,
                "versions": [
                    {**v.to_dict(), "current": v.version == current}
                    for v in service.versions(model)
                ],
                "jobs": [j.to_dict() for j in service.jobs(model)],
            }

        return await guarded(run)

    @router.post("/{model}/rollback")
    async def rollback(model: str, request: Request) -> JSONResponse:
        async def run() -> Any:
            b = await body_of(request, {"version"})
            v = _field(b, "version", "an int (an existing version)")
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValidationError("version", "an int (an existing version)", v)
            rec = await service.rollback(model, v)
            return {"model": model, "current": rec.version, "version": rec.to_dict()}

        return await guarded(run)

    @router.get("/{model}/users/{uid}")
    async def user(model: str, uid: str) -> JSONResponse:
        async def run() -> Any:
            return service.user(model, uid)

        return await guarded(run)

    @router.get("/{model}/stats")
    async def stats(model: str) -> JSONResponse:
        async def run() -> Any:
            return service.stats(model)

        return await guarded(run)

    @router.get("/{model}/events")
    async def events(model: str) -> JSONResponse:
        async def run() -> Any:
            return {"model": model, "events": service.events(model)}

        return await guarded(run)

    return router


def _finite(x: Any) -> Any:
    """Non-finite floats as null: JSON has no NaN (a fresh loss average is NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"request body of {size} bytes exceeds the limit of {limit}")
