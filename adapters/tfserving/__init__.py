"""TensorFlow Serving adapter (``tfserving://host:8501`` over REST, ``tfserving+grpc://host:8500``).

``TFServingBackend`` implements ``inferline.core.Backend`` over TF Serving's REST API
(``requests``) and gRPC API (the ``tensorflow-serving-api`` stubs, optional): predict with
preformed batches, model status and metadata, model management through
``ModelService/HandleReloadConfigRequest`` (carrying the models it does not change), one replica
per server endpoint (given, or launched from a ``tensorflow_model_server`` binary).
The operator's entries round-trip exactly through every reload, and
``TFServingBackend.restore_operator_settings()`` / ``restore_snapshot(url, snapshot)`` put the
operator's model sets back when attach stops. Steering (``inferline attach --steer``):
``apply_server_batcher`` sets a model's TF Serving batcher through a new version directory
holding ``batching_params.pbtxt`` (``batching_text``), ``server_counters`` reads the servers'
Prometheus pages; restoring removes the version directories inferline added.
"""

from ._backend import SCHEMES, TFServingBackend
from ._batching import BATCHING_PARAMS, batching_text, parse_batching_text, parse_config_block
from ._client import (
    TFServingClient,
    TFServingConnectionError,
    TFServingFailure,
    TFServingInvalidArgument,
    TFServingNotFound,
)
from ._config import ServedModel, format_text, from_proto, merged, parse_text, to_proto
from ._protos import available as grpc_available
from ._protos import from_tensor_proto, to_tensor_proto
from ._protos import stubs as grpc_stubs
from ._replica import TFServingReplica
from ._servers import Endpoint, find_model_server
from ._snapshot import restore_snapshot

__all__ = [
    "BATCHING_PARAMS",
    "SCHEMES",
    "Endpoint",
    "ServedModel",
    "TFServingBackend",
    "TFServingClient",
    "TFServingConnectionError",
    "TFServingFailure",
    "TFServingInvalidArgument",
    "TFServingNotFound",
    "TFServingReplica",
    "batching_text",
    "find_model_server",
    "format_text",
    "from_proto",
    "from_tensor_proto",
    "grpc_available",
    "grpc_stubs",
    "merged",
    "parse_batching_text",
    "parse_config_block",
    "parse_text",
    "restore_snapshot",
    "to_proto",
    "to_tensor_proto",
]
