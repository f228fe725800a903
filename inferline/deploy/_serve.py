"""Serving a deployment over HTTP until stopped (what ``inferline serve`` runs): the service
with its live tuner, the admin, selection and Velox routers, the deployment's own routers and
the protocol front doors it names (HTTP on the same port; gRPC on ``grpc_port``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferline.core import Pipeline, Plan, Profiles, TunerConfig, ValidationError
from inferline.deploy._drift import make_drift_router
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._format import Deployment, import_object
from inferline.deploy._start import start_service
from inferline.server import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    bind_socket,
    create_app,
    make_admin_router,
    serve_app,
)
from inferline.server.frontdoors import (
    DEFAULT_MAX_ROWS,
    FrontDoor,
    FrontDoorGrpc,
    make_kserve_router,
    make_tfserving_router,
)

__all__ = ["serve"]


async def serve(
    dep: Deployment,
    plan: Plan | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_request_rows: int = DEFAULT_MAX_ROWS,
    allowed_hosts: Sequence[str] | None = None,
    grpc_port: int | None = None,
    ready_file: str | None = None,
    ready: Callable[[dict[str, Any]], None] | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    tuner: TunerConfig | None = TunerConfig(),  # noqa: B008 (frozen)
    variant_switching: bool = True,
    drift: DriftConfig | None = None,
    profiles: Profiles | None = None,
    pipeline: Pipeline | None = None,
    model_switching: Any = None,
) -> None:
    """Start ``dep`` with ``plan`` and serve it on ``host:port`` until SIGINT/SIGTERM or until
    ``stop`` is set. Binds before anything starts (a port in use fails fast).

    ``tuner``: the live tuner's configuration (None: no tuner; it runs only for a plan with
    tuner inputs); ``drift`` / ``profiles`` / ``pipeline``: the drift loop (``start_service``;
    ``GET /admin/drift`` either way). Once serving, ``{url, pid, apps, models}`` is written to ``ready_file``
    (atomically) and passed to ``ready``. ``max_request_rows``: the most rows (queries) one
    request may carry on the native route and every front door. ``allowed_hosts``: the
    ``Host`` names the server answers to (None: the bound address and localhost).
    ``grpc_port``: serve the gRPC services of the deployment's ``front_doors`` there (0: any
    free port; None: none); their HTTP routes are always mounted on ``port``.
    ``model_switching``: Model-Switching on one app (``start_service``).
    """
    if grpc_port is not None and not dep.front_doors:
        raise ValidationError(
            "--grpc-port", 'a deployment naming "front_doors" (kserve, tfserving)', grpc_port
        )
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    try:
        svc = await start_service(
            dep,
            plan,
            tuner=tuner,
            variant_switching=variant_switching,
            drift=drift,
            profiles=profiles,
            pipeline=pipeline,
            model_switching=model_switching,
        )
    except BaseException:
        sock.close()
        raise
    for a in svc.apps.values():
        a.max_batch_inputs = max_request_rows
    routers: list[Any] = [make_admin_router, make_drift_router]
    if any(a.selection is not None for a in dep.apps):  # feedback + per-user routes
        from inferline.server import make_selection_router

        routers.append(make_selection_router)
    if dep.velox is not None:
        from inferline.server import start_velox

        routers.append(await start_velox(svc, dep.velox))
    for path in dep.routers:
        routers.append(import_object(path, "routers[]"))
    door = None
    if dep.front_doors:
        door = FrontDoor(
            svc, model_slo_s=plan.slo_s if plan is not None else 1.0, max_rows=max_request_rows
        )
        if "kserve" in dep.front_doors:
            routers.append(make_kserve_router(door))
        if "tfserving" in dep.front_doors:
            routers.append(make_tfserving_router(door))
    grpc = None
    if door is not None and grpc_port is not None:
        grpc = FrontDoorGrpc(
            door,
            host=host,
            port=grpc_port,
            token=token,
            max_message_bytes=max_body_bytes,
            protocols=dep.front_doors,
        )
        try:
            await grpc.start()
        except BaseException:
            sock.close()
            await svc.close()
            raise
    app = create_app(
        svc,
        token=token,
        max_body_bytes=max_body_bytes,
        routers=routers,
        allowed_hosts=allowed_hosts,
    )
    shown = host if ":" not in host else f"[{host}]"
    info = {
        "url": f"http://{shown}:{bound}",
        "pid": os.getpid(),
        "apps": sorted(svc.apps),
        "models": svc.models,
        "front_doors": list(dep.front_doors),
    }
    if grpc is not None:
        info["grpc"] = f"{shown}:{grpc.port}"
        info["grpc_services"] = grpc.services

    def on_ready() -> None:
        if ready_file:
            tmp = Path(ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, ready_file)
        if ready is not None:
            ready(info)

    try:
        await serve_app(app, sock, ready=on_ready, stop=stop, read_timeout_s=read_timeout_s)
    finally:
        if grpc is not None:
            await grpc.stop()
