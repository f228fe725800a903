"""What a plan asks of a deployment's models: each model's configuration (variant stages by their chosen variant), the checks before anything moves, and draining a model's queue before its replicas go."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from inferline.core import (
    ModelConfig,
    Plan,
    ValidationError,
)
from inferline.deploy._format import Deployment

__all__ = [
    "check_stages_served",
    "configs_for",
    "drain",
    "oversubscription",
    "planned_models",
    "stage_routes",
]

log = logging.getLogger(__name__)


def planned_models(plan: Plan) -> dict[str, ModelConfig]:
    """The plan's configurations by the deployment model that serves them: a variant stage by
    its chosen variant, the stage's other variants idle (no replicas, the stage's hardware and
    batch size, so a switch only has to start replicas)."""
    if plan.variants is None:
        return dict(plan.models)
    out: dict[str, ModelConfig] = {}
    variants = plan.variants.stage_models()
    for stage, cfg in plan.models.items():
        for name in variants.get(stage, ()):
            out[name] = ModelConfig(cfg.hardware, cfg.max_batch_size, 0)
        out[plan.variants.model_for(stage)] = cfg
    return out


def check_stages_served(plan: Plan | None) -> None:
    """Refuse a plan that gives a pipeline's model no replica: every query for it would wait
    in its queue until the deadline (``simulate`` refuses such a plan too). Idle model
    variants are not in ``plan.models``; ``planned_models`` adds them."""
    if plan is None:
        return
    for name, cfg in sorted(plan.models.items()):
        if cfg.replicas < 1:
            raise ValidationError(
                f"plan.models.{name}.replicas",
                "at least 1: the pipeline sends queries there (idle model variants are "
                "listed in plan.variants, not here)",
                cfg.replicas,
            )


def configs_for(dep: Deployment, plan: Plan | None) -> dict[str, ModelConfig]:
    planned = planned_models(plan) if plan is not None else {}
    out = {}
    for spec in dep.models:
        out[spec.name] = planned.get(spec.name, ModelConfig("cpu", 1, 1))
    unknown = sorted(set(planned) - {m.name for m in dep.models})
    if unknown:
        what = "plan.models" if plan is None or plan.variants is None else "plan.variants"
        raise ValidationError(what, f"models of deployment {dep.name!r}", unknown)
    return out


async def drain(dispatcher: Any, model: str, timeout_s: float = 30.0) -> bool:
    """Wait until ``model``'s queue has no query waiting or in a replica (before its replicas
    go, so nothing queued is stranded); False if ``timeout_s`` passed first."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while True:
        st = dispatcher.stats(model)
        if st.queued + st.in_flight == 0:
            return True
        if time.monotonic() >= deadline:
            log.warning("%r still has %d queries after %.0f s", model, st.queued, timeout_s)
            return False
        await asyncio.sleep(0.01)


def stage_routes(plan: Plan | None) -> dict[str, str]:
    """Stage -> the variant serving it (stages served by a model of another name)."""
    if plan is None or plan.variants is None:
        return {}
    return {s: v for s, v in plan.variants.choice.items() if s != v}


def oversubscription(
    dep: Deployment, backend: Any, configs: Mapping[str, ModelConfig]
) -> str | None:
    """What ``configs`` take beyond the backend's inventory, as a note, or None. Only a
    backend that shares its cores or GPUs (``oversubscribe``) places such a plan at all; an
    estimate that gives every replica a core (or GPU) of its own is optimistic there (the
    2-core demo at a 20 ms SLO: estimated P99 19 ms, served 24.6 ms), one planned with
    ``pinned_cores`` is not."""
    inventory = getattr(backend, "inventory", None)
    if inventory is None:
        return None
    have = inventory()
    use: dict[str, int] = {}
    for name, c in configs.items():
        threads = dep.model(name).threads if c.hardware == "cpu" else 1
        use[c.hardware] = use.get(c.hardware, 0) + c.replicas * threads
    over = [f"{h}: {n} of {have[h]}" for h, n in sorted(use.items()) if n > have.get(h, n)]
    if not over:
        return None
    pins = ",".join(f"{h}={have[h]}" for h in sorted(use) if h in have)
    return (
        f"the plan's replicas take {', '.join(over)} units: they share them. An estimate that "
        f"gives each replica its own is optimistic: plan with --pinned-cores {pins} (how this "
        "runtime places replicas), or --inventory to stay within, or re-plan on `inferline "
        "calibrate` profiles with --service-spread once it has served"
    )
