"""The tuner's inputs every planner writes into its plan (InferLine §5 "Initialization")."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._envelope import envelope_windows
from .._pipeline import Pipeline
from .._plan import ModelConfig, TunerInputs, TunerModel
from .._profiles import Profiles
from .._trace import max_arrivals_in_window, mean_rate

__all__ = ["tuner_inputs"]


def tuner_inputs(
    pipeline: Pipeline,
    profiles: Profiles,
    configs: Mapping[str, ModelConfig],
    trace: np.ndarray,
) -> TunerInputs:
    """Traffic envelope of the planning trace and per-model figures for the tuner.

    Service time: the critical path of the planned batch latencies. Envelope: max arrivals in
    windows from the service time doubling up to 60 s. Per model: scale factor, single-replica
    throughput at the planned batch size and hardware (``Profiles.throughput``), and the
    max-provisioning ratio ``rho = mean_rate * s / (replicas * throughput)``.
    """
    lat = {
        m: profiles.latency(m, configs[m].hardware, configs[m].max_batch_size)
        for m in pipeline.models
    }
    service, _ = pipeline.critical_path(lat)
    rate = mean_rate(trace)
    envelope = tuple((w, max_arrivals_in_window(trace, w)) for w in envelope_windows(service))
    models = {}
    for m in pipeline.models:
        c = configs[m]
        mu = profiles.throughput(m, c.hardware, c.max_batch_size)
        s = pipeline.calls(m)  # queue entries per pipeline query (visits included)
        rho = rate * s / (max(1, c.replicas) * mu)
        models[m] = TunerModel(scale_factor=s, throughput_qps=mu, max_provisioning_ratio=rho)
    return TunerInputs(service_time_s=service, envelope=envelope, mean_rate_qps=rate, models=models)
