"""Variant-aware planning and tuning (format ``inferline.variants/1``).

A stage of a pipeline may be served by one of several *variants*: models that do the same job
at different accuracy and cost (resnet152 / resnet50 / mobilenet). None of the peer systems
plans with them; here the planner picks, for every stage, a variant and its configuration so the
cost is lowest subject to the latency SLO *and* an accuracy floor, and the tuner may switch a
stage to a cheaper variant instead of adding replicas.

The variants document (separate from the pipeline, which stays ``inferline.pipeline/1``)::

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

Planning (:func:`plan_with_variants`) wraps the existing planner (``make_plan``, InferLine's
algorithm by default) without changing it: for every combination of variants that meets the
floors, the pipeline is planned with the stages' profiles taken from the chosen variants.
Combinations are tried in order of a cost lower bound (each stage needs at least one replica and
at least the capacity for its mean load at its cheapest cost per query) and skipped once the
bound is not below the best plan found (branch and bound), so the answer is the cheapest
feasible combination while most combinations are never planned.

Tuning (:class:`VariantTuner`) wraps ``TunerPolicy``: when the policy decides to scale up, each
variant stage may instead switch to a cheaper variant (floors held). Without a ladder the
alternative is provisioned with the paper's rule (``ceil(rate * s / (mu' * rho))``, ``mu'`` the
new variant's single-replica throughput at the stage's hardware and batch size); with the plan's
ladder it is the ladder's configuration with each switched stage resized to keep its throughput
at the same batch size. The cheapest alternative whose cost is below the plain scale-up and whose
estimated tail latency meets the SLO (the estimator on a seeded gamma trace, at the batch sizes
that will run and at the rate the plain decision provisions for) replaces it; the decision says
which stages switched and why. Back at the plan's configuration, with traffic the plan's own
tuner would not scale up for, the stages switch back to the plan's variants.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._hardware import DEFAULT_CATALOG, HardwareCatalog
from ._ladder import largest_feasible
from ._pipeline import Pipeline
from ._plan import LadderStep, ModelConfig, Plan, PlanVariants, TunerModel
from ._profiles import Profiles
from ._tuner import TunerConfig, TunerDecision, TunerPolicy, TunerState
from ._validate import as_float, as_list, as_mapping, as_str, check_format, no_extra_keys, req
from .errors import InfeasibleError, NotFoundError, ValidationError

__all__ = [
    "VARIANTS_FORMAT",
    "PipelineVariants",
    "StageVariants",
    "VariantDecision",
    "VariantPlan",
    "VariantSpec",
    "VariantTuner",
    "pipeline_accuracy",
    "plan_with_variants",
    "plan_with_variants_section",
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


def _wake_of(profiles: Profiles, keep: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``profiles``' wake-up extras of the pairs in ``keep``."""
    out: dict[str, Any] = {}
    for m, by_hw in keep.items():
        for hw in by_hw:
            w = profiles.wake(m, hw)
            if w is not None:
                out.setdefault(m, {})[hw] = w
    return out


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


def _cost_lower_bound(
    pipeline: Pipeline, profiles: Profiles, rate: float, catalog: HardwareCatalog
) -> float:
    """Each model needs >= 1 replica and >= its mean load's worth of capacity."""
    total = 0.0
    for m in pipeline.models:
        best = math.inf
        load = rate * pipeline.visit_probability(m)
        for hw in profiles.hardware_for(m):
            if hw not in catalog:
                continue
            mu = max(profiles.throughput(m, hw, b) for b in profiles.batch_sizes(m, hw))
            best = min(best, max(1.0, load / mu) * catalog.cost(hw))
        total += best
    return total


@dataclass(frozen=True)
class VariantPlan:
    """The chosen variant per stage, the plan (keyed by stage names) and what was considered:
    ``(choice, accuracy, cost or None if infeasible / skipped by the bound, note)``."""

    plan: Plan
    choice: Mapping[str, str]
    accuracy: float
    considered: tuple[tuple[Mapping[str, str], float, float | None, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "choice": dict(self.choice),
            "accuracy": self.accuracy,
            "considered": [
                {"choice": dict(c), "accuracy": a, "cost_per_hour": cost, "note": note}
                for c, a, cost, note in self.considered
            ],
        }

    @classmethod
    def from_dict(cls, d: Any) -> VariantPlan:
        m = as_mapping(d, "variant_plan")
        no_extra_keys(m, {"plan", "choice", "accuracy", "considered"}, "variant_plan")
        return cls(
            Plan.from_dict(req(m, "plan", "")),
            {str(k): str(v) for k, v in as_mapping(req(m, "choice", ""), "choice").items()},
            as_float(req(m, "accuracy", ""), "accuracy", lo=0.0, hi=1.0),
            tuple(
                (dict(c["choice"]), float(c["accuracy"]), c["cost_per_hour"], str(c["note"]))
                for c in as_list(m.get("considered", []), "considered")
            ),
        )


def plan_with_variants(
    pipeline: Pipeline,
    variants: PipelineVariants,
    profiles: Profiles,
    trace: np.ndarray,
    slo_s: float,
    *,
    accuracy_floor: float | None = None,
    strategy: str = "inferline",
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    planner: Callable[..., Plan] | None = None,
    **planner_kw: Any,
) -> VariantPlan:
    """The cheapest plan over every variant combination that meets the floors and the SLO.

    ``accuracy_floor`` overrides the document's pipeline floor. ``planner`` (default
    ``make_plan(strategy, ...)``) is called as ``planner(pipeline, profiles, trace, slo_s,
    catalog=..., **planner_kw)``. Raises ``InfeasibleError`` when no combination is feasible.
    """
    from ._baselines import make_plan  # the planner this wraps (not modified)

    variants.check(pipeline, profiles)
    floor = variants.accuracy_floor if accuracy_floor is None else accuracy_floor
    if accuracy_floor is not None:
        _floor(accuracy_floor, "accuracy_floor")
    run = planner or (lambda *a, **kw: make_plan(strategy, *a, **kw))
    rate = float(len(trace) / max(trace[-1] - trace[0], 1e-9)) if len(trace) > 1 else 0.0
    cands = []
    for ch in variants.choices():
        acc = pipeline_accuracy(pipeline, variants, ch)
        if floor is not None and acc < floor - 1e-12:
            continue
        prof = stage_profiles(profiles, ch)
        cands.append((_cost_lower_bound(pipeline, prof, rate, catalog), -acc, ch, prof, acc))
    if not cands:
        raise InfeasibleError(
            f"no variant combination meets the accuracy floor {floor} "
            f"(best {max(pipeline_accuracy(pipeline, variants, c) for c in variants.choices()):.4f})"
        )
    cands.sort(key=lambda c: (c[0], c[1]))
    best: tuple[Plan, dict[str, str], float] | None = None
    considered: list[tuple[Mapping[str, str], float, float | None, str]] = []
    for bound, _, ch, prof, acc in cands:
        if best is not None and bound >= best[0].cost_per_hour - 1e-12:
            considered.append((ch, acc, None, f"skipped: cost bound {bound:.4f} >= best"))
            continue
        try:
            p = run(pipeline, prof, trace, slo_s, catalog=catalog, **planner_kw)
        except InfeasibleError as e:
            considered.append((ch, acc, None, f"infeasible: {e}"))
            continue
        considered.append((ch, acc, p.cost_per_hour, "planned"))
        # equal cost: the more accurate combination
        if (
            best is None
            or p.cost_per_hour < best[0].cost_per_hour - 1e-12
            or (abs(p.cost_per_hour - best[0].cost_per_hour) <= 1e-12 and acc > best[2])
        ):
            best = (p, ch, acc)
    if best is None:
        raise InfeasibleError(
            f"no variant combination meets the SLO {slo_s * 1e3:.0f} ms"
            + ("" if floor is None else f" with accuracy >= {floor}")
        )
    return VariantPlan(best[0], best[1], best[2], tuple(considered))


def plan_with_variants_section(
    vplan: VariantPlan,
    pipeline: Pipeline,
    variants: PipelineVariants,
    profiles: Profiles,
    plan: Plan | None = None,
) -> Plan:
    """``plan`` (default ``vplan.plan``, e.g. with its ladder added) carrying the variant
    choice and what a live tuner needs to switch stages later (``Plan.variants``): the
    variants document, the pipeline graph, and the profiles of every stage and variant on the
    planned hardware (other hardware is left out: a switch keeps the stage's hardware)."""
    p = plan if plan is not None else vplan.plan
    keep: dict[str, Any] = {}
    for stage in pipeline.models:
        hw = p.models[stage].hardware
        names = [stage]
        if stage in variants.stages:
            names = [v.name for v in variants.stages[stage].variants]
        for name in names:
            if profiles.has(name, hw):
                keep.setdefault(name, {})[hw] = profiles.models[name][hw]
    section = PlanVariants(
        dict(vplan.choice),
        vplan.accuracy,
        variants.to_dict(),
        pipeline.to_dict(),
        Profiles(keep, _wake_of(profiles, keep)).to_dict(),
    )
    return replace(p, variants=section)


# ---------------------------------------------------------------- tuning


@dataclass(frozen=True)
class VariantDecision:
    """A tuner decision that may also switch stages to other variants."""

    decision: TunerDecision
    variants: Mapping[str, str]  # the variant serving every variant stage after the decision
    switched: Mapping[str, tuple[str, str]]  # stage -> (old, new), empty for a plain decision
    cost_per_hour: float
    scale_up_cost_per_hour: float | None = None  # what plain scaling would have cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision.to_dict(),
            "variants": dict(self.variants),
            "switched": {k: list(v) for k, v in self.switched.items()},
            "cost_per_hour": self.cost_per_hour,
            "scale_up_cost_per_hour": self.scale_up_cost_per_hour,
        }


class VariantTuner:
    """``TunerPolicy`` plus variant switching on scale-up (see the module docstring).

    Holds the current choice and policy (rebuilt with the new variant's throughput after a
    switch); ``step(state, now_s, peaks)`` returns ``(state, VariantDecision | None)``.
    Pure: the estimator runs on a gamma trace drawn from ``seed``.

    With a ladder (the policy's configurations carry batch sizes), an alternative keeps the
    decision's configuration and gives each switched stage the replicas that keep its
    throughput at the same batch size and hardware (``ceil(k * mu_old(b) / mu_new(b))``); it is
    checked at the rate the step was chosen for (the rate with the headroom) at the decision's
    batch sizes, which are what runs. After a switch the ladder's steps are rewritten the same
    way and re-checked (a step that fails is dropped), so the tuner goes on choosing proven
    configurations for the variants that serve. Without a ladder, the paper's replica rule.
    When a scale-down returns to the plan's configuration the stages switch back to the plan's
    variants: the plan is proven for them at that traffic.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        variants: PipelineVariants,
        profiles: Profiles,
        vplan: VariantPlan,
        config: TunerConfig | None = None,
        *,
        accuracy_floor: float | None = None,
        catalog: HardwareCatalog = DEFAULT_CATALOG,
        check_queries: int = 4000,
        cv: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.pipeline = pipeline
        self.variants = variants
        self.profiles = profiles
        self.plan = vplan.plan
        self.choice = dict(vplan.choice)
        self.floor = variants.accuracy_floor if accuracy_floor is None else accuracy_floor
        self.catalog = catalog
        self.config = config if config is not None else TunerConfig()
        self.check_queries = check_queries
        self.cv = cv
        self.seed = seed
        self.policy = TunerPolicy.from_plan(self.plan, self.config)
        # what a return to the plan restores
        self._plan_choice = dict(vplan.choice)
        self._plan_policy = self.policy

    @classmethod
    def from_plan(cls, plan: Plan, config: TunerConfig | None = None, **kw: Any) -> VariantTuner:
        """The tuner of a plan made with variants (``Plan.variants``, what ``inferline plan
        --variants`` writes); raises ``ValidationError`` for a plan without them."""
        v = plan.variants
        if v is None:
            raise ValidationError("plan.variants", "a plan made with variants", None)
        vplan = VariantPlan(plan, dict(v.choice), v.accuracy)
        return cls(
            Pipeline.from_dict(v.pipeline),
            PipelineVariants.from_dict(v.spec),
            Profiles.from_dict(v.profiles),
            vplan,
            config,
            **kw,
        )

    def initial_state(self, now_s: float = 0.0) -> TunerState:
        return self.policy.initial_state(now_s)

    def warm(self) -> float:
        """Run the estimator once on the plan (loads or compiles its kernel, up to seconds on
        a fresh machine), so a live tuner's first switch decision does not pay for it; the
        plan's estimated tail latency at its planned rate."""
        k = {m: c.replicas for m, c in self.plan.models.items()}
        b = {m: c.max_batch_size for m, c in self.plan.models.items()}
        rate = max(self.policy.inputs.mean_rate_qps, 1.0)
        return self._estimate(self.choice, k, b, rate)

    @property
    def windows(self) -> tuple[float, ...]:
        return self.policy.windows

    def cost(self, replicas: Mapping[str, int]) -> float:
        return sum(self.catalog.cost(self.plan.models[m].hardware) * n for m, n in replicas.items())

    def step(
        self, state: TunerState, now_s: float, peaks: Sequence[int]
    ) -> tuple[TunerState, VariantDecision | None]:
        new_state, d = self.policy.step(state, now_s, peaks)
        if d is None:
            held = None
            if self.choice != self._plan_choice:
                held = self._plan_holds(new_state, now_s, peaks)
            if held is not None:
                return self._return_to_plan(held[0], now_s, held[1])
            return new_state, None
        plain_cost = self.cost(d.replicas)
        if d.action != "up":
            if (
                self.choice != self._plan_choice
                and self._at_plan(d)
                and self._plan_fits(new_state, now_s)
            ):
                return self._switch_back(new_state, d, plain_cost)
            return new_state, VariantDecision(d, dict(self.choice), {}, plain_cost)
        alt = self._cheaper_variant(d)
        if alt is None:
            return new_state, VariantDecision(d, dict(self.choice), {}, plain_cost, plain_cost)
        choice, replicas, cost, est, rate = alt
        switched = {s: (self.choice[s], v) for s, v in choice.items() if self.choice[s] != v}
        self._adopt(choice)
        text = ", ".join(f"{s} {a}->{b}" for s, (a, b) in switched.items())
        reason = (
            f"{d.reason}; instead switch {text} (accuracy "
            f"{pipeline_accuracy(self.pipeline, self.variants, choice):.4f} >= floor), "
            f"${cost:.3f}/h < ${plain_cost:.3f}/h, estimated P{self.plan.percentile:g} "
            f"{est * 1e3:.0f} ms at {rate:.1f} q/s"
        )
        nd = replace(d, replicas=dict(replicas), reason=reason)
        st = replace(new_state, replicas=dict(replicas))
        return st, VariantDecision(nd, dict(self.choice), switched, cost, plain_cost)

    # -- internals ----------------------------------------------------------------------
    def _batch(self, d: TunerDecision) -> dict[str, int]:
        """The batch sizes that run after ``d``: its own (ladder), else the plan's."""
        return {m: int(d.batch.get(m, c.max_batch_size)) for m, c in self.plan.models.items()}

    def _at_plan(self, d: TunerDecision) -> bool:
        if any(d.replicas[m] != c.replicas for m, c in self.plan.models.items()):
            return False
        return not d.batch or d.batch == {m: c.max_batch_size for m, c in self.plan.models.items()}

    def _plan_holds(
        self, state: TunerState, now_s: float, peaks: Sequence[int]
    ) -> tuple[TunerState, TunerDecision | None] | None:
        """When the configuration is the plan's, stable for the stabilization delay, the plan's
        own tuner would keep no more than the plan for the traffic of its horizons, and would
        not scale it up now (with the plan's variants): that tuner's step (it may settle batch
        sizes); else None."""
        c = self.plan.models
        if any(state.replicas[m] != c[m].replicas for m in c):
            return None
        if now_s - state.last_change_s < self.config.stabilization_delay_s:
            return None
        if not self._plan_fits(state, now_s):
            return None
        st, d = self._plan_policy.step(state, now_s, peaks)
        return None if d is not None and d.action == "up" else (st, d)

    def _plan_fits(self, state: TunerState, now_s: float) -> bool:
        """Whether the plan's own tuner would keep no more than the plan's counts for the
        traffic of its horizons (not this tick's peaks alone: a tick may see no arrival), and
        no window exceeds the planned envelope. A scale-down of the switched variants' policy
        may reach the plan's counts at traffic the plan's variants cannot serve with them."""
        need = self._plan_policy.traffic_need(state, now_s)
        if not all(need[m] <= c.replicas for m, c in self.plan.models.items()):
            return False
        # nor while a window still holds traffic above the planned envelope: the plan's
        # tuner would scale up (and so switch again) as soon as a tick's rise reads it
        return not self._plan_policy.uses_ladder or self._plan_policy.within_envelope(state, now_s)

    def _return_to_plan(
        self, state: TunerState, now_s: float, d: TunerDecision | None
    ) -> tuple[TunerState, VariantDecision]:
        """Back to the plan's variants; replica counts stay the plan's."""
        if d is None:
            reps = {m: c.replicas for m, c in self.plan.models.items()}
            d = TunerDecision(
                float(now_s), reps, "the traffic fits the plan", 0.0, 0.0, "down", dict(state.batch)
            )
        else:
            d = replace(d, action="down")
        st = replace(state, last_change_s=float(now_s))  # the variants' replicas load: a change
        return self._switch_back(st, d, self.cost(d.replicas))

    def _switch_back(
        self, state: TunerState, d: TunerDecision, cost: float
    ) -> tuple[TunerState, VariantDecision]:
        switched = {s: (v, self._plan_choice[s]) for s, v in self.choice.items()}
        switched = {s: ab for s, ab in switched.items() if ab[0] != ab[1]}
        self.choice = dict(self._plan_choice)
        self.policy = self._plan_policy
        text = ", ".join(f"{s} {a}->{b}" for s, (a, b) in switched.items())
        nd = replace(d, reason=f"{d.reason}; back at the plan: switch {text} (the plan's variants)")
        return state, VariantDecision(nd, dict(self.choice), switched, cost)

    def _model(self, stage: str, variant: str) -> TunerModel:
        old = self.policy.inputs.models[stage]
        c = self.plan.models[stage]
        mu = self.profiles.throughput(variant, c.hardware, c.max_batch_size)
        return TunerModel(old.scale_factor, mu, old.max_provisioning_ratio)

    def _need(self, rate: float, choice: Mapping[str, str]) -> dict[str, int]:
        out = {}
        for m in self.pipeline.models:
            t = (
                self._model(m, choice[m])
                if m in choice and choice[m] != self.choice[m]
                else self.policy.inputs.models[m]
            )
            out[m] = max(
                1,
                math.ceil(
                    rate * t.scale_factor / (t.throughput_qps * t.max_provisioning_ratio) - 1e-9
                ),
            )
        return out

    def _resized(
        self, replicas: Mapping[str, int], batch: Mapping[str, int], choice: Mapping[str, str]
    ) -> dict[str, int] | None:
        """``replicas`` with every stage switched in ``choice`` given the replicas that keep
        its throughput at its batch size and hardware; None if a variant lacks that profile."""
        out = dict(replicas)
        for s, v in choice.items():
            if v == self.choice[s]:
                continue
            hw, b = self.plan.models[s].hardware, batch[s]
            try:
                ratio = self.profiles.throughput(self.choice[s], hw, b) / self.profiles.throughput(
                    v, hw, b
                )
            except (ValidationError, NotFoundError):
                return None
            out[s] = max(1, math.ceil(replicas[s] * ratio - 1e-9))
        return out

    def _estimate(
        self,
        choice: Mapping[str, str],
        replicas: Mapping[str, int],
        batch: Mapping[str, int],
        rate: float,
    ) -> float:
        """The estimator's tail latency of a configuration on a seeded gamma trace at ``rate``."""
        from ._estimator import simulate
        from ._trace import gamma_trace

        rng = np.random.default_rng(self.seed)
        trace = gamma_trace(rate, self.cv, self.check_queries / max(rate, 1e-9), rng)
        configs = {
            m: ModelConfig(c.hardware, batch[m], replicas[m]) for m, c in self.plan.models.items()
        }
        prof = stage_profiles(self.profiles, choice)
        res = simulate(self.pipeline, configs, prof, trace, catalog=self.catalog)
        return float(res.percentile(self.plan.percentile))

    def _cheaper_variant(
        self, d: TunerDecision
    ) -> tuple[dict[str, str], dict[str, int], float, float, float] | None:
        plain = self.cost(d.replicas)
        batch = self._batch(d)
        ladder = self.policy.uses_ladder and bool(d.batch)
        # the ladder chose its step for the rate with the headroom: hold the alternative to it
        rate = self.policy.room(d.rate_qps, self.config.headroom) if ladder else d.rate_qps
        options = []
        for ch in self.variants.choices():
            if ch == self.choice:
                continue
            if (
                self.floor is not None
                and pipeline_accuracy(self.pipeline, self.variants, ch) < self.floor - 1e-12
            ):
                continue
            if any(not self.profiles.has(ch[s], self.plan.models[s].hardware) for s in ch):
                continue
            need = self._resized(d.replicas, batch, ch) if ladder else self._need(d.rate_qps, ch)
            if need is None:
                continue
            cost = self.cost(need)
            if cost < plain - 1e-12:
                options.append((cost, ch, need))
        options.sort(key=lambda o: (o[0], -pipeline_accuracy(self.pipeline, self.variants, o[1])))
        for cost, ch, need in options:
            est = self._estimate(ch, need, batch, rate)
            if est <= self.plan.slo_s:
                return ch, need, cost, est, rate
        return None

    def _adopt(self, choice: Mapping[str, str]) -> None:
        models = dict(self.policy.inputs.models)
        for s, v in choice.items():
            if v != self.choice[s]:
                models[s] = self._model(s, v)
        ladder = self._rewrite_ladder(choice) if self.policy.uses_ladder else ()
        inputs = replace(self.policy.inputs, models=models, ladder=ladder)
        planned_batch = self.policy.planned_batch if ladder else None
        self.choice = dict(choice)
        self.policy = TunerPolicy(inputs, self.policy.planned, self.config, planned_batch)

    def _rewrite_ladder(self, choice: Mapping[str, str]) -> tuple[LadderStep, ...]:
        """The current ladder with the switched stages resized (throughput kept), each step
        re-checked at its rate for the new variants (steps that fail are dropped) and given
        the rate it is proven for with them (bisection, 4 halvings, between its rate and its
        rate times the switched stages' throughput gain)."""
        out: list[LadderStep] = []
        slo = self.plan.slo_s
        for st in self.policy.inputs.ladder:
            batch = {m: c.max_batch_size for m, c in st.models.items()}
            old = {m: c.replicas for m, c in st.models.items()}
            k = self._resized(old, batch, choice)
            if k is None or self._estimate(choice, k, batch, st.rate_qps) > slo:
                continue
            # Without its own rate, a step rewritten for a faster variant keeps the slower
            # one's, and above it the tuner adds replicas the new variant does not need (found
            # simulating a 12x burst: a switch cost more than adding slow replicas).
            rate, hi = st.rate_qps, st.rate_qps * self._speedup(old, k, batch, choice)
            if hi > rate * 1.01:
                rate = largest_feasible(
                    lambda r, k=k, b=batch: self._estimate(choice, k, b, r) <= slo, rate, hi, 4
                )
            models = {
                m: ModelConfig(c.hardware, c.max_batch_size, k[m]) for m, c in st.models.items()
            }
            out.append(LadderStep(rate, models, self.cost(k)))
        # a step another one serves more at no higher cost is dropped, as the ladder does
        out.sort(key=lambda x: (x.rate_qps, x.cost_per_hour))
        keep: list[LadderStep] = []
        for x in out:
            while keep and keep[-1].cost_per_hour >= x.cost_per_hour:
                keep.pop()
            keep.append(x)
        return tuple(keep)

    def _speedup(
        self,
        old: Mapping[str, int],
        new: Mapping[str, int],
        batch: Mapping[str, int],
        choice: Mapping[str, str],
    ) -> float:
        """The largest throughput gain of a switched stage (its new replicas and variant
        against the old): no stage can carry more than this over the step's rate."""
        best = 1.0
        for s, v in choice.items():
            if v == self.choice[s]:
                continue
            hw, b = self.plan.models[s].hardware, batch[s]
            mu_old = self.profiles.throughput(self.choice[s], hw, b)
            best = max(best, new[s] * self.profiles.throughput(v, hw, b) / (old[s] * mu_old))
        return best
