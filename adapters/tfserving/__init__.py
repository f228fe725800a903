"""TensorFlow Serving adapter (``tfserving://host:8501`` over REST, ``tfserving+grpc://host:8500``).

``TFServingBackend`` implements ``inferline.core.Backend`` over TF Serving's REST API
(``requests``) and gRPC API (the ``tensorflow-serving-api`` stubs, optional): predict with
preformed batches, model status and metadata, model management through
``ModelService/HandleReloadConfigRequest`` (carrying the models it does not change), one replica
per server endpoint (given, or launched from a ``tensorflow_model_server`` binary).
The operator's entries round-trip exactly through every reload, and
``TFServingBackend.restore_operator_settings()`` / ``restore_snapshot(url, snapshot)`` put the
operator's model sets back when attach stops.
"""

from ._backend import SCHEMES, TFServingBackend
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
    "find_model_server",
    "format_text",
    "from_proto",
    "from_tensor_proto",
    "grpc_available",
    "grpc_stubs",
    "merged",
    "parse_text",
    "restore_snapshot",
    "to_proto",
    "to_tensor_proto",
]
