"""Admission by predicted completion and Clockwork's dispatch rule: the arithmetic shared by
the live queue (``inferline.queueing``, which imports it from here) and the estimator
(``EstimatorOptions.admission``; the compiled kernel's port is checked against
:func:`predict_completion` by tests/core/test_estimator_admission.py).

Clockwork (Gujarati et al., OSDI 2020): a query is refused at arrival when its predicted
completion is later than its deadline minus a small buffer, and a queued query is dropped
when a batch is cut if its deadline minus the buffer is earlier than now plus this batch's
execution time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._validate import as_float, as_mapping, no_extra_keys

__all__ = ["DEFAULT_BUFFER_S", "EstimatorAdmission", "dispatch_late", "predict_completion"]

# Clockwork's buffer between the internal and the client's deadline: a prediction is a P99,
# so a small margin keeps the admitted ones on time when a batch runs slightly longer.
DEFAULT_BUFFER_S = 0.002
LatencyFn = Callable[[int], float | None]


def predict_completion(
    now: float,
    position: int,
    queued: int,
    free_at: Sequence[float],
    max_batch: int,
    latency: LatencyFn,
) -> float | None:
    """When the query at ``position`` (0-based, EDF order) of ``queued`` queries finishes, if
    each replica, when free (``free_at``, clock times; past ones mean now), takes the next
    ``min(max_batch, left)`` queries at once (the fixed-batching rule). ``None`` when a batch
    size has no latency estimate or there is no replica."""
    if not free_at or not 0 <= position < queued:
        return None
    free = [max(now, t) for t in free_at]
    heapq.heapify(free)
    start = 0
    while True:
        t = heapq.heappop(free)
        size = min(max_batch, queued - start)
        lat = latency(size)
        if lat is None:
            return None
        done = t + lat
        if start + size > position:
            return done
        start += size
        heapq.heappush(free, done)


def dispatch_late(deadline: float, buffer_s: float, now: float, batch_latency: float) -> bool:
    """Clockwork's dispatch rule: the deadline minus the buffer is earlier than now (the
    replica is free) plus this batch's execution time."""
    return deadline - buffer_s < now + batch_latency


@dataclass(frozen=True)
class EstimatorAdmission:
    """The estimator with the live queue's ``queue.admission: "predicted"`` (docs/deadlines.md):
    every query's deadline is its arrival plus ``slo_s``; ``buffer_s`` is subtracted from it."""

    slo_s: float
    buffer_s: float = DEFAULT_BUFFER_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "slo_s", as_float(self.slo_s, "admission.slo_s", positive=True))
        b = as_float(self.buffer_s, "admission.buffer_s", nonneg=True)
        object.__setattr__(self, "buffer_s", b)

    def to_dict(self) -> dict[str, Any]:
        return {"slo_s": self.slo_s, "buffer_s": self.buffer_s}

    @classmethod
    def from_dict(cls, d: Any) -> EstimatorAdmission:
        m = as_mapping(d, "admission")
        no_extra_keys(m, {"slo_s", "buffer_s"}, "admission")
        return cls(m.get("slo_s"), m.get("buffer_s", DEFAULT_BUFFER_S))  # type: ignore[arg-type]
