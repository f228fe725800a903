"""Hardware catalog (format ``inferline.hardware/1``): what each kind of resource costs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._validate import as_float, as_mapping, as_str, check_format, no_extra_keys, req
from .errors import NotFoundError, ValidationError

__all__ = ["DEFAULT_CATALOG", "HARDWARE_FORMAT", "Hardware", "HardwareCatalog"]

HARDWARE_FORMAT = "inferline.hardware/1"
Kind = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Hardware:
    """One kind of resource a replica can be placed on."""

    kind: Kind
    cost_per_hour: float

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu"):
            raise ValidationError("kind", "'cpu' or 'gpu'", self.kind)
        as_float(self.cost_per_hour, "cost_per_hour", nonneg=True)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cost_per_hour": self.cost_per_hour}

    @classmethod
    def from_dict(cls, d: Any, where: str = "hardware") -> Hardware:
        m = as_mapping(d, where)
        no_extra_keys(m, {"kind", "cost_per_hour"}, where)
        kind = req(m, "kind", where)
        if kind not in ("cpu", "gpu"):
            raise ValidationError(f"{where}.kind", "'cpu' or 'gpu'", kind)
        cost = as_float(req(m, "cost_per_hour", where), f"{where}.cost_per_hour", nonneg=True)
        return cls(kind=kind, cost_per_hour=cost)


@dataclass(frozen=True)
class HardwareCatalog:
    """Named hardware kinds and their hourly prices."""

    hardware: Mapping[str, Hardware] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.hardware:
            as_str(name, "hardware name")

    def __getitem__(self, name: str) -> Hardware:
        try:
            return self.hardware[name]
        except KeyError:
            raise NotFoundError("hardware", name, sorted(self.hardware)) from None

    def __contains__(self, name: object) -> bool:
        return name in self.hardware

    def names(self) -> list[str]:
        return list(self.hardware)

    def cost(self, name: str) -> float:
        return self[name].cost_per_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": HARDWARE_FORMAT,
            "hardware": {k: v.to_dict() for k, v in self.hardware.items()},
        }

    @classmethod
    def from_dict(cls, d: Any) -> HardwareCatalog:
        m = check_format(d, HARDWARE_FORMAT)
        no_extra_keys(m, {"format", "hardware"}, "")
        hw = as_mapping(req(m, "hardware", ""), "hardware")
        return cls(
            {as_str(k, "hardware"): Hardware.from_dict(v, f"hardware.{k}") for k, v in hw.items()}
        )

    def merged(self, other: HardwareCatalog) -> HardwareCatalog:
        """This catalog with ``other``'s entries added or overriding."""
        return HardwareCatalog({**self.hardware, **other.hardware})


# Prices used throughout the InferLine evaluation (AWS on-demand, per hour).
DEFAULT_CATALOG = HardwareCatalog(
    {
        "cpu": Hardware("cpu", 0.0665),
        "gpu-k80": Hardware("gpu", 0.634),
        "gpu-v100": Hardware("gpu", 2.528),
    }
)
