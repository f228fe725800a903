"""Measuring: the profiler and its latency fits, the open-loop replay client, calibration of
profiles to a running server, a server started as a child process, and the tables and plots
these print; ``profile_deployment`` / ``estimate`` are the steps the CLI, the demo and the
fidelity benchmark share.
"""

from inferline.measure._attached import profile_attachment, synthetic_inputs
from inferline.measure._calibrate import (
    MIN_BATCHES,
    CalibrationRow,
    calibrate_profiles,
    live_service_from_admin,
)
from inferline.measure._profile_fit import (
    STATISTICS,
    BatchFit,
    fit_batch_latency,
    profiles_from_samples,
)
from inferline.measure._profiler import (
    ProfileResult,
    ProfilerOptions,
    batch_sizes_up_to,
    profile_models,
)
from inferline.measure._replay import ReplayResult, closed_loop, encode_bodies, replay, replay_sync
from inferline.measure._server_proc import ServerProcess
from inferline.measure._tables import finite_or_none, print_fits, print_replay
from inferline.measure._timeline import plot_formats, plot_timeline
from inferline.measure._workflow import (
    estimate,
    hop_overhead_from,
    load_containers,
    profile_deployment,
    trace_deployment,
)

__all__ = [
    "MIN_BATCHES",
    "STATISTICS",
    "BatchFit",
    "CalibrationRow",
    "ProfileResult",
    "ProfilerOptions",
    "ReplayResult",
    "ServerProcess",
    "batch_sizes_up_to",
    "calibrate_profiles",
    "closed_loop",
    "encode_bodies",
    "estimate",
    "finite_or_none",
    "fit_batch_latency",
    "hop_overhead_from",
    "live_service_from_admin",
    "load_containers",
    "plot_formats",
    "plot_timeline",
    "print_fits",
    "print_replay",
    "profile_attachment",
    "profile_deployment",
    "profile_models",
    "profiles_from_samples",
    "replay",
    "replay_sync",
    "synthetic_inputs",
    "trace_deployment",
]
