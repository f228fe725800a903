"""Turning raw batch-latency samples into profiles, and fitting latency against batch size.

Pure functions (no clock, no processes): the profiler in ``_profiler.py`` measures, this module
summarizes. The fit is a quantile regression (statsmodels ``QuantReg``) of latency on batch
size at the median and at the 99th percentile, so a user sees the per-item cost, the fixed
cost of a batch, and whether the model batches linearly at all (a model whose batch latency
grows super-linearly, or is flat then jumps, is flagged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import BatchProfile, Profiles, ValidationError

__all__ = [
    "STATISTICS",
    "BatchFit",
    "batch_profile",
    "fit_batch_latency",
    "profiles_from_samples",
    "trimmed_mean",
]

# Which summary of the samples becomes ``latency_s`` (the number the estimator uses); "mean"
# is the mean without the slowest 1% (see ``trimmed_mean``).
STATISTICS = ("mean", "p50", "p90", "p99")

Samples = Mapping[str, Mapping[str, Mapping[int, Sequence[float]]]]


@dataclass(frozen=True)
class BatchFit:
    """Quantile-regression fit ``latency ≈ intercept_s + slope_s * batch`` for one model/hardware.

    ``pseudo_r2`` is Koenker and Machado's R1 (1 minus the check loss of the fit over that of
    an intercept-only fit): 1 is a perfect line, 0 no better than a constant.
    ``max_rel_deviation`` is the largest gap between the observed quantile at a profiled batch
    size and the line, relative to the largest observed quantile. ``linear`` (the verdict the
    CLI prints) is that gap being at most ``max_deviation`` (20% by default) or at most
    ``abs_tolerance_s`` (0.5 ms: scheduling noise). R1 is reported,
    not judged: a profile that is flat in batch size has nothing for a line to explain.
    """

    model: str
    hardware: str
    quantile: float
    intercept_s: float
    slope_s: float
    pseudo_r2: float
    max_rel_deviation: float
    linear: bool
    batch_sizes: tuple[int, ...]
    points: int

    def predict(self, batch: int) -> float:
        return self.intercept_s + self.slope_s * batch

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "quantile": self.quantile,
            "intercept_s": self.intercept_s,
            "slope_s": self.slope_s,
            "pseudo_r2": self.pseudo_r2,
            "max_rel_deviation": self.max_rel_deviation,
            "linear": self.linear,
            "batch_sizes": list(self.batch_sizes),
            "points": self.points,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchFit:
        return cls(
            model=str(d["model"]),
            hardware=str(d["hardware"]),
            quantile=float(d["quantile"]),
            intercept_s=float(d["intercept_s"]),
            slope_s=float(d["slope_s"]),
            pseudo_r2=float(d["pseudo_r2"]),
            max_rel_deviation=float(d["max_rel_deviation"]),
            linear=bool(d["linear"]),
            batch_sizes=tuple(int(b) for b in d["batch_sizes"]),
            points=int(d["points"]),
        )


def trimmed_mean(a: np.ndarray, top: float = 0.01) -> float:
    """Mean without the slowest ``top`` fraction of samples (at least one once there are 20).

    One stall of the machine (a second-long pause while profiling a 1 ms model) would
    otherwise move the mean, and through it every plan, by orders of magnitude; the tail
    is still reported as ``p99_s``.
    """
    a = np.sort(np.asarray(a, dtype=float))
    k = int(a.size * top) if a.size < 20 else max(1, int(a.size * top))
    return float(a[: a.size - k].mean()) if k else float(a.mean())


def batch_profile(samples: Sequence[float], statistic: str = "mean") -> BatchProfile:
    """Summarize one batch size's latency samples (seconds)."""
    if statistic not in STATISTICS:
        raise ValidationError("statistic", f"one of {list(STATISTICS)!r}", statistic)
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValidationError("samples", "a non-empty list of positive latencies", list(a[:5]))
    if statistic == "mean":
        value = trimmed_mean(a)
    else:
        value = float(np.percentile(a, int(statistic[1:])))
    return BatchProfile(
        latency_s=value,
        p50_s=float(np.percentile(a, 50)),
        p99_s=float(np.percentile(a, 99)),
        std_s=float(a.std()),
        samples=int(a.size),
    )


def profiles_from_samples(samples: Samples, statistic: str = "mean") -> Profiles:
    """``{model: {hardware: {batch: [latency_s, ...]}}}`` -> ``Profiles`` with quantile extras.

    Latency is forced to be non-decreasing in batch size (a bigger batch never finishes
    sooner than a smaller one would have): measurement noise could otherwise make the planner
    prefer a larger batch for a spurious speed-up.
    """
    out: dict[str, dict[str, dict[int, BatchProfile]]] = {}
    for model, by_hw in samples.items():
        for hw, by_b in by_hw.items():
            entry: dict[int, BatchProfile] = {}
            floor = 0.0
            for b in sorted(by_b):
                bp = batch_profile(by_b[b], statistic)
                if bp.latency_s < floor:
                    bp = BatchProfile(floor, bp.p50_s, bp.p99_s, bp.std_s, bp.samples)
                floor = bp.latency_s
                entry[int(b)] = bp
            if entry:
                out.setdefault(model, {})[hw] = entry
    return Profiles(out)


def _check_loss(resid: np.ndarray, q: float) -> float:
    return float(np.sum(np.where(resid >= 0, q * resid, (q - 1.0) * resid)))


def fit_batch_latency(
    model: str,
    hardware: str,
    by_batch: Mapping[int, Sequence[float]],
    quantile: float = 0.5,
    *,
    max_deviation: float = 0.2,
    abs_tolerance_s: float = 0.0005,
) -> BatchFit:
    """Quantile regression of latency on batch size over every raw sample.

    With a single profiled batch size the slope is 0 and the fit is the sample quantile.
    """
    if not 0.0 < quantile < 1.0:
        raise ValidationError("quantile", "a number in (0, 1)", quantile)
    sizes = sorted(int(b) for b in by_batch if len(by_batch[b]) > 0)
    if not sizes:
        raise ValidationError(f"samples of {model!r} on {hardware!r}", "some samples", {})
    xs = np.concatenate([np.full(len(by_batch[b]), float(b)) for b in sizes])
    ys = np.concatenate([np.asarray(by_batch[b], dtype=float) for b in sizes])
    const = float(np.quantile(ys, quantile))
    if len(sizes) == 1:
        return BatchFit(
            model, hardware, quantile, const, 0.0, 0.0, 0.0, True, tuple(sizes), ys.size
        )

    from statsmodels.regression.quantile_regression import QuantReg  # slow import: lazy

    exog = np.column_stack([np.ones_like(xs), xs])
    res = QuantReg(ys, exog).fit(q=quantile, max_iter=5000)
    intercept, slope = (float(v) for v in res.params)
    loss_fit = _check_loss(ys - (intercept + slope * xs), quantile)
    loss_const = _check_loss(ys - const, quantile)
    r2 = 1.0 - loss_fit / loss_const if loss_const > 0 else 1.0
    # Deviation relative to the profile's scale (its largest observed quantile), so a flat
    # profile's measurement noise is not mistaken for non-linear batching.
    obs = {b: float(np.quantile(np.asarray(by_batch[b], dtype=float), quantile)) for b in sizes}
    scale = max(obs.values())
    gap = max(abs(o - (intercept + slope * b)) for b, o in obs.items())
    dev = gap / scale if scale > 0 else 0.0
    r2 = r2 if math.isfinite(r2) else 0.0
    # Sub-millisecond gaps are timer and scheduling noise on a shared machine, not batching.
    linear = dev <= max_deviation or gap <= abs_tolerance_s
    return BatchFit(
        model, hardware, quantile, intercept, slope, r2, dev, linear, tuple(sizes), int(ys.size)
    )
