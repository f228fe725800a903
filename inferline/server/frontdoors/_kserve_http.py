"""KServe v2 over HTTP: health, metadata, model-configuration, statistics and inference routes (what tritonclient and perf_analyzer call)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError
from inferline.server._http import error_body, status_for
from inferline.server._service import Service
from inferline.server.frontdoors._deadline import kserve_limits
from inferline.server.frontdoors._door import (
    KSERVE_EXTENSIONS,
    KSERVE_OF,
    FrontDoor,
    TensorInfo,
    decode_off_loop,
)
from inferline.server.frontdoors._kserve_codec import header_length, kserve_decode, kserve_encode

__all__ = [
    "InferFastPath",
    "KServeRoutes",
    "encode_answer",
    "infer_model",
    "kserve_error",
    "make_kserve_router",
    "requested_outputs",
]

_JSON = "application/json"


def _kserve_error_parts(
    e: BaseException, not_found: int = 404
) -> tuple[int, bytes, str, dict[str, str] | None]:
    status = status_for(e) if isinstance(e, InferlineError) else 500
    if status == 422:
        status = 400  # KServe clients expect 400 for a bad request
    if status == 404:
        status = not_found  # Triton answers 400 for an unknown model's config and stats
    return status, json.dumps({**error_body(e), "error": str(e)}).encode(), _JSON, None


def _kserve_error(e: BaseException, not_found: int = 404) -> Response:
    status, body, media, _ = _kserve_error_parts(e, not_found)
    return Response(body, status_code=status, media_type=media)


_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string"}},
            }
        }
    }
}
_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}
_NO_BODY = {"response_class": Response}
_INFER_DOCS: dict[str, Any] = {
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                },
            },
        }
    },
    "responses": {
        200: {
            "description": "Outputs (JSON, or JSON header + binary tensors)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        **{
            c: {"description": d, **_ERROR}
            for c, d in (
                (400, "Bad request"),
                (404, "Unknown model"),
                (409, "Infeasible"),
                (502, "Backend error"),
                (503, "Overloaded or closing"),
                (504, "Deadline exceeded"),
            )
        },
    },
}


class KServeRoutes:
    """KServe v2 HTTP routes over a ``FrontDoor``: one method per route."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door

    def router(self) -> APIRouter:
        r = APIRouter(tags=["KServe v2"])
        r.add_api_route("/v2", self.server_metadata, methods=["GET"])
        r.add_api_route(
            "/v2/health/live",
            self.live,
            methods=["GET"],
            responses={200: {"description": "Live"}},
            **_NO_BODY,
        )
        r.add_api_route(
            "/v2/health/ready",
            self.ready,
            methods=["GET"],
            responses={200: {"description": "Ready"}, 503: {"description": "Not ready"}},
            **_NO_BODY,
        )
        meta = {
            200: {"description": "Model metadata", **_OBJECT},
            404: {"description": "Unknown model", **_ERROR},
        }
        ready = {
            200: {"description": "Ready"},
            400: {"description": "Unknown model"},
            503: {"description": "Not ready"},
        }
        config = {
            200: {"description": "Model configuration (Triton's extension)", **_OBJECT},
            400: {"description": "Unknown model", **_ERROR},
        }
        stats = {
            200: {"description": "Statistics (KServe's extension)", **_OBJECT},
            400: {"description": "Unknown model", **_ERROR},
        }
        # before ``/v2/models/{model}``: every name's statistics
        r.add_api_route(
            "/v2/models/stats", self.all_stats, methods=["GET"], responses=stats, **_NO_BODY
        )
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_api_route(
                prefix, self.model_metadata, methods=["GET"], responses=meta, **_NO_BODY
            )
            r.add_api_route(
                prefix + "/config",
                self.model_config,
                methods=["GET"],
                responses=config,
                **_NO_BODY,
            )
            r.add_api_route(
                prefix + "/stats", self.model_stats, methods=["GET"], responses=stats, **_NO_BODY
            )
            r.add_api_route(
                prefix + "/ready",
                self.model_ready,
                methods=["GET"],
                responses=ready,
                **_NO_BODY,
            )
            r.add_api_route(
                prefix + "/infer", self.infer, methods=["POST"], **_INFER_DOCS, **_NO_BODY
            )
        return r

    async def server_metadata(self) -> dict[str, Any]:
        from inferline.core import __version__

        return {"name": "inferline", "version": __version__, "extensions": list(KSERVE_EXTENSIONS)}

    async def live(self) -> Response:
        return Response(status_code=200)

    async def ready(self) -> Response:
        return Response(status_code=200 if self.door.ready() else 503)

    async def model_metadata(self, model: str, version: str = "1") -> Response:
        try:
            sig = await self.door.describe(model)
        except InferlineError as e:
            return _kserve_error(e)

        def meta(t: TensorInfo) -> dict[str, Any]:
            return {
                "name": t.name,
                "datatype": KSERVE_OF.get(t.dtype, "FP32"),
                "shape": [-1, *t.shape],
            }

        body = {
            "name": model,
            "versions": ["1"],
            "platform": "inferline",
            "inputs": [meta(t) for t in sig.inputs],
            "outputs": [meta(t) for t in sig.outputs],
        }
        return Response(json.dumps(body), media_type="application/json")

    async def model_config(self, model: str, version: str = "1") -> Response:
        try:
            body = await self.door.model_config(model)
        except InferlineError as e:
            return _kserve_error(e, not_found=400)
        return Response(json.dumps(body), media_type="application/json")

    async def model_stats(self, model: str, version: str = "1") -> Response:
        try:
            body = self.door.model_stats(model)
        except InferlineError as e:
            return _kserve_error(e, not_found=400)
        return Response(json.dumps(body), media_type="application/json")

    async def all_stats(self) -> Response:
        return Response(json.dumps(self.door.model_stats()), media_type="application/json")

    async def model_ready(self, model: str, version: str = "1") -> Response:
        if model not in self.door.names():
            return Response(status_code=400)
        return Response(status_code=200 if self.door.ready(model) else 503)

    async def infer(self, model: str, request: Request, version: str = "1") -> Response:
        hl = request.headers.get("inference-header-content-length")
        status, body, media, headers = await self.answer_infer(model, await request.body(), hl)
        return Response(body, status_code=status, media_type=media, headers=headers)

    async def answer_infer(
        self, model: str, raw: bytes, hl: str | None
    ) -> tuple[int, bytes, str, dict[str, str] | None]:
        """One infer request, start to end: ``(status, body, media type, extra headers)``,
        what the FastAPI route and the raw ASGI fast path (``InferFastPath``) both send. A
        door worker process (``inferline.server._door_worker``) runs the same three steps,
        the decode and the encode in the worker and ``run_decoded`` in the queue process."""
        try:
            req, tensors = await decode_off_loop(
                len(raw), kserve_decode, raw, header_length(hl, len(raw)), self.door.max_rows
            )
            outs = await self.run_decoded(
                model, req.get("parameters"), tensors, requested_outputs(req)
            )
            return encode_answer(model, req, outs)
        except InferlineError as e:
            return _kserve_error_parts(e)

    async def run_decoded(
        self,
        model: str,
        params: Any,
        tensors: dict[str, np.ndarray],
        wanted: list[str],
    ) -> dict[str, np.ndarray]:
        """A decoded request's outputs, stacked: its limits, datatypes and rows checked, its
        queries through the queue. Raises ``InferlineError`` for what is answered 4xx/5xx."""
        limits = kserve_limits(params)
        self.door.check_datatypes(model, tensors)
        outs = await self.door.run(model, self.door.queries(model, tensors), limits)
        return self.door.stack(model, outs, wanted)


def requested_outputs(req: dict[str, Any]) -> list[str]:
    """The output names a decoded request asks for (none: every output)."""
    return [o["name"] for o in req.get("outputs") or [] if isinstance(o, dict) and "name" in o]


def encode_answer(
    model: str, req: dict[str, Any], outs: dict[str, np.ndarray]
) -> tuple[int, bytes, str, dict[str, str] | None]:
    """The 200 answer of ``outs`` (JSON, or JSON + binary tensors as the request asked).
    Raises ``InferlineError`` for an output the protocol cannot carry."""
    body, header_len = kserve_encode(model, req, outs)
    if header_len is None:
        return 200, body, "application/json", None
    headers = {"Inference-Header-Content-Length": str(header_len)}
    return 200, body, "application/octet-stream", headers


def kserve_error(e: BaseException) -> tuple[int, bytes, str, dict[str, str] | None]:
    """The answer of an infer request refused with ``e``."""
    return _kserve_error_parts(e)


def infer_model(path: str) -> str | None:
    """The model of a ``/v2/models/{model}[/versions/{version}]/infer`` path, else None
    (what FastAPI's ``{model}`` would match: one non-empty segment)."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0]
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0]
    return None


class InferFastPath:
    """``POST /v2/models/{model}[/versions/{version}]/infer`` for the raw ASGI layer
    (``_predict_route.FastRoutes``): the route's path parsed here, its answer
    ``KServeRoutes.answer_infer``'s, so both paths answer alike."""

    def __init__(self, routes: KServeRoutes) -> None:
        self.routes = routes

    def match(self, path: str) -> str | None:
        return infer_model(path)

    async def answer(
        self, model: str, raw: bytes, headers: list[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, str, dict[str, str] | None]:
        hl = None
        for k, v in headers:
            if k == b"inference-header-content-length":
                hl = v.decode("latin-1")
                break  # the first one, as Starlette's Headers.get
        return await self.routes.answer_infer(model, raw, hl)


def make_kserve_router(door: FrontDoor | Service) -> APIRouter:
    """KServe v2 HTTP routes over ``door`` (a ``FrontDoor``, or a ``Service`` to wrap)."""
    routes = KServeRoutes(door if isinstance(door, FrontDoor) else FrontDoor(door))
    r = routes.router()
    # create_app puts these in front of FastAPI's routing (the data path)
    r.inferline_fast_paths = [InferFastPath(routes)]  # type: ignore[attr-defined]
    return r
