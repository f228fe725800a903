"""inferline: serve ML prediction pipelines under tail-latency SLOs at the lowest cost.

The top-level names are the everyday API (``__all__`` lists them all):

* from ``inferline.core``, imported at once: the file formats and their loaders (``Pipeline``,
  ``Profiles``, ``Plan``, ``ModelConfig``, ``HardwareCatalog``, ``DEFAULT_CATALOG``,
  ``load_pipeline``, ``load_profiles``, ``load_plan``, ``load_trace``), ``gamma_trace``, the
  errors ``InferlineError`` and ``ValidationError``, and ``__version__``;
* from ``inferline.server``, on first use: ``Service``, ``App``, ``InputSpec``, ``Prediction``,
  ``create_app``, ``handle_predict``, ``run_server``;
* from ``inferline.deploy``, on first use: deployments (``Deployment``, ``AppSpec``,
  ``load_deployment``, ``start_service``, ``serve``, ``apply_plan``) and attaching to a running
  Triton or TF Serving (``attach``, ``Attachment``, ``plan_attachment``,
  ``apply_attachment_plan``, ``serve_attachment``, ``start_attachment_service``,
  ``dag_pipeline``);
* from ``inferline.measure``, on first use: profiling (``profile_models``, ``ProfilerOptions``,
  ``ProfileResult``, ``BatchFit``, ``profile_deployment``, ``profile_attachment``,
  ``trace_deployment``), replay (``replay``, ``replay_sync``, ``ReplayResult``,
  ``ServerProcess``), calibration (``calibrate_profiles``, ``CalibrationRow``,
  ``live_service_from_admin``, ``hop_overhead_from``) and ``estimate``.

The serving half is imported lazily so that ``import inferline`` and the CLI's other commands
do not pay for FastAPI and uvicorn. Everything else lives in its subpackage:
``inferline.core`` (formats, estimator, planner, tuner), ``inferline.queueing``,
``inferline.selection``, ``inferline.velox`` and ``inferline.adapters`` (plugin host, backends,
``inferline.adapters.checks``). The design is ``docs/design.md``.
"""

from typing import TYPE_CHECKING

from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    InferlineError,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    ValidationError,
    __version__,
    gamma_trace,
    load_pipeline,
    load_plan,
    load_profiles,
    load_trace,
)

__all__ = [
    "DEFAULT_CATALOG",
    "App",
    "AppSpec",
    "Attachment",
    "BatchFit",
    "CalibrationRow",
    "Deployment",
    "HardwareCatalog",
    "InferlineError",
    "InputSpec",
    "ModelConfig",
    "Pipeline",
    "Plan",
    "Prediction",
    "ProfileResult",
    "ProfilerOptions",
    "Profiles",
    "ReplayResult",
    "ServerProcess",
    "Service",
    "ValidationError",
    "__version__",
    "apply_attachment_plan",
    "apply_plan",
    "attach",
    "calibrate_profiles",
    "create_app",
    "dag_pipeline",
    "estimate",
    "gamma_trace",
    "handle_predict",
    "hop_overhead_from",
    "live_service_from_admin",
    "load_deployment",
    "load_pipeline",
    "load_plan",
    "load_profiles",
    "load_trace",
    "plan_attachment",
    "profile_attachment",
    "profile_deployment",
    "profile_models",
    "replay",
    "replay_sync",
    "run_server",
    "serve",
    "serve_attachment",
    "start_attachment_service",
    "start_service",
    "trace_deployment",
]

if TYPE_CHECKING:  # the lazy names, visible to type checkers and IDEs (never run)
    from inferline.deploy import (
        AppSpec,
        Attachment,
        Deployment,
        apply_attachment_plan,
        apply_plan,
        attach,
        dag_pipeline,
        load_deployment,
        plan_attachment,
        serve,
        serve_attachment,
        start_attachment_service,
        start_service,
    )
    from inferline.measure import (
        BatchFit,
        CalibrationRow,
        ProfileResult,
        ProfilerOptions,
        ReplayResult,
        ServerProcess,
        calibrate_profiles,
        estimate,
        hop_overhead_from,
        live_service_from_admin,
        profile_attachment,
        profile_deployment,
        profile_models,
        replay,
        replay_sync,
        trace_deployment,
    )
    from inferline.server import (
        App,
        InputSpec,
        Prediction,
        Service,
        create_app,
        handle_predict,
        run_server,
    )

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
