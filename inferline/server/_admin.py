"""Operator endpoints of a running server (``/admin/...``), mounted by ``inferline serve``.

``GET /admin/plan`` the plan in force; ``PUT /admin/plan`` apply a new plan (replica counts
and batch sizes change in place: what ``inferline deploy PLAN --url ...`` sends; 502
``PlanPartlyApplied`` with the per-model results when a model could not be moved, which then
keeps its old configuration in ``GET /admin/plan``);
``GET /admin/models`` queue and backend statistics per model (replica ids, pids, restarts,
activation delays; with model variants, every variant's ``serves_stages``: the stages it serves
now, empty when idle); ``/admin/drain`` and ``/admin/undrain`` drain a fleet's servers
(``_fleet_routes``); ``POST /admin/detach`` (an attach server only: ``inferline detach
--server URL``) puts the operator's backend settings back and stops the server. They sit behind
the same bearer token as every other endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError, Plan, ValidationError, decode_json
from inferline.server._fleet_routes import FleetRoutes
from inferline.server._service import Service

__all__ = ["AdminRoutes", "check_inventory", "make_admin_router"]


def check_inventory(backend: Any, plan: Plan) -> None:
    """A plan's replicas within ``backend``'s inventory, before anything is applied: 422
    naming ``models.<name>.replicas`` (or ``.hardware``) for the first model that does not
    fit. One replica takes one unit of its hardware (on ``cpu``, its threads when the backend
    says: ``replica_units()``). A backend that oversubscribes shares its units instead and
    bounds them itself; with no backend (pure-Python apps) there is nothing to count."""
    if backend is None or getattr(backend, "oversubscribe", False):
        return
    inventory = dict(backend.inventory())
    units_of = getattr(backend, "replica_units", None)
    units = dict(units_of()) if callable(units_of) else {}
    used: dict[str, int] = {}
    for name, cfg in sorted(plan.models.items()):
        if cfg.replicas == 0:
            continue
        have = inventory.get(cfg.hardware)
        if have is None:
            raise ValidationError(
                f"models.{name}.hardware",
                f"hardware of the backend's inventory {inventory!r}",
                cfg.hardware,
            )
        per = units.get(name, 1) if cfg.hardware == "cpu" else 1
        used[cfg.hardware] = used.get(cfg.hardware, 0) + cfg.replicas * per
        if used[cfg.hardware] > have:
            room = max(0, have - (used[cfg.hardware] - cfg.replicas * per)) // max(per, 1)
            raise ValidationError(
                f"models.{name}.replicas",
                f"at most {room} replica(s) of {per} {cfg.hardware} unit(s): the backend's "
                f"inventory is {inventory!r} (the plan's models together may not exceed it)",
                cfg.replicas,
            )


_ERR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_PLAN_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "A plan (format inferline.plan/1): pipeline, slo_s, "
                    "models {name: {hardware, max_batch_size, replicas}}, ...",
                    "required": ["format", "pipeline", "slo_s", "models"],
                    "properties": {
                        "format": {"type": "string", "enum": ["inferline.plan/1"]},
                        "pipeline": {"type": "string"},
                        "slo_s": {"type": "number", "exclusiveMinimum": 0},
                        "models": {"type": "object"},
                    },
                }
            }
        },
    }
}
_DETACH_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
_APPLIED = {
    "type": "object",
    "properties": {"applied": {"type": "object", "additionalProperties": {"type": "string"}}},
}


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, default=str).encode(), status, media_type="application/json")


class AdminRoutes:
    """The ``/admin`` routes of one ``Service``; plans go to its ``plan_target``. ``detach``
    (an attach server): restores the operator's settings and stops the server, answering what
    it restored; it mounts ``POST /admin/detach``."""

    def __init__(
        self,
        service: Service,
        detach: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.service = service
        self.detach = detach

    def router(self) -> APIRouter:
        r = APIRouter(prefix="/admin", tags=["admin"])
        r.add_api_route("/plan", self.get_plan, methods=["GET"], summary="The plan in force")
        r.add_api_route(
            "/plan",
            self.put_plan,
            methods=["PUT"],
            summary="Apply a plan (inferline.plan/1) to the running deployment",
            openapi_extra=_PLAN_BODY,
            responses={
                200: {
                    "description": "Applied to every model",
                    "content": {"application/json": {"schema": _APPLIED}},
                },
                400: {"description": "Malformed JSON", **_ERR},
                404: {"description": "A model the server does not serve", **_ERR},
                422: {"description": "Not a valid plan, or beyond the inventory", **_ERR},
                502: {
                    "description": "PlanPartlyApplied: some models kept their configuration",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                503: {"description": "No capacity for the plan", **_ERR},
            },
        )
        r.add_api_route(
            "/models",
            self.models,
            methods=["GET"],
            summary="Queue and backend statistics per model",
        )
        FleetRoutes(self.service).add_to(r)  # drain/undrain a fleet's servers
        if self.detach is not None:
            r.add_api_route(
                "/detach",
                self.post_detach,
                methods=["POST"],
                summary="Put the operator's backend settings back and stop the attach server",
                openapi_extra=_DETACH_BODY,
                responses={
                    200: {
                        "description": "Restored; the server stops",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    400: {"description": "Malformed JSON", **_ERR},
                    502: {"description": "The backend did not take the settings back", **_ERR},
                },
            )
        return r

    async def post_detach(self, request: Request) -> Response:
        raw = await request.body()
        body = decode_json(raw, "a JSON object ({})") if raw.strip() else {}
        if not isinstance(body, dict):
            raise ValidationError("body", "a JSON object ({})", type(body).__name__)
        assert self.detach is not None
        return _json({"detached": True, **(await self.detach())})

    async def get_plan(self) -> Response:
        plan = self.service.plan
        return _json(None if plan is None else plan.to_dict())

    async def put_plan(self, request: Request) -> Response:
        body = decode_json(await request.body(), "a JSON plan (inferline.plan/1)")
        plan = Plan.from_dict(body)
        target = self.service.plan_target
        if target is None:
            raise ValidationError(
                "server", "a server started from a deployment or an attachment", "neither"
            )
        check_inventory(self.service.backend, plan)
        result = await target.apply(self.service, plan)
        failed = sorted(n for n, what in result.items() if what.startswith("failed"))
        if failed:  # a 200 here made scripts believe the whole plan was in force
            return _json(
                {
                    "error": "PlanPartlyApplied",
                    "detail": f"the plan did not reach {', '.join(failed)}; "
                    "GET /admin/plan shows what is in force",
                    "applied": result,
                },
                502,
            )
        return _json({"applied": result})

    async def models(self) -> Response:
        service = self.service
        out: dict[str, Any] = {}
        variants = service.variant_stages()
        for m in service.models:
            entry: dict[str, Any] = {}
            if service.dispatcher is not None:
                try:
                    entry["queue"] = service.dispatcher.stats(m).to_dict()
                    # the policy's name and state (AIMD's current size, Rafiki's sizes)
                    entry["batching"] = service.dispatcher.batching(m).to_dict()
                except InferlineError as e:
                    entry["queue"] = {"error": str(e)}
            if service.backend is not None:
                try:
                    entry["backend"] = dict(await service.backend.stats(m))
                except InferlineError as e:
                    entry["backend"] = {"error": str(e)}
            if m in variants:  # model variants: the pipeline stages this model serves now
                entry["serves_stages"] = variants[m]
            out[m] = entry
        return _json(out)


def make_admin_router(
    service: Service, detach: Callable[[], Awaitable[dict[str, Any]]] | None = None
) -> APIRouter:
    """The ``/admin`` router of ``service`` (a factory for ``create_app(routers=...)``)."""
    return AdminRoutes(service, detach).router()
