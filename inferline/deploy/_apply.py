"""Applying a plan to a running service started from a deployment (``PUT /admin/plan``, ``inferline deploy --url``): replica counts and batch sizes in place, hardware changes by redeploying, variant stages moved once their replicas serve."""

from __future__ import annotations

import logging

from inferline.core import (
    InferlineError,
    ModelConfig,
    Plan,
    ValidationError,
)
from inferline.deploy._batching import with_max_batch
from inferline.deploy._fleet_plan import place_on_fleet
from inferline.deploy._format import Deployment
from inferline.deploy._planned import (
    check_stages_served,
    configs_for,
    drain,
    oversubscription,
    planned_models,
    stage_routes,
)
from inferline.queueing import BatchingPolicy
from inferline.server import Service

__all__ = ["apply_deployment_plan", "apply_plan"]

log = logging.getLogger(__name__)


async def apply_plan(svc: Service, plan: Plan) -> dict[str, str]:
    """Move a running service to ``plan`` through its plan target: the models of the
    deployment it was started from (``apply_deployment_plan``), or those of an attached
    server. Answers what was done per model."""
    if svc.plan_target is None:
        raise ValidationError("service", "a service started from a deployment or attachment", None)
    return await svc.plan_target.apply(svc, plan)


def _policy(svc: Service, dep: Deployment, name: str, cfg: ModelConfig) -> BatchingPolicy:
    """A policy the deployment names keeps its state with the new bound (AIMD's learned
    size); otherwise the new plan decides: its batch wait (delayed batching) or fixed."""
    assert svc.dispatcher is not None
    if name in dep.batching:
        return with_max_batch(svc.dispatcher.batching(name), cfg.max_batch_size)
    return dep.policy_for(name, cfg, min((a.slo_s for a in dep.apps), default=1.0))


async def apply_deployment_plan(svc: Service, dep: Deployment, plan: Plan) -> dict[str, str]:
    """Move a running service started from ``dep`` to ``plan``: replica counts and batch sizes change in place; a
    model whose hardware changes is redeployed (its queue keeps its queries meanwhile). With
    model variants, a stage moves to another variant only once that variant's replicas serve,
    and the variant it leaves drains its queue before its replicas go (nothing queued is
    lost)."""
    if svc.backend is None or svc.dispatcher is None:
        raise ValidationError("service", "a service started from a deployment", None)
    check_stages_served(plan)
    configs = configs_for(dep, plan)
    planned = planned_models(plan)
    # without a plan the service runs the deployment's defaults (one CPU replica, batch 1)
    olds = configs_for(dep, svc.plan)
    done: dict[str, str] = {}
    _check_hardware(svc, configs, planned)
    place_on_fleet(svc.backend, configs, svc.plugins, {s.name: s.threads for s in dep.models})
    # models that shrink do so last: after the others have grown and the stages moved
    leaving = {n for n, c in configs.items() if n in planned and c.replicas < _active(svc, n, olds)}
    for name, cfg in configs.items():
        if name in planned and name not in leaving:
            done[name] = await _move_model(svc, dep, name, olds[name], cfg)
    _move_stages(svc, plan, done)
    for name in sorted(leaving):
        if configs[name].replicas == 0:  # nothing would serve what it still has queued
            await drain(svc.dispatcher, name)
        done[name] = await _move_model(svc, dep, name, olds[name], configs[name])
    note = oversubscription(dep, svc.backend, configs)
    if note is not None:
        done["inventory"] = note
        log.warning("%s", note)
    failed = {n for n, what in done.items() if n in configs and what.startswith("failed")}
    svc.plan = _in_force(plan, olds, failed, _left_out(svc, dep, plan, planned, olds, done))
    await _tuner_follows(svc, plan, done)
    return done


def _left_out(
    svc: Service,
    dep: Deployment,
    plan: Plan,
    planned: dict[str, ModelConfig],
    olds: dict[str, ModelConfig],
    done: dict[str, str],
) -> dict[str, ModelConfig]:
    """The served models a plan does not name (``"models": {}`` included) keep their
    configuration, and the answer says so; before, the plan was recorded as if they had none
    and ``GET /admin/plan`` no longer matched what runs."""
    stages = set(plan.models)
    kept = {}
    for spec in dep.models:
        if spec.name in planned or spec.name in stages:
            continue
        cfg = olds[spec.name]
        replicas = _active(svc, spec.name, olds)
        kept[spec.name] = ModelConfig(
            cfg.hardware, cfg.max_batch_size, replicas, batch_wait_ms=cfg.batch_wait_ms
        )
        done[spec.name] = (
            f"kept: not in the plan ({replicas} replicas, max batch {cfg.max_batch_size})"
        )
    return kept


def _in_force(
    plan: Plan, olds: dict[str, ModelConfig], failed: set[str], kept: dict[str, ModelConfig]
) -> Plan:
    """What ``GET /admin/plan`` shows: the plan, where a model it could not move keeps its old
    configuration, plus the models it left out as they run."""
    if not failed and not kept:
        return plan
    models = {n: (olds[n] if n in failed else c) for n, c in plan.models.items()}
    return plan.with_models({**models, **kept})


def _active(svc: Service, name: str, olds: dict[str, ModelConfig]) -> int:
    """Replicas serving now: a live tuner may have moved the service off the old plan."""
    try:
        return len(svc.backend.replicas(name))
    except InferlineError:
        return olds[name].replicas


def _check_hardware(svc: Service, configs: dict[str, ModelConfig], planned: set[str]) -> None:
    """Hardware the backend does not have is refused before anything changes (applying it
    would remove the model's replicas and fail to start new ones)."""
    inventory = svc.backend.inventory()
    for name, cfg in configs.items():
        if name in planned and cfg.hardware not in inventory:
            raise ValidationError(
                f"models.{name}.hardware",
                f"hardware this backend has ({', '.join(sorted(inventory))})",
                cfg.hardware,
            )


async def _move_model(
    svc: Service, dep: Deployment, name: str, old: ModelConfig, cfg: ModelConfig
) -> str:
    """One model to ``cfg``; what was done, or ``failed: ...``. A backend that can change a
    model's batch size and hardware in place (Triton: one reload with the new model
    configuration) does so; before, only the replica count reached Triton, and a larger
    planned batch was split into several requests."""
    assert svc.dispatcher is not None
    reconfigure = getattr(svc.backend, "reconfigure", None)
    try:
        if reconfigure is not None:
            await reconfigure(name, cfg)
            what = f"{cfg.replicas} replicas" + (
                f" on {cfg.hardware}" if old.hardware != cfg.hardware else ""
            )
        elif old.hardware != cfg.hardware:
            await svc.backend.remove(name)
            try:
                await svc.backend.deploy(dep.model(name), cfg)
            except InferlineError:
                # back on the old hardware, so that the model keeps serving
                await svc.backend.deploy(dep.model(name), old)
                raise
            what = f"redeployed on {cfg.hardware}"
        else:
            await svc.backend.scale(name, cfg.replicas)
            what = f"{cfg.replicas} replicas"
        svc.dispatcher.set_batching(name, _policy(svc, dep, name, cfg))
        what += f", max batch {cfg.max_batch_size}"
        if name not in dep.batching and cfg.batch_wait_ms > 0:
            what += f", batch wait {cfg.batch_wait_ms:g} ms"
        if svc.plugins is not None:
            svc.plugins.notify_config(name, old, cfg, backend=dep.backend, reason="plan applied")
    except InferlineError as e:
        log.error("applying plan to %r failed: %s", name, e)
        return f"failed: {e}"
    return what


def _move_stages(svc: Service, plan: Plan, done: dict[str, str]) -> None:
    """Each stage routed to the variant the plan names, unless that variant failed to move."""
    assert svc.dispatcher is not None
    routes = stage_routes(plan)
    stages = set(plan.models) | set(svc.plan.models if svc.plan is not None else {})
    for stage in stages:
        target = routes.get(stage, stage)
        if svc.dispatcher.resolve(stage) != target:
            if target != stage and done.get(target, "").startswith("failed"):
                done[stage] = f"still served by {svc.dispatcher.resolve(stage)}"
                continue
            svc.dispatcher.route(stage, target if target != stage else None)
            done[stage] = f"served by {target}"


async def _tuner_follows(svc: Service, plan: Plan, done: dict[str, str]) -> None:
    if svc.tuner is None:
        return
    if plan.tuner is not None:
        svc.tuner.replan(plan)
        if not svc.tuner.running:
            svc.tuner.start()
        done["tuner"] = "follows the new plan"
    elif svc.tuner.running:
        await svc.tuner.stop()
        done["tuner"] = "stopped: the new plan has no tuner inputs"
