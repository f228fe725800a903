"""Backend-agnostic brain of inferline: formats, workloads, profiles, estimator, planner, tuner.

Pure: no sockets, no processes, no wall clock.
"""

from ._envelope import (
    MAX_ENVELOPE_WINDOW_S,
    OnlineEnvelope,
    TrafficEnvelope,
    envelope_windows,
    trace_envelope,
)
from ._hardware import DEFAULT_CATALOG, HARDWARE_FORMAT, Hardware, HardwareCatalog
from ._io import dump_json, load_catalog, load_json, load_pipeline, load_plan, load_profiles, save
from ._pipeline import PIPELINE_FORMAT, Pipeline
from ._plan import PLAN_FORMAT, ModelConfig, Plan, TunerInputs, TunerModel
from ._profiles import PROFILES_FORMAT, BatchProfile, Profiles
from ._trace import (
    Trace,
    gamma_trace,
    load_csv_trace,
    load_trace,
    max_arrivals_in_window,
    mean_rate,
    peak_rate,
    rescale_to_rate,
    save_trace,
    split_trace,
    varying_trace,
)
from ._tuner import (
    InferLineController,
    Tuner,
    TunerConfig,
    TunerDecision,
    TunerPolicy,
    TunerState,
)
from .errors import (
    BackendError,
    CapacityError,
    DeadlineExceededError,
    InfeasibleError,
    InferlineError,
    NotFoundError,
    OverloadedError,
    ReplicaError,
    ValidationError,
)
from .protocols import Backend, ModelSpec, ReplicaHandle

__all__ = [
    "MAX_ENVELOPE_WINDOW_S",
    "OnlineEnvelope",
    "TrafficEnvelope",
    "envelope_windows",
    "trace_envelope",
    "InferLineController",
    "Tuner",
    "TunerConfig",
    "TunerDecision",
    "TunerPolicy",
    "TunerState",
    "DEFAULT_CATALOG",
    "HARDWARE_FORMAT",
    "PIPELINE_FORMAT",
    "PLAN_FORMAT",
    "PROFILES_FORMAT",
    "Backend",
    "BackendError",
    "BatchProfile",
    "CapacityError",
    "DeadlineExceededError",
    "Hardware",
    "HardwareCatalog",
    "InfeasibleError",
    "InferlineError",
    "ModelConfig",
    "ModelSpec",
    "NotFoundError",
    "OverloadedError",
    "Pipeline",
    "Plan",
    "Profiles",
    "ReplicaError",
    "ReplicaHandle",
    "Trace",
    "TunerInputs",
    "TunerModel",
    "ValidationError",
    "dump_json",
    "gamma_trace",
    "load_catalog",
    "load_csv_trace",
    "load_json",
    "load_pipeline",
    "load_plan",
    "load_profiles",
    "load_trace",
    "max_arrivals_in_window",
    "mean_rate",
    "peak_rate",
    "rescale_to_rate",
    "save",
    "save_trace",
    "split_trace",
    "varying_trace",
]
