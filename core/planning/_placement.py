"""Where a model can be placed: the hardware it may use, the fastest of it (InferLine's
initialization), the units of the deployment's inventory its replicas take, and, with
per-node inventories (``PlannerOptions.nodes``), the node each replica goes to (``_nodes.py``:
first-fit decreasing; a replica never spans nodes)."""

from __future__ import annotations

from collections.abc import Mapping

from .._hardware import HardwareCatalog
from .._plan import ModelConfig
from .._profiles import Profiles
from ..errors import CapacityError, NotFoundError, ValidationError
from ._nodes import bin_replicas, node_totals
from ._options import PlannerOptions

__all__ = [
    "fastest_hardware",
    "inventory_use",
    "over_inventory",
    "place_on_nodes",
    "replica_items",
    "replica_use",
    "total_inventory",
    "usable_hardware",
]


def usable_hardware(profiles: Profiles, model: str, catalog: HardwareCatalog) -> list[str]:
    """The hardware ``model`` is profiled on that the catalog prices (profile order)."""
    if model not in profiles.models:
        raise NotFoundError("profiled model", model, sorted(profiles.models))
    hws = [h for h in profiles.hardware_for(model) if h in catalog]
    if not hws:
        raise ValidationError(
            f"profiles.{model}",
            f"a profile on hardware from the catalog {catalog.names()!r}",
            profiles.hardware_for(model),
        )
    return hws


def fastest_hardware(profiles: Profiles, model: str, catalog: HardwareCatalog) -> str:
    """Lowest batch-1 latency; ties go to the cheaper, then the earlier-listed hardware."""
    hws = usable_hardware(profiles, model, catalog)
    return min(hws, key=lambda h: (profiles.latency(model, h, 1), catalog.cost(h), hws.index(h)))


def replica_use(
    model: str,
    hardware: str,
    catalog: HardwareCatalog,
    replica_units: Mapping[str, int] | None = None,
    gpu_host_units: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Units of each kind one replica of ``model`` on ``hardware`` takes: on a CPU kind its
    ``replica_units`` (threads, default 1); on a GPU one, plus its ``gpu_host_units`` of
    ``cpu`` when it has any."""
    if catalog[hardware].kind == "cpu":
        return {hardware: (replica_units or {}).get(model, 1)}
    use = {hardware: 1}
    host = (gpu_host_units or {}).get(model, 0)
    if host:
        use["cpu"] = host
    return use


def inventory_use(
    configs: Mapping[str, ModelConfig],
    catalog: HardwareCatalog,
    replica_units: Mapping[str, int] | None = None,
    gpu_host_units: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Units of each hardware kind ``configs`` take (:func:`replica_use` times replicas)."""
    use: dict[str, int] = {}
    for m, c in configs.items():
        for h, n in replica_use(m, c.hardware, catalog, replica_units, gpu_host_units).items():
            use[h] = use.get(h, 0) + c.replicas * n
    return use


def total_inventory(options: PlannerOptions, catalog: HardwareCatalog) -> dict[str, int]:
    """The units a plan may use of each kind: ``options.inventory``, or with ``options.nodes``
    their totals, every catalog kind no node has at 0 (kinds absent from a flat inventory are
    unlimited; a cluster has only what its machines have)."""
    if not options.nodes:
        return dict(options.inventory)
    return node_totals(options.nodes, catalog.names())


def replica_items(
    configs: Mapping[str, ModelConfig],
    catalog: HardwareCatalog,
    replica_units: Mapping[str, int] | None = None,
    gpu_host_units: Mapping[str, int] | None = None,
) -> list[tuple[str, dict[str, int]]]:
    """One ``(label, units)`` per replica of ``configs``, what :func:`bin_replicas` takes."""
    out: list[tuple[str, dict[str, int]]] = []
    for m, c in configs.items():
        use = replica_use(m, c.hardware, catalog, replica_units, gpu_host_units)
        out += [(f"{m!r} on {c.hardware}", use)] * c.replicas
    return out


def _bin(
    configs: Mapping[str, ModelConfig], catalog: HardwareCatalog, o: PlannerOptions
) -> tuple[list[tuple[str, dict[str, int]]], list[str] | str]:
    items = replica_items(configs, catalog, o.replica_units, o.gpu_host_units)
    return items, bin_replicas(items, o.nodes)


def place_on_nodes(
    configs: Mapping[str, ModelConfig], catalog: HardwareCatalog, options: PlannerOptions
) -> dict[str, dict[str, int]]:
    """Replicas of each model per node (``{"node-a": {"yolo": 2}}``, every node listed) as
    first-fit decreasing bins ``configs`` into ``options.nodes``; ``CapacityError`` naming the
    replica and the nodes when it cannot."""
    if not options.nodes:
        raise ValidationError("options.nodes", "per-node inventories to place on", [])
    _, where = _bin(configs, catalog, options)
    if isinstance(where, str):
        raise CapacityError(where, {n.name: dict(n.hardware) for n in options.nodes})
    out: dict[str, dict[str, int]] = {n.name: {} for n in options.nodes}
    i = 0
    for m, c in configs.items():
        for _ in range(c.replicas):
            out[where[i]][m] = out[where[i]].get(m, 0) + 1
            i += 1
    return out


def over_inventory(
    configs: Mapping[str, ModelConfig], catalog: HardwareCatalog, options: PlannerOptions
) -> str | None:
    """What ``configs`` need beyond ``options.inventory`` ("cpu: 6 > 4"), or beyond the
    per-node inventories (the totals, then the replica that fits no node), or None if they
    fit."""
    use = inventory_use(configs, catalog, options.replica_units, options.gpu_host_units)
    inv = total_inventory(options, catalog)
    over = [f"{h}: {use[h]} > {n}" for h, n in sorted(inv.items()) if use.get(h, 0) > n]
    if over or not options.nodes:
        return ", ".join(over) or None
    _, where = _bin(configs, catalog, options)
    return where if isinstance(where, str) else None
