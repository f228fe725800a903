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

Each step's rate is the highest its configuration is proven for (bisection with the
estimator on the compressed trace), the plan included, so a configuration is used up to its
capacity. The tuner (``TunerConfig(reconfigure="ladder")``) provisions a rate ``λ`` with the
cheapest step whose rate is at least ``λ``, and above the top step scales the top step's
counts by ``λ / rate_top``: the paper's rule with the top step as the plan.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import LadderStep, ModelConfig, Plan
from .._profiles import Profiles
from .._trace import compress
from ..errors import InfeasibleError, ValidationError
from ..estimator import simulate
from ._inferline import plan_inferline
from ._margin import resolve_margin
from ._options import PlannerOptions

__all__ = [
    "LADDER_FACTORS",
    "capacity_factor",
    "largest_feasible",
    "pin_hardware",
    "plan_ladder",
    "with_ladder",
]

# Rate factors over the planning trace's mean; finer near 1 where most excursions are. The
# greedy planner's answers are not monotone in the rate (a re-plan for 2.2x can cost little more
# than one for 2x and serve far more), so more factors find cheaper steps: 18 instead of 8 made
# the benchmark's tuner 1% cheaper on average, for about 2.5x the ladder's planning time.
LADDER_FACTORS: tuple[float, ...] = (
    1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.75, 1.9, 2.0, 2.2, 2.5, 2.75, 3.0, 3.5, 4.0,
)  # fmt: skip


def pin_hardware(profiles: Profiles, plan: Plan) -> Profiles:
    """``profiles`` with every model of ``plan`` restricted to its planned hardware."""
    out = {}
    wake = {}
    for m, c in plan.models.items():
        if not profiles.has(m, c.hardware):
            raise ValidationError(f"plan.models.{m}.hardware", "a profiled hardware", c.hardware)
        out[m] = {c.hardware: profiles.models[m][c.hardware]}
        w = profiles.wake(m, c.hardware)
        if w is not None:
            wake[m] = {c.hardware: w}
    return Profiles(out, wake)


def _feasible(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    trace: np.ndarray,
    factor: float,
    plan: Plan,
    catalog: HardwareCatalog,
    options: PlannerOptions,
) -> bool:
    """The planner's test: the percentile latency on the trace compressed by ``factor`` (and
    by the planner's rate margin on top, so a step keeps the plan's slack)."""
    compressed = compress(trace, factor * (1.0 + options.rate_margin))
    r = simulate(
        pipeline, configs, profiles, compressed, options=options.estimator, catalog=catalog
    )
    return bool(r.percentile(plan.percentile) <= plan.slo_s)


def capacity_factor(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    trace: np.ndarray,
    plan: Plan,
    *,
    lo: float = 1.0,
    hi: float = 2.0,
    iterations: int = 7,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    options: PlannerOptions | None = None,
) -> float:
    """The largest rate factor (bisection within ``[lo, hi]``, ``lo`` assumed feasible) at
    which ``configs`` still meet the plan's SLO on the trace compressed by that factor.

    A re-plan is the cheapest configuration for its rate, but integer replica counts leave it
    slack: it usually serves more. The tuner uses each configuration up to this proven rate
    instead of stepping up at every factor of the ladder."""
    t = np.asarray(trace, dtype=np.float64)
    opts = resolve_margin(options or PlannerOptions(), t)  # "auto": the plan's sample's margin
    return largest_feasible(
        lambda f: _feasible(pipeline, configs, profiles, t, f, plan, catalog, opts),
        lo,
        hi,
        iterations,
    )


def largest_feasible(ok: Callable[[float], bool], lo: float, hi: float, iterations: int) -> float:
    """``hi`` if ``ok(hi)``, else the largest value bisection finds in ``[lo, hi]`` after
    ``iterations`` halvings (``lo`` assumed ok): how a configuration's capacity is found,
    for the ladder's steps and for steps rewritten for another model variant."""
    if ok(hi):
        return hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
    workers: int | None = None,
) -> tuple[LadderStep, ...]:
    """Re-plan ``plan`` for the rates ``factors x`` the trace's mean, hardware pinned.

    Stops at the first infeasible factor (the pinned hardware cannot serve that rate within
    the SLO at any batch size and the replica cap). Each step's ``rate_qps`` is then the
    highest rate its configuration is proven for (:func:`capacity_factor`), and the plan
    itself becomes a step when it serves more than its planning rate. Steps are kept only if
    no step proven for at least their rate costs as little (so the first step with enough rate
    is the cheapest). ``progress(factor, step_or_None)`` is called after each factor, in
    factor order. ``workers``: threads planning factors at once (default: one per CPU).
    """
    if plan.tuner is None:
        raise ValidationError("plan.tuner", "tuner inputs (re-run the planner)", None)
    fs = sorted(float(f) for f in factors)
    if any(f <= 1.0 for f in fs):
        raise ValidationError("factors", "rate factors > 1", fs)
    t = np.asarray(trace, dtype=np.float64)
    if t.size < 2:
        raise ValidationError("trace", "at least 2 arrivals", int(t.size))
    opts = _with_plan_waits(resolve_margin(options or PlannerOptions(), t), plan)
    pinned = pin_hardware(profiles, plan)
    base = plan.tuner.mean_rate_qps

    def replan(f: float) -> Plan | None:
        try:
            return plan_inferline(
                pipeline,
                pinned,
                compress(t, f),  # the planner adds its own rate margin
                plan.slo_s,
                percentile=plan.percentile,
                catalog=catalog,
                options=opts,
            )
        except InfeasibleError:
            return None

    def capacity(step: tuple[float, Mapping[str, ModelConfig], float]) -> LadderStep | None:
        f, models, cost = step
        cap = capacity_factor(
            pipeline, models, profiles, t, plan, lo=f, hi=2.0 * f, catalog=catalog, options=opts
        )
        return LadderStep(base * cap, models, cost) if cap > 1.0 else None

    # The factors are independent re-plans and the estimator's kernel releases the GIL, so
    # they run in threads (the same results as one by one; a factor past the first infeasible
    # one may be planned in vain).
    n = max(1, min(len(fs), os.cpu_count() or 1) if workers is None else int(workers))
    found: list[tuple[float, Mapping[str, ModelConfig], float]] = []
    with ThreadPoolExecutor(n, thread_name_prefix="ladder") as pool:
        futures = [pool.submit(replan, f) for f in fs]
        try:
            for f, fut in zip(fs, futures, strict=True):
                p = fut.result()
                if p is None:
                    if progress is not None:
                        progress(f, None)
                    break
                models = _carry_waits(p.models, plan)
                found.append((f, models, p.cost_per_hour))
                if progress is not None:
                    progress(f, LadderStep(base * f, models, p.cost_per_hour))
        finally:
            for fut in futures:
                fut.cancel()  # the ladder stops at the first infeasible factor (or an error)
        first = (1.0, dict(plan.models), plan.cost_per_hour)
        cands = [s for s in pool.map(capacity, [first, *found]) if s is not None]
    return _cheapest_steps(cands)


def _with_plan_waits(options: PlannerOptions, plan: Plan) -> PlannerOptions:
    """Steps are judged with the plan's batch waits and search none of their own: the live
    tuner changes batch sizes and replicas and keeps each model's batching policy (the
    plan's delayed batching, or fixed)."""
    waits = {m: c.batch_wait_s for m, c in plan.models.items() if c.batch_wait_ms > 0}
    est = replace(options.estimator, batch_wait_s={**waits, **options.estimator.batch_wait_s})
    return replace(options, estimator=est, batch_wait=False)


def _carry_waits(models: Mapping[str, ModelConfig], plan: Plan) -> dict[str, ModelConfig]:
    """A step's configurations with the plan's batch waits written in (what they were judged
    with and what the live policy keeps)."""
    return {m: replace(c, batch_wait_ms=plan.models[m].batch_wait_ms) for m, c in models.items()}


def _cheapest_steps(cands: Sequence[LadderStep]) -> tuple[LadderStep, ...]:
    """The steps no other step proven for at least their rate serves as cheaply, by rate."""
    keep = [
        s
        for s in cands
        if not any(
            o is not s
            and o.rate_qps >= s.rate_qps
            and o.cost_per_hour <= s.cost_per_hour
            and (o.rate_qps > s.rate_qps or o.cost_per_hour < s.cost_per_hour)
            for o in cands
        )
    ]
    out: list[LadderStep] = []
    for s in sorted(keep, key=lambda s: s.rate_qps):
        if not out or s.rate_qps > out[-1].rate_qps:
            out.append(s)
    return tuple(out)


def with_ladder(
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    plan: Plan,
    **kw: object,
) -> Plan:
    """``plan`` with :func:`plan_ladder`'s steps in its tuner inputs."""
    steps = plan_ladder(pipeline, profiles, trace, plan, **kw)  # type: ignore[arg-type]
    assert plan.tuner is not None
    return replace(plan, tuner=replace(plan.tuner, ladder=steps))
