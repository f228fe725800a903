"""Operator endpoints of a running server (``/admin/...``), mounted by ``inferline serve``.

``GET /admin/plan`` the plan in force; ``PUT /admin/plan`` apply a new plan (replica counts
and batch sizes change in place: what ``inferline deploy PLAN --url ...`` sends; 502
``PlanPartlyApplied`` with the per-model results when a model could not be moved, which then
keeps its old configuration in ``GET /admin/plan``);
``GET /admin/models`` queue and backend statistics per model (replica ids, pids, restarts,
activation delays; with model variants, every variant's ``serves_stages``: the stages it serves
now, empty when idle). They sit behind the same bearer token as every other endpoint.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError, Plan

from ._app import decode_json
from ._deploy import apply_plan
from ._service import Service

__all__ = ["make_admin_router"]


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, default=str).encode(), status, media_type="application/json")


def make_admin_router(service: Service) -> APIRouter:
    r = APIRouter(prefix="/admin", tags=["admin"])

    @r.get("/plan", summary="The plan in force")
    async def get_plan() -> Response:
        plan = service.plan
        return _json(None if plan is None else plan.to_dict())

    @r.put("/plan", summary="Apply a plan (inferline.plan/1) to the running deployment")
    async def put_plan(request: Request) -> Response:
        body = decode_json(await request.body(), "a JSON plan (inferline.plan/1)")
        plan = Plan.from_dict(body)
        if service.attachment is not None:  # inferline attach: the attached models, in place
            from ._attach import apply_attachment_plan

            result = await apply_attachment_plan(service, service.attachment, plan)
        else:
            result = await apply_plan(service, plan)
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

    @r.get("/models", summary="Queue and backend statistics per model")
    async def models() -> Response:
        out: dict[str, Any] = {}
        variants = service.variant_stages()
        for m in service.models:
            entry: dict[str, Any] = {}
            if service.dispatcher is not None:
                try:
                    entry["queue"] = service.dispatcher.stats(m).to_dict()
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

    return r
