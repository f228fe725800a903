"""The cluster's nodes as inferline sees them, and where new replicas go (pure: no Ray here).

``NodeInfo`` is one node's capacity in hardware-catalog terms, the shape the planner takes
(``RayBackend.nodes()``). It depends on nothing but ``inferline.core``, so ``core`` can adopt it
unchanged. ``choose_nodes`` picks a node for each new replica from a snapshot of the nodes and
of what this backend already holds on each, spread (default) or packed; a request that does
not fit is a ``CapacityError`` saying what is free where.

Ray resource names: ``CPU`` and ``GPU`` are Ray's own; a hardware kind of the catalog
(``gpu-v100``) is a custom resource of that name that the operator declares on the nodes that
have it (``ray start --num-gpus 1 --resources '{"gpu-v100": 1}'``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferline.core import (
    CapacityError,
    HardwareCatalog,
    ValidationError,
    as_int,
    as_mapping,
    as_str,
    no_extra_keys,
    req,
)

__all__ = [
    "PLACEMENTS",
    "Demand",
    "NodeInfo",
    "choose_nodes",
    "demand_for",
    "describe_free",
    "free_resources",
    "hardware_kinds",
    "is_gpu_kind",
    "node_from_ray",
]

PLACEMENTS = ("spread", "pack")
_KIND_PREFIXES = ("gpu-", "cpu-")


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node: capacity by catalog name, and what this backend has not allocated.

    ``hardware`` holds ``"cpu"`` (whole CPUs) and one entry per hardware kind the node
    declares (``{"cpu": 8, "gpu-v100": 2}``); ``free`` is the same minus what this backend's
    replicas hold there (other Ray jobs on the cluster are not counted).
    """

    node_id: str
    address: str = ""
    alive: bool = True
    cpus: int = 0
    gpus: int = 0
    hardware: Mapping[str, int] = field(default_factory=dict)
    free: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_str(self.node_id, "node_id")
        as_int(self.cpus, "cpus", minimum=0)
        as_int(self.gpus, "gpus", minimum=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "address": self.address,
            "alive": self.alive,
            "cpus": self.cpus,
            "gpus": self.gpus,
            "hardware": dict(self.hardware),
            "free": dict(self.free),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "node") -> NodeInfo:
        m = as_mapping(d, where)
        no_extra_keys(m, {"node_id", "address", "alive", "cpus", "gpus", "hardware", "free"}, where)
        alive = m.get("alive", True)
        if not isinstance(alive, bool):
            raise ValidationError(f"{where}.alive", "true or false", alive)

        def counts(key: str) -> dict[str, int]:
            raw = as_mapping(m.get(key, {}), f"{where}.{key}")
            return {
                as_str(k, f"{where}.{key}"): as_int(v, f"{where}.{key}.{k}", minimum=0)
                for k, v in raw.items()
            }

        return cls(
            node_id=as_str(req(m, "node_id", where), f"{where}.node_id"),
            address=str(m.get("address", "")),
            alive=alive,
            cpus=as_int(m.get("cpus", 0), f"{where}.cpus", minimum=0),
            gpus=as_int(m.get("gpus", 0), f"{where}.gpus", minimum=0),
            hardware=counts("hardware"),
            free=counts("free"),
        )


def hardware_kinds(
    resources: Iterable[str], catalog: HardwareCatalog, extra: Iterable[str]
) -> set[str]:
    """The custom resources that stand for catalog hardware kinds: names in the catalog or in
    ``extra``, and any ``gpu-*`` / ``cpu-*`` name (a kind a plugin may price later)."""
    known = set(catalog.names()) | set(extra)
    return {
        r
        for r in resources
        if r not in ("CPU", "GPU", "cpu") and (r in known or r.startswith(_KIND_PREFIXES))
    }


def is_gpu_kind(kind: str, catalog: HardwareCatalog) -> bool:
    """Whether replicas of ``kind`` need a GPU (``num_gpus=1``): the catalog says, else the name."""
    if kind in catalog:
        return catalog[kind].kind == "gpu"
    return kind.startswith("gpu")


def _units(resources: Mapping[str, float], kind: str, gpu: bool) -> int:
    n = math.floor(float(resources.get(kind, 0.0)) + 1e-9)
    if gpu:  # a GPU kind is usable only as far as the node also has GPUs to hand out
        n = min(n, math.floor(float(resources.get("GPU", 0.0)) + 1e-9))
    return max(0, n)


def node_from_ray(
    raw: Mapping[str, Any],
    catalog: HardwareCatalog,
    extra_kinds: Iterable[str] = (),
    used: Mapping[str, float] | None = None,
) -> NodeInfo:
    """A ``NodeInfo`` from one entry of ``ray.nodes()`` (``NodeID``, ``Alive``,
    ``NodeManagerAddress``, ``Resources``); ``used`` is what this backend holds there, in Ray
    resource names."""
    res = {str(k): float(v) for k, v in dict(raw.get("Resources") or {}).items()}
    alive = bool(raw.get("Alive", False))
    used = used or {}
    free_res = {k: max(0.0, v - float(used.get(k, 0.0))) for k, v in res.items()}
    kinds = sorted(hardware_kinds(res, catalog, extra_kinds))
    hw = {"cpu": _units(res, "CPU", False)}
    free = {"cpu": _units(free_res, "CPU", False)}
    for k in kinds:
        gpu = is_gpu_kind(k, catalog)
        hw[k] = _units(res, k, gpu)
        free[k] = _units(free_res, k, gpu)
    if not alive:
        free = {k: 0 for k in free}
    return NodeInfo(
        node_id=str(raw.get("NodeID", "")),
        address=str(raw.get("NodeManagerAddress", "")),
        alive=alive,
        cpus=hw["cpu"],
        gpus=_units(res, "GPU", False),
        hardware=hw,
        free=free,
    )


@dataclass(frozen=True)
class Demand:
    """What one replica asks Ray for: ``num_cpus``, ``num_gpus`` and custom resources."""

    cpus: float
    gpus: float = 0.0
    kind: str | None = None  # the custom resource, one unit

    def resources(self) -> dict[str, float]:
        """The request in Ray resource names (``CPU``, ``GPU``, the kind)."""
        out = {"CPU": self.cpus}
        if self.gpus:
            out["GPU"] = self.gpus
        if self.kind is not None:
            out[self.kind] = 1.0
        return out

    def custom(self) -> dict[str, float] | None:
        return {self.kind: 1.0} if self.kind is not None else None


def demand_for(hardware: str, threads: int, catalog: HardwareCatalog) -> Demand:
    """A replica on ``hardware`` with ``threads`` threads: ``threads`` CPUs, plus one GPU and
    one unit of the kind's custom resource for a GPU kind (one unit only for another kind)."""
    if hardware == "cpu":
        return Demand(float(threads))
    return Demand(float(threads), 1.0 if is_gpu_kind(hardware, catalog) else 0.0, hardware)


def _fits(free: Mapping[str, float], need: Mapping[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def describe_free(free_by_node: Mapping[str, Mapping[str, float]]) -> str:
    """``node abcd1234: CPU=1, gpu-v100=1; ...`` (node ids shortened to 8 characters)."""
    parts = []
    for nid, free in free_by_node.items():
        shown = ", ".join(
            f"{k}={v:g}"
            for k, v in sorted(free.items())
            if v > 0 and (k in ("CPU", "GPU") or k.startswith(_KIND_PREFIXES))
        )
        parts.append(f"node {nid[:8]}: {shown or 'nothing'}")
    return "; ".join(parts) or "no alive nodes"


def choose_nodes(
    free_by_node: Mapping[str, Mapping[str, float]],
    demand: Demand,
    count: int,
    *,
    placement: str = "spread",
    existing: Mapping[str, int] | None = None,
    special: Iterable[str] = (),
    what: str = "replica",
) -> list[str]:
    """A node id for each of ``count`` new replicas, all or nothing.

    ``free_by_node``: alive nodes (in a stable order) -> free Ray resources. ``existing``: this
    model's replicas per node already. ``special``: nodes with accelerators (GPUs or hardware
    kinds), which a replica that needs none avoids while other nodes fit, so CPU replicas do
    not strand a GPU node's CPUs.

    ``spread`` puts each replica on the fitting node with the fewest replicas of the model
    (then the most free CPUs); ``pack`` on the fitting node with the most replicas of the
    model (then the fewest free CPUs), filling one node before the next.
    """
    if placement not in PLACEMENTS:
        raise ValidationError("placement", f"one of {list(PLACEMENTS)}", placement)
    need = demand.resources()
    free = {n: dict(f) for n, f in free_by_node.items()}
    counts = {n: int((existing or {}).get(n, 0)) for n in free}
    order = {n: i for i, n in enumerate(free)}
    special = set(special)
    plain = demand.gpus == 0 and demand.kind is None
    chosen: list[str] = []
    for _ in range(count):
        fitting = [n for n in free if _fits(free[n], need)]
        if not fitting:
            raise CapacityError(
                f"{what}: {count} replica(s) needing {_show(need)} each do not fit; "
                f"free: {describe_free(free_by_node)}",
                {n: dict(f) for n, f in free_by_node.items()},
            )

        def key(n: str) -> tuple[float, ...]:
            avoid = 1.0 if (plain and n in special) else 0.0
            cpu = free[n].get("CPU", 0.0)
            if placement == "spread":
                return (avoid, counts[n], -cpu, order[n])
            return (avoid, -counts[n], cpu, order[n])

        best = min(fitting, key=key)
        chosen.append(best)
        counts[best] += 1
        for k, v in need.items():
            free[best][k] = free[best].get(k, 0.0) - v
    return chosen


def _show(need: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in need.items())


def free_resources(
    nodes: Sequence[Mapping[str, Any]], used: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """Alive node id -> its Ray resources minus ``used[node]`` (what this backend holds)."""
    out: dict[str, dict[str, float]] = {}
    for raw in nodes:
        if not raw.get("Alive", False):
            continue
        nid = str(raw.get("NodeID", ""))
        res = dict(raw.get("Resources") or {})
        u = used.get(nid, {})
        out[nid] = {str(k): float(v) - float(u.get(k, 0.0)) for k, v in res.items()}
    return out
