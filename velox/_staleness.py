"""Staleness detection: running per-user and global loss, and the "rising too fast" rule.

A pure decision object (state in attributes, no clock, no I/O): the service feeds it the
prequential loss of every observation (computed before the observation is learned) and acts on
the verdict. See :class:`~inferline.velox.StalenessConfig` for the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._config import StalenessConfig

__all__ = ["LossStats", "StalenessDetector", "StalenessVerdict", "retrain_blocker"]


def retrain_blocker(
    config: StalenessConfig, *, can_change: bool, new_observations: int
) -> str | None:
    """Why a stale verdict must not start a retrain, or None when it may.

    A retrain "can change something" when the model says its retrain can produce other
    weights or features than the live version (``can_change``: always for a table model, which
    refits the item features; for a split model only with its own retrain function or once its
    feature model's version changed) and at least ``min_observations`` observations arrived
    since the live version was built (the retrain's input differs from the last one's).
    """
    if not config.auto_retrain:
        return "automatic retraining is off"
    if not can_change:
        return "a retrain would reproduce the live weights (the feature model has not changed)"
    if new_observations < config.min_observations:
        return f"{new_observations} new observations < min_observations {config.min_observations}"
    return None


def _decay(halflife: float) -> float:
    return math.exp(-math.log(2.0) / halflife)


@dataclass(frozen=True)
class StalenessVerdict:
    """What one observation's loss did to the detector."""

    stale: bool
    fast: float
    slow: float
    trend: float
    observations: int
    reason: str = ""  # "loss rising", or "loss still above the level before the drift"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stale": self.stale,
            "fast": self.fast,
            "slow": self.slow,
            "trend": self.trend,
            "observations": self.observations,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StalenessVerdict:
        return cls(**d)


class _Ewma:
    """Bias-corrected exponentially weighted mean: the weighted sum over the weight sum.

    Seeding a plain EWMA with the first sample would let one early outlier dominate a slow
    average for hundreds of observations; normalising by the accumulated weight makes it the
    plain mean while few samples are in, and the EWMA afterwards.
    """

    __slots__ = ("decay", "s", "w")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.s = 0.0
        self.w = 0.0

    def add(self, x: float) -> None:
        self.s = self.decay * self.s + x
        self.w = self.decay * self.w + 1.0

    @property
    def value(self) -> float:
        return self.s / self.w if self.w else math.nan


class LossStats:
    """Running mean and EWMA of one stream of losses (a user, or everything)."""

    __slots__ = ("_ewma", "count", "total")

    def __init__(self, decay: float) -> None:
        self.count = 0
        self.total = 0.0
        self._ewma = _Ewma(decay)

    def add(self, loss: float) -> None:
        self.count += 1
        self.total += loss
        self._ewma.add(loss)

    @property
    def ewma(self) -> float:
        return self._ewma.value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "ewma": self.ewma}


class StalenessDetector:
    """Global fast/slow loss averages plus per-user running loss.

    ``update(uid, loss)`` returns a verdict; ``stale`` is True exactly once per arming: the
    detector then stays disarmed until :meth:`reset` (called when a new version goes live).
    """

    def __init__(self, config: StalenessConfig) -> None:
        self.config = config
        self._fast_decay = _decay(config.fast_halflife)
        self._slow_decay = _decay(config.slow_halflife)
        self._fast = _Ewma(self._fast_decay)
        self._slow = _Ewma(self._slow_decay)
        self._seen = 0
        self._armed = True
        # the slow average when a drift was first flagged (the loss the model had before it),
        # kept across versions until a version brings the loss back near it
        self.reference: float | None = None
        self._follow_ups = 0
        self.global_loss = LossStats(self._slow_decay)
        self.users: dict[str, LossStats] = {}

    def reset(self) -> None:
        """A new version is live: restart the trend from scratch and re-arm."""
        self._fast = _Ewma(self._fast_decay)
        self._slow = _Ewma(self._slow_decay)
        self._seen = 0
        self._armed = True

    @property
    def armed(self) -> bool:
        return self._armed

    def update(self, uid: str, loss: float) -> StalenessVerdict:
        if not math.isfinite(loss):
            # A model's loss function returning NaN must not poison the averages forever.
            return StalenessVerdict(False, self._fast.value, self._slow.value, math.nan, self._seen)
        self.global_loss.add(loss)
        stats = self.users.get(uid)
        if stats is None:
            stats = self.users[uid] = LossStats(self._fast_decay)
        stats.add(loss)
        self._seen += 1
        self._fast.add(loss)
        self._slow.add(loss)
        fast, slow = self._fast.value, self._slow.value
        trend = (fast - slow) / slow if slow > 0 else 0.0
        cfg = self.config
        if not (self._armed and self._seen >= cfg.min_observations):
            return StalenessVerdict(False, fast, slow, trend, self._seen)
        reason = ""
        if trend > cfg.threshold:
            reason = "loss rising"
            if self.reference is None:
                self.reference, self._follow_ups = slow, 0
        elif self.reference is not None:
            if fast <= (1.0 + cfg.threshold) * self.reference:
                self.reference = None  # recovered
            elif self._follow_ups < cfg.follow_up_retrains:
                self._follow_ups += 1
                reason = "loss still above the level before the drift"
            else:
                self.reference = None  # give up until the loss rises again
        if reason:
            self._armed = False
        return StalenessVerdict(bool(reason), fast, slow, trend, self._seen, reason)

    def snapshot(self) -> dict[str, Any]:
        return {
            "armed": self._armed,
            "reference": self.reference,
            "observations_since_reset": self._seen,
            "fast": self._fast.value,
            "slow": self._slow.value,
            "global": self.global_loss.to_dict(),
            "users": len(self.users),
        }
