"""Steering a server's own batchers and instances (``inferline attach URL --steer``), as plain
functions; inferline stays out of the data path (clients keep calling the server)::

    att, target = await steer_target("triton://10.0.0.5:8000", "digits")  # ensemble -> steps
    prof = await profile_attachment(att)                 # each composing model, live
    plan = plan_steer(att, target, prof.profiles, trace, slo_s=0.2)
    await apply_steer_plan(att, target, plan)            # explicit-mode loads, in place
    await run_steer(att, target, plan, prof.profiles)    # the loop + its admin app

``apply_server_batcher`` and ``server_counters`` are all the loop asks of a backend (Triton's
in ``adapters/triton``; TF Serving's likewise). The operator's settings are restored on
SIGTERM/SIGINT and ``POST /admin/detach`` as attach does (``_Restorer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from inferline.core import Pipeline, Plan, PlannerOptions, ValidationError
from inferline.deploy._attach import Attachment, _Restorer, attach, plan_attachment
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._steer_admin import SteerRoutes, steer_app
from inferline.deploy._steer_app import ensemble_pipeline, is_ensemble, single_model_pipeline
from inferline.deploy._steer_loop import SteerLoop, apply_server_plan

__all__ = ["SteerTarget", "apply_steer_plan", "plan_steer", "run_steer", "steer_target"]

_STEER_METHODS = ("apply_server_batcher", "server_counters")


@dataclass(frozen=True)
class SteerTarget:
    """The app clients call (``app``: the ensemble or the model), its pipeline of planned
    models, whether it is a server-side ensemble, and the server kind planned for."""

    app: str
    pipeline: Pipeline
    ensemble: bool
    server: str


def _server_kind(url: str) -> str:
    return "tfserving" if url.lower().startswith("tfserving") else "triton"


async def steer_target(
    url: str, app: str, pipeline: Pipeline | None = None, **options: Any
) -> tuple[Attachment, SteerTarget]:
    """Attach to the server at ``url`` for steering ``app``: a Triton ensemble's steps become
    the pipeline (each composing model adopted), else ``pipeline`` or the one model."""
    att = await attach(url, models=[app], **options)
    try:
        missing = [n for n in _STEER_METHODS if not callable(getattr(att.backend, n, None))]
        if missing:
            raise ValidationError("backend", f"an adapter with {missing} (steerable)", url)
        read = getattr(att.backend, "server_config", None)
        cfg = await read(app) if callable(read) else {}
    except BaseException:
        await att.backend.close()
        raise
    ens = is_ensemble(cfg)
    pl = pipeline or (ensemble_pipeline(app, cfg) if ens else single_model_pipeline(app))
    if list(pl.models) == [app]:
        return att, SteerTarget(app, pl, ens, _server_kind(url))
    await att.backend.close()  # the steps are the models steered, not the app itself
    att = await attach(url, models=list(pl.models), **options)
    return att, SteerTarget(app, pl, ens, _server_kind(url))


def plan_steer(
    att: Attachment,
    target: SteerTarget,
    profiles: Any,
    trace: np.ndarray,
    slo_s: float,
    options: PlannerOptions | None = None,
) -> Plan:
    """InferLine's planner for the server's own batchers (``PlannerOptions.server``), the
    end-to-end P99 of ``target``'s pipeline within ``slo_s`` on ``trace``."""
    opts = replace(options or PlannerOptions(), server=target.server)
    return plan_attachment(att, target.pipeline, profiles, trace, slo_s, options=opts)


async def apply_steer_plan(att: Attachment, target: SteerTarget, plan: Plan) -> dict[str, str]:
    """The plan through the server's own API: an ensemble first allows no larger batch than
    its steps will take, then each model gets its batcher and instance count."""
    done: dict[str, str] = {}
    fit = getattr(att.backend, "fit_ensemble", None)
    if target.ensemble and callable(fit):
        smallest = min(c.max_batch_size for c in plan.models.values())
        if await fit(target.app, smallest):
            done[target.app] = f"max batch {smallest} (its steps take no more)"
    done.update(await apply_server_plan(att.backend, plan))
    return done


async def run_steer(
    att: Attachment,
    target: SteerTarget,
    plan: Plan,
    profiles: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    tick_s: float = 1.0,
    drift: DriftConfig = DriftConfig(),  # noqa: B008 (frozen)
    ready: Callable[[dict[str, Any]], None] | None = None,
    restored: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
    seed: int | None = None,
) -> None:
    """Run the steer loop and its admin app until SIGTERM/SIGINT, ``POST /admin/detach`` or
    ``stop``; then put the operator's settings back (``restored()`` once done)."""
    from prometheus_client import CollectorRegistry

    from inferline.server import bind_socket, serve_app

    stop = stop if stop is not None else asyncio.Event()
    restorer = _Restorer(att.backend, stop, restored)
    registry = CollectorRegistry()
    loop = SteerLoop(
        att.backend,
        plan,
        target.app,
        target.pipeline,
        profiles,
        tick_s=tick_s,
        drift=drift,
        registry=registry,
        rng=np.random.default_rng(seed),
        catalog=att.host.hardware_catalog(),
    )
    app = steer_app(SteerRoutes(loop, registry, restorer.detach), token)
    sock = bind_socket(host, port)
    shown = host if ":" not in host else f"[{host}]"
    info = {
        "url": f"http://{shown}:{sock.getsockname()[1]}",
        "app": target.app,
        "models": list(plan.models),
        "server": att.url,
    }
    loop.start()
    try:
        await serve_app(app, sock, ready=None if ready is None else lambda: ready(info), stop=stop)
    finally:
        await loop.stop()
        await restorer.restore()
