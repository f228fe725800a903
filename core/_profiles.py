"""Model profiles (format ``inferline.profiles/1``): batch latency by model, hardware, batch size."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._validate import as_float, as_int, as_mapping, as_str, check_format, no_extra_keys, req
from .errors import NotFoundError, ValidationError

__all__ = ["PROFILES_FORMAT", "BatchProfile", "Profiles"]

PROFILES_FORMAT = "inferline.profiles/1"
_OPTIONAL = ("p50_s", "p99_s", "std_s", "samples")


@dataclass(frozen=True)
class BatchProfile:
    """Processing latency of one batch. ``latency_s`` is what the estimator uses."""

    latency_s: float
    p50_s: float | None = None
    p99_s: float | None = None
    std_s: float | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        as_float(self.latency_s, "latency_s", positive=True)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"latency_s": self.latency_s}
        for k in _OPTIONAL:
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> BatchProfile:
        m = as_mapping(d, where)
        no_extra_keys(m, {"latency_s", *_OPTIONAL}, where)
        kw: dict[str, Any] = {
            "latency_s": as_float(req(m, "latency_s", where), f"{where}.latency_s", positive=True)
        }
        for k in ("p50_s", "p99_s", "std_s"):
            if k in m:
                kw[k] = as_float(m[k], f"{where}.{k}", nonneg=True)
        if "samples" in m:
            kw["samples"] = as_int(m["samples"], f"{where}.samples", minimum=1)
        return cls(**kw)


@dataclass(frozen=True)
class Profiles:
    """``models[model][hardware][batch_size] -> BatchProfile``.

    A model/hardware pair that is absent cannot be placed on that hardware.
    """

    models: Mapping[str, Mapping[str, Mapping[int, BatchProfile]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model, by_hw in self.models.items():
            for hw, by_b in by_hw.items():
                if not by_b:
                    raise ValidationError(f"models.{model}.{hw}", "at least one batch size", {})
                for b in by_b:
                    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                        raise ValidationError(f"models.{model}.{hw}", "integer batch sizes >= 1", b)

    # -- queries -------------------------------------------------------------------------
    def hardware_for(self, model: str) -> list[str]:
        return list(self._model(model))

    def batch_sizes(self, model: str, hardware: str) -> list[int]:
        return sorted(self._pair(model, hardware))

    def max_batch(self, model: str, hardware: str) -> int:
        return max(self._pair(model, hardware))

    def has(self, model: str, hardware: str) -> bool:
        return hardware in self.models.get(model, {})

    def latency(self, model: str, hardware: str, batch: int) -> float:
        """Latency of a batch of ``batch``: the smallest profiled size at least that large."""
        by_b = self._pair(model, hardware)
        sizes = sorted(by_b)
        i = bisect.bisect_left(sizes, batch)
        if i == len(sizes):
            raise ValidationError(
                f"batch size for {model!r} on {hardware!r}",
                f"at most the largest profiled size {sizes[-1]}",
                batch,
            )
        return by_b[sizes[i]].latency_s

    def latency_table(self, model: str, hardware: str, max_batch: int) -> list[float]:
        """``table[b]`` is the latency of a batch of b for b in 1..max_batch (index 0 unused)."""
        return [0.0] + [self.latency(model, hardware, b) for b in range(1, max_batch + 1)]

    def throughput(self, model: str, hardware: str, batch: int) -> float:
        """Single-replica throughput (queries/s) when always running full batches of ``batch``."""
        return batch / self.latency(model, hardware, batch)

    def _model(self, model: str) -> Mapping[str, Mapping[int, BatchProfile]]:
        try:
            return self.models[model]
        except KeyError:
            raise NotFoundError("profiled model", model, sorted(self.models)) from None

    def _pair(self, model: str, hardware: str) -> Mapping[int, BatchProfile]:
        by_hw = self._model(model)
        try:
            return by_hw[hardware]
        except KeyError:
            raise NotFoundError(
                f"hardware profile of model {model!r}", hardware, sorted(by_hw)
            ) from None

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_latencies(cls, table: Mapping[str, Mapping[str, Mapping[int, float]]]) -> Profiles:
        """Build from plain ``{model: {hw: {batch: latency_s}}}`` numbers."""
        return cls(
            {
                m: {
                    h: {int(b): BatchProfile(float(s)) for b, s in bs.items()}
                    for h, bs in hws.items()
                }
                for m, hws in table.items()
            }
        )

    def merged(self, other: Profiles) -> Profiles:
        out: dict[str, dict[str, Mapping[int, BatchProfile]]] = {
            m: dict(h) for m, h in self.models.items()
        }
        for m, hws in other.models.items():
            out.setdefault(m, {}).update(hws)
        return Profiles(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILES_FORMAT,
            "models": {
                m: {
                    h: {str(b): bp.to_dict() for b, bp in sorted(bs.items())}
                    for h, bs in hws.items()
                }
                for m, hws in self.models.items()
            },
        }

    @classmethod
    def from_dict(cls, d: Any) -> Profiles:
        m = check_format(d, PROFILES_FORMAT)
        no_extra_keys(m, {"format", "models"}, "")
        models = as_mapping(req(m, "models", ""), "models")
        out: dict[str, dict[str, dict[int, BatchProfile]]] = {}
        for name, hws in models.items():
            as_str(name, "models")
            hws = as_mapping(hws, f"models.{name}")
            out[name] = {}
            for hw, bs in hws.items():
                bs = as_mapping(bs, f"models.{name}.{hw}")
                entry: dict[int, BatchProfile] = {}
                for b, bp in bs.items():
                    where = f"models.{name}.{hw}.{b}"
                    if not (isinstance(b, str) and b.isdigit() and int(b) >= 1):
                        raise ValidationError(where, 'a batch size key like "1" or "32"', b)
                    entry[int(b)] = BatchProfile.from_dict(bp, where)
                if not entry:
                    raise ValidationError(f"models.{name}.{hw}", "at least one batch size", {})
                out[name][hw] = entry
        return cls(out)
