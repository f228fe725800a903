"""The coarse-grained baselines of InferLine §6: CG-Mean and CG-Peak.

Reading of the paper ("Coarse-Grained Baseline Comparison"): the pipeline is treated as one
black box. It is profiled as a whole to find the single largest batch size that can meet the
SLO, and then replicated as a unit to reach the throughput the planning trace needs; CG-Mean
provisions for the trace's mean rate, CG-Peak for its peak rate over a sliding window as long
as the SLO. Concretely, here:

* Hardware: every model runs on its lowest-latency hardware (the same choice as the first step
  of InferLine's initialization), since a black box is not tuned per stage.
* Batch size: one size ``b`` for every model, the largest on the ladder 1, 2, 4, ... (up to the
  smallest of the models' largest profiled sizes) whose end-to-end service time, the critical
  path of the models' batch-``b`` latencies, is at most the SLO.
* A pipeline unit is one replica of every model; its throughput is that of its slowest stage
  relative to the traffic the stage sees, ``min_m throughput_m(b) / calls_m`` (scale factor times visits).
* Units: ``ceil(rate / unit throughput)`` with ``rate = mean_rate(trace)`` (CG-Mean) or
  ``peak_rate(trace, slo_s)`` (CG-Peak); every model gets that many replicas.

The plan's estimated latency is the estimator's ``percentile``-th latency on the planning trace
(the same estimator as InferLine's planner); the baselines do not check it against the SLO, as
the black-box method has no way to.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig, Plan
from .._profiles import Profiles
from .._trace import mean_rate, peak_rate
from .._validate import as_float
from ..errors import InfeasibleError
from ..estimator import simulate
from ._options import PlannerOptions, ProgressFn
from ._placement import fastest_hardware, over_inventory
from ._tuner_inputs import tuner_inputs

__all__ = ["coarse_grained_configs", "plan_cg_mean", "plan_cg_peak"]


def coarse_grained_configs(
    pipeline: Pipeline,
    profiles: Profiles,
    slo_s: float,
    rate_qps: float,
    *,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
) -> dict[str, ModelConfig]:
    """The black-box configuration for a required throughput ``rate_qps`` (see module doc)."""
    hw = {m: fastest_hardware(profiles, m, catalog) for m in pipeline.models}
    top = min(profiles.max_batch(m, hw[m]) for m in pipeline.models)

    def service(b: int) -> float:
        return pipeline.critical_path({m: profiles.latency(m, hw[m], b) for m in pipeline.models})[
            0
        ]

    if service(1) > slo_s:
        raise InfeasibleError(
            f"SLO {slo_s:g} s is infeasible for the coarse-grained pipeline "
            f"{pipeline.name!r}: its batch-1 service time is {service(1):.4g} s",
            service(1),
        )
    batch = 1
    b = 1
    while b < top:
        b = min(2 * b, top)
        if service(b) <= slo_s:
            batch = b
        else:
            break
    unit = min(profiles.throughput(m, hw[m], batch) / pipeline.calls(m) for m in pipeline.models)
    units = max(1, math.ceil(rate_qps / unit - 1e-9))
    return {m: ModelConfig(hw[m], batch, units) for m in pipeline.models}


def _plan_cg(
    kind: Literal["mean", "peak"],
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    slo_s: float,
    percentile: float,
    catalog: HardwareCatalog,
    options: PlannerOptions,
) -> Plan:
    slo_s = as_float(slo_s, "slo_s", positive=True)
    trace = np.ascontiguousarray(trace, dtype=np.float64)
    rate = mean_rate(trace) if kind == "mean" else peak_rate(trace, slo_s)
    configs = coarse_grained_configs(pipeline, profiles, slo_s, rate, catalog=catalog)
    over = over_inventory(configs, catalog, options)
    if over is not None:
        # the black box cannot trade replicas for batch size per model: it just does not fit
        raise InfeasibleError(
            f"the coarse-grained plan for {pipeline.name!r} needs more than the inventory ({over})"
        )
    estimator = options.estimator
    res = simulate(pipeline, configs, profiles, trace, options=estimator, catalog=catalog)
    return Plan(
        pipeline=pipeline.name,
        slo_s=slo_s,
        models=configs,
        percentile=percentile,
        cost_per_hour=float(sum(c.cost_per_hour(catalog) for c in configs.values())),
        estimated_latency_s=res.percentile(percentile),
        strategy=f"cg-{kind}",
        tuner=tuner_inputs(pipeline, profiles, configs, trace),
    )


def plan_cg_mean(
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
    """CG-Mean: the pipeline replicated as a unit for the trace's mean rate."""
    opts = options or PlannerOptions()
    return _plan_cg("mean", pipeline, profiles, trace, slo_s, percentile, catalog, opts)


def plan_cg_peak(
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
    """CG-Peak: the pipeline replicated as a unit for the peak rate over SLO-long windows."""
    opts = options or PlannerOptions()
    return _plan_cg("peak", pipeline, profiles, trace, slo_s, percentile, catalog, opts)
