"""The planner's automatic rate margin: slack for the next realization of the sample's process.

The planner returns the cheapest configuration whose tail latency on the *sample* meets the
SLO. The sample is one realization of an arrival process; the next one has its own mean rate,
and a plan with no throughput slack over the sample misses the SLO on the realizations that run
faster (``benchmarks/plan_generalization.py``: planned on 120 s at CV 4, 3 of 48 fresh traces
missed the 1% target with no margin, none with 0.1).

``auto_rate_margin(sample)`` sizes the margin from the sample's own variability. The sample is
cut into windows of ``window_s`` (at least ``MIN_WINDOWS`` of them); the spread of their counts
gives the standard error of the sample's mean rate, ``se = std(counts) / sqrt(K) / mean``
(for a renewal process about ``CV / sqrt(N)``, whatever the window). A fresh realization's rate
differs from the sample's by the error of both, ``sqrt(2) * se``; the margin covers ``Z`` such
standard deviations (one-sided, about 97.7% for ``Z = 2``) on top of ``FLOOR``, at most
``MAX_AUTO_MARGIN``:

    margin = min(MAX_AUTO_MARGIN, FLOOR + Z * sqrt(2) * se)

The floor is for what the mean rate does not say: the cheapest plan sits near saturation,
where the tail depends on the bursts of the realization even at a known rate (on 300 s
samples at 150 q/s the error term alone, 1.3% at CV 1 and 5% at CV 4, left 15 of 192 fresh
runs over 1%, against 33 with no margin). So a Poisson sample of 12,000 queries gets about
5.6%, a CV-4 one about 13%, and a long or steady sample little more than the floor. A sample
whose windows differ for other reasons (a trend, a daily cycle) gets more, up to the cap: its
rate says less about the next stretch of traffic.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ._options import AUTO_MARGIN, PlannerOptions

__all__ = ["FLOOR", "MAX_AUTO_MARGIN", "auto_rate_margin", "resolve_margin"]

WINDOW_S = 5.0
MIN_WINDOWS = 8
Z = 2.0
FLOOR = 0.03
MAX_AUTO_MARGIN = 0.5


def auto_rate_margin(sample: np.ndarray, *, window_s: float = WINDOW_S, z: float = Z) -> float:
    """The rate margin for ``sample`` (arrival times, sorted): see the module doc."""
    a = np.asarray(sample, dtype=np.float64)
    if a.size < 2:
        return FLOOR
    t0, span = float(a[0]), float(a[-1] - a[0])
    if not span > 0.0:
        return FLOOR
    k = max(MIN_WINDOWS, int(span // window_s))
    w = span / k
    idx = np.minimum(((a - t0) / w).astype(np.int64), k - 1)
    counts = np.bincount(idx, minlength=k).astype(np.float64)
    mean = counts.mean()
    se = counts.std(ddof=1) / math.sqrt(k) / mean
    return float(min(MAX_AUTO_MARGIN, FLOOR + z * math.sqrt(2.0) * se))


def resolve_margin(options: PlannerOptions, sample: np.ndarray) -> PlannerOptions:
    """``options`` with ``rate_margin="auto"`` replaced by the sample's margin (a number
    stays as it is: an explicit override, 0 being the paper's test)."""
    if options.rate_margin != AUTO_MARGIN:
        return options
    return replace(options, rate_margin=auto_rate_margin(sample))
