"""The steer loop's own small HTTP app (no inference route: clients call the server itself).

``GET /metrics`` (Prometheus: estimated and measured P99 per app, the drift actions),
``GET /admin/drift`` (the loop's figures, instances, plan and events), ``POST /admin/detach``
(restore the operator's settings, then stop) and ``GET /health``. With a token every route
but ``/health`` wants ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["SteerRoutes", "steer_app"]


class SteerRoutes:
    """The handlers, over a loop (``snapshot()``), a registry and a detach action."""

    def __init__(
        self, loop: Any, registry: Any, detach: Callable[[], Awaitable[dict[str, Any]]]
    ) -> None:
        self.loop = loop
        self.registry = registry
        self.detach_fn = detach

    async def metrics(self) -> Any:
        from fastapi.responses import Response
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def drift(self) -> Any:
        from fastapi.responses import Response

        body = json.dumps(self.loop.snapshot(), default=str).encode()
        return Response(body, media_type="application/json")

    async def detach(self) -> dict[str, Any]:
        return await self.detach_fn()

    async def health(self) -> dict[str, str]:
        return {"status": "ok"}


def steer_app(routes: SteerRoutes, token: str | None = None) -> Any:
    """The FastAPI app of ``routes``, behind the bearer token if one is given."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="inferline steer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    app.add_api_route("/admin/drift", routes.drift, methods=["GET"])
    app.add_api_route("/admin/detach", routes.detach, methods=["POST"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    if token:
        want = f"Bearer {token}".encode()

        @app.middleware("http")
        async def bearer(request: Request, call_next: Any) -> Any:
            got = request.headers.get("authorization", "").encode()
            if request.url.path != "/health" and not hmac.compare_digest(got, want):
                return JSONResponse(
                    {"error": "Unauthorized", "detail": "a bearer token is required"},
                    status_code=401,
                    headers={"www-authenticate": "Bearer"},
                )
            return await call_next(request)

    return app
