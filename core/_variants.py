"""Model variants (format ``inferline.variants/1``): which models may serve a stage.

A stage of a pipeline may be served by one of several *variants*: models that do the same job
at different accuracy and cost (resnet152 / resnet50 / mobilenet). The variants document
(separate from the pipeline, which stays ``inferline.pipeline/1``)::

    {"format": "inferline.variants/1", "pipeline": "video-monitoring",
     "accuracy_floor": 0.85,
     "stages": {"vehicle": {"variants": [{"name": "vehicle-r152", "accuracy": 0.95},
                                         {"name": "vehicle-r50", "accuracy": 0.92}],
                            "accuracy_floor": 0.9}}}

``stages`` keys are model names of the pipeline; each variant's ``name`` is a model in the
profiles. A stage without variants is served by its own model and counts as accuracy 1 in the
products below. Accuracy floors: a stage's ``accuracy_floor`` bounds the variant chosen for it;
the top-level ``accuracy_floor`` bounds the *pipeline accuracy*
``prod_m (1 - v_m (1 - a_m))`` over the variant stages, with ``v_m`` the stage's visit
probability (a query a stage never sees cannot be spoiled by it; errors of different stages are
taken as independent).

This module holds the document and what planning and tuning with variants share (the pipeline
accuracy of a choice, the profiles a choice serves with); the plan format (``Plan.variants``)
checks its variants section with it. Planning with variants is
:func:`~inferline.core.planning.plan_with_variants` (``core/planning/_variants.py``), switching
variants live is :class:`~inferline.core.tuner.VariantTuner` (``core/tuner/_variants.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._pipeline import Pipeline
from ._profiles import Profiles
from ._validate import as_float, as_list, as_mapping, as_str, check_format, no_extra_keys, req
from .errors import NotFoundError, ValidationError

__all__ = [
    "VARIANTS_FORMAT",
    "Choice",
    "PipelineVariants",
    "StageVariants",
    "VariantSpec",
    "pipeline_accuracy",
    "stage_profiles",
]

VARIANTS_FORMAT = "inferline.variants/1"
Choice = Mapping[str, str]


@dataclass(frozen=True)
class VariantSpec:
    """A model that can serve a stage, and its accuracy in [0, 1]."""

    name: str
    accuracy: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "accuracy": self.accuracy}


@dataclass(frozen=True)
class StageVariants:
    stage: str
    variants: tuple[VariantSpec, ...]
    accuracy_floor: float | None = None

    def allowed(self) -> tuple[VariantSpec, ...]:
        floor = self.accuracy_floor
        return tuple(v for v in self.variants if floor is None or v.accuracy >= floor - 1e-12)

    def accuracy_of(self, name: str) -> float:
        for v in self.variants:
            if v.name == name:
                return v.accuracy
        raise NotFoundError(
            f"variant of stage {self.stage!r}", name, [v.name for v in self.variants]
        )


@dataclass(frozen=True)
class PipelineVariants:
    """The variants document of one pipeline (see the module docstring)."""

    pipeline: str
    stages: Mapping[str, StageVariants] = field(default_factory=dict)
    accuracy_floor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": VARIANTS_FORMAT, "pipeline": self.pipeline}
        if self.accuracy_floor is not None:
            d["accuracy_floor"] = self.accuracy_floor
        stages: dict[str, Any] = {}
        for name, sv in self.stages.items():
            s: dict[str, Any] = {"variants": [v.to_dict() for v in sv.variants]}
            if sv.accuracy_floor is not None:
                s["accuracy_floor"] = sv.accuracy_floor
            stages[name] = s
        d["stages"] = stages
        return d

    @classmethod
    def from_dict(cls, d: Any) -> PipelineVariants:
        m = check_format(d, VARIANTS_FORMAT)
        no_extra_keys(m, {"format", "pipeline", "accuracy_floor", "stages"}, "")
        floor = _floor(m.get("accuracy_floor"), "accuracy_floor")
        stages: dict[str, StageVariants] = {}
        for name, raw in as_mapping(req(m, "stages", ""), "stages").items():
            where = f"stages.{name}"
            s = as_mapping(raw, where)
            no_extra_keys(s, {"variants", "accuracy_floor"}, where)
            vs = []
            for i, v in enumerate(as_list(req(s, "variants", where), f"{where}.variants")):
                w = f"{where}.variants[{i}]"
                vm = as_mapping(v, w)
                no_extra_keys(vm, {"name", "accuracy"}, w)
                vs.append(
                    VariantSpec(
                        as_str(req(vm, "name", w), f"{w}.name"),
                        as_float(req(vm, "accuracy", w), f"{w}.accuracy", lo=0.0, hi=1.0),
                    )
                )
            if not vs:
                raise ValidationError(f"{where}.variants", "at least one variant", [])
            names = [v.name for v in vs]
            if len(set(names)) != len(names):
                raise ValidationError(f"{where}.variants", "distinct variant names", names)
            sfloor = _floor(s.get("accuracy_floor"), f"{where}.accuracy_floor")
            stages[as_str(name, "stages")] = StageVariants(name, tuple(vs), sfloor)
        return cls(as_str(req(m, "pipeline", ""), "pipeline"), stages, floor)

    def check(self, pipeline: Pipeline, profiles: Profiles | None = None) -> None:
        """The document must name ``pipeline`` and its stages must be pipeline models; with
        ``profiles``, every variant must be profiled; a stage whose floor no variant meets is
        an error. Each error names the document's field."""
        if self.pipeline != pipeline.name:
            raise ValidationError(
                "pipeline", f"the pipeline's name {pipeline.name!r}", self.pipeline
            )
        for name, sv in self.stages.items():
            if name not in pipeline.models:
                raise ValidationError(
                    f"stages.{name}", f"a model of pipeline {pipeline.name!r}", name
                )
            if not sv.allowed():
                raise ValidationError(
                    f"stages.{name}.accuracy_floor",
                    f"at most the best variant's accuracy {max(v.accuracy for v in sv.variants)}",
                    sv.accuracy_floor,
                )
            if profiles is not None:
                for i, v in enumerate(sv.variants):
                    if v.name not in profiles.models:
                        raise ValidationError(
                            f"stages.{name}.variants[{i}].name",
                            f"a profiled model (profiled: {sorted(profiles.models)})",
                            v.name,
                        )

    def choices(self) -> Iterable[dict[str, str]]:
        """Every combination of allowed variants (stage floors applied)."""
        names = list(self.stages)
        pools = [[v.name for v in self.stages[s].allowed()] for s in names]
        for combo in itertools.product(*pools):
            yield dict(zip(names, combo, strict=True))


def _floor(v: Any, field: str) -> float | None:
    return None if v is None else as_float(v, field, lo=0.0, hi=1.0)


def pipeline_accuracy(pipeline: Pipeline, variants: PipelineVariants, choice: Choice) -> float:
    """``prod_m (1 - v_m (1 - a_m))`` over the variant stages (see the module docstring)."""
    acc = 1.0
    for stage, sv in variants.stages.items():
        a = sv.accuracy_of(choice[stage])
        acc *= 1.0 - pipeline.visit_probability(stage) * (1.0 - a)
    return acc


def stage_profiles(profiles: Profiles, choice: Choice) -> Profiles:
    """``profiles`` with each chosen stage's entry replaced by its variant's profile."""
    models = dict(profiles.models)
    wake = dict(profiles.wake_up)
    for stage, variant in choice.items():
        if variant not in profiles.models:
            raise NotFoundError("profiled model for variant", variant, sorted(profiles.models))
        models[stage] = profiles.models[variant]
        wake.pop(stage, None)
        if variant in profiles.wake_up:
            wake[stage] = profiles.wake_up[variant]
    return Profiles(models, wake)
