"""Protocol-compatible front doors: inferline also speaks KServe v2 and TF Serving's Predict.

Existing Triton or TF Serving clients point at inferline instead of the server and keep
working: every row of a request's batch becomes one query of inferline's queue (an app's
pipeline, or a model of the dispatcher directly), so the EDF queue and the plan decide how
it is batched and where it runs; the answers are stacked back into the protocol's tensors.

* KServe v2 over HTTP (``make_kserve_router``): ``GET /v2``, ``/v2/health/live|ready``,
  ``GET /v2/models/{m}``, ``/v2/models/{m}/ready``, ``POST /v2/models/{m}/infer`` (JSON
  ``data`` or the binary tensor extension tritonclient uses by default);
* TF Serving REST (``make_tfserving_router``): ``GET /v1/models/{m}`` (status),
  ``GET /v1/models/{m}/metadata``, ``POST /v1/models/{m}[/versions/{v}]:predict`` (row
  ``instances`` or columnar ``inputs``);
* gRPC (``FrontDoorGrpc``): KServe's ``inference.GRPCInferenceService`` (tritonclient's
  generated definitions) and TF Serving's ``PredictionService``/``ModelService`` (when the
  ``tensorflow-serving-api`` stubs are installed) on one port.

The HTTP routes are ordinary routers for ``create_app(routers=...)``, so they sit behind the
frontend's bearer-token and body-size guard; their inference routes (``/infer``,
``:predict``) are also declared as ``inferline_fast_paths`` on the router, which
``create_app`` answers at the ASGI level in front of FastAPI's routing (same answers, byte for
byte; ``inferline.server._predict_route``).

Per request (``_deadline``): KServe v2 ``parameters.timeout`` (microseconds, as Triton) and
``parameters.priority`` (inferline's class: -100 to 100, higher first) over HTTP and gRPC, and
the deadline a gRPC client sets (KServe and TF Serving) shorten the served name's SLO, which
is the default and the cap (docs/deadlines.md). The gRPC server checks the same token
(``authorization: Bearer ...`` metadata), caps messages at the body limit, binds 127.0.0.1
unless told otherwise, and answers inference calls past ``max_inflight`` (1,024) in flight
``RESOURCE_EXHAUSTED``, counted in ``inferline_overloaded_total``, instead of letting
grpc-core reset them.

A served name's tensors are described by a ``Signature`` (names, dtypes, per-query shapes);
``inferline attach`` passes the ones it discovered so the names match the original server.
Without one, an app's ``InputSpec`` gives the input (values are cast to its dtype by
``inferline.core.cast_exact``: one that would change is a 400 naming the field), and the
outputs declared are the ones the app really returns: traced the first time a door describes
it (``FrontDoor.describe``), from ``samples`` or zeros of its ``InputSpec``, else learned from
its first answer; named ``output``, or by the keys of a dict output.

One rule for ``None`` on all four doors (``_outputs``): an output field that is ``None`` in
every row is left out of the response and of the declared outputs; ``None`` in some rows
only is refused.
"""

from inferline.server.frontdoors._door import (
    DEFAULT_MAX_ROWS,
    KSERVE_DTYPES,
    TF_DTYPES,
    FrontDoor,
    Signature,
    TensorInfo,
    check_max_rows,
    decode_off_loop,
)
from inferline.server.frontdoors._grpc import DEFAULT_MAX_INFLIGHT, FrontDoorGrpc, grpc_door_of
from inferline.server.frontdoors._grpc_relay import GrpcRelay
from inferline.server.frontdoors._grpc_worker import start_worker_grpc
from inferline.server.frontdoors._kserve_codec import header_length, kserve_decode, kserve_encode
from inferline.server.frontdoors._kserve_http import (
    InferFastPath,
    encode_answer,
    infer_model,
    kserve_error,
    make_kserve_router,
    requested_outputs,
)
from inferline.server.frontdoors._tfserving_rest import make_tfserving_router

__all__ = [
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_ROWS",
    "KSERVE_DTYPES",
    "TF_DTYPES",
    "FrontDoor",
    "FrontDoorGrpc",
    "GrpcRelay",
    "InferFastPath",
    "Signature",
    "TensorInfo",
    "check_max_rows",
    "decode_off_loop",
    "encode_answer",
    "grpc_door_of",
    "header_length",
    "infer_model",
    "kserve_decode",
    "kserve_encode",
    "kserve_error",
    "make_kserve_router",
    "make_tfserving_router",
    "requested_outputs",
    "start_worker_grpc",
]
