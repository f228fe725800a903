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
    "App": "inferline.server",
    "InputSpec": "inferline.server",
    "Prediction": "inferline.server",
    "Service": "inferline.server",
    "create_app": "inferline.server",
    "handle_predict": "inferline.server",
    "run_server": "inferline.server",
    "AppSpec": "inferline.deploy",
    "Deployment": "inferline.deploy",
    "apply_plan": "inferline.deploy",
    "load_deployment": "inferline.deploy",
    "serve": "inferline.deploy",
    "start_service": "inferline.deploy",
    "BatchFit": "inferline.measure",
    "ProfileResult": "inferline.measure",
    "ProfilerOptions": "inferline.measure",
    "profile_models": "inferline.measure",
    "ReplayResult": "inferline.measure",
    "replay": "inferline.measure",
    "replay_sync": "inferline.measure",
    "ServerProcess": "inferline.measure",
    "CalibrationRow": "inferline.measure",
    "calibrate_profiles": "inferline.measure",
    "live_service_from_admin": "inferline.measure",
    "estimate": "inferline.measure",
    "hop_overhead_from": "inferline.measure",
    "profile_attachment": "inferline.measure",
    "profile_deployment": "inferline.measure",
    "trace_deployment": "inferline.measure",
}


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'inferline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


# Attaching to a running Triton / TF Serving deployment (inferline.deploy), lazily as above.
_ATTACH = (
    "Attachment",
    "apply_attachment_plan",
    "attach",
    "dag_pipeline",
    "plan_attachment",
    "serve_attachment",
    "start_attachment_service",
)
_LAZY.update(dict.fromkeys(_ATTACH, "inferline.deploy"))
__all__ += sorted(_LAZY)
