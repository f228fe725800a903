"""The composition root: the one place that builds the running system's parts.

``plugin_host()`` makes the plugin host, ``open_backend`` a backend by URL (both in
``_host.py``, which the deployment format also opens its backend through), ``new_service``
the interposed queue (dispatcher, cache) and the ``Service`` over it; ``build_service`` puts a
deployment together from those (models deployed, queues, routes, apps, live tuner,
Model-Switching, drift loop). ``inferline serve`` (``serve``), ``start_service``, attach
(``start_attachment_service``: a service made from what discovery found), ``deploy`` and the
demo all build through these functions; nothing else constructs the plugin host, a backend
or a dispatcher (``benchmarks/layout.py`` counts it). The plugin host is built once, by the
entry point, and passed down (docs/design.md, "The composition root").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferline.core import Pipeline, Plan, PlannerOptions, Profiles, TunerConfig
from inferline.deploy._drift import DriftMonitor
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._fleet_plan import place_on_fleet
from inferline.deploy._format import Deployment
from inferline.deploy._host import open_backend, plugin_host
from inferline.deploy._planned import (
    check_stages_served,
    configs_for,
    oversubscription,
    stage_routes,
)
from inferline.deploy._tuning import LiveTuner
from inferline.server import App, Service

__all__ = [
    "DeploymentTarget",
    "Loops",
    "build_service",
    "new_service",
    "open_backend",
    "plugin_host",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeploymentTarget:
    """The plan target of a service started from a deployment: its models move in place
    (``apply_deployment_plan``)."""

    deployment: Deployment

    async def apply(self, service: Service, plan: Plan) -> dict[str, str]:
        from inferline.deploy._apply import apply_deployment_plan

        return await apply_deployment_plan(service, self.deployment, plan)


def new_service(
    backend: Any,
    host: Any,
    models: Iterable[str],
    *,
    plan: Plan | None = None,
    plan_target: Any = None,
    cache_entries: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    tuner: Callable[[Any], LiveTuner | None] | None = None,
) -> Service:
    """The interposed queue over ``backend`` (a dispatcher, a prediction cache when
    ``cache_entries`` > 0) and the ``Service`` holding it; no model queue yet (the caller adds
    them, then ``dispatcher.attach(backend)``). ``tuner``: given the dispatcher, the live
    tuner the service holds (or None)."""
    from inferline.queueing import Dispatcher, PredictionCache

    dispatcher = Dispatcher(clock=clock)
    cache = PredictionCache(cache_entries) if cache_entries > 0 else None
    svc = Service(
        dispatcher=dispatcher,
        backend=backend,
        cache=cache,
        models=list(models),
        clock=clock,
        plugins=host,
        plan=plan,
        plan_target=plan_target,
        tuner=tuner(dispatcher) if tuner is not None else None,
    )
    svc.metrics.watch(dispatcher)
    return svc


@dataclass(frozen=True)
class Loops:
    """The control loops a service runs besides its queue, as ``serve`` was asked for them."""

    tuner: TunerConfig | None = None
    variant_switching: bool = True
    drift: DriftConfig | None = None
    profiles: Profiles | None = None
    pipeline: Pipeline | None = None
    model_switching: Any = None
    variant_queue: str = "shared"  # the tuner's variant stages: one queue, or one per variant


async def build_service(
    dep: Deployment,
    plan: Plan | None,
    host: Any,
    *,
    backend: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    apps: Sequence[str] | None = None,
    loops: Loops = Loops(),
) -> Service:
    """``dep`` running with ``plan`` (``start_service``'s contract): models deployed, queues,
    routes and apps in place, loops launched; on failure everything started is undone."""
    check_stages_served(plan)
    configs = configs_for(dep, plan)
    _check_selection(dep, apps, host)  # a bad selection block fails before any replica starts
    backend = backend if backend is not None else open_backend(host, dep.backend)
    tuner = loops.tuner
    if loops.model_switching is not None and tuner is not None:
        # one controller owns the variants' replica counts: Model-Switching's core budget
        log.info("tuner off: --switching model-switching sets the variants' replicas")
        tuner = None
    monitor = _drift_monitor(loops, plan, clock, dep)

    def live_tuner(dispatcher: Any) -> LiveTuner | None:
        if tuner is None or plan is None or plan.tuner is None:
            return None
        observer = host.scaling_observer("tuner")
        return LiveTuner(
            backend,
            plan,
            tuner,
            clock=clock,
            observer=observer,
            dispatcher=dispatcher,
            variants=loops.variant_switching,
            variant_queue=loops.variant_queue,
        )

    svc = new_service(
        backend,
        host,
        [m.name for m in dep.models],
        plan=plan,
        plan_target=DeploymentTarget(dep),
        cache_entries=dep.queue.cache_entries,
        clock=clock,
        tuner=live_tuner,
    )
    try:
        await _deploy_models(svc, dep, configs, host)
        _add_queues(svc, dep, configs, plan)
        _add_apps(svc, dep, apps, host)
        await _launch_loops(svc, dep, apps, loops.model_switching, monitor)
    except BaseException:
        await svc.close()
        raise
    return svc


def _check_selection(dep: Deployment, apps: Sequence[str] | None, host: Any) -> None:
    from inferline.server import build_policy

    for a in dep.apps:
        if a.selection is not None and (apps is None or a.name in apps):
            build_policy(a.name, a.selection, host)


async def _deploy_models(svc: Service, dep: Deployment, configs: dict[str, Any], host: Any) -> None:
    backend = svc.backend
    # a fleet deploys each model's replicas on the servers where the plan placed them
    place_on_fleet(backend, configs, host, {s.name: s.threads for s in dep.models})
    await asyncio.gather(*(backend.deploy(s, configs[s.name]) for s in dep.models))
    note = oversubscription(dep, backend, configs)
    if note is not None:
        log.warning("%s", note)
    # observers registered through the plugin host hear about deploys, plan changes, scaling
    for s in dep.models:
        host.notify_config(s.name, None, configs[s.name], backend=dep.backend, reason="deploy")


def _add_queues(svc: Service, dep: Deployment, configs: dict[str, Any], plan: Plan | None) -> None:
    dispatcher = svc.dispatcher
    assert dispatcher is not None
    # an adaptive policy (AIMD) aims under the tightest of the apps' SLOs
    slo = min((a.slo_s for a in dep.apps), default=1.0)
    for s in dep.models:
        dispatcher.add_model(
            s.name,
            # the deployment's policy, else the plan's batch wait, else fixed
            batching=dep.policy_for(s.name, configs[s.name], slo),
            max_queue=dep.queue.max_queue,
            expire_late=dep.queue.expire_late,
            expire_grace_s=dep.queue.expire_grace_s,
            max_retries=dep.queue.max_retries,
            admission=dep.queue.admission_config(),
        )
    for stage, model in stage_routes(plan).items():
        dispatcher.route(stage, model)
    dispatcher.attach(svc.backend)


def _add_apps(svc: Service, dep: Deployment, apps: Sequence[str] | None, host: Any) -> None:
    dispatcher = svc.dispatcher
    for a in dep.apps:
        if apps is not None and a.name not in apps:
            continue
        kw: dict[str, Any] = {
            "input_spec": a.input,
            "respond_by_slo": a.respond_by_slo,
            "description": a.description,
        }
        if a.on_predicted_late != "refuse":  # a predicted-late refusal answers the default
            kw["on_predicted_late"] = a.on_predicted_late
        if a.has_default:
            kw["default_output"] = a.default_output
        if a.selection is not None:
            from inferline.server import make_selection_app

            svc.add_app(
                make_selection_app(
                    svc,
                    a.name,
                    a.selection,
                    dispatcher,
                    a.slo_s,
                    cache=svc.cache,
                    known_models=svc.models,
                    host=host,
                    **kw,
                )
            )
            continue
        kw["models"] = tuple(m.name for m in dep.models)
        svc.add_app(
            App.from_pipeline(a.name, a.pipeline_fn(), dispatcher, a.slo_s, cache=svc.cache, **kw)
        )


async def _launch_loops(
    svc: Service,
    dep: Deployment,
    apps: Sequence[str] | None,
    model_switching: Any,
    monitor: DriftMonitor | None,
) -> None:
    if svc.tuner is not None:
        await svc.tuner.launch(svc, apps)
    if model_switching is not None:
        from inferline.deploy._switching_serve import launch_switching

        specs = {s.name: s for s in dep.models}
        await launch_switching(svc, svc.backend, svc.dispatcher, specs, model_switching)
    if monitor is not None:
        await monitor.launch(svc, apps)


def _drift_monitor(
    loops: Loops, plan: Plan | None, clock: Callable[[], float], dep: Deployment | None = None
) -> DriftMonitor | None:
    config, profiles, pipeline = loops.drift, loops.profiles, loops.pipeline
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
    # re-plans for the queue's own rule (admission, max_refused)
    planner = PlannerOptions(**(dep.planner_admission() if dep is not None else {}))
    return DriftMonitor(config, profiles, pipeline, clock=clock, planner=planner)
