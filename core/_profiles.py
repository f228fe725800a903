"""Model profiles (format ``inferline.profiles/1``): batch latency by model, hardware, batch size,
and optionally the wake-up time a batch pays when it starts on a replica that was idle."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from ._validate import (
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_format,
    no_extra_keys,
    req,
)
from .errors import NotFoundError, ValidationError

__all__ = ["PROFILES_FORMAT", "BatchProfile", "Profiles", "WakeProfile"]

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
class WakeProfile:
    """Extra latency of a batch that starts on a replica idle for ``idle_s[k]``: ``extra_s[k]``.

    Profiles are measured back to back, but live traffic below saturation reaches replicas
    that have gone idle, and the first request after a gap runs slower (cold caches, sleeping
    threads, clocks down: +1-2 ms on a CPU core after 50 ms, more on a GPU). Between points
    the extra is linear, from 0 at no idle time; beyond the last point it stays at the last
    value. Extras never decrease with idle time.
    """

    idle_s: tuple[float, ...]
    extra_s: tuple[float, ...]

    def __post_init__(self) -> None:
        idle = tuple(float(as_float(v, "idle_s", positive=True)) for v in self.idle_s)
        extra = tuple(float(as_float(v, "extra_s", nonneg=True)) for v in self.extra_s)
        if not idle or len(idle) != len(extra):
            raise ValidationError(
                "idle_s/extra_s", "two lists of the same non-zero length", (idle, extra)
            )
        if any(b <= a for a, b in pairwise(idle)):
            raise ValidationError("idle_s", "strictly increasing idle times", idle)
        if any(b < a for a, b in pairwise(extra)):
            raise ValidationError("extra_s", "extras that never decrease with idle time", extra)
        object.__setattr__(self, "idle_s", idle)
        object.__setattr__(self, "extra_s", extra)

    def extra(self, idle: float) -> float:
        """The extra latency after ``idle`` seconds idle (0 for none); the same arithmetic as
        the estimator's kernel, so a live replay in virtual time matches it exactly."""
        if idle <= 0.0:
            return 0.0
        if idle >= self.idle_s[-1]:
            return self.extra_s[-1]
        g0 = x0 = 0.0
        for g1, x1 in zip(self.idle_s, self.extra_s, strict=True):
            if idle < g1:
                return x0 + (x1 - x0) * (idle - g0) / (g1 - g0)
            g0, x0 = g1, x1
        return x0

    def to_dict(self) -> dict[str, Any]:
        return {"idle_s": list(self.idle_s), "extra_s": list(self.extra_s)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> WakeProfile:
        m = as_mapping(d, where)
        no_extra_keys(m, {"idle_s", "extra_s"}, where)
        idle = [
            as_float(v, f"{where}.idle_s", positive=True)
            for v in as_list(req(m, "idle_s", where), f"{where}.idle_s")
        ]
        extra = [
            as_float(v, f"{where}.extra_s", nonneg=True)
            for v in as_list(req(m, "extra_s", where), f"{where}.extra_s")
        ]
        try:
            return cls(tuple(idle), tuple(extra))
        except ValidationError as e:
            raise ValidationError(f"{where}.{e.field}", e.expected, e.got) from None

    @classmethod
    def from_samples(cls, back_to_back: float, after_idle: Mapping[float, float]) -> WakeProfile:
        """From one statistic of batch latency back to back and after each idle time:
        the extras, floored at 0 and made non-decreasing (a longer idle is never faster)."""
        idle = sorted(after_idle)
        extra = np.maximum.accumulate([max(0.0, after_idle[g] - back_to_back) for g in idle])
        return cls(tuple(idle), tuple(float(x) for x in extra))


@dataclass(frozen=True)
class Profiles:
    """``models[model][hardware][batch_size] -> BatchProfile``.

    A model/hardware pair that is absent cannot be placed on that hardware. ``wake_up`` gives,
    for some pairs, the extra latency after idle time (:class:`WakeProfile`).
    """

    models: Mapping[str, Mapping[str, Mapping[int, BatchProfile]]] = field(default_factory=dict)
    wake_up: Mapping[str, Mapping[str, WakeProfile]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model, by_hw in self.wake_up.items():
            for hw in by_hw:
                if hw not in self.models.get(model, {}):
                    raise ValidationError(
                        f"wake_up.{model}.{hw}", "a model/hardware pair that is profiled", hw
                    )
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
        return self.batch_profile(model, hardware, batch).latency_s

    def batch_profile(self, model: str, hardware: str, batch: int) -> BatchProfile:
        """The profile a batch of ``batch`` runs with: the smallest profiled size at least
        that large."""
        by_b = self._pair(model, hardware)
        sizes = sorted(by_b)
        i = bisect.bisect_left(sizes, batch)
        if i == len(sizes):
            raise ValidationError(
                f"batch size for {model!r} on {hardware!r}",
                f"at most the largest profiled size {sizes[-1]}",
                batch,
            )
        return by_b[sizes[i]]

    def latency_table(self, model: str, hardware: str, max_batch: int) -> list[float]:
        """``table[b]`` is the latency of a batch of b for b in 1..max_batch (index 0 unused)."""
        return [0.0] + [self.latency(model, hardware, b) for b in range(1, max_batch + 1)]

    def wake(self, model: str, hardware: str) -> WakeProfile | None:
        """The pair's wake-up extras, if they were profiled."""
        return self.wake_up.get(model, {}).get(hardware)

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
        wake: dict[str, dict[str, WakeProfile]] = {m: dict(h) for m, h in self.wake_up.items()}
        for m, hws in other.models.items():
            out.setdefault(m, {}).update(hws)
            for h in hws:  # a re-profiled pair keeps only its new wake-up extras
                wake.get(m, {}).pop(h, None)
        for m, whs in other.wake_up.items():
            wake.setdefault(m, {}).update(whs)
        return Profiles(out, {m: w for m, w in wake.items() if w})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": PROFILES_FORMAT,
            "models": {
                m: {
                    h: {str(b): bp.to_dict() for b, bp in sorted(bs.items())}
                    for h, bs in hws.items()
                }
                for m, hws in self.models.items()
            },
        }
        if self.wake_up:
            d["wake_up"] = {
                m: {h: w.to_dict() for h, w in hws.items()} for m, hws in self.wake_up.items()
            }
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Profiles:
        m = check_format(d, PROFILES_FORMAT)
        no_extra_keys(m, {"format", "models", "wake_up"}, "")
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
        wake: dict[str, dict[str, WakeProfile]] = {}
        for name, hws in as_mapping(m.get("wake_up", {}), "wake_up").items():
            for hw, w in as_mapping(hws, f"wake_up.{name}").items():
                wake.setdefault(name, {})[hw] = WakeProfile.from_dict(w, f"wake_up.{name}.{hw}")
        return cls(out, wake)
