"""Screening on a representative part of the planning trace (issue 48).

A long trace (an hour at 1,000 q/s: 3.6 M queries) makes every estimator run seconds long,
and the greedy search runs hundreds. :class:`Screen` picks a part of the trace that stands
for the whole: the busiest windows (by their query count, the traffic envelope at the
window's length), every one of them in, plus a seeded random sample of the other windows,
each weighted by the inverse of its sampling rate. Each window is simulated after a warm-up
(the seconds before it, weight 0, so its queues start as they would), and the windows are laid
back to back on one time axis with a gap between them. The weighted share of queries over
the SLO estimates the whole trace's share: above the percentile's allowance means infeasible.

The screen is an estimate, so the search confirms exactly (``_space.py``): a candidate whose
estimated miss share is within ``screen_margin`` (relative) of the allowance is judged on the
whole trace, and so is the final plan; a plan that fails that falls back to the exact search.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Screen", "build_screen"]

# windows of this many seconds, at least this many of them; the busiest and a random sample
_WINDOW_S = 30.0
_MIN_WINDOWS = 20
_BUSY_SHARE = 0.03  # the busiest 3% of the windows (at least 2), always in
_SAMPLE_SHARE = 0.04  # and 4% of the rest (at least 2), drawn at random
_WARM_S = 5.0  # simulated before each window, weight 0
_GAP_S = 5.0  # idle time between two windows on the screen's time axis


class Screen:
    """The screen's arrivals (``trace``), each query's weight (0 during a warm-up) and the
    allowance of the percentile. ``miss_share(latencies)`` is the weighted share over the
    SLO; ``percentile(latencies)`` the weighted percentile (what the search caches)."""

    def __init__(self, trace: np.ndarray, weights: np.ndarray, percentile: float) -> None:
        self.trace = trace
        self.weights = weights
        self.percentile = percentile
        self.allowance = (100.0 - percentile) / 100.0
        self._total = float(weights.sum())

    def miss_share(self, latencies: np.ndarray, slo_s: float) -> float:
        return float(self.weights[latencies > slo_s].sum()) / self._total

    def value(self, latencies: np.ndarray) -> float:
        """The weighted ``percentile``-th latency (queries of weight 0 left out)."""
        keep = self.weights > 0
        lat, w = latencies[keep], self.weights[keep]
        order = np.argsort(lat, kind="stable")
        cum = np.cumsum(w[order])
        i = int(np.searchsorted(cum, self.percentile / 100.0 * cum[-1], side="left"))
        return float(lat[order[min(i, lat.size - 1)]])

    def close(self, share: float, margin: float) -> bool:
        """Whether an estimated miss share is too near the allowance to trust."""
        return abs(share - self.allowance) <= margin * max(self.allowance, 1e-6)


def _windows(trace: np.ndarray) -> tuple[np.ndarray, float]:
    """The start index of every window and the window's length."""
    span = float(trace[-1] - trace[0])
    width = min(_WINDOW_S, span / _MIN_WINDOWS)
    edges = trace[0] + width * np.arange(math.ceil(span / width) + 1)
    return np.searchsorted(trace, edges, side="left"), width


def build_screen(trace: np.ndarray, percentile: float, seed: int) -> Screen:
    """The screen of ``trace`` (sorted arrivals): see the module doc."""
    starts, width = _windows(trace)
    counts = np.diff(starts)
    n = counts.size
    n_busy = max(2, math.ceil(_BUSY_SHARE * n))
    busy = np.argsort(-counts, kind="stable")[:n_busy]
    rest = np.setdiff1d(np.arange(n), busy)
    n_rand = min(rest.size, max(2, math.ceil(_SAMPLE_SHARE * rest.size)))
    rng = np.random.default_rng(seed)
    drawn = rng.choice(rest, size=n_rand, replace=False) if n_rand else rest[:0]
    weight = {int(w): 1.0 for w in busy}
    weight |= {int(w): rest.size / n_rand for w in drawn}
    parts: list[np.ndarray] = []
    wparts: list[np.ndarray] = []
    t = 0.0
    for w in sorted(weight):
        lo = trace[0] + w * width
        a = int(np.searchsorted(trace, lo - _WARM_S, side="left"))
        b, e = int(starts[w]), int(starts[w + 1])
        if e <= b:
            continue
        seg = trace[a:e]
        parts.append(seg - seg[0] + t)
        wparts.append(np.concatenate([np.zeros(b - a), np.full(e - b, weight[w])]))
        t = float(parts[-1][-1]) + _GAP_S
    return Screen(np.concatenate(parts), np.concatenate(wparts), percentile)
