"""HTTP routes of selection apps (``inferline.server._selection_app``): feedback and per-user queries.

``POST /apps/{app}/feedback`` with ``{"query_id": ...}`` or ``{"input": ...}``, the true
``"label"`` and optionally ``"user"``. The query id is the ``selection_query_id`` of the app's
answer; an input is decoded and checked exactly like a predict input, so it names the same
logged query. The feedback is joined to the predictions logged for that query and passed to the
policy's ``observe`` for the query's context (or ``user``'s); the state update is acknowledged
only once the store has it (durable with SQLite). Answers ``{"query_id", "context",
"models_observed", "steps"}``; an unknown query is a 404.

``POST /apps/{app}/select`` with ``{"input": ..., "user": ..., "latency_slo_ms": ...}``: the
same as ``/predict`` but in ``user``'s context (per-user policy state, Clipper's
contextualization).

``GET /apps/{app}/selection``: the policy's name and configuration, and its live status where
it has one (the ``rafiki`` policy: models per query and arrival rate over its recent window,
queries in flight).

Mounted by ``inferline serve`` when a deployment has selection apps, or by naming
``inferline.server._selection_routes:make_selection_router`` in ``create_app(routers=...)``.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import NotFoundError, ValidationError
from inferline.server._http import decode_json
from inferline.server._selection_app import current_user, selection_services

__all__ = ["make_selection_router"]

_MAX_SLO_MS = 3_600_000.0


def _body(raw: bytes, allowed: set[str]) -> dict[str, Any]:
    if not raw:
        raise ValidationError("body", "a JSON object", "an empty body")
    body = decode_json(raw, "a JSON object")
    if not isinstance(body, dict):
        raise ValidationError("body", "a JSON object", type(body).__name__)
    extra = sorted(set(body) - allowed)
    if extra:
        raise ValidationError(extra[0], f"only the fields {sorted(allowed)}", "unexpected field")
    return body


def _user(body: dict[str, Any]) -> str | None:
    u = body.get("user")
    if u is not None and (not isinstance(u, str) or not u or len(u) > 256):
        raise ValidationError("user", "a non-empty user id string (at most 256 characters)", u)
    return u


def _label(v: Any) -> Any:
    if isinstance(v, bool) or not (
        isinstance(v, str | int) or (isinstance(v, float) and math.isfinite(v))
    ):
        raise ValidationError("label", "the true label (a string or a number)", v)
    return v


def make_selection_router(service: Any) -> APIRouter:
    router = APIRouter(tags=["selection"])

    def sel_of(app: str) -> Any:
        service.app(app)  # 404 for an unknown app
        sel = selection_services(service).get(app)
        if sel is None:
            raise NotFoundError("selection app", app, sorted(selection_services(service)))
        return sel

    def json_response(body: Any, status: int = 200) -> Response:
        return Response(json.dumps(body), status_code=status, media_type="application/json")

    @router.post("/apps/{app}/feedback", summary="True label for a query of a selection app")
    async def feedback(app: str, request: Request) -> Response:
        sel = sel_of(app)
        body = _body(await request.body(), {"query_id", "input", "label", "user"})
        if "label" not in body:
            raise ValidationError("label", "the true label", None)
        label = _label(body["label"])
        qid = body.get("query_id")
        x = None
        if qid is not None:
            if not isinstance(qid, str) or not qid:
                raise ValidationError("query_id", "a query id string", qid)
        elif "input" in body:
            x = service.check_input(service.app(app), body["input"], "input")
        else:
            raise ValidationError("query_id", "a query id or the input", None)
        user = _user(body)
        # in a thread: a durable store's commit waits for the disk (fsync), not the loop
        answer = await asyncio.to_thread(sel.feedback, label, query_id=qid, x=x, user=user)
        return json_response(answer)

    @router.get("/apps/{app}/selection", summary="A selection app's policy and live status")
    async def status(app: str) -> Response:
        sel = sel_of(app)
        pol = sel.policy
        cfg = getattr(pol, "config", None)
        stat = getattr(pol, "status", None)
        body = {
            "app": app,
            "policy": pol.name,
            "models": list(pol.models),
            "config": cfg() if callable(cfg) else None,
            "status": stat() if callable(stat) else None,
        }
        return Response(
            json.dumps(body, default=str), status_code=200, media_type="application/json"
        )

    @router.post("/apps/{app}/select", summary="Predict in a user's selection context")
    async def select(app: str, request: Request) -> Response:
        from inferline.core import value_to_json

        sel_of(app)
        body = _body(await request.body(), {"input", "user", "latency_slo_ms"})
        if "input" not in body:
            raise ValidationError("input", "the query input", None)
        a = service.app(app)
        x = service.check_input(a, body["input"], "input")
        slo = body.get("latency_slo_ms")
        if slo is not None and (
            isinstance(slo, bool) or not isinstance(slo, int | float) or not 0 < slo <= _MAX_SLO_MS
        ):
            raise ValidationError("latency_slo_ms", f"a number in (0, {_MAX_SLO_MS:.0f}]", slo)
        token = current_user.set(_user(body))
        try:
            p = await service.predict(app, x, None if slo is None else slo / 1e3)
        finally:
            current_user.reset(token)
        return json_response(value_to_json(p.to_json()))

    return router
