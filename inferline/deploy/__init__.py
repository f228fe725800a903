"""Deployment control: the deployment format, starting a service from a deployment and a plan,
applying plans, serving over HTTP (``serve``), attaching to a running Triton or TF Serving
server, the live tuner, live model switching and the drift loop.
"""

from inferline.deploy._apply import apply_deployment_plan, apply_plan
from inferline.deploy._attach import (
    Attachment,
    AttachmentTarget,
    apply_attachment_plan,
    attach,
    dag_pipeline,
    plan_attachment,
    serve_attachment,
    start_attachment_service,
)
from inferline.deploy._build import (
    Loops,
    build_service,
    new_service,
)
from inferline.deploy._drift import DriftEvent, DriftMonitor, drift_monitor
from inferline.deploy._drift_policy import (
    DRIFT_MODES,
    DriftConfig,
    DriftDecision,
    DriftObservation,
    DriftPolicy,
    DriftState,
)
from inferline.deploy._export import EXPORT_TARGETS, ExportResult, export_plan
from inferline.deploy._format import (
    DEPLOYMENT_FORMAT,
    AppSpec,
    Deployment,
    QueueSpec,
    import_object,
    load_deployment,
)
from inferline.deploy._host import open_backend, plugin_host
from inferline.deploy._planned import drain, planned_models
from inferline.deploy._serve import serve, serve_deployment
from inferline.deploy._settings import ServeSettings
from inferline.deploy._start import DeploymentTarget, start_service
from inferline.deploy._steer import (
    SteerTarget,
    apply_steer_plan,
    plan_steer,
    run_steer,
    steer_target,
)
from inferline.deploy._steer_app import ensemble_pipeline
from inferline.deploy._steer_loop import SteerLoop, apply_server_plan
from inferline.deploy._steer_policy import ModelFigures, SteerController, SteerTick
from inferline.deploy._switching import LiveSwitcher, SwitchEvent
from inferline.deploy._switching_serve import load_switching
from inferline.deploy._tuning import AppliedDecision, LiveTuner

__all__ = [
    "DEPLOYMENT_FORMAT",
    "DRIFT_MODES",
    "EXPORT_TARGETS",
    "AppSpec",
    "AppliedDecision",
    "Attachment",
    "AttachmentTarget",
    "Deployment",
    "DeploymentTarget",
    "DriftConfig",
    "DriftDecision",
    "DriftEvent",
    "DriftMonitor",
    "DriftObservation",
    "DriftPolicy",
    "DriftState",
    "ExportResult",
    "LiveSwitcher",
    "LiveTuner",
    "Loops",
    "ModelFigures",
    "QueueSpec",
    "ServeSettings",
    "SteerController",
    "SteerLoop",
    "SteerTarget",
    "SteerTick",
    "SwitchEvent",
    "apply_attachment_plan",
    "apply_deployment_plan",
    "apply_plan",
    "apply_server_plan",
    "apply_steer_plan",
    "attach",
    "build_service",
    "dag_pipeline",
    "drain",
    "drift_monitor",
    "ensemble_pipeline",
    "export_plan",
    "import_object",
    "load_deployment",
    "load_switching",
    "new_service",
    "open_backend",
    "plan_attachment",
    "plan_steer",
    "planned_models",
    "plugin_host",
    "run_steer",
    "serve",
    "serve_attachment",
    "serve_deployment",
    "start_attachment_service",
    "start_service",
    "steer_target",
]
