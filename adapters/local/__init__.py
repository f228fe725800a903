"""The bundled Clipper-style container runtime: backend ``local://``.

``LocalBackend`` runs every replica of a model container in its own OS process speaking gRPC
on 127.0.0.1; see ``_backend.py`` for the life cycle and ``examples.py`` for containers.
"""

from ._backend import LocalBackend
from ._convert import from_pb, to_pb_strict
from ._handle import LocalReplica
from ._inventory import Inventory, Placement, detect_cores, detect_gpus
from ._server import ContainerStats, load_container, run_container, serve_grpc

__all__ = [
    "ContainerStats",
    "Inventory",
    "LocalBackend",
    "LocalReplica",
    "Placement",
    "detect_cores",
    "detect_gpus",
    "from_pb",
    "load_container",
    "run_container",
    "serve_grpc",
    "to_pb_strict",
]
