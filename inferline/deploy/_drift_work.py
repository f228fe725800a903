"""The drift loop's computations, run in a worker process of their own (``DriftMonitor``).

The re-plan's search and the estimator's driver are Python: in a thread they would hold the
GIL, and the server's event loop with it, for as long as they run (a re-plan takes seconds).
So they run in a spawned process that imports this module: module-level functions of
picklable arguments, core only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from inferline.core import (
    EstimatorOptions,
    HardwareCatalog,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    plan_inferline,
    simulate,
)

__all__ = ["estimate_p99s", "replan"]


def estimate_p99s(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    arrivals: Mapping[str, np.ndarray],
    options: EstimatorOptions,
    catalog: HardwareCatalog,
) -> dict[str, float]:
    """The estimator's P99 per app of ``arrivals`` (0 for an app with none)."""
    out: dict[str, float] = {}
    for app, arr in arrivals.items():
        if arr.size == 0 or not configs:
            out[app] = 0.0
            continue
        sim = simulate(pipeline, configs, profiles, arr, options=options, catalog=catalog)
        out[app] = float(sim.percentile(99))
    return out


def replan(
    pipeline: Pipeline,
    profiles: Profiles,
    arrivals: np.ndarray,
    slo_s: float,
    percentile: float,
    catalog: HardwareCatalog,
    options: PlannerOptions,
) -> Plan:
    return plan_inferline(
        pipeline,
        profiles,
        arrivals,
        slo_s,
        percentile=percentile,
        catalog=catalog,
        options=options,
    )
