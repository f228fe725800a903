"""Triton Inference Server adapter (``triton://host:8000`` over HTTP, ``triton+grpc://host:8001``).

``TritonBackend`` implements ``inferline.core.Backend`` over ``tritonclient``'s asyncio
clients: explicit model control (deploy, reconfigure and scale by loading the full model
configuration), discovery of an existing server, one replica handle per Triton instance,
statistics-based monitoring, and recovery after a server restart. Scaling changes the count of
the model's first instance group only; ``TritonBackend.restore_operator_settings()`` and
``restore_snapshot(url, snapshot)`` put the operator's configuration back when attach stops. Registered as backend schemes
``triton``, ``triton+http`` and ``triton+grpc`` by ``inferline.adapters.triton.plugin``.
"""

from ._backend import TritonBackend
from ._client import GrpcInfer, TritonDeadline, TritonModelMissing
from ._config import (
    KEEP_BATCHER,
    BatcherSettings,
    TritonModelInfo,
    build_config,
    instance_count,
    steer_config,
)
from ._metrics import metrics_url_for, parse_triton_metrics
from ._replica import TritonReplica
from ._snapshot import check_model_control, restore_snapshot
from ._stats import ClientTiming, cumulative_figures, interval_figures
from ._tensors import ModelIO, TensorSpec, triton_datatype
from ._url import SCHEMES, parse_triton_url

__all__ = [
    "KEEP_BATCHER",
    "SCHEMES",
    "BatcherSettings",
    "ClientTiming",
    "GrpcInfer",
    "ModelIO",
    "TensorSpec",
    "TritonBackend",
    "TritonDeadline",
    "TritonModelInfo",
    "TritonModelMissing",
    "TritonReplica",
    "build_config",
    "check_model_control",
    "cumulative_figures",
    "instance_count",
    "interval_figures",
    "metrics_url_for",
    "parse_triton_metrics",
    "parse_triton_url",
    "restore_snapshot",
    "steer_config",
    "triton_datatype",
]
