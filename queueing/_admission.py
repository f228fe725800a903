"""Admission by predicted completion and Clockwork's dispatch rule: pure decisions.

Clockwork (Gujarati et al., OSDI 2020) meets tight SLOs by refusing, before running it, every
request that cannot finish in time. Two rules, both here as pure functions of numbers (the
caller passes ``now``; nothing reads a clock):

- **Admission** (``admit``): at arrival, a query's completion is predicted from the queries
  ahead of it in EDF order, the replicas' next free times and the batch latency per batch
  size; it is refused at once when that is later than its deadline minus a small buffer
  (Clockwork's internal deadline: arrival + SLO - buffer).
- **Dispatch** (``late_at_dispatch``): when a free replica cuts a batch, a queued query whose
  deadline (minus the buffer) is earlier than now plus this batch's execution time is dropped
  rather than run late.
- **Doomed in the queue** (``doomed``, ``doom_time``): between batch cuts, a queued query
  whose deadline (minus the buffer) is earlier than the earliest a replica can start it (now,
  or the earliest predicted free time of a busy replica) plus the shortest predicted batch is
  answered at once, not when a cut reaches it: the dispatch rule could only drop it later.

A query admitted without a prediction (``predicted`` ``inf``: no estimate yet, or the one
query admitted at an idle replica with nothing queued when only the estimate's tail refuses
it, ``probe``: run to measure the model again) is exempt from the last two: it was admitted to run. Dropping it would leave the estimate as it
was (no batch runs), so an estimate held high by a stall refused everything for good.

The rules answer the query with ``PredictedLate`` (an ``OverloadedError``, so a surface that does
not know it still answers "overloaded, retry").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferline.core.errors import OverloadedError, ValidationError
from inferline.core.estimator import DEFAULT_BUFFER_S, dispatch_late, predict_completion

__all__ = [
    "ADMISSION_MODES",
    "AdmissionConfig",
    "AdmissionDecision",
    "PredictedLate",
    "admit",
    "doom_time",
    "doomed",
    "late_at_dispatch",
    "predict_completion",
    "probe",
    "shortest_batch",
    "unpredicted",
]

ADMISSION_MODES = ("off", "predicted")
# DEFAULT_BUFFER_S and predict_completion's arithmetic live in the estimator's package, which
# simulates the same rules (EstimatorOptions.admission); re-exported here unchanged.
LatencyFn = Callable[[int], float | None]


class PredictedLate(OverloadedError):
    """The query was refused because it was predicted to finish after its deadline.

    ``stage``: ``"admission"`` (refused at arrival) or ``"dispatch"`` (dropped from the queue
    by the dispatch rule: when a batch was cut, or as soon as it was ``doomed``). ``late_by_s``: how far past its deadline it was predicted to finish.
    ``retry_after_s``: when a retry with the same SLO would be predicted to make it (the
    backlog ahead of it drained by then, if no more arrives)."""

    def __init__(self, model: str, stage: str, late_by_s: float, retry_after_s: float) -> None:
        super().__init__(model, 0)
        self.stage = stage
        self.late_by_s = late_by_s
        self.retry_after_s = max(0.0, retry_after_s)
        where = "at arrival" if stage == "admission" else "from the queue"
        self.args = (
            f"model {model!r}: refused {where}, predicted to finish "
            f"{late_by_s * 1e3:.1f} ms after its deadline (retry after "
            f"{self.retry_after_s * 1e3:.0f} ms)",
        )

    @property
    def reason(self) -> str:
        """The metrics' label: ``predicted_late`` (arrival) or ``dropped_late`` (dispatch)."""
        return "predicted_late" if self.stage == "admission" else "dropped_late"


@dataclass(frozen=True)
class AdmissionConfig:
    """A model queue's admission settings. ``mode``: ``"off"`` (today's queue) or
    ``"predicted"`` (both rules on). ``buffer_s``: subtracted from each deadline.
    ``min_samples``: batches of one size measured before the live P99 is trusted for it.
    ``window``: how many recent batches per size the P99 is taken over. ``tail_quantile``:
    the quantile of the recent batches' excess over their size's median that is added to
    it (Clockwork's 0.99; higher where batches overrun it, at the cost of more refusals)."""

    mode: str = "off"
    buffer_s: float = DEFAULT_BUFFER_S
    min_samples: int = 5
    window: int = 1000
    tail_quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.mode not in ADMISSION_MODES:
            raise ValidationError("admission", f"one of {list(ADMISSION_MODES)}", self.mode)
        b = self.buffer_s
        if isinstance(b, bool) or not isinstance(b, int | float) or not 0 <= b < 10:
            raise ValidationError("admission_buffer_s", "a number of seconds in [0, 10)", b)
        object.__setattr__(self, "buffer_s", float(b))
        t = self.tail_quantile
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.5 <= t <= 1:
            raise ValidationError("tail_quantile", "a number in [0.5, 1]", t)
        object.__setattr__(self, "tail_quantile", float(t))
        for name in ("min_samples", "window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValidationError(name, "an int >= 1", v)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "buffer_s": self.buffer_s,
            "min_samples": self.min_samples,
            "window": self.window,
            "tail_quantile": self.tail_quantile,
        }

    @classmethod
    def from_dict(cls, d: Any) -> AdmissionConfig:
        if not isinstance(d, dict):
            raise ValidationError("admission", "an object", d)
        keys = {"mode", "buffer_s", "min_samples", "window", "tail_quantile"}
        extra = set(d) - keys
        if extra:
            raise ValidationError("admission", f"keys {sorted(keys)}", extra)
        return cls(**d)


@dataclass(frozen=True)
class AdmissionDecision:
    """``admitted``; ``predicted``: the predicted completion (clock time; ``inf`` when it
    could not be predicted, then admitted); ``late_by_s`` and ``retry_after_s`` for a refusal."""

    admitted: bool
    predicted: float = math.inf
    late_by_s: float = 0.0
    retry_after_s: float = 0.0


def admit(
    config: AdmissionConfig,
    now: float,
    deadline: float,
    position: int,
    queued: int,
    free_at: Sequence[float],
    max_batch: int,
    latency: LatencyFn,
) -> AdmissionDecision:
    """Admission by predicted completion: admit unless the query at ``position`` of ``queued``
    (itself included) is predicted to finish after ``deadline - buffer``. Admits what it
    cannot predict (no replica, no latency estimate yet, an infinite deadline)."""
    if not config.enabled or deadline == math.inf:
        return AdmissionDecision(True)
    done = predict_completion(now, position, queued, free_at, max_batch, latency)
    if done is None:
        return AdmissionDecision(True)
    internal = deadline - config.buffer_s
    if done <= internal:
        return AdmissionDecision(True, done)
    # a retry with the same SLO at now + x has the deadline now + x + slo: it makes it once
    # the backlog ahead (done) fits, x = done - internal
    return AdmissionDecision(False, done, done - deadline, done - internal)


def probe(config: AdmissionConfig, now: float, deadline: float, typical: float | None) -> bool:
    """Admit, unpredicted, a query refused at an idle replica with nothing queued when a
    batch of one at the model's ``typical`` (median, tail left out) latency would make its
    deadline minus the buffer: only the estimate's tail stands in its way, and a tail held
    high by past stalls is measured down only by running batches. A deadline even the
    typical batch misses is refused as before (no estimate: admitted, as ``admit`` does)."""
    if not config.enabled or typical is None:
        return True
    return now + typical <= deadline - config.buffer_s


def unpredicted(predicted: float | None) -> bool:
    """A query admitted without a prediction (its ``predicted`` completion ``inf``): the
    dispatch and doomed rules leave it to run (module doc). ``None``: not known, not exempt."""
    return predicted == math.inf


def late_at_dispatch(
    config: AdmissionConfig,
    now: float,
    deadline: float,
    batch_latency: float | None,
    predicted: float | None = None,
) -> bool:
    """Clockwork's dispatch rule: a query is dropped when its deadline minus the buffer is
    earlier than now (the replica is free) plus this batch's execution time. Never drops
    without an estimate, nor a query admitted without a prediction (``predicted`` inf)."""
    if not config.enabled or batch_latency is None or unpredicted(predicted):
        return False
    return dispatch_late(deadline, config.buffer_s, now, batch_latency)


def shortest_batch(latency: LatencyFn, max_batch: int) -> float | None:
    """The shortest predicted batch of sizes 1..``max_batch`` (None: no estimate). A queued
    query's batch can take no less, whatever size it is cut at."""
    best: float | None = None
    for size in range(1, max(1, max_batch) + 1):
        t = latency(size)
        if t is not None and (best is None or t < best):
            best = t
    return best


def doomed(
    config: AdmissionConfig,
    now: float,
    deadline: float,
    free_at: Sequence[float],
    shortest: float | None,
    predicted: float | None = None,
) -> bool:
    """A queued query that cannot make its deadline even in the very next batch: its deadline
    minus the buffer is earlier than the earliest start (``now``, or later when every replica
    is predicted busy past it) plus the ``shortest`` predicted batch. Such a query would be
    dropped by the dispatch rule at any later cut, so it is answered now. Never drops without
    an estimate or a replica, nor a query admitted without a prediction (``predicted`` inf)."""
    if not config.enabled or shortest is None or not free_at or deadline == math.inf:
        return False
    if unpredicted(predicted):
        return False
    start = max(now, min(free_at))
    return deadline - config.buffer_s < start + shortest


def doom_time(
    config: AdmissionConfig,
    deadline: float,
    shortest: float | None,
    predicted: float | None = None,
) -> float:
    """When a query with ``deadline`` becomes ``doomed`` as time passes (``inf``: never
    without an estimate, or for a query admitted without a prediction); the queue arms one
    timer for the earliest of its queries."""
    if not config.enabled or shortest is None or unpredicted(predicted):
        return math.inf
    return deadline - config.buffer_s - shortest
