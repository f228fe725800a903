"""Calibrate profiles to what a running deployment measures (``inferline calibrate``).

A profile is measured with the model alone on an idle machine. Live, the same batch may run
slower: the frontend, the load generator and other replicas share the cores, and replicas
idle between queries wake up cold. The queue keeps the service times of each model's last
1024 batches, with their quantiles per batch size (``ModelStats.service_recent_by_batch``);
this module turns them into profiles the estimator can plan with.

Per model, on the hardware its plan gives it, and over the live batch sizes with at least
``min_batches`` batches: the ratio of the live median to the profile's ``p50_s`` and of the
live P99 to its ``p99_s`` at that size, averaged in log space weighted by batches, are the
factors ``f50`` and ``f99``. Every batch size of the pair then gets ``p50_s * f50`` and
``p99_s * f99`` (at least the new median), and ``latency_s`` the factor of its own position
between the two (log-linear: a mean near the median moves with ``f50``, a ``--statistic p99``
with ``f99``). The pair's wake-up extras are dropped: the live times already contain the
wake-ups at the live load, and the estimator would otherwise add them twice. Plan or simulate
the result with ``--service-spread`` so the estimate draws from the calibrated spread.

Pure: statistics in, profiles and a report out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferline.core import BatchProfile, Profiles, ValidationError
from inferline.queueing import RecentService

__all__ = ["CalibrationRow", "calibrate_profiles", "live_service_from_admin"]

MIN_BATCHES = 50  # a P99 of fewer batches is mostly their maximum


@dataclass(frozen=True)
class CalibrationRow:
    """What calibration did to one model (``note`` says why it did nothing)."""

    model: str
    hardware: str
    batches: int = 0
    sizes: tuple[int, ...] = ()
    p50_factor: float = 1.0
    p99_factor: float = 1.0
    note: str = ""

    @property
    def calibrated(self) -> bool:
        return not self.note

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "batches": self.batches,
            "sizes": list(self.sizes),
            "p50_factor": self.p50_factor,
            "p99_factor": self.p99_factor,
            "note": self.note,
        }


def live_service_from_admin(body: Any) -> dict[str, dict[int, RecentService]]:
    """``GET /admin/models`` -> per model, the recent service quantiles per batch size."""
    if not isinstance(body, Mapping):
        raise ValidationError("/admin/models", "a JSON object of models", type(body).__name__)
    out: dict[str, dict[int, RecentService]] = {}
    for model, entry in body.items():
        queue = entry.get("queue") if isinstance(entry, Mapping) else None
        if not isinstance(queue, Mapping) or "service_recent_by_batch" not in queue:
            continue  # no queue (or an older server): nothing to calibrate from
        where = f"/admin/models.{model}.queue.service_recent_by_batch"
        by_b = queue["service_recent_by_batch"]
        if not isinstance(by_b, Mapping):
            raise ValidationError(where, "an object of batch sizes", type(by_b).__name__)
        try:
            out[model] = {int(b): RecentService.from_dict(r) for b, r in by_b.items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError(where, "{size: {batches, p50_s, p99_s}}", str(e)) from None
    return out


def _between(bp: BatchProfile, f50: float, f99: float) -> float:
    """``latency_s``'s factor: f50 at the median, f99 at the P99, log-linear between."""
    p50, p99 = bp.p50_s, bp.p99_s
    if not p50 or not p99 or p99 <= p50:
        return f50
    u = math.log(bp.latency_s / p50) / math.log(p99 / p50)
    u = min(1.0, max(0.0, u))
    return math.exp((1.0 - u) * math.log(f50) + u * math.log(f99))


def calibrate_profiles(
    profiles: Profiles,
    hardware: Mapping[str, str],
    live: Mapping[str, Mapping[int, RecentService]],
    min_batches: int = MIN_BATCHES,
) -> tuple[Profiles, list[CalibrationRow]]:
    """Profiles with each model of ``hardware`` (model -> the hardware it serves on) scaled
    to its live service quantiles; the other pairs unchanged. One report row per model."""
    if min_batches < 1:
        raise ValidationError("min_batches", "a count of at least 1", min_batches)
    models = {m: dict(by_hw) for m, by_hw in profiles.models.items()}
    wake = {m: dict(by_hw) for m, by_hw in profiles.wake_up.items()}
    rows: list[CalibrationRow] = []
    for model, hw in sorted(hardware.items()):
        pair = profiles.models.get(model, {}).get(hw)
        if pair is None:
            rows.append(CalibrationRow(model, hw, note=f"not profiled on {hw!r}"))
            continue
        largest = max(pair)
        used = {
            b: r
            for b, r in live.get(model, {}).items()
            if r.batches >= min_batches and b <= largest and r.p50_s > 0 and r.p99_s > 0
        }
        if not used:
            seen = sum(r.batches for r in live.get(model, {}).values())
            rows.append(
                CalibrationRow(
                    model,
                    hw,
                    batches=seen,
                    note=f"no batch size with {min_batches}+ live batches ({seen} in all)",
                )
            )
            continue
        log50 = log99 = 0.0
        n = 0
        for b, r in used.items():
            bp = profiles.batch_profile(model, hw, b)
            p50 = bp.p50_s or bp.latency_s
            p99 = bp.p99_s or p50
            log50 += r.batches * math.log(r.p50_s / p50)
            log99 += r.batches * math.log(r.p99_s / p99)
            n += r.batches
        f50, f99 = math.exp(log50 / n), math.exp(log99 / n)
        new: dict[int, BatchProfile] = {}
        for b, bp in pair.items():
            p50 = (bp.p50_s or bp.latency_s) * f50
            p99 = max((bp.p99_s or bp.p50_s or bp.latency_s) * f99, p50)
            new[b] = BatchProfile(bp.latency_s * _between(bp, f50, f99), p50, p99, None, None)
        models[model][hw] = new
        wake.get(model, {}).pop(hw, None)
        rows.append(CalibrationRow(model, hw, n, tuple(sorted(used)), f50, f99))
    return Profiles(models, {m: w for m, w in wake.items() if w}), rows
