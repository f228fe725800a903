"""Early stop: end a simulation as soon as its percentile latency is certain to exceed the SLO.

The planner judges a configuration feasible when ``numpy.percentile(latencies, p) <= slo``
on the planning trace. With ``n`` queries that percentile interpolates between the sorted
latencies at ``lo = floor((n - 1) * p / 100)`` and ``lo + 1`` (numpy's "linear" method), so
once ``n - lo`` queries have missed the SLO (latency above it, or never finishing), the one at
``lo`` has missed and the percentile is above the SLO whatever the other queries do. With
``n - 1 - lo`` misses it may still be at most the SLO (the interpolation can land below it),
so that is the :func:`miss_allowance`, and the kernel stops at the first miss beyond it.

A miss is counted only when certain: a query that finishes late, one a server batcher drops,
and, at the start of each instant ``t``, a query still in the system with ``t - arrival`` over
the SLO (it finishes at ``t`` or later). Every counted miss is a miss of the full run (the run
up to the stop *is* the full run's prefix), so a run that stops is infeasible, and a run that
does not stop is the full run, bit for bit. ``floor((1 - p / 100) * n)`` is not the allowance:
for ``n = 1050, p = 99`` it is 10 while 11 misses may still meet the SLO.

With ``drops_are_misses=False`` (the planner's judgement of the *served* queries' percentile,
``PlannerOptions.drops_are_misses`` off) only late finishes count, against the allowance of all
``n`` queries (at least the served ones', the allowance growing with ``n``): a query late in a
queue may still be dropped, so there is no deadline sweep. Drops count on their own, and the run
stops once they exceed ``max_drops`` (the planner's limit on drops, if it has one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import as_float, as_int
from ..errors import ValidationError

__all__ = ["EarlyStop", "miss_allowance"]


def miss_allowance(n: int, percentile: float) -> int:
    """The most queries of ``n`` that may miss the SLO with the ``percentile``-th latency
    (``numpy.percentile``, linear interpolation) possibly still within it."""
    if n <= 0:
        return 0
    # the same float operations as numpy's percentile: q = p / 100, index (n - 1) * q
    v = (n - 1) * float(np.true_divide(percentile, 100))
    lo = n - 1 if v >= n - 1 else max(0, math.floor(v))
    return n - 1 - lo


@dataclass(frozen=True)
class EarlyStop:
    """Stop :func:`simulate` once more than :func:`miss_allowance` queries have certainly
    missed ``slo_s`` (the run is then certain to have ``percentile``-th latency above
    ``slo_s``). A run-level argument of ``simulate(stop=...)``, not an ``EstimatorOptions``
    field: it changes what a run returns, not the system it simulates.

    ``drops_are_misses``: a query a server batcher drops is a miss (latency inf, as
    ``SimResult.percentile`` counts it). Off: the percentile of the served queries is meant
    (see the module doc); ``max_drops`` then also stops the run past that many drops.
    ``max_refused``: also stop past that many admission refusals (``SimResult.refused_late``;
    they only grow, so the run is then certain to exceed it)."""

    slo_s: float
    percentile: float = 99.0
    drops_are_misses: bool = True
    max_drops: int | None = None
    max_refused: int | None = None

    def __post_init__(self) -> None:
        as_float(self.slo_s, "stop.slo_s", nonneg=True)
        as_float(self.percentile, "stop.percentile", lo=0.0, hi=100.0)
        if not isinstance(self.drops_are_misses, bool):
            raise ValidationError("stop.drops_are_misses", "true or false", self.drops_are_misses)
        if self.max_drops is not None:
            if self.drops_are_misses:
                raise ValidationError(
                    "stop.max_drops", "None while drops are misses (they count as misses)", 0
                )
            as_int(self.max_drops, "stop.max_drops", minimum=0)
        if self.max_refused is not None:
            as_int(self.max_refused, "stop.max_refused", minimum=0)

    def allowance(self, n: int) -> int:
        return miss_allowance(n, self.percentile)
