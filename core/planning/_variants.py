"""Planning with model variants (the document is ``core/_variants.py``, format
``inferline.variants/1``): for every stage, a variant and its configuration so the cost is
lowest subject to the latency SLO *and* an accuracy floor.

Planning (:func:`plan_with_variants`) wraps the existing planner (``make_plan``, InferLine's
algorithm by default) without changing it: for every combination of variants that meets the
floors, the pipeline is planned with the stages' profiles taken from the chosen variants.
Combinations are tried in order of a cost lower bound (each stage needs at least one replica and
at least the capacity for its mean load at its cheapest cost per query) and skipped once the
bound is not below the best plan found (branch and bound), so the answer is the cheapest
feasible combination while most combinations are never planned.
:func:`plan_with_variants_section` writes what a live tuner needs to switch stages later into
the plan (``Plan.variants``); the tuner that switches is ``core/tuner/_variants.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import Plan, PlanVariants
from .._profiles import Profiles
from .._validate import as_float, as_list, as_mapping, no_extra_keys, req
from .._variants import PipelineVariants, pipeline_accuracy, stage_profiles
from ..errors import InfeasibleError
from ._strategies import make_plan

__all__ = ["VariantPlan", "plan_with_variants", "plan_with_variants_section"]


def _wake_of(profiles: Profiles, keep: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``profiles``' wake-up extras of the pairs in ``keep``."""
    out: dict[str, Any] = {}
    for m, by_hw in keep.items():
        for hw in by_hw:
            w = profiles.wake(m, hw)
            if w is not None:
                out.setdefault(m, {})[hw] = w
    return out


def _cost_lower_bound(
    pipeline: Pipeline, profiles: Profiles, rate: float, catalog: HardwareCatalog
) -> float:
    """Each model needs >= 1 replica and >= its mean load's worth of capacity."""
    total = 0.0
    for m in pipeline.models:
        best = math.inf
        load = rate * pipeline.visit_probability(m) * pipeline.visits_of(m)
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
    variants.check(pipeline, profiles)
    floor = variants.accuracy_floor if accuracy_floor is None else accuracy_floor
    if accuracy_floor is not None:
        as_float(accuracy_floor, "accuracy_floor", lo=0.0, hi=1.0)
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
