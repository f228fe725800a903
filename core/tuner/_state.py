"""What the tuner decides and remembers: :class:`TunerDecision`, :class:`TunerState`, and the
state's arithmetic (sliding maxima, the state after a decision)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._validate import as_float, as_int, as_list, as_mapping, as_str, no_extra_keys, req
from ..errors import ValidationError

__all__ = ["EPS", "TunerDecision", "TunerState", "ceil_count", "moved", "push"]

# Replica counts are ceilings of ratios that are integers at the planned rate; the slack keeps
# float noise (2.0000000001) from adding a replica.
EPS = 1e-9


def ceil_count(x: float) -> int:
    return max(0, math.ceil(x - EPS))


@dataclass(frozen=True)
class TunerDecision:
    """A change of replica counts and why it was made."""

    time_s: float
    replicas: Mapping[str, int]  # the new absolute count of every model
    reason: str
    window_s: float  # the window whose rate drove the decision
    rate_qps: float  # that rate
    action: Literal["up", "down", "settle"] = "up"
    # the new max batch size of every model when the tuner manages them (ladder), else empty
    batch: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "replicas": dict(self.replicas),
            "reason": self.reason,
            "window_s": self.window_s,
            "rate_qps": self.rate_qps,
            "action": self.action,
            "batch": dict(self.batch),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "decision") -> TunerDecision:
        m = as_mapping(d, where)
        no_extra_keys(
            m, {"time_s", "replicas", "reason", "window_s", "rate_qps", "action", "batch"}, where
        )
        action = as_str(m.get("action", "up"), f"{where}.action")
        if action not in ("up", "down", "settle"):
            raise ValidationError(f"{where}.action", "'up', 'down' or 'settle'", action)
        return cls(
            time_s=as_float(req(m, "time_s", where), f"{where}.time_s"),
            replicas={
                as_str(k, f"{where}.replicas"): as_int(v, f"{where}.replicas.{k}", minimum=0)
                for k, v in as_mapping(req(m, "replicas", where), f"{where}.replicas").items()
            },
            reason=as_str(req(m, "reason", where), f"{where}.reason"),
            window_s=as_float(req(m, "window_s", where), f"{where}.window_s", nonneg=True),
            rate_qps=as_float(req(m, "rate_qps", where), f"{where}.rate_qps", nonneg=True),
            action=action,  # type: ignore[arg-type]
            batch=_counts(m.get("batch", {}), f"{where}.batch", 1),
        )


@dataclass(frozen=True)
class TunerState:
    """What the tuner remembers between ticks.

    ``down_peaks``: ``(time_s, count)`` of the largest ``down_window_s`` counts of the last
    ``down_horizon_s`` seconds, as a skyline (each entry larger than every later one, so the
    first is the maximum and each tick does amortized constant work). ``up_peaks``: the same
    for the rates that exceeded the plan over the last ``keep_horizon_s`` seconds.
    """

    replicas: Mapping[str, int]
    last_change_s: float
    down_peaks: tuple[tuple[float, float], ...] = ()
    up_peaks: tuple[tuple[float, float], ...] = ()
    batch: Mapping[str, int] = field(default_factory=dict)  # current max batch sizes (ladder)
    # (time_s, count) of the down_window_s window at each tick of the last down_window_s
    trend: tuple[tuple[float, float], ...] = ()
    started_s: float | None = None  # when the tuner started watching (its windows fill up)
    # Ladder: per planning window, the skyline of its counts over the last down_horizon_s
    recent: tuple[tuple[tuple[float, float], ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": dict(self.replicas),
            "last_change_s": self.last_change_s,
            "down_peaks": [list(h) for h in self.down_peaks],
            "up_peaks": [list(h) for h in self.up_peaks],
            "batch": dict(self.batch),
            "trend": [list(h) for h in self.trend],
            "started_s": self.started_s,
            "recent": [[list(h) for h in r] for r in self.recent],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuner_state") -> TunerState:
        m = as_mapping(d, where)
        keys = {
            "replicas",
            "last_change_s",
            "down_peaks",
            "up_peaks",
            "batch",
            "trend",
            "started_s",
            "recent",
        }
        no_extra_keys(m, keys, where)

        def pairs(d: Any, at: str) -> tuple[tuple[float, float], ...]:
            out = []
            for i, h in enumerate(as_list(d, at)):
                h = as_list(h, f"{at}[{i}]")
                if len(h) != 2:
                    raise ValidationError(f"{at}[{i}]", "a pair [time_s, value]", h)
                out.append(
                    (as_float(h[0], f"{at}[{i}][0]"), as_float(h[1], f"{at}[{i}][1]", nonneg=True))
                )
            return tuple(out)

        def peaks(key: str) -> tuple[tuple[float, float], ...]:
            return pairs(m.get(key, []), f"{where}.{key}")

        return cls(
            replicas={
                as_str(k, f"{where}.replicas"): as_int(v, f"{where}.replicas.{k}", minimum=0)
                for k, v in as_mapping(req(m, "replicas", where), f"{where}.replicas").items()
            },
            last_change_s=as_float(req(m, "last_change_s", where), f"{where}.last_change_s"),
            down_peaks=peaks("down_peaks"),
            up_peaks=peaks("up_peaks"),
            batch=_counts(m.get("batch", {}), f"{where}.batch", 1),
            trend=peaks("trend"),
            started_s=(
                as_float(m["started_s"], f"{where}.started_s")
                if m.get("started_s") is not None
                else None
            ),
            recent=tuple(
                pairs(r, f"{where}.recent[{i}]")
                for i, r in enumerate(as_list(m.get("recent", []), f"{where}.recent"))
            ),
        )


def _counts(d: Any, where: str, minimum: int) -> dict[str, int]:
    return {
        as_str(k, where): as_int(v, f"{where}.{k}", minimum=minimum)
        for k, v in as_mapping(d, where).items()
    }


def push(
    peaks: tuple[tuple[float, float], ...], now_s: float, value: float, horizon_s: float
) -> tuple[tuple[float, float], ...]:
    """Sliding maximum: drop entries older than the horizon and those ``value`` dominates."""
    start = now_s - horizon_s
    lo = 0
    while lo < len(peaks) and peaks[lo][0] <= start:
        lo += 1
    hi = len(peaks)
    while hi > lo and peaks[hi - 1][1] <= value:
        hi -= 1
    return (*peaks[lo:hi], (float(now_s), float(value)))


def moved(
    state: TunerState,
    now_s: float,
    replicas: dict[str, int],
    down_peaks: tuple[tuple[float, float], ...],
    up_peaks: tuple[tuple[float, float], ...],
    batch: dict[str, int] | None = None,
) -> TunerState:
    """The state after a decision: the change restarts the stabilization delay; ``batch``
    only with a ladder (replica-only scaling keeps the state's)."""
    return replace(
        state,
        replicas=replicas,
        last_change_s=float(now_s),
        down_peaks=down_peaks,
        up_peaks=up_peaks,
        batch=state.batch if batch is None else batch,
    )
