"""Health: what ``GET /healthz`` (and the front doors' readiness) report of a service.

Read at call time from the service's parts, since the plan, the dispatcher's variant
switches and the backend's replicas all change while it serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from inferline.core import InferlineError

__all__ = ["HealthSource", "health", "variant_stages"]


class HealthSource(Protocol):
    """What health reads (a ``Service``)."""

    apps: Mapping[str, Any]
    models: Sequence[str]
    backend: Any
    dispatcher: Any
    plan: Any
    closing: bool


def health(svc: HealthSource) -> dict[str, Any]:
    """``status`` (ok, degraded, closing), the apps and the serving replicas per model."""
    replicas, unresponsive = _replica_counts(svc)
    idle = {m for m, stages in variant_stages(svc.plan, svc.dispatcher).items() if not stages}
    ok = not svc.closing and all(n > 0 for m, n in replicas.items() if m not in idle)
    out: dict[str, Any] = {
        "status": "ok" if ok else ("closing" if svc.closing else "degraded"),
        "apps": sorted(svc.apps),
        "replicas": replicas,
    }
    if idle:
        # variants that serve no stage now run no replicas by design (the plan's idle
        # variants, or the one a live switch left): not counted as down
        out["idle_variants"] = sorted(idle)
    if unresponsive:
        out["unresponsive"] = unresponsive
    return out


def _replica_counts(svc: HealthSource) -> tuple[dict[str, int], dict[str, int]]:
    """Serving and unresponsive replicas per model (none without a backend)."""
    replicas: dict[str, int] = {}
    unresponsive: dict[str, int] = {}
    if svc.backend is None:
        return replicas, unresponsive
    for m in svc.models:
        try:
            handles = svc.backend.replicas(m)
        except InferlineError:
            handles = []
        # a replica that stopped answering its heartbeats (hung, or stopped) is not
        # counted as serving, though the backend has not replaced it yet
        stuck = sum(1 for h in handles if getattr(h, "unresponsive", False))
        replicas[m] = len(handles) - stuck
        if stuck:
            unresponsive[m] = stuck
    return replicas, unresponsive


def variant_stages(plan: Any, dispatcher: Any) -> dict[str, list[str]]:
    """With model variants: every variant model and the stages it serves now (empty for
    an idle one); ``{}`` without variants."""
    variants = getattr(plan, "variants", None)
    if variants is None:
        return {}
    out: dict[str, list[str]] = {}
    for stage, names in variants.stage_models().items():
        serving = dispatcher.resolve(stage) if dispatcher is not None else variants.model_for(stage)
        for n in names:
            out.setdefault(n, [])
            if n == serving:
                out[n].append(stage)
    return out
