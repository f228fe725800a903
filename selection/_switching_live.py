"""A switching table kept live: when to rebuild it from the live service times and arrivals.

Model-Switching's table (Algorithm 1's inputs: each variant's service time per batch size and
the arrival rate) was built once at start, while the same model's service time on a shared
machine moved 24-106 ms between runs. ``TableRebuildPolicy`` is the pure decision: from the
window's per-variant batch timings (``VariantTiming``) it computes each variant's factor
against its start-up profile (a count-weighted geometric mean of live median / profiled
latency over its batch sizes, as ``inferline calibrate`` does) and says when the table is due
(``every_s`` since the last build, and a factor moved by more than ``threshold`` or the rate
left the table's grid). ``scaled_profiles`` applies the factors: the factor measured on the
variant's serving split scales every split of that variant (what slowed it, a loaded machine,
slows its other splits alike; a split that does not serve has no timings of its own).
A variant with too few batches in the window (a warm spare that did not serve) gets, with
``unobserved="common"`` (the default), the observed variants' common factor: on one machine's
cores a load that slows the serving variant slows the spares alike, and their start-up figure
was taken under another load (measured: a forest profiled at 24.6 ms served at about twice
that). ``unobserved="keep"`` keeps the factor it had (for variants on hardware of their own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferline.core import BatchProfile, Profiles, ValidationError

__all__ = [
    "UNOBSERVED",
    "RebuildDecision",
    "TableInfo",
    "TableRebuildConfig",
    "TableRebuildPolicy",
    "VariantTiming",
    "scaled_profiles",
    "timings_by_batch",
]


UNOBSERVED = ("common", "keep")  # what a variant without live timings gets


@dataclass(frozen=True)
class VariantTiming:
    """The window's batches of one variant and batch size: how many, their median seconds."""

    batches: int
    p50_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "p50_s": self.p50_s}


def timings_by_batch(
    batches: Iterable[tuple[str, int, float]],
) -> dict[str, dict[int, VariantTiming]]:
    """``(variant, batch size, service seconds)`` rows -> per variant and batch size."""
    by: dict[str, dict[int, list[float]]] = {}
    for v, size, s in batches:
        by.setdefault(v, {}).setdefault(int(size), []).append(float(s))
    out: dict[str, dict[int, VariantTiming]] = {}
    for v, sizes in by.items():
        out[v] = {}
        for b, xs in sizes.items():
            xs.sort()
            n = len(xs)
            mid = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
            out[v][b] = VariantTiming(n, mid)
    return out


@dataclass(frozen=True)
class TableRebuildConfig:
    """``every_s``: least time between two builds (0: never rebuild, the start-up table
    stays); ``window_s``: the batches the timings are taken over (the drift loop's window);
    ``min_batches``: a variant's batches in the window before its timings count;
    ``threshold``: relative change of a variant's factor that makes the table due;
    ``unobserved``: a variant with too few batches gets the observed variants' common factor
    (``"common"``: a load slows all CPU variants alike) or keeps its own (``"keep"``)."""

    every_s: float = 10.0
    window_s: float = 10.0
    min_batches: int = 10
    threshold: float = 0.1
    unobserved: str = "common"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.every_s) and self.every_s >= 0):
            raise ValidationError("switching.rebuild_s", "a number >= 0 (0: off)", self.every_s)
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValidationError("switching.rebuild_window_s", "a number > 0", self.window_s)
        if self.min_batches < 1:
            raise ValidationError(
                "switching.rebuild_min_batches", "an integer >= 1", self.min_batches
            )
        if not self.threshold >= 0:
            raise ValidationError("switching.rebuild_threshold", "a number >= 0", self.threshold)
        if self.unobserved not in UNOBSERVED:
            raise ValidationError(
                "switching.rebuild_unobserved", f"one of {list(UNOBSERVED)}", self.unobserved
            )


@dataclass(frozen=True)
class RebuildDecision:
    """A rebuild that is due: the factors to build with, the rate, and one line of why."""

    time_s: float
    factors: Mapping[str, float]
    rate_qps: float
    changes: str


@dataclass(frozen=True)
class TableInfo:
    """What ``GET /admin/switching`` shows besides the table: when and from what it was built
    (``source`` "startup" or "live"), each variant's service-time factor against its start-up
    profile, the measured arrival rate, and where each accuracy came from."""

    built_at_s: float
    source: str
    factors: Mapping[str, float]
    rate_qps: float
    changes: str
    accuracy_source: Mapping[str, str] = field(default_factory=dict)
    builds: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "built_at_s": self.built_at_s,
            "source": self.source,
            "factors": dict(self.factors),
            "rate_qps": self.rate_qps,
            "changes": self.changes,
            "accuracy_source": dict(self.accuracy_source),
            "builds": self.builds,
        }


class TableRebuildPolicy:
    """Pure: ``decide(now, ...) -> RebuildDecision | None``. ``base`` are the start-up
    profiles, ``serving_hw`` the hardware (thread split) each variant's timings were taken on."""

    def __init__(self, config: TableRebuildConfig, base: Profiles) -> None:
        self.config = config
        self.base = base

    def factor(
        self, variant: str, hardware: str, live: Mapping[int, VariantTiming]
    ) -> float | None:
        """Live median / profiled latency over the batch sizes with enough batches
        (count-weighted geometric mean); None when too few batches or not profiled."""
        if not self.base.has(variant, hardware):
            return None
        used = {b: t for b, t in live.items() if t.p50_s > 0}
        n = sum(t.batches for t in used.values())
        if n < self.config.min_batches:
            return None
        top = self.base.max_batch(variant, hardware)
        acc = 0.0
        for b, t in used.items():
            prof = self.base.latency(variant, hardware, min(b, top))
            acc += t.batches * math.log(t.p50_s / prof)
        return math.exp(acc / n)

    def decide(
        self,
        now_s: float,
        built_at_s: float,
        current: Mapping[str, float],
        live: Mapping[str, Mapping[int, VariantTiming]],
        serving_hw: Mapping[str, str],
        rate_qps: float,
        top_rate_qps: float,
    ) -> RebuildDecision | None:
        """Due when ``every_s`` passed since ``built_at_s`` and a variant's factor moved
        more than ``threshold`` from ``current`` (the factors the table was built with), or
        the rate is above the grid's top rate ``top_rate_qps``."""
        c = self.config
        if c.every_s <= 0 or now_s - built_at_s < c.every_s:
            return None
        seen = {}  # variant -> (factor, batches, hardware): the variants with enough batches
        for v, hw in sorted(serving_hw.items()):
            f = self.factor(v, hw, live.get(v, {}))
            if f is not None:
                seen[v] = (f, sum(t.batches for t in live[v].values()), hw)
        target = {v: f for v, (f, _, _) in seen.items()}
        why = {v: f"{n} batches on {hw}" for v, (_, n, hw) in seen.items()}
        if c.unobserved == "common" and seen:
            common = _common(seen.values())
            src = "common factor of " + ", ".join(sorted(seen))
            for v in serving_hw:
                if v not in seen:
                    target[v], why[v] = common, src
        factors = dict(current)
        moved = []
        for v in sorted(target):
            f, old = target[v], current.get(v, 1.0)
            if abs(f - old) > c.threshold * old:
                moved.append(f"{v} service x{old:.2f} -> x{f:.2f} ({why[v]})")
                factors[v] = f
        beyond = math.isfinite(rate_qps) and rate_qps > top_rate_qps
        if not moved and not beyond:
            return None
        if beyond:
            moved.append(f"rate {rate_qps:.1f} q/s above the grid's {top_rate_qps:.1f}")
        return RebuildDecision(now_s, factors, rate_qps, "; ".join(moved))


def _common(seen: Iterable[tuple[float, int, str]]) -> float:
    """The observed variants' factors as one: their batch-count-weighted geometric mean."""
    rows = list(seen)
    n = sum(b for _, b, _ in rows)
    return math.exp(sum(b * math.log(f) for f, b, _ in rows) / n)


def scaled_profiles(base: Profiles, factors: Mapping[str, float]) -> Profiles:
    """``base`` with every split of each variant in ``factors`` scaled by its factor."""
    models: dict[str, dict[str, dict[int, BatchProfile]]] = {}
    for m, by_hw in base.models.items():
        f = factors.get(m, 1.0)
        models[m] = {
            hw: {b: _scaled(bp, f) for b, bp in by_b.items()} for hw, by_b in by_hw.items()
        }
    return Profiles(models, base.wake_up)


def _scaled(bp: BatchProfile, f: float) -> BatchProfile:
    if f == 1.0:
        return bp
    return BatchProfile(
        bp.latency_s * f,
        None if bp.p50_s is None else bp.p50_s * f,
        None if bp.p99_s is None else bp.p99_s * f,
        None if bp.std_s is None else bp.std_s * f,
        bp.samples,
    )
