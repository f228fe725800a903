"""When a served ensemble combines: the combine/return allowance.

Clipper's straggler mitigation combines, at the deadline, the predictions that arrived. But an
answer is not delivered the instant its models are combined: the combine timer fires late on a
busy loop (uvloop rounds timers to milliseconds), the combine, the service's bookkeeping, the
response's encoding and its trip to the client all take time. An app that combines at
arrival + SLO therefore answers after the SLO (measured through ``inferline serve``: every one of
120 answers over a 100 ms SLO, P99 105 ms). So the app combines at arrival + SLO - margin.

``CombineAllowance`` decides the margin, a pure decision object (state in, margin and new
state out; the caller owns the clock):

- ``fixed_s``: what the app cannot observe itself (the request's parsing before the app
  starts, the response's encoding and sending after it returns); a few ms by default.
- ``measured``: plus a tail estimate of what it can observe, the time from the combine target
  to the app's answer, as an EWMA of its mean and of its mean deviation (Jacobson's
  retransmission-timeout rule, mean + ``k`` x deviation), so that the margin follows the
  load of the server's event loop.
- The margin is capped at ``max_fraction`` of the SLO: the models keep most of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferline.core.errors import ValidationError

__all__ = ["AllowanceState", "CombineAllowance"]


def _number(v: Any, field: str, lo: float, hi: float = math.inf, *, hi_open: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValidationError(field, f"a number in [{lo}, {hi}{')' if hi_open else ']'}", v)
    ok = lo <= v < hi if hi_open else lo <= v <= hi
    if not ok:
        raise ValidationError(field, f"a number in [{lo}, {hi}{')' if hi_open else ']'}", v)
    return float(v)


@dataclass(frozen=True)
class AllowanceState:
    """The measured part: EWMA of the combine-to-answer time and of its mean deviation."""

    mean_s: float = 0.0
    dev_s: float = 0.0
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"mean_s": self.mean_s, "dev_s": self.dev_s, "samples": self.samples}

    @classmethod
    def from_dict(cls, d: Any) -> AllowanceState:
        return cls(float(d["mean_s"]), float(d["dev_s"]), int(d["samples"]))


@dataclass(frozen=True)
class CombineAllowance:
    """How long before the deadline an ensemble combines (see the module docstring)."""

    fixed_s: float = 0.005
    measured: bool = True
    alpha: float = 0.125  # gain of the mean's EWMA
    beta: float = 0.25  # gain of the deviation's EWMA
    k: float = 4.0
    max_fraction: float = 0.5

    def __post_init__(self) -> None:
        _number(self.fixed_s, "combine_margin_ms", 0.0)
        if not isinstance(self.measured, bool):
            raise ValidationError("measure_combine_margin", "true or false", self.measured)
        _number(self.alpha, "alpha", 0.0, 1.0, hi_open=False)
        _number(self.beta, "beta", 0.0, 1.0, hi_open=False)
        _number(self.k, "k", 0.0)
        _number(self.max_fraction, "max_fraction", 0.0, 1.0)

    def init(self) -> AllowanceState:
        return AllowanceState()

    def margin_s(self, state: AllowanceState, slo_s: float) -> float:
        """Seconds before the deadline to combine, for a query with ``slo_s``."""
        m = self.fixed_s
        if self.measured and state.samples:
            m += state.mean_s + self.k * state.dev_s
        return min(m, self.max_fraction * slo_s)

    def observe(self, state: AllowanceState, late_s: float) -> AllowanceState:
        """``state`` after one answer that left ``late_s`` after its combine target (a
        negative or non-finite sample is ignored)."""
        if not self.measured or not late_s >= 0.0 or late_s == math.inf:
            return state
        if state.samples == 0:
            return AllowanceState(late_s, late_s / 2.0, 1)
        err = late_s - state.mean_s
        return AllowanceState(
            state.mean_s + self.alpha * err,
            state.dev_s + self.beta * (abs(err) - state.dev_s),
            state.samples + 1,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_s": self.fixed_s,
            "measured": self.measured,
            "alpha": self.alpha,
            "beta": self.beta,
            "k": self.k,
            "max_fraction": self.max_fraction,
        }

    @classmethod
    def from_dict(cls, d: Any) -> CombineAllowance:
        return cls(**{k: d[k] for k in cls().to_dict() if k in d})
