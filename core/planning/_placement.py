"""Where a model can be placed: the hardware it may use, the fastest of it (InferLine's
initialization), and the units of the deployment's inventory its replicas take."""

from __future__ import annotations

from collections.abc import Mapping

from .._hardware import HardwareCatalog
from .._plan import ModelConfig
from .._profiles import Profiles
from ..errors import NotFoundError, ValidationError
from ._options import PlannerOptions

__all__ = [
    "fastest_hardware",
    "inventory_use",
    "over_inventory",
    "replica_use",
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


def over_inventory(
    configs: Mapping[str, ModelConfig], catalog: HardwareCatalog, options: PlannerOptions
) -> str | None:
    """What ``configs`` need beyond ``options.inventory`` ("cpu: 6 > 4"), or None if they fit."""
    use = inventory_use(configs, catalog, options.replica_units, options.gpu_host_units)
    over = [
        f"{h}: {use[h]} > {n}" for h, n in sorted(options.inventory.items()) if use.get(h, 0) > n
    ]
    return ", ".join(over) or None
