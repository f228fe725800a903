"""Planning with a named strategy: InferLine's planner or one of the coarse-grained baselines
of its evaluation (what ``inferline plan --strategy`` and the benchmarks choose from)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import Plan
from .._profiles import Profiles
from ..errors import NotFoundError
from ._baselines import plan_cg_mean, plan_cg_peak
from ._inferline import plan_inferline
from ._options import PlannerOptions, ProgressFn

__all__ = ["STRATEGIES", "make_plan"]

PlanFn = Callable[..., Plan]

STRATEGIES: Mapping[str, PlanFn] = {
    "inferline": plan_inferline,
    "cg-mean": plan_cg_mean,
    "cg-peak": plan_cg_peak,
}


def make_plan(
    strategy: str,
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    slo_s: float,
    *,
    percentile: float = 99.0,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    options: PlannerOptions | None = None,
    progress: ProgressFn | None = None,
) -> Plan:
    """Plan with a named strategy: ``inferline``, ``cg-mean`` or ``cg-peak``."""
    try:
        fn = STRATEGIES[strategy]
    except KeyError:
        raise NotFoundError("planning strategy", strategy, sorted(STRATEGIES)) from None
    return fn(
        pipeline,
        profiles,
        trace,
        slo_s,
        percentile=percentile,
        catalog=catalog,
        options=options,
        progress=progress,
    )
