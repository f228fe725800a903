"""Starting a ``Service`` from a deployment and a plan: deploy every model, the interposed queue, the apps, the live tuner; and the plan target that ``PUT /admin/plan`` applies plans to."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferline.core import Pipeline, Plan, Profiles, TunerConfig
from inferline.deploy._apply import apply_deployment_plan
from inferline.deploy._drift import DriftMonitor
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._format import Deployment
from inferline.deploy._planned import (
    check_stages_served,
    configs_for,
    oversubscription,
    stage_routes,
)
from inferline.deploy._tuning import LiveTuner
from inferline.server import App, Service

__all__ = ["DeploymentTarget", "start_service"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeploymentTarget:
    """The plan target of a service started from a deployment: its models move in place
    (``apply_deployment_plan``)."""

    deployment: Deployment

    async def apply(self, service: Service, plan: Plan) -> dict[str, str]:
        return await apply_deployment_plan(service, self.deployment, plan)


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
) -> Service:
    """Deploy every model (plan's configuration, or one CPU replica with batch 1), create the
    interposed queue and the apps; returns a ready ``Service``. On failure, undoes it all.

    ``tuner``: run the live tuner (InferLine §5) with this configuration when the plan has
    tuner inputs; ``variant_switching``: it may switch a variant stage of a plan made with
    variants to a cheaper variant instead of adding replicas. ``model_switching`` (a
    ``ServeSwitching``): switch one app's stage between variants by Model-Switching's
    effective-accuracy rule (``--switching model-switching``); the tuner then stays off.

    ``drift``: run the drift loop (estimated vs measured P99 per app; with mode ``replan``,
    recalibration and re-planning, ``DriftMonitor``) with this configuration; it needs a
    plan, the ``profiles`` and the ``pipeline`` to estimate with (without them it stays off,
    with a one-line note). Its estimates run in a spawned process: a script that calls this
    with ``drift`` guards its entry point (``if __name__ == "__main__"``)."""
    from inferline.adapters import PluginHost
    from inferline.queueing import Dispatcher

    host = host if host is not None else PluginHost.default()
    check_stages_served(plan)
    configs = configs_for(dep, plan)
    for a in dep.apps:  # a bad selection block fails before any replica starts
        if a.selection is not None and (apps is None or a.name in apps):
            from inferline.server import build_policy

            build_policy(a.name, a.selection, host)
    if backend is None:
        backend = host.backend_for(dep.backend)
    dispatcher = Dispatcher(clock=clock)
    cache = None
    if dep.queue.cache_entries > 0:
        from inferline.queueing import PredictionCache

        cache = PredictionCache(dep.queue.cache_entries)
    live = None
    if model_switching is not None and tuner is not None:
        # one controller owns the variants' replica counts: Model-Switching's core budget
        log.info("tuner off: --switching model-switching sets the variants' replicas")
        tuner = None
    if tuner is not None and plan is not None and plan.tuner is not None:
        live = LiveTuner(
            backend,
            plan,
            tuner,
            clock=clock,
            observer=host.scaling_observer("tuner"),
            dispatcher=dispatcher,
            variants=variant_switching,
        )
    monitor = _drift_monitor(drift, plan, profiles, pipeline, clock)
    # observers registered through the plugin host hear about deploys, plan changes and scaling
    svc = Service(
        dispatcher=dispatcher,
        backend=backend,
        cache=cache,
        models=[m.name for m in dep.models],
        clock=clock,
        plugins=host,
        plan=plan,
        plan_target=DeploymentTarget(dep),
        tuner=live,
    )
    try:
        import asyncio

        await asyncio.gather(*(backend.deploy(s, configs[s.name]) for s in dep.models))
        note = oversubscription(dep, backend, configs)
        if note is not None:
            log.warning("%s", note)
        for s in dep.models:
            host.notify_config(s.name, None, configs[s.name], backend=dep.backend, reason="deploy")
        for s in dep.models:
            dispatcher.add_model(
                s.name,
                # the deployment's policy, else the plan's batch wait, else fixed
                batching=dep.policy_for(s.name, configs[s.name], _slo_of(dep, s.name)),
                max_queue=dep.queue.max_queue,
                expire_late=dep.queue.expire_late,
                expire_grace_s=dep.queue.expire_grace_s,
                max_retries=dep.queue.max_retries,
            )
        for stage, model in stage_routes(plan).items():
            dispatcher.route(stage, model)
        dispatcher.attach(backend)
        svc.metrics.watch(dispatcher)
        for a in dep.apps:
            if apps is not None and a.name not in apps:
                continue
            kw: dict[str, Any] = {
                "input_spec": a.input,
                "respond_by_slo": a.respond_by_slo,
                "description": a.description,
                "models": tuple(m.name for m in dep.models),
            }
            if a.has_default:
                kw["default_output"] = a.default_output
            if a.selection is not None:
                from inferline.server import make_selection_app

                kw.pop("models")
                svc.add_app(
                    make_selection_app(
                        svc,
                        a.name,
                        a.selection,
                        dispatcher,
                        a.slo_s,
                        cache=cache,
                        known_models=svc.models,
                        **kw,
                    )
                )
                continue
            svc.add_app(
                App.from_pipeline(a.name, a.pipeline_fn(), dispatcher, a.slo_s, cache=cache, **kw)
            )
        if live is not None:
            await live.launch(svc, apps)
        if model_switching is not None:
            from inferline.deploy._switching_serve import launch_switching

            specs = {s.name: s for s in dep.models}
            await launch_switching(svc, backend, dispatcher, specs, model_switching)
        if monitor is not None:
            await monitor.launch(svc, apps)
    except BaseException:
        await svc.close()
        raise
    return svc


def _drift_monitor(
    config: DriftConfig | None,
    plan: Plan | None,
    profiles: Profiles | None,
    pipeline: Pipeline | None,
    clock: Callable[[], float],
) -> DriftMonitor | None:
    if config is None or config.mode == "off":
        return None
    missing = [
        what
        for what, v in (("a plan", plan), ("profiles", profiles), ("a pipeline", pipeline))
        if v is None
    ]
    if missing or profiles is None or pipeline is None:
        log.info("drift loop off: it needs %s to estimate with", ", ".join(missing))
        return None
    return DriftMonitor(config, profiles, pipeline, clock=clock)


def _slo_of(dep: Deployment, model: str) -> float:
    """The SLO an adaptive batching policy (AIMD) aims under: the tightest of the apps'."""
    return min((a.slo_s for a in dep.apps), default=1.0)
