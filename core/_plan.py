"""Plan (format ``inferline.plan/1``): per-model configuration plus the tuner's inputs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._hardware import HardwareCatalog
from ._pipeline import Pipeline
from ._profiles import Profiles
from ._validate import (
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_format,
    no_extra_keys,
    req,
)
from ._variants import PipelineVariants
from .errors import NotFoundError, ValidationError

__all__ = [
    "MAX_BATCH_WAIT_MS",
    "PLAN_FORMAT",
    "LadderStep",
    "ModelConfig",
    "Plan",
    "PlanVariants",
    "TunerInputs",
    "TunerModel",
]

PLAN_FORMAT = "inferline.plan/1"
# A planned batch-wait timeout beyond this is no latency trade-off any SLO would make.
MAX_BATCH_WAIT_MS = 60_000.0


@dataclass(frozen=True)
class ModelConfig:
    """How one model is served: hardware kind, maximum batch size and replica count.

    ``batch_wait_ms``: the batch-wait timeout the planner chose (delayed batching: an idle
    replica starts a batch when it is full or its oldest query has waited this long); 0, the
    default, is greedy batching. In the plan file only when above 0, so older readers and
    older plan files are unaffected."""

    hardware: str
    max_batch_size: int = 1
    replicas: int = 1
    batch_wait_ms: float = 0.0

    def __post_init__(self) -> None:
        as_str(self.hardware, "hardware")
        as_int(self.max_batch_size, "max_batch_size", minimum=1)
        as_int(self.replicas, "replicas", minimum=0)
        w = as_float(self.batch_wait_ms, "batch_wait_ms", lo=0.0, hi=MAX_BATCH_WAIT_MS)
        object.__setattr__(self, "batch_wait_ms", w)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hardware": self.hardware,
            "max_batch_size": self.max_batch_size,
            "replicas": self.replicas,
        }
        if self.batch_wait_ms > 0:
            d["batch_wait_ms"] = self.batch_wait_ms
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> ModelConfig:
        m = as_mapping(d, where)
        no_extra_keys(m, {"hardware", "max_batch_size", "replicas", "batch_wait_ms"}, where)
        return cls(
            hardware=as_str(req(m, "hardware", where), f"{where}.hardware"),
            max_batch_size=as_int(
                req(m, "max_batch_size", where), f"{where}.max_batch_size", minimum=1
            ),
            replicas=as_int(req(m, "replicas", where), f"{where}.replicas", minimum=0),
            batch_wait_ms=as_float(
                m.get("batch_wait_ms", 0.0),
                f"{where}.batch_wait_ms",
                lo=0.0,
                hi=MAX_BATCH_WAIT_MS,
            ),
        )

    @property
    def batch_wait_s(self) -> float:
        return self.batch_wait_ms / 1e3

    def cost_per_hour(self, catalog: HardwareCatalog) -> float:
        return self.replicas * catalog.cost(self.hardware)


@dataclass(frozen=True)
class TunerModel:
    """Per-model inputs of the tuner (InferLine §5)."""

    scale_factor: float  # calls per pipeline query (``Pipeline.calls``: above 1 with visits)
    throughput_qps: float  # single replica, at the planned batch size and hardware
    max_provisioning_ratio: float  # planned arrival rate at the model / planned capacity

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale_factor": self.scale_factor,
            "throughput_qps": self.throughput_qps,
            "max_provisioning_ratio": self.max_provisioning_ratio,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> TunerModel:
        m = as_mapping(d, where)
        no_extra_keys(m, {"scale_factor", "throughput_qps", "max_provisioning_ratio"}, where)
        return cls(
            as_float(req(m, "scale_factor", where), f"{where}.scale_factor", positive=True),
            as_float(req(m, "throughput_qps", where), f"{where}.throughput_qps", positive=True),
            as_float(
                req(m, "max_provisioning_ratio", where),
                f"{where}.max_provisioning_ratio",
                positive=True,
            ),
        )


@dataclass(frozen=True)
class LadderStep:
    """A re-plan of the planned hardware for a higher arrival rate (the tuner's ladder).

    The planner run again on the planning trace compressed in time to ``rate_qps``, with each
    model pinned to its planned hardware: a configuration the estimator proved for that rate
    that differs from the plan only in batch sizes and replica counts, which the tuner can change
    on a live deployment (a batch size at once, a replica after its activation time).
    """

    rate_qps: float
    models: Mapping[str, ModelConfig]
    cost_per_hour: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_qps": self.rate_qps,
            "cost_per_hour": self.cost_per_hour,
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LadderStep:
        m = as_mapping(d, where)
        no_extra_keys(m, {"rate_qps", "cost_per_hour", "models"}, where)
        models = {
            as_str(k, f"{where}.models"): ModelConfig.from_dict(v, f"{where}.models.{k}")
            for k, v in as_mapping(req(m, "models", where), f"{where}.models").items()
        }
        return cls(
            as_float(req(m, "rate_qps", where), f"{where}.rate_qps", positive=True),
            models,
            as_float(m.get("cost_per_hour", 0.0), f"{where}.cost_per_hour", nonneg=True),
        )


@dataclass(frozen=True)
class TunerInputs:
    """The traffic envelope of the planning trace and per-model slack figures."""

    service_time_s: float
    # (window_s, max arrivals in any window of that size), windows doubling up to 60 s
    envelope: tuple[tuple[float, int], ...]
    mean_rate_qps: float
    models: Mapping[str, TunerModel] = field(default_factory=dict)
    # re-plans for higher rates on the planned hardware, by increasing rate (may be empty)
    ladder: tuple[LadderStep, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "envelope", tuple((float(w), int(n)) for w, n in self.envelope))
        object.__setattr__(self, "ladder", tuple(sorted(self.ladder, key=lambda s: s.rate_qps)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "service_time_s": self.service_time_s,
            "envelope": [[w, n] for w, n in self.envelope],
            "mean_rate_qps": self.mean_rate_qps,
            "models": {k: v.to_dict() for k, v in self.models.items()},
            **({"ladder": [s.to_dict() for s in self.ladder]} if self.ladder else {}),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuner") -> TunerInputs:
        m = as_mapping(d, where)
        no_extra_keys(m, {"service_time_s", "envelope", "mean_rate_qps", "models", "ladder"}, where)
        env = []
        for i, e in enumerate(as_list(req(m, "envelope", where), f"{where}.envelope")):
            e = as_list(e, f"{where}.envelope[{i}]")
            env.append(
                (
                    as_float(e[0], f"{where}.envelope[{i}][0]", positive=True),
                    as_int(e[1], f"{where}.envelope[{i}][1]", minimum=0),
                )
            )
        models = {
            k: TunerModel.from_dict(v, f"{where}.models.{k}")
            for k, v in as_mapping(m.get("models", {}), f"{where}.models").items()
        }
        return cls(
            as_float(req(m, "service_time_s", where), f"{where}.service_time_s", positive=True),
            tuple(env),
            as_float(req(m, "mean_rate_qps", where), f"{where}.mean_rate_qps", nonneg=True),
            models,
            tuple(
                LadderStep.from_dict(s, f"{where}.ladder[{i}]")
                for i, s in enumerate(as_list(m.get("ladder", []), f"{where}.ladder"))
            ),
        )


@dataclass(frozen=True)
class PlanVariants:
    """Which variant serves each variant stage of a plan made with variants, and what a live
    tuner needs to switch them later: the variants document (``inferline.variants/1``), the
    pipeline graph (``inferline.pipeline/1``) and the profiles (``inferline.profiles/1``) of
    every stage and variant on the planned hardware. Kept as documents (``Plan.from_dict``
    checks that they parse, with ``core/_variants.py`` and the pipeline and profile formats),
    so the plan file alone is enough for ``inferline serve``."""

    choice: Mapping[str, str]  # stage -> the variant (a model name) serving it
    accuracy: float
    spec: Mapping[str, Any]
    pipeline: Mapping[str, Any]
    profiles: Mapping[str, Any]

    def model_for(self, stage: str) -> str:
        """The model that serves ``stage`` in the plan (the stage itself if not a variant
        stage)."""
        return self.choice.get(stage, stage)

    def stage_models(self) -> dict[str, tuple[str, ...]]:
        """Every variant stage and the names of its variants, in the document's order."""
        stages = as_mapping(self.spec.get("stages", {}), "variants.spec.stages")
        return {
            s: tuple(str(v["name"]) for v in as_mapping(d, s).get("variants", []))
            for s, d in stages.items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": dict(self.choice),
            "accuracy": self.accuracy,
            "spec": dict(self.spec),
            "pipeline": dict(self.pipeline),
            "profiles": dict(self.profiles),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "variants") -> PlanVariants:
        m = as_mapping(d, where)
        no_extra_keys(m, {"choice", "accuracy", "spec", "pipeline", "profiles"}, where)
        choice = {
            as_str(k, f"{where}.choice"): as_str(v, f"{where}.choice.{k}")
            for k, v in as_mapping(req(m, "choice", where), f"{where}.choice").items()
        }
        return cls(
            choice,
            as_float(req(m, "accuracy", where), f"{where}.accuracy", lo=0.0, hi=1.0),
            dict(as_mapping(req(m, "spec", where), f"{where}.spec")),
            dict(as_mapping(req(m, "pipeline", where), f"{where}.pipeline")),
            dict(as_mapping(req(m, "profiles", where), f"{where}.profiles")),
        )


def _check_variants(v: PlanVariants, models: Mapping[str, ModelConfig]) -> None:
    """The documents parse, describe this plan's stages, and profile every variant on its
    stage's planned hardware (what the tuner prices a switch with)."""

    def refused(what: str, e: ValidationError | NotFoundError) -> ValidationError:
        if isinstance(e, ValidationError):
            return ValidationError(f"variants.{what}.{e.field}", e.expected, e.got)
        return ValidationError(f"variants.{what}", f"a known {e.kind}", e.name)

    def parsed(what: str, fn: Any, doc: Any) -> Any:
        try:
            return fn(doc)
        except (ValidationError, NotFoundError) as e:
            raise refused(what, e) from None

    spec = parsed("spec", PipelineVariants.from_dict, v.spec)
    pipeline = parsed("pipeline", Pipeline.from_dict, v.pipeline)
    profiles = parsed("profiles", Profiles.from_dict, v.profiles)
    if set(pipeline.models) != set(models):
        raise ValidationError(
            "variants.pipeline.models", f"the plan's models {sorted(models)!r}", pipeline.models
        )
    try:
        spec.check(pipeline)
    except (ValidationError, NotFoundError) as e:
        raise refused("spec", e) from None
    if set(v.choice) != set(spec.stages):
        raise ValidationError(
            "variants.choice", f"a variant for each of {sorted(spec.stages)!r}", sorted(v.choice)
        )
    for stage, sv in spec.stages.items():
        names = [x.name for x in sv.variants]
        if v.choice[stage] not in names:
            raise ValidationError(f"variants.choice.{stage}", f"one of {names!r}", v.choice[stage])
        hw = models[stage].hardware
        for name in names:
            if not profiles.has(name, hw):
                raise ValidationError(
                    f"variants.profiles.models.{name}", f"a profile on {hw!r}", "none"
                )


@dataclass(frozen=True)
class Plan:
    """A configuration of every model of a pipeline, as chosen by a planner."""

    pipeline: str
    slo_s: float
    models: Mapping[str, ModelConfig]
    percentile: float = 99.0
    cost_per_hour: float = 0.0
    estimated_latency_s: float = 0.0
    strategy: str = "inferline"
    tuner: TunerInputs | None = None
    variants: PlanVariants | None = None  # a plan made with model variants
    # model -> its server batcher's document (``TritonBatcher`` / ``TFServingBatcher``
    # ``to_dict()``, parsed by ``inferline.core.estimator.batcher_from_dict``): a plan made
    # with ``PlannerOptions.server``. Kept as documents because this module sits below the
    # estimator; in the file only when not empty.
    server_batchers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def config(self, model: str) -> ModelConfig:
        try:
            return self.models[model]
        except KeyError:
            raise NotFoundError("model in plan", model, sorted(self.models)) from None

    def with_models(self, models: Mapping[str, ModelConfig]) -> Plan:
        return replace(self, models=dict(models))

    def total_cost(self, catalog: HardwareCatalog) -> float:
        return sum(c.cost_per_hour(catalog) for c in self.models.values())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "pipeline": self.pipeline,
            "slo_s": self.slo_s,
            "percentile": self.percentile,
            "cost_per_hour": self.cost_per_hour,
            "estimated_latency_s": self.estimated_latency_s,
            "strategy": self.strategy,
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }
        if self.tuner is not None:
            d["tuner"] = self.tuner.to_dict()
        if self.variants is not None:
            d["variants"] = self.variants.to_dict()
        if self.server_batchers:
            d["server_batchers"] = {k: dict(v) for k, v in self.server_batchers.items()}
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Plan:
        m = check_format(d, PLAN_FORMAT)
        no_extra_keys(
            m,
            {
                "format",
                "pipeline",
                "slo_s",
                "percentile",
                "cost_per_hour",
                "estimated_latency_s",
                "strategy",
                "models",
                "tuner",
                "variants",
                "server_batchers",
            },
            "",
        )
        models = {
            as_str(k, "models"): ModelConfig.from_dict(v, f"models.{k}")
            for k, v in as_mapping(req(m, "models", ""), "models").items()
        }
        tuner = TunerInputs.from_dict(m["tuner"]) if m.get("tuner") is not None else None
        if tuner is not None:
            _check_ladder(tuner, models)
        variants = None
        if m.get("variants") is not None:
            variants = PlanVariants.from_dict(m["variants"])
            _check_variants(variants, models)
        return cls(
            pipeline=as_str(req(m, "pipeline", ""), "pipeline"),
            slo_s=as_float(req(m, "slo_s", ""), "slo_s", positive=True),
            models=models,
            percentile=as_float(m.get("percentile", 99.0), "percentile", lo=0.0, hi=100.0),
            cost_per_hour=as_float(m.get("cost_per_hour", 0.0), "cost_per_hour", nonneg=True),
            estimated_latency_s=as_float(
                m.get("estimated_latency_s", 0.0), "estimated_latency_s", nonneg=True
            ),
            strategy=as_str(m.get("strategy", "inferline"), "strategy"),
            tuner=tuner,
            variants=variants,
            server_batchers=_server_batchers(m.get("server_batchers", {}), models),
        )


_BATCHER_KINDS = ("tfserving", "triton")


def _server_batchers(d: Any, models: Mapping[str, ModelConfig]) -> dict[str, dict[str, Any]]:
    """The plan's server batchers: per planned model a document with a known ``kind`` and
    the model's ``max_batch_size`` (the fields themselves are the estimator's to check)."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in as_mapping(d, "server_batchers").items():
        where = f"server_batchers.{k}"
        if k not in models:
            raise ValidationError("server_batchers", f"models of the plan {sorted(models)!r}", k)
        b = as_mapping(v, where)
        kind = req(b, "kind", where)
        if kind not in _BATCHER_KINDS:
            raise ValidationError(f"{where}.kind", f"one of {list(_BATCHER_KINDS)!r}", kind)
        if req(b, "max_batch_size", where) != models[k].max_batch_size:
            raise ValidationError(
                f"{where}.max_batch_size",
                f"the model's max_batch_size {models[k].max_batch_size}",
                b["max_batch_size"],
            )
        out[k] = dict(b)
    return out


def _check_ladder(tuner: TunerInputs, models: Mapping[str, ModelConfig]) -> None:
    """A ladder step configures exactly the plan's models on the plan's hardware."""
    for i, step in enumerate(tuner.ladder):
        where = f"tuner.ladder[{i}].models"
        if set(step.models) != set(models):
            raise ValidationError(
                where, f"exactly the plan's models {sorted(models)!r}", sorted(step.models)
            )
        for k, c in step.models.items():
            if c.hardware != models[k].hardware:
                raise ValidationError(
                    f"{where}.{k}.hardware",
                    f"the plan's hardware {models[k].hardware!r}",
                    c.hardware,
                )
