"""The backend's view of the cluster: Ray's node table plus what this backend holds per node.

``NodeTable`` takes snapshots of ``ray.nodes()`` (``apply`` says which nodes joined and which
were lost since the last one), keeps the resources this backend's replicas hold on each node,
and answers the questions placement needs: the per-node ``NodeInfo``, totals by catalog name,
and a node for each new replica (``plan``). Pure bookkeeping: no Ray calls, one event loop.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from inferline.core import CapacityError, HardwareCatalog

from ._nodes import (
    Demand,
    NodeInfo,
    choose_nodes,
    demand_for,
    free_resources,
    hardware_kinds,
    node_from_ray,
)

__all__ = ["NodeTable"]


class NodeTable:
    """Snapshots of the cluster's nodes and this backend's holdings on them."""

    def __init__(self, catalog: HardwareCatalog, kinds: Iterable[str], placement: str) -> None:
        self.catalog = catalog
        self.kinds = tuple(kinds)
        self.placement = placement
        self.raw: list[dict[str, Any]] = []
        self.read_at = -float("inf")  # time.monotonic() of the last snapshot
        self._alive: set[str] | None = None
        self._used: dict[str, Counter[str]] = {}

    # -- snapshots --------------------------------------------------------------------------

    def apply(self, raw: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        """Take a ``ray.nodes()`` snapshot; returns (joined, lost) node ids since the last
        one (both empty for the first)."""
        self.raw = raw
        self.read_at = time.monotonic()
        alive = {str(n["NodeID"]) for n in raw if n.get("Alive")}
        before, self._alive = self._alive, alive
        if before is None:
            return [], []
        return sorted(alive - before), sorted(before - alive)

    def is_alive(self, node: str) -> bool:
        return self._alive is not None and node in self._alive

    def address_of(self, node: str) -> str:
        return next(
            (str(n.get("NodeManagerAddress", "")) for n in self.raw if n["NodeID"] == node), ""
        )

    # -- views ------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every node of the snapshot, alive first."""
        infos = [
            node_from_ray(raw, self.catalog, self.kinds, self._used.get(str(raw["NodeID"])))
            for raw in self.raw
        ]
        return sorted(infos, key=lambda n: not n.alive)

    def totals(self, what: str = "hardware") -> dict[str, int]:
        """``hardware`` or ``free`` summed over the alive nodes, by catalog name."""
        out: dict[str, int] = {"cpu": 0}
        for n in self.nodes():
            if n.alive:
                for k, v in getattr(n, what).items():
                    out[k] = out.get(k, 0) + v
        return out

    # -- holdings ---------------------------------------------------------------------------

    def hold(self, node: str, demand: Demand) -> None:
        self._used.setdefault(node, Counter()).update(demand.resources())

    def release(self, node: str, demand: Demand) -> None:
        used = self._used.get(node)
        if used is not None:
            used.subtract(demand.resources())

    def forget(self, node: str) -> None:
        """A lost node's holdings go with it."""
        self._used.pop(node, None)

    # -- placement --------------------------------------------------------------------------

    def demand(self, hardware: str, threads: int) -> Demand:
        return demand_for(hardware, threads, self.catalog)

    def _special(self) -> set[str]:
        out = set()
        for raw in self.raw:
            res = raw.get("Resources") or {}
            if res.get("GPU", 0) > 0 or hardware_kinds(res, self.catalog, self.kinds):
                out.add(str(raw["NodeID"]))
        return out

    def plan(
        self,
        model: str,
        hardware: str,
        threads: int,
        count: int,
        existing: Mapping[str, int],
        only: str | None = None,
    ) -> list[str]:
        """Node ids for ``count`` new replicas of ``model`` (``existing``: its replicas per
        node now), on node ``only`` alone when given; ``CapacityError`` if they do not fit."""
        if count <= 0:
            return []
        inv = self.totals("hardware")
        if hardware != "cpu" and inv.get(hardware, 0) <= 0:
            raise CapacityError(
                f"model {model!r}: hardware {hardware!r} is not in this backend's inventory "
                f"{inv!r} (declare it on the nodes that have it: ray start --resources "
                f"'{{\"{hardware}\": 1}}')",
                self.totals("free"),
            )
        free = free_resources(self.raw, self._used)
        if only is not None:
            if only not in free:
                raise CapacityError(
                    f"model {model!r}: node {only[:8]!r} is not an alive node of the cluster",
                    self.totals("free"),
                )
            free = {only: free[only]}
        return choose_nodes(
            free,
            self.demand(hardware, threads),
            count,
            placement=self.placement,
            existing=existing,
            special=self._special(),
            what=f"model {model!r} on {hardware!r}",
        )
