"""Per-node inventories: the machines of a deployment, and binning replicas into them.

A replica runs on one machine, so a cluster of two 3-core nodes cannot host a replica that
takes 4 cores, although 6 are free in total. :class:`NodeInventory` is one machine (its units
of each hardware kind, ``{"cpu": 8, "gpu-v100": 2}``); ``PlannerOptions.nodes`` holds the
deployment's machines and the planner then accepts only configurations :func:`bin_replicas`
can place.

Binning is first-fit decreasing, over several kinds at once: replicas that take an
accelerator (a unit of a kind other than ``cpu``) go first, then by decreasing units of
``cpu`` (cores: threads, or a GPU replica's host cores); each goes to the first node, in the
order given, where every unit it takes is still free. FFD is a heuristic: it can miss a
packing that exists (bin packing is NP-hard), never claims one that does not, and is
deterministic, so the same configuration is always judged the same way.

Pure data and arithmetic: ``core`` never imports an adapter. A backend's own per-node view
converts with :func:`nodes_from_dicts` (``inferline.adapters.ray.NodeInfo.to_dict()`` is one
of the accepted forms).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._validate import as_int, as_list, as_mapping, as_str, check_format, no_extra_keys, req
from ..errors import ValidationError

__all__ = [
    "NODES_FORMAT",
    "NodeInventory",
    "bin_replicas",
    "describe_nodes",
    "node_totals",
    "nodes_document",
    "nodes_from_dicts",
    "nodes_from_document",
]

NODES_FORMAT = "inferline.nodes/1"

_INFO_KEYS = {"node_id", "address", "alive", "cpus", "gpus", "hardware", "free"}


@dataclass(frozen=True)
class NodeInventory:
    """One machine: ``name`` and the units of each hardware kind it has (``{"cpu": 4}``)."""

    name: str
    hardware: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError("node.name", "a non-empty string", self.name)
        m = as_mapping(self.hardware, f"node {self.name!r}.hardware")
        object.__setattr__(
            self,
            "hardware",
            {
                as_str(k, f"node {self.name!r}.hardware"): as_int(
                    v, f"node {self.name!r}.hardware.{k}", minimum=0
                )
                for k, v in m.items()
            },
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hardware": dict(self.hardware)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "node") -> NodeInventory:
        m = as_mapping(d, where)
        no_extra_keys(m, {"name", "hardware"}, where)
        return cls(as_str(req(m, "name", where), f"{where}.name"), _units(m, where))

    def describe(self) -> str:
        """``name (cpu=4, gpu-v100=1)``."""
        units = ", ".join(f"{k}={v}" for k, v in sorted(self.hardware.items()))
        return f"{self.name} ({units or 'nothing'})"


def _units(m: Mapping[str, Any], where: str) -> dict[str, int]:
    raw = as_mapping(m.get("hardware", {}), f"{where}.hardware")
    return {
        as_str(k, f"{where}.hardware"): as_int(v, f"{where}.hardware.{k}", minimum=0)
        for k, v in raw.items()
    }


def nodes_from_dicts(items: Any, where: str = "nodes") -> tuple[NodeInventory, ...]:
    """Node inventories from a JSON list whose items are either ``{"name", "hardware"}``
    (:meth:`NodeInventory.to_dict`) or a backend's node view with ``node_id`` (the Ray
    backend's ``NodeInfo.to_dict()``: its ``hardware``, the node's capacity, is taken; nodes
    with ``"alive": false`` are left out). Names must be unique."""
    out: list[NodeInventory] = []
    for i, d in enumerate(as_list(items, where)):
        at = f"{where}[{i}]"
        m = as_mapping(d, at)
        if "node_id" in m:
            no_extra_keys(m, _INFO_KEYS, at)
            alive = m.get("alive", True)
            if not isinstance(alive, bool):
                raise ValidationError(f"{at}.alive", "true or false", alive)
            if not alive:
                continue
            name = as_str(m["node_id"], f"{at}.node_id")
            out.append(NodeInventory(name, _units(m, at)))
        else:
            out.append(NodeInventory.from_dict(m, at))
    names = [n.name for n in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValidationError(where, "nodes with distinct names", dup)
    return tuple(out)


def nodes_document(nodes: Sequence[Any]) -> dict[str, Any]:
    """``{"format": "inferline.nodes/1", "nodes": [...]}`` (``plan --inventory-nodes`` reads
    it); items are :class:`NodeInventory` or anything with ``to_dict()`` of an accepted form."""
    return {"format": NODES_FORMAT, "nodes": [n.to_dict() for n in nodes]}


def nodes_from_document(doc: Any) -> tuple[NodeInventory, ...]:
    """The nodes of an ``inferline.nodes/1`` document, or of a bare JSON list of node dicts
    (:func:`nodes_from_dicts`); at least one alive node."""
    if isinstance(doc, list):
        items: Any = doc
    else:
        m = check_format(doc, NODES_FORMAT)
        no_extra_keys(m, {"format", "nodes"}, "")
        items = req(m, "nodes", "document")
    nodes = nodes_from_dicts(items)
    if not nodes:
        raise ValidationError("nodes", "at least one (alive) node", [])
    return nodes


def node_totals(nodes: Sequence[NodeInventory], kinds: Iterable[str] = ()) -> dict[str, int]:
    """Units of each kind over all ``nodes``; each of ``kinds`` no node has counts 0 (with
    nodes given, a kind no machine has cannot be placed: it is not the paper's unlimited)."""
    out = dict.fromkeys(kinds, 0)
    for n in nodes:
        for k, v in n.hardware.items():
            out[k] = out.get(k, 0) + v
    return out


def describe_nodes(nodes: Sequence[NodeInventory]) -> str:
    """``node a (cpu=3), node b (cpu=3, gpu-v100=1)``."""
    return ", ".join(f"node {n.describe()}" for n in nodes) or "no nodes"


def _order(use: Mapping[str, int]) -> tuple[int, int]:
    accel = sum(v for k, v in use.items() if k != "cpu")
    return (-accel, -use.get("cpu", 0))


def bin_replicas(
    replicas: Sequence[tuple[str, Mapping[str, int]]], nodes: Sequence[NodeInventory]
) -> list[str] | str:
    """Place each ``(label, units)`` replica on one node, first-fit decreasing (module doc).

    Returns the node name of each replica (in the order given), or, when some replica fits
    no node, a message naming it, what it needs and what each node had left for it."""
    free = [dict(n.hardware) for n in nodes]
    where: list[str] = [""] * len(replicas)
    order = sorted(range(len(replicas)), key=lambda i: (_order(replicas[i][1]), i))
    for i in order:
        label, use = replicas[i]
        for j, f in enumerate(free):
            if all(f.get(k, 0) >= v for k, v in use.items() if v > 0):
                for k, v in use.items():
                    f[k] = f.get(k, 0) - v
                where[i] = nodes[j].name
                break
        else:
            need = ", ".join(f"{k}={v}" for k, v in sorted(use.items()) if v > 0)
            left = ", ".join(
                f"node {n.name} ("
                + (
                    ", ".join(f"{k}={f.get(k, 0)} of {v}" for k, v in sorted(n.hardware.items()))
                    or "nothing"
                )
                + ")"
                for n, f in zip(nodes, free, strict=True)
            )
            return (
                f"a replica of {label} needing {need} fits no node (a replica cannot span "
                f"nodes; first-fit decreasing left {left or 'no nodes'})"
            )
    return where
