"""``start_service``: a ``Service`` from a deployment and a plan (every model deployed, the
interposed queue, the apps, the live tuner), built by the composition root (``_build``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core import Pipeline, Plan, Profiles, TunerConfig
from inferline.deploy._build import DeploymentTarget, Loops, build_service, plugin_host
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._format import Deployment
from inferline.server import Service

__all__ = ["DeploymentTarget", "start_service"]


async def start_service(
    dep: Deployment,
    plan: Plan | None = None,
    *,
    backend: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    apps: Sequence[str] | None = None,
    host: Any = None,
    tuner: TunerConfig | None = None,
    variant_switching: bool = True,
    drift: DriftConfig | None = None,
    profiles: Profiles | None = None,
    pipeline: Pipeline | None = None,
    model_switching: Any = None,
    variant_queue: str = "shared",
) -> Service:
    """Deploy every model (plan's configuration, or one CPU replica with batch 1), create the
    interposed queue and the apps; returns a ready ``Service``. On failure, undoes it all.

    ``host``: the plugin host (None: this process's, ``plugin_host()``). ``tuner``: run the
    live tuner (InferLine §5) with this configuration when the plan has tuner inputs;
    ``variant_switching``: it may switch a variant stage of a plan made with variants to a
    cheaper variant instead of adding replicas. ``model_switching`` (a ``ServeSwitching``):
    switch one app's stage between variants by Model-Switching's effective-accuracy rule
    (``--switching model-switching``); the tuner then stays off. ``variant_queue``: the
    tuner's variant stages share one queue (``"shared"``) or keep one per variant.

    ``drift``: run the drift loop (estimated vs measured P99 per app; with mode ``replan``,
    recalibration and re-planning, ``DriftMonitor``) with this configuration; it needs a
    plan, the ``profiles`` and the ``pipeline`` to estimate with (without them it stays off,
    with a one-line note). Its estimates run in a spawned process: a script that calls this
    with ``drift`` guards its entry point (``if __name__ == "__main__"``)."""
    loops = Loops(
        tuner, variant_switching, drift, profiles, pipeline, model_switching, variant_queue
    )
    return await build_service(
        dep,
        plan,
        host if host is not None else plugin_host(),
        backend=backend,
        clock=clock,
        apps=apps,
        loops=loops,
    )
