"""Serving a deployment over HTTP until stopped (what ``inferline serve`` runs): the service
with its live tuner, the admin, selection and Velox routers, the deployment's own routers and
the protocol front doors it names (HTTP on the same port; gRPC on ``grpc_port``).

``serve_deployment`` takes a ``ServeSettings``; ``serve`` is the same with the settings as
keyword arguments. ``bind``, ``start_grpc`` and ``run_http`` are the serving steps that
``serve_attachment`` shares."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferline.core import Pipeline, Plan, Profiles, TunerConfig, ValidationError
from inferline.deploy._build import Loops, build_service, plugin_host
from inferline.deploy._drift import make_drift_router
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._format import Deployment, import_object
from inferline.deploy._settings import ServeSettings
from inferline.deploy._switching_table import make_switching_router
from inferline.server import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    Service,
    bind_socket,
    create_app,
    make_admin_router,
    serve_app,
)
from inferline.server.frontdoors import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_ROWS,
    FrontDoor,
    FrontDoorGrpc,
    make_kserve_router,
    make_tfserving_router,
)

__all__ = ["bind", "run_http", "serve", "serve_deployment", "start_grpc"]

Ready = Callable[[dict[str, Any]], None]
log = logging.getLogger(__name__)


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
    grpc_max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ready_file: str | None = None,
    ready: Ready | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    tuner: TunerConfig | None = TunerConfig(),  # noqa: B008 (frozen)
    variant_switching: bool = True,
    drift: DriftConfig | None = None,
    profiles: Profiles | None = None,
    pipeline: Pipeline | None = None,
    model_switching: Any = None,
    door_workers: int = 0,
    variant_queue: str = "shared",
) -> None:
    """Start ``dep`` with ``plan`` and serve it until SIGINT/SIGTERM or until ``stop`` is set
    (``serve_deployment`` with these keyword arguments as its ``ServeSettings``).
    ``profiles`` / ``pipeline``: what the drift loop estimates with; ``model_switching``:
    Model-Switching on one app (``start_service``)."""
    settings = ServeSettings(
        host=host,
        port=port,
        token=token,
        max_body_bytes=max_body_bytes,
        max_request_rows=max_request_rows,
        allowed_hosts=None if allowed_hosts is None else tuple(allowed_hosts),
        grpc_port=grpc_port,
        grpc_max_inflight=grpc_max_inflight,
        ready_file=ready_file,
        read_timeout_s=read_timeout_s,
        tuner=tuner,
        variant_switching=variant_switching,
        drift=drift,
        door_workers=door_workers,
        variant_queue=variant_queue,
    )
    loops = Loops(
        tuner, variant_switching, drift, profiles, pipeline, model_switching, variant_queue
    )
    await serve_deployment(dep, plan, settings, loops=loops, ready=ready, stop=stop)


async def serve_deployment(
    dep: Deployment,
    plan: Plan | None,
    settings: ServeSettings,
    *,
    host: Any = None,
    loops: Loops | None = None,
    ready: Ready | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Bind ``settings.host:port`` before anything starts (a port in use fails fast), build
    the service (``build_service``; ``host``: the plugin host, None: this process's), mount
    the routers and front doors, serve. Once serving, ``{url, pid, apps, models, ...}`` is
    written to ``settings.ready_file`` (atomically) and passed to ``ready``. ``loops``: the
    control loops (default: those ``settings`` names, no drift data, no Model-Switching)."""
    if settings.grpc_port is not None and not dep.front_doors:
        raise ValidationError(
            "--grpc-port",
            'a deployment naming "front_doors" (kserve, tfserving)',
            settings.grpc_port,
        )
    if loops is None:
        loops = Loops(
            settings.tuner,
            settings.variant_switching,
            settings.drift,
            variant_queue=settings.variant_queue,
        )
    sock = bind(settings)
    try:
        svc = await build_service(
            dep, plan, host if host is not None else plugin_host(), loops=loops
        )
    except BaseException:
        sock.close()
        raise
    for a in svc.apps.values():
        a.max_batch_inputs = settings.max_request_rows
    grpc = None
    try:
        routers, door = await _routers(svc, dep, plan, settings.max_request_rows)
        if door is not None:
            grpc = await start_grpc(door, settings, dep.front_doors)
    except BaseException:
        sock.close()
        await svc.close()
        raise
    info = {
        "url": _url(settings, sock),
        "pid": os.getpid(),
        "apps": sorted(svc.apps),
        "models": svc.models,
        "front_doors": list(dep.front_doors),
    }
    if grpc is not None:
        info["grpc"] = f"{_shown(settings.host)}:{grpc.port}"
        info["grpc_services"] = grpc.services
    await run_http(svc, sock, settings, routers, grpc, _announce(info, settings, ready), stop)


async def _routers(
    svc: Service, dep: Deployment, plan: Plan | None, max_rows: int
) -> tuple[list[Any], FrontDoor | None]:
    """The routers ``dep`` asks for, and its protocol front door (None: it names none)."""
    routers: list[Any] = [make_admin_router, make_drift_router, make_switching_router]
    if any(a.selection is not None for a in dep.apps):  # feedback + per-user routes
        from inferline.server import make_selection_router

        routers.append(make_selection_router)
    if dep.velox is not None:
        from inferline.server import start_velox

        routers.append(await start_velox(svc, dep.velox))
    for path in dep.routers:
        routers.append(import_object(path, "routers[]"))
    if not dep.front_doors:
        return routers, None
    slo_s = plan.slo_s if plan is not None else 1.0
    door = FrontDoor(svc, model_slo_s=slo_s, max_rows=max_rows, samples=_door_samples(dep))
    if "kserve" in dep.front_doors:
        routers.append(make_kserve_router(door))
    if "tfserving" in dep.front_doors:
        routers.append(make_tfserving_router(door))
    return routers, door


def _door_samples(dep: Deployment) -> dict[str, list[Any]] | None:
    """A few of the deployment's sample queries per app: the door traces the outputs it
    declares with them (else with zeros of the app's input spec)."""
    if not dep.sample_inputs:
        return None
    try:
        xs = list(dep.load_sample_inputs())[:2]
    except Exception as e:  # the door can still trace with zeros
        log.warning("front door: the deployment's sample_inputs failed (%s); tracing with zeros", e)
        return None
    return {a.name: xs for a in dep.apps} if xs else None


def bind(settings: ServeSettings) -> socket.socket:
    """The HTTP socket, bound now (a port in use fails before anything starts)."""
    workers = settings.door_workers > 0  # the workers listen; this process holds the port
    return bind_socket(settings.host, settings.port, reuse_port=workers, listen=not workers)


async def start_grpc(
    door: FrontDoor, settings: ServeSettings, protocols: Sequence[str] | None = None
) -> FrontDoorGrpc | None:
    """The gRPC front doors on ``settings.grpc_port`` (None: not served); ``protocols``:
    which (None: every one)."""
    if settings.grpc_port is None:
        return None
    kw: dict[str, Any] = {} if protocols is None else {"protocols": protocols}
    grpc = FrontDoorGrpc(
        door,
        host=settings.host,
        port=settings.grpc_port,
        token=settings.token,
        max_message_bytes=settings.max_body_bytes,
        max_inflight=settings.grpc_max_inflight,
        **kw,
    )
    await grpc.start()
    return grpc


async def run_http(
    svc: Service,
    sock: socket.socket,
    settings: ServeSettings,
    routers: Sequence[Any],
    grpc: FrontDoorGrpc | None,
    ready: Callable[[], None] | None,
    stop: asyncio.Event | None,
) -> None:
    """Serve ``svc`` with ``routers`` on ``sock`` until stopped, then stop ``grpc``."""
    app = create_app(
        svc,
        token=settings.token,
        max_body_bytes=settings.max_body_bytes,
        routers=list(routers),
        allowed_hosts=settings.allowed_hosts,
    )
    try:
        await serve_app(
            app,
            sock,
            ready=ready,
            stop=stop,
            read_timeout_s=settings.read_timeout_s,
            door_workers=settings.door_workers,
        )
    finally:
        if grpc is not None:
            await grpc.stop()


def _shown(host: str) -> str:
    return host if ":" not in host else f"[{host}]"


def _url(settings: ServeSettings, sock: socket.socket) -> str:
    return f"http://{_shown(settings.host)}:{sock.getsockname()[1]}"


def _announce(
    info: dict[str, Any], settings: ServeSettings, ready: Ready | None
) -> Callable[[], None]:
    def on_ready() -> None:
        # what start-up made (imports, models, the app: ~100k objects) leaves the collector's
        # generations, so a full collection scans only what serving allocates; full
        # collections of 60-218 ms froze the event loop and made admitted queries late
        # (docs/deadlines.md)
        gc.collect()
        gc.freeze()
        if settings.ready_file:
            tmp = Path(settings.ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, settings.ready_file)
        if ready is not None:
            ready(info)

    return on_ready
