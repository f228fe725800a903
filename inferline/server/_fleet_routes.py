"""Draining a fleet's servers (``/admin/drain``, ``/admin/undrain``), mounted with ``/admin``.

``POST /admin/drain {"server": URL, "wait_s": 30}`` stops new batches to one member of the
fleet backend (a deployment whose ``"backend"`` is a list of URLs); batches in flight there
finish. With ``wait_s`` the answer comes when the member is empty or the wait is over;
``"empty": true`` says the server may be stopped. ``GET /admin/drain`` reports every member
(``?server=URL``: one). ``POST /admin/undrain {"server": URL}`` sends it batches again. On a
backend that is not a fleet the routes answer 422 naming ``backend``. Same bearer token as
every other endpoint (``inferline drain``/``undrain`` send it).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import ValidationError, as_float, as_str, decode_json, no_extra_keys
from inferline.server._service import Service

__all__ = ["FleetRoutes"]

_MAX_WAIT_S = 600.0
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["server"],
                    "properties": {
                        "server": {"type": "string", "description": "a member's URL"},
                        "wait_s": {"type": "number", "minimum": 0, "maximum": _MAX_WAIT_S},
                    },
                }
            }
        },
    }
}
_ERR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The drain status (one member, or every member under 'servers')",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    400: {"description": "Malformed JSON", **_ERR},
    404: {"description": "Not a member of the fleet", **_ERR},
    422: {"description": "Not a valid request, or the backend is not a fleet", **_ERR},
}


def _json(body: Any) -> Response:
    return Response(json.dumps(body).encode(), 200, media_type="application/json")


class FleetRoutes:
    """The drain routes of one ``Service`` whose backend may be a fleet."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def _fleet(self) -> Any:
        backend = self.service.backend
        if not callable(getattr(backend, "drain", None)):
            raise ValidationError(
                "backend", "a fleet (a deployment's backend as a list of URLs)", backend
            )
        return backend

    def add_to(self, r: APIRouter) -> None:
        r.add_api_route(
            "/drain",
            self.post_drain,
            methods=["POST"],
            summary="Stop new batches to one server of the fleet; in-flight ones finish",
            openapi_extra=_BODY,
            responses=_RESPONSES,
        )
        r.add_api_route(
            "/drain",
            self.get_drain,
            methods=["GET"],
            summary="Drain status of the fleet's servers",
            responses=_RESPONSES,
        )
        r.add_api_route(
            "/undrain",
            self.post_undrain,
            methods=["POST"],
            summary="Send batches to a drained server again",
            openapi_extra=_BODY,
            responses=_RESPONSES,
        )

    @staticmethod
    async def _body(request: Request) -> tuple[str, float]:
        body = decode_json(await request.body(), 'a JSON object {"server": URL}')
        if not isinstance(body, dict):
            raise ValidationError("body", 'a JSON object {"server": URL}', type(body).__name__)
        no_extra_keys(body, {"server", "wait_s"}, "")
        if "server" not in body:
            raise ValidationError("server", "a member's URL", None)
        server = as_str(body["server"], "server")
        wait_s = as_float(body.get("wait_s", 0.0), "wait_s", lo=0.0, hi=_MAX_WAIT_S)
        return server, wait_s

    async def post_drain(self, request: Request) -> Response:
        server, wait_s = await self._body(request)
        fleet = self._fleet()
        fleet.drain(server)
        if wait_s > 0:
            await fleet.wait_drained(server, wait_s)
        return _json(fleet.drain_status(server))

    async def post_undrain(self, request: Request) -> Response:
        server, _ = await self._body(request)
        return _json(self._fleet().undrain(server))

    async def get_drain(self, server: str | None = None) -> Response:
        return _json(self._fleet().drain_status(server))
