"""The tuner's ladder: re-plans of the planned hardware for higher arrival rates.

InferLine's tuner (§5) only changes replica counts of the plan, scaling every model's count by
the rate ratio (``ceil(λ s_m / (μ_m ρ_m)) = ceil(k_m λ / λ_plan)``). The paper's own oracle
shows what that leaves on the table: a plan made for the peak picks other batch sizes (social
media at 250 q/s: nmt batch 8 x 2 instead of 4 x 4), so replica-only scaling pays 1.3-1.5x the
peak plan's cost while the rate is up (``benchmarks/paper_tuner.py``).

The ladder is computed with the plan, offline: the same planner run on the planning trace
compressed in time by factors above 1 (the same burstiness at a higher rate), with each model
pinned to its planned hardware. Hardware is pinned because a live hardware change means new
replicas of another kind on a model whose replicas are all of one kind (the backends' ``scale()``
and the estimator work per model); batch size and replica count are what the tuner can change
on a live deployment. Each step is a configuration the estimator proved for its rate.

The tuner (``TunerConfig(reconfigure="ladder")``) provisions a rate ``λ`` with the cheapest step
whose rate is at least ``λ``, and above the top step scales the top step's counts by
``λ / rate_top``: the paper's rule with the top step as the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ._hardware import DEFAULT_CATALOG, HardwareCatalog
from ._pipeline import Pipeline
from ._plan import LadderStep, Plan
from ._planning import PlannerOptions
from ._profiles import Profiles
from .errors import InfeasibleError, ValidationError

__all__ = ["LADDER_FACTORS", "pin_hardware", "plan_ladder", "with_ladder"]

# Rate factors over the planning trace's mean; finer near 1 where most excursions are.
LADDER_FACTORS: tuple[float, ...] = (1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)


def pin_hardware(profiles: Profiles, plan: Plan) -> Profiles:
    """``profiles`` with every model of ``plan`` restricted to its planned hardware."""
    out = {}
    for m, c in plan.models.items():
        if not profiles.has(m, c.hardware):
            raise ValidationError(f"plan.models.{m}.hardware", "a profiled hardware", c.hardware)
        out[m] = {c.hardware: profiles.models[m][c.hardware]}
    return Profiles(out)


def plan_ladder(
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    plan: Plan,
    *,
    factors: Sequence[float] = LADDER_FACTORS,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    options: PlannerOptions | None = None,
    progress: Callable[[float, LadderStep | None], None] | None = None,
) -> tuple[LadderStep, ...]:
    """Re-plan ``plan`` for the rates ``factors x`` the trace's mean, hardware pinned.

    Stops at the first infeasible factor (the pinned hardware cannot serve that rate within
    the SLO at any batch size and the replica cap). A step that costs more than a later one is
    dropped (the later, cheaper configuration serves the lower rate too), and so is one whose
    configuration the next step repeats or that equals the plan.
    ``progress(factor, step_or_None)`` is called after each factor.
    """
    from ._planner import plan_inferline  # the planner imports this module's users

    if plan.tuner is None:
        raise ValidationError("plan.tuner", "tuner inputs (re-run the planner)", None)
    fs = sorted(float(f) for f in factors)
    if any(f <= 1.0 for f in fs):
        raise ValidationError("factors", "rate factors > 1", fs)
    t = np.asarray(trace, dtype=np.float64)
    if t.size < 2:
        raise ValidationError("trace", "at least 2 arrivals", int(t.size))
    pinned = pin_hardware(profiles, plan)
    base = plan.tuner.mean_rate_qps
    steps: list[LadderStep] = []
    for f in fs:
        compressed = t[0] + (t - t[0]) / f
        try:
            p = plan_inferline(
                pipeline,
                pinned,
                compressed,
                plan.slo_s,
                percentile=plan.percentile,
                catalog=catalog,
                options=options,
            )
        except InfeasibleError:
            if progress is not None:
                progress(f, None)
            break
        step = LadderStep(rate_qps=base * f, models=dict(p.models), cost_per_hour=p.cost_per_hour)
        steps.append(step)
        if progress is not None:
            progress(f, step)
    keep: list[LadderStep] = []
    for i, s in enumerate(steps):
        later = steps[i + 1 :]
        if any(s.cost_per_hour > o.cost_per_hour + 1e-9 for o in later):
            continue  # a cheaper configuration is proven for a higher rate
        if later and later[0].models == s.models:
            continue  # the same configuration is proven for the next rate up
        if s.models != plan.models:
            keep.append(s)
    return tuple(keep)


def with_ladder(
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    plan: Plan,
    **kw: object,
) -> Plan:
    """``plan`` with :func:`plan_ladder`'s steps in its tuner inputs."""
    from dataclasses import replace

    steps = plan_ladder(pipeline, profiles, trace, plan, **kw)  # type: ignore[arg-type]
    assert plan.tuner is not None
    return replace(plan, tuner=replace(plan.tuner, ladder=steps))
