"""Backend ``ray://``: the bundled model containers as Ray actors across a Ray cluster.

``RayBackend`` runs every replica of a model as one actor (the same containers as
``local://``: ``package.module:factory`` with ``params``), placed per node and replaced on
surviving nodes when a node is lost; ``nodes()`` gives the per-node inventory as
``NodeInfo``. Ray is an optional extra (``pip install 'inferline[ray]'``): this package imports
it only when ``RayBackend`` or ``RayReplica`` is first used. See ``docs/scale-out.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._nodes import PLACEMENTS, Demand, NodeInfo, choose_nodes, demand_for, node_from_ray

if TYPE_CHECKING:
    from ._backend import RayBackend
    from ._handle import RayReplica

__all__ = [
    "PLACEMENTS",
    "Demand",
    "NodeInfo",
    "RayBackend",
    "RayReplica",
    "choose_nodes",
    "demand_for",
    "node_from_ray",
]


def __getattr__(name: str) -> Any:
    # Ray is optional: RayBackend and RayReplica (which import it) load on first use.
    if name == "RayBackend":
        from ._backend import RayBackend

        return RayBackend
    if name == "RayReplica":
        from ._handle import RayReplica

        return RayReplica
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
