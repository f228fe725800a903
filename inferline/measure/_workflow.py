"""The steps the CLI, the demo and the fidelity benchmark share.

* ``trace_deployment``: run the sample queries through an app's pipeline with every model
  evaluated in this process, recording each model's inputs (what the profiler batches) and
  deriving the pipeline DAG with scale factors (the queue's lineage tracer).
* ``profile_deployment``: trace, then profile every model on the deployment's backend.
* ``hop_overhead_from``: the per-hop overhead of the live system (HTTP, RPC, event-loop
  time that profiles do not contain), from a low-load replay: the median measured latency
  minus the median simulated one, spread over the mean number of model visits per query.
* ``estimate``: the estimator's latencies for a plan and a trace, with that overhead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    HardwareCatalog,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    SimResult,
    ValidationError,
    import_object,
    simulate,
)
from inferline.measure._profiler import ProfileResult, ProfilerOptions, Progress, profile_models
from inferline.measure._replay import ReplayResult

__all__ = [
    "estimate",
    "hop_overhead_from",
    "load_containers",
    "profile_deployment",
    "trace_deployment",
]

log = logging.getLogger(__name__)


class AppLike(Protocol):
    """What these steps read of an app of a deployment (``inferline.deploy.AppSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def input(self) -> Any: ...
    def pipeline_fn(self) -> Any: ...


class DeploymentLike(Protocol):
    """What these steps read of a deployment (``inferline.deploy.Deployment``; measure sits
    below deploy, so it names the shape, not the class)."""

    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def models(self) -> Sequence[Any]: ...
    @property
    def apps(self) -> Sequence[AppLike]: ...
    def load_sample_inputs(self) -> list[Any]: ...
    def open_backend(self, host: Any = None) -> Any: ...


def load_containers(dep: DeploymentLike, models: Sequence[str] | None = None) -> dict[str, Any]:
    """Instantiate and ``load()`` the model containers in this process (tracing only)."""
    out = {}
    for spec in dep.models:
        if models is not None and spec.name not in models:
            continue
        factory = import_object(spec.source, f"models.{spec.name}.source")
        c = factory(**dict(spec.params))
        if callable(getattr(c, "load", None)):
            c.load()
        out[spec.name] = c
    return out


def _app(dep: DeploymentLike, app: str | None) -> AppLike:
    if not dep.apps:
        raise ValidationError("apps", "at least one app to trace", [])
    if app is None:
        return dep.apps[0]
    for a in dep.apps:
        if a.name == app:
            return a
    raise ValidationError("app", f"one of {[a.name for a in dep.apps]!r}", app)


async def trace_deployment(
    dep: DeploymentLike,
    *,
    app: str | None = None,
    samples: Sequence[Any] | None = None,
    containers: Mapping[str, Any] | None = None,
    stages: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Pipeline, dict[str, list[Any]]]:
    """``(pipeline DAG, {model: inputs it received})`` from the sample queries.

    ``stages`` (model variants, ``{stage: [variant, ...]}``): a pipeline call of a stage
    that is not a model of the deployment runs the stage's first variant (the pipeline's
    control flow follows its outputs); the stage keeps its name in the DAG and its inputs."""
    from inferline.queueing import trace_pipeline

    a = _app(dep, app)
    xs = list(samples) if samples is not None else dep.load_sample_inputs()
    if a.input is not None:
        xs = [a.input.check(x, "sample") for x in xs]
    models = dict(containers) if containers is not None else load_containers(dep)
    seen: dict[str, list[Any]] = {}
    variants = dict(stages or {})

    async def call(model: str, x: Any) -> Any:
        c = models.get(model)
        if c is None and model in variants and variants[model]:
            c = models.get(variants[model][0])
        if c is None:
            raise ValidationError(
                "pipeline call", f"a model of the deployment {sorted(models)}", model
            )
        seen.setdefault(model, []).append(x)
        out = c.predict_batch([x])
        return out[0]

    pipeline = await trace_pipeline(a.pipeline_fn(), xs, dep.name, call=call)
    return pipeline, seen


async def profile_deployment(
    dep: DeploymentLike,
    options: ProfilerOptions | None = None,
    *,
    backend: Any = None,
    app: str | None = None,
    samples: Sequence[Any] | None = None,
    progress: Progress | None = None,
    stages: Mapping[str, Sequence[str]] | None = None,
) -> tuple[ProfileResult, Pipeline]:
    """Trace the pipeline, then profile its models on ``backend`` (default: the deployment's).

    ``stages`` (model variants, ``{stage: [variant, ...]}``, e.g. from an
    ``inferline.variants/1`` document): every variant is profiled on the inputs its stage
    received; the DAG names the stages (what ``inferline plan --variants`` takes)."""
    stages = dict(stages or {})
    pipeline, inputs = await trace_deployment(dep, app=app, samples=samples, stages=stages)
    for stage, names in stages.items():
        for name in names:
            if stage in inputs and name not in inputs:
                inputs[name] = inputs[stage]
    specs = [s for s in dep.models if s.name in inputs]
    missing = [s.name for s in dep.models if s.name not in inputs]
    if missing:
        log.warning("no sample query reached %s: not profiled", missing)
    own = backend is None
    if own:  # the deployment opens it (measure builds no backend of its own)
        backend = dep.open_backend()
    try:
        result = await profile_models(backend, specs, inputs, options, progress=progress)
        hops = getattr(backend, "hop_profiles", None)
        if callable(hops):  # a fleet: the hop to its farthest server is in the service time
            result = replace(result, profiles=await hops(result.profiles))
    finally:
        if own:
            await backend.close()
    return result, pipeline


def estimate(
    pipeline: Pipeline,
    plan: Plan | Mapping[str, ModelConfig],
    profiles: Profiles,
    arrivals: np.ndarray,
    *,
    hop_overhead_s: float = 0.0,
    seed: int = 0,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    service_spread: bool = False,
    base: EstimatorOptions | None = None,
) -> SimResult:
    """The estimator on ``arrivals`` with ``base``'s options (its shared cores, say) and the
    per-hop overhead, seed and service spread given here."""
    configs = plan.models if isinstance(plan, Plan) else plan
    opts = replace(
        base or EstimatorOptions(),
        hop_overhead_s=max(0.0, hop_overhead_s),
        seed=seed,
        service_spread=service_spread,
    )
    arr = np.asarray(arrivals, dtype=float)
    return simulate(pipeline, configs, profiles, arr, options=opts, catalog=catalog)


def hop_overhead_from(
    measured: ReplayResult,
    pipeline: Pipeline,
    plan: Plan | Mapping[str, ModelConfig],
    profiles: Profiles,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    service_spread: bool = False,
    base: EstimatorOptions | None = None,
) -> float:
    """Per-hop overhead (s) that makes the estimator's median match a low-load replay's."""
    ok = measured.ok
    if ok.sum() < 5:
        raise ValidationError("replay", "at least 5 answered queries", int(ok.sum()))
    sim = estimate(
        pipeline,
        plan,
        profiles,
        measured.scheduled_s,
        catalog=catalog,
        service_spread=service_spread,
        base=base,
    )
    visits = sum(pipeline.calls(m) for m in pipeline.models)  # queue entries per query
    gap = float(np.median(measured.latency_s[ok]) - np.median(sim.latencies_s))
    return max(0.0, gap / max(visits, 1e-9))
