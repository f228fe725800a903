"""inferline: serve ML prediction pipelines under tail-latency SLOs at the lowest cost.

The facade re-exports the public API of the subsystems (``inferline.core``, ``inferline.queueing``,
``inferline.selection``, ``inferline.velox``, ``inferline.adapters``).
"""

from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    InferlineError,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    ValidationError,
    gamma_trace,
    load_pipeline,
    load_plan,
    load_profiles,
    load_trace,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CATALOG",
    "HardwareCatalog",
    "InferlineError",
    "ModelConfig",
    "Pipeline",
    "Plan",
    "Profiles",
    "ValidationError",
    "__version__",
    "gamma_trace",
    "load_pipeline",
    "load_plan",
    "load_profiles",
    "load_trace",
]

# Serving side (HTTP frontend, deployments, profiler, replay client), imported on first use so
# that ``import inferline`` and the CLI's other commands do not pay for FastAPI and uvicorn.
_LAZY = {
    "App": "inferline._service",
    "InputSpec": "inferline._service",
    "Prediction": "inferline._service",
    "Service": "inferline._service",
    "create_app": "inferline._app",
    "handle_predict": "inferline._app",
    "run_server": "inferline._app",
    "AppSpec": "inferline._deploy",
    "Deployment": "inferline._deploy",
    "apply_plan": "inferline._deploy",
    "load_deployment": "inferline._deploy",
    "start_service": "inferline._deploy",
    "BatchFit": "inferline._profile_fit",
    "ProfileResult": "inferline._profiler",
    "ProfilerOptions": "inferline._profiler",
    "profile_models": "inferline._profiler",
    "ReplayResult": "inferline._replay",
    "replay": "inferline._replay",
    "replay_sync": "inferline._replay",
    "ServerProcess": "inferline._server_proc",
    "CalibrationRow": "inferline._calibrate",
    "calibrate_profiles": "inferline._calibrate",
    "live_service_from_admin": "inferline._calibrate",
    "estimate": "inferline._workflow",
    "hop_overhead_from": "inferline._workflow",
    "profile_deployment": "inferline._workflow",
    "trace_deployment": "inferline._workflow",
}
__all__ += sorted(_LAZY)


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'inferline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


# Attaching to a running Triton / TF Serving deployment (inferline._attach), lazily as above.
_ATTACH = (
    "Attachment",
    "apply_attachment_plan",
    "attach",
    "dag_pipeline",
    "plan_attachment",
    "profile_attachment",
    "serve_attachment",
    "start_attachment_service",
)
_LAZY.update(dict.fromkeys(_ATTACH, "inferline._attach"))
__all__ += list(_ATTACH)
