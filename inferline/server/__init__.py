"""The serving side: ``Service`` (apps over a queue and a backend), the HTTP app and its
routers (admin, selection, Velox), the protocol front doors (KServe v2, TF Serving), metrics.

``Service`` is what every route works on; ``create_app`` builds the FastAPI app over one, and
``serve_app`` / ``run_server`` run it with uvicorn.
"""

from inferline.server._admin import AdminRoutes, make_admin_router
from inferline.server._apps import ON_PREDICTED_LATE, check_on_predicted_late
from inferline.server._http import DEFAULT_MAX_BODY_BYTES, AppRoutes, RouterSource, create_app
from inferline.server._metrics import ServiceMetrics
from inferline.server._predict import handle_predict
from inferline.server._run import (
    DEFAULT_READ_TIMEOUT_S,
    bind_socket,
    run_loop,
    run_server,
    serve_app,
)
from inferline.server._selection_app import SelectionAppSpec, build_policy, make_selection_app
from inferline.server._selection_routes import make_selection_router
from inferline.server._service import (
    App,
    DefaultAnswer,
    InputSpec,
    PlanTarget,
    Prediction,
    Service,
    TunerHandle,
    json_default,
)
from inferline.server._velox_app import VeloxSpec, start_velox
from inferline.server.frontdoors import (
    FrontDoor,
    FrontDoorGrpc,
    Signature,
    TensorInfo,
    make_kserve_router,
    make_tfserving_router,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "ON_PREDICTED_LATE",
    "AdminRoutes",
    "App",
    "AppRoutes",
    "DefaultAnswer",
    "FrontDoor",
    "FrontDoorGrpc",
    "InputSpec",
    "PlanTarget",
    "Prediction",
    "RouterSource",
    "SelectionAppSpec",
    "Service",
    "ServiceMetrics",
    "Signature",
    "TensorInfo",
    "TunerHandle",
    "VeloxSpec",
    "bind_socket",
    "build_policy",
    "check_on_predicted_late",
    "create_app",
    "handle_predict",
    "json_default",
    "make_admin_router",
    "make_kserve_router",
    "make_selection_app",
    "make_selection_router",
    "make_tfserving_router",
    "run_loop",
    "run_server",
    "serve_app",
    "start_velox",
]
