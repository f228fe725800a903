"""When the estimate and the measurement part ways: the pure decision rule of the drift loop.

Every tick the live runner (``inferline/deploy/_drift.py``) hands the policy, per app, the
estimator's P99 for the plan in force on the arrivals of the last ``window_s`` seconds and the
P99 measured over the same arrivals. An app whose two figures differ by more than
``threshold`` (relative to the measured one) on ``sustain`` ticks in a row has *drifted*. The
policy then answers ``alert`` (mode ``alert``: log it and count it) or ``recalibrate`` (mode
``replan``: calibrate the profiles to the live service times, and re-plan if the plan no
longer meets its SLO under the new estimate), at most once per ``cooldown_s``. A window with
fewer than ``min_queries`` arrivals says nothing (its P99 is its maximum) and resets the
app's count. The cooldown lets a changed deployment show in the measurement; an action that
changed nothing (calibrated, and the plan kept) lifts it (:meth:`DriftPolicy.settled`), so
a gap that opens right after, a model slowing down, is acted on within ``sustain`` ticks
(a 5 s cooldown after an early calibration once delayed a slowdown's re-plan by 5 s, and the
backlog it left missed the SLO). An estimate over the app's SLO counts as apart too: once calibration has closed
the gap, a plan that no longer fits (a re-plan that failed to apply, say) is still acted on.

Pure: state in, decision and new state out; the caller passes the time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from inferline.core import ValidationError

__all__ = [
    "DRIFT_MODES",
    "DriftConfig",
    "DriftDecision",
    "DriftObservation",
    "DriftPolicy",
    "DriftState",
]

DRIFT_MODES = ("off", "alert", "replan")


@dataclass(frozen=True)
class DriftConfig:
    """The drift loop's knobs (``inferline serve --on-drift``).

    ``mode``: ``off`` (no loop), ``alert`` (gauges, log and event only), ``replan`` (also
    recalibrate, and re-plan when the plan no longer fits). ``window_s``: the arrivals the
    estimate and the measurement are taken over; ``tick_s``: how often; ``threshold``:
    relative gap ``|estimated - measured| / measured`` that counts as apart; ``sustain``:
    consecutive ticks apart before acting; ``cooldown_s``: the least time between two
    actions. ``min_queries``: the fewest arrivals in a window worth judging;
    ``min_batches``: the fewest live batches of one size calibration uses;
    ``plan_trace_s``: the arrivals a re-plan plans for (the last that many seconds), with
    ``rate_margin`` headroom (``PlannerOptions.rate_margin``: fresh traffic is another
    realization of the same process);
    ``hop_overhead_s`` / ``service_spread``: estimator options of the live estimate.
    """

    mode: str = "alert"
    window_s: float = 10.0
    tick_s: float = 2.0
    threshold: float = 0.25
    sustain: int = 3
    cooldown_s: float = 30.0
    min_queries: int = 50
    min_batches: int = 20
    plan_trace_s: float = 30.0
    rate_margin: float = 0.1
    hop_overhead_s: float = 0.0
    service_spread: bool = False

    def __post_init__(self) -> None:
        if self.mode not in DRIFT_MODES:
            raise ValidationError("drift.mode", f"one of {DRIFT_MODES}", self.mode)
        for name in ("window_s", "tick_s", "threshold", "plan_trace_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValidationError(f"drift.{name}", "a finite number > 0", v)
        for name in ("cooldown_s", "hop_overhead_s", "rate_margin"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValidationError(f"drift.{name}", "a finite number >= 0", v)
        for name in ("sustain", "min_queries", "min_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValidationError(f"drift.{name}", "an integer >= 1", v)
        if not isinstance(self.service_spread, bool):
            raise ValidationError("drift.service_spread", "true or false", self.service_spread)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DriftConfig:
        if not isinstance(d, Mapping):
            raise ValidationError("drift", "an object of drift settings", type(d).__name__)
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValidationError("drift", f"only keys {sorted(known)}", extra)
        return cls(**dict(d))


@dataclass(frozen=True)
class DriftObservation:
    """One app over one window: the two P99s (seconds), how many queries arrived, the SLO
    the plan was made for (0: none)."""

    app: str
    estimated_p99_s: float
    measured_p99_s: float
    queries: int
    slo_s: float = 0.0

    @property
    def over_slo(self) -> bool:
        """The estimate says the plan in force misses its SLO on this window."""
        return self.slo_s > 0 and self.estimated_p99_s > self.slo_s

    @property
    def gap(self) -> float:
        """``|estimated - measured| / measured`` (inf when the estimate is unbounded)."""
        e, m = self.estimated_p99_s, self.measured_p99_s
        if not math.isfinite(e) or not math.isfinite(m):
            return math.inf
        return abs(e - m) / m if m > 0 else (0.0 if e <= 0 else math.inf)

    def to_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "estimated_p99_s": self.estimated_p99_s,
            "measured_p99_s": self.measured_p99_s,
            "queries": self.queries,
            "slo_s": self.slo_s,
            "gap": self.gap,
        }


@dataclass(frozen=True)
class DriftState:
    """Consecutive ticks each app has been apart, and when the policy last acted."""

    apart: tuple[tuple[str, int], ...] = ()
    last_action_s: float = -math.inf

    def count(self, app: str) -> int:
        return dict(self.apart).get(app, 0)


@dataclass(frozen=True)
class DriftDecision:
    """``action``: ``none``, ``alert`` or ``recalibrate``; ``apps``: those that drifted."""

    time_s: float
    action: str
    apps: tuple[str, ...] = ()
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "action": self.action,
            "apps": list(self.apps),
            "reason": self.reason,
        }


class DriftPolicy:
    """The rule; ``decide`` is a pure function of the state, the observations and the time."""

    def __init__(self, config: DriftConfig = DriftConfig()) -> None:
        self.config = config

    def decide(
        self, state: DriftState, observations: Sequence[DriftObservation], now_s: float
    ) -> tuple[DriftDecision, DriftState]:
        c = self.config
        counts = dict(state.apart)
        for o in observations:
            judged = o.queries >= c.min_queries and o.measured_p99_s > 0
            apart = o.gap > c.threshold or o.over_slo
            counts[o.app] = counts.get(o.app, 0) + 1 if judged and apart else 0
        drifted = tuple(sorted(a for a, n in counts.items() if n >= c.sustain))
        new = replace(state, apart=tuple(sorted(counts.items())))
        if c.mode == "off" or not drifted:
            return DriftDecision(now_s, "none"), new
        gaps = {o.app: o for o in observations if o.app in drifted}
        why = "; ".join(
            f"{a}: estimated P99 {gaps[a].estimated_p99_s * 1e3:.1f} ms, measured "
            f"{gaps[a].measured_p99_s * 1e3:.1f} ms ({gaps[a].gap:.0%} apart"
            + (f", over the SLO {gaps[a].slo_s * 1e3:.0f} ms" if gaps[a].over_slo else "")
            + f", {counts[a]} ticks)"
            for a in drifted
            if a in gaps
        )
        if now_s - state.last_action_s < c.cooldown_s:
            return DriftDecision(now_s, "none", drifted, f"cooling down: {why}"), new
        action = "alert" if c.mode == "alert" else "recalibrate"
        counts.update({a: 0 for a in drifted})
        acted = DriftState(tuple(sorted(counts.items())), now_s)
        return DriftDecision(now_s, action, drifted, why), acted

    def settled(self, state: DriftState, acted_s: float, changed: bool) -> DriftState:
        """The state once the action decided at ``acted_s`` is done: without a change to the
        deployment (the plan kept), no cooldown. Only the latest action's outcome counts."""
        if changed or state.last_action_s != acted_s:
            return state
        return replace(state, last_action_s=-math.inf)
