"""Serving a deployment over HTTP until stopped (what ``inferline serve`` runs): the service
with its live tuner, the admin, selection and Velox routers, the deployment's own routers."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferline.core import Pipeline, Plan, Profiles, TunerConfig
from inferline.deploy._drift import make_drift_router
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._format import Deployment, import_object
from inferline.deploy._start import start_service
from inferline.server._admin import make_admin_router
from inferline.server._http import DEFAULT_MAX_BODY_BYTES, create_app
from inferline.server._run import DEFAULT_READ_TIMEOUT_S, bind_socket, serve_app
from inferline.server.frontdoors._door import DEFAULT_MAX_ROWS

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
    ready_file: str | None = None,
    ready: Callable[[dict[str, Any]], None] | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    tuner: TunerConfig | None = TunerConfig(),  # noqa: B008 (frozen)
    variant_switching: bool = True,
    drift: DriftConfig | None = None,
    profiles: Profiles | None = None,
    pipeline: Pipeline | None = None,
) -> None:
    """Start ``dep`` with ``plan`` and serve it on ``host:port`` until SIGINT/SIGTERM or until
    ``stop`` is set. Binds before anything starts (a port in use fails fast).

    ``tuner``: the live tuner's configuration (None: no tuner; it runs only for a plan with
    tuner inputs); ``drift`` / ``profiles`` / ``pipeline``: the drift loop (``start_service``;
    ``GET /admin/drift`` either way). Once serving, ``{url, pid, apps, models}`` is written to ``ready_file``
    (atomically) and passed to ``ready``. ``max_request_rows``: the most rows (queries) one
    request may carry on the native route and every front door. ``allowed_hosts``: the
    ``Host`` names the server answers to (None: the bound address and localhost).
    """
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
        )
    except BaseException:
        sock.close()
        raise
    for a in svc.apps.values():
        a.max_batch_inputs = max_request_rows
    routers: list[Any] = [make_admin_router, make_drift_router]
    if any(a.selection is not None for a in dep.apps):  # feedback + per-user routes
        from inferline.server._selection_routes import make_selection_router

        routers.append(make_selection_router)
    if dep.velox is not None:
        from inferline.server._velox_app import start_velox

        routers.append(await start_velox(svc, dep.velox))
    for path in dep.routers:
        routers.append(import_object(path, "routers[]"))
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
    }

    def on_ready() -> None:
        if ready_file:
            tmp = Path(ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, ready_file)
        if ready is not None:
            ready(info)

    await serve_app(app, sock, ready=on_ready, stop=stop, read_timeout_s=read_timeout_s)
