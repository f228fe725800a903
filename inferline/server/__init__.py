"""The serving side: ``Service`` (apps over a queue and a backend), the HTTP app and its
routers (admin, selection, Velox), the protocol front doors (KServe v2, TF Serving), metrics.

``Service`` is what every route works on; ``create_app`` builds the FastAPI app over one, and
``serve_app`` / ``run_server`` run it with uvicorn.
"""

from inferline.server._admin import AdminRoutes, make_admin_router
from inferline.server._http import DEFAULT_MAX_BODY_BYTES, AppRoutes, RouterSource, create_app
from inferline.server._metrics import ServiceMetrics
from inferline.server._predict import handle_predict
from inferline.server._run import bind_socket, run_loop, run_server, serve_app
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
    "Service",
    "ServiceMetrics",
    "Signature",
    "TensorInfo",
    "TunerHandle",
    "bind_socket",
    "create_app",
    "handle_predict",
    "json_default",
    "make_admin_router",
    "make_kserve_router",
    "make_tfserving_router",
    "run_loop",
    "run_server",
    "serve_app",
]
