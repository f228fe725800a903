"""Admission's glue to a model queue: what ``_admission``'s pure rules read off the queue
(the position of a new query, the replicas' next free times, the batch latency) and what a
refusal does (counts, raises ``PredictedLate``). Only called when the queue's ``admission``
is set, so today's queue pays one attribute test."""

from __future__ import annotations

import math

from ._admission import AdmissionConfig, PredictedLate, admit, probe
from ._batch_latency import BatchLatency
from ._mqueue import ModelQueue, QueuedQuery

__all__: list[str] = []  # private to the package


def free_times(q: ModelQueue) -> list[float]:
    """Each serving replica's predicted free time (past or ``-inf``: free now)."""
    return [p.busy_until for p in q.pullers.values() if not p.stopping]


# a query's order key: QueuedQuery's first five fields (class, deadline, arrival, rank, seq)
OrderKey = tuple[int, float, float, int, int]


def _position(q: ModelQueue, key: OrderKey) -> int:
    """How many live queued queries go before ``key`` (EDF within its class). O(n): only
    when the cheap bound (everything queued goes first) refused it. ``seq`` is unique, so
    a record never compares equal to the key on its first five fields."""
    return sum(1 for e in q.heap if e < key and not e.fut.done())


def check_arrival(
    q: ModelQueue, config: AdmissionConfig, latency: BatchLatency, key: OrderKey, now: float
) -> float:
    """The predicted completion of the query of order ``key`` (``inf``: not predicted,
    admitted) or ``PredictedLate`` when it cannot make its deadline. It is not queued yet."""
    free = free_times(q)
    mb = q.policy.max_batch_size
    est = latency.estimate
    n = len(q.heap)
    # first as if every queued query went first: the common case (same SLO, in arrival
    # order) is exact and costs no scan
    deadline = key[1]
    d = admit(config, now, deadline, n, n + 1, free, mb, est)
    if not d.admitted:
        pos = _position(q, key)
        if pos < n:
            live = sum(1 for e in q.heap if not e.fut.done())
            d = admit(config, now, deadline, pos, live + 1, free, mb, est)
    if d.admitted:
        return d.predicted
    if (
        n == 0
        and free
        and min(free) <= now
        and probe(config, now, deadline, latency.estimate(1, False))
    ):
        # an idle replica, nothing queued, and only the estimate's tail refuses it: running
        # it measures the model again (a tail held high by a stall would otherwise refuse
        # everything and never be measured down). Admitted unpredicted (inf), so the
        # dispatch and doomed rules let it run: dropped at its cut by the same estimate, it
        # measured nothing and the refusals went on for good (docs/deadlines.md)
        return math.inf
    q.refused_late += 1
    raise PredictedLate(q.name, "admission", d.late_by_s, d.retry_after_s)


def dispatch_latency(q: ModelQueue, size: int) -> float | None:
    """This batch's predicted execution time (None: admission off or no estimate)."""
    lat = q.latency
    return None if lat is None else lat.estimate(size)


def busy_until(q: ModelQueue, start: float, size: int) -> float:
    """When a replica that starts a batch of ``size`` at ``start`` is predicted free."""
    lat = dispatch_latency(q, size)
    return start if lat is None else start + lat


def prediction_errors(batch: list[QueuedQuery], finish: float) -> tuple[float, ...]:
    """Predicted minus actual completion of a batch's admitted, predicted queries."""
    return tuple(e.predicted - finish for e in batch if e.predicted != math.inf)
