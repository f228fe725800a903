"""A model's batch latency per batch size, as admission predicts with it.

Clockwork's estimate: the P99 of the model's recent runs of that batch size. Live timings are
used for a size once ``min_samples`` batches of it were measured; before that, a profile (the
batching policy's or the plan's latency function) if the queue has one; else no estimate
(admission then admits). A size never measured is read from the nearest measured ones: the
smallest measured size at least as large (the profiles' rule), or, past the largest, the
profile, else a line through the two largest (proportional growth from the largest alone).

Learned state in ``_``-prefixed attributes (a learner, not a policy): ``observe`` after each
batch (a sort of at most 128 samples), ``estimate`` at each arrival (the pooled tail is
re-sorted at most once per batch, lazily).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable

__all__ = ["BatchLatency"]


class BatchLatency:
    """Recent P99 batch latency per batch size, with a profile fallback.

    The P99 of a size is read as its recent median plus the P99 of all recent batches'
    excess over their size's median, pooled across sizes. Per size, a raw P99 of few samples
    is their maximum: one stall would hold a size's estimate high, admission would then stop
    forming batches of that size, and the estimate would never be measured down again. The
    pooled tail refreshes with every batch whatever its size.
    """

    __slots__ = (
        "_dirty",
        "_med",
        "_min",
        "_profile",
        "_q",
        "_samples",
        "_sizes",
        "_tail",
        "_tails",
    )

    def __init__(
        self,
        window: int = 1000,
        min_samples: int = 5,
        profile: Callable[[int], float] | None = None,
        tail_quantile: float = 0.99,
    ) -> None:
        self._min = min_samples
        self._q = tail_quantile  # of the pooled excess: higher holds on a noisier machine
        self._profile = profile
        self._samples: dict[int, deque[float]] = {}
        self._med: dict[int, float] = {}  # sizes with enough samples: their median
        self._sizes: list[int] = []  # the keys of ``_med``, sorted
        self._tails: deque[float] = deque(maxlen=window)  # excess over the size's median
        self._tail = 0.0  # P99 of ``_tails``
        self._dirty = False

    def observe(self, size: int, service_s: float) -> None:
        s = self._samples.get(size)
        if s is None:
            s = self._samples[size] = deque(maxlen=128)
        s.append(service_s)
        if len(s) >= self._min:
            xs = sorted(s)
            med = xs[len(xs) // 2]
            if size not in self._med:
                bisect.insort(self._sizes, size)
            self._med[size] = med
            self._tails.append(service_s - med)
            self._dirty = True

    def _p99(self, size: int, tail: bool = True) -> float:
        if not tail:
            return self._med[size]
        if self._dirty:
            xs = sorted(self._tails)
            self._tail = max(0.0, xs[max(0, math.ceil(self._q * len(xs)) - 1)])
            self._dirty = False
        return self._med[size] + self._tail

    def estimate(self, size: int, tail: bool = True) -> float | None:
        """The P99 latency of a batch of ``size`` (seconds), or None when unknown.
        ``tail=False``: its typical (median) latency, without the pooled tail."""
        if size in self._med:
            return self._p99(size, tail)
        sizes = self._sizes
        if sizes:
            i = bisect.bisect_left(sizes, size)
            if i < len(sizes):
                return self._p99(sizes[i], tail)
            if self._profile is not None:  # past the largest measured: the profile knows
                return float(self._profile(size))
            top = sizes[-1]
            if len(sizes) >= 2:
                prev = sizes[-2]
                slope = max(0.0, (self._med[top] - self._med[prev]) / (top - prev))
                return self._p99(top, tail) + slope * (size - top)
            return self._p99(top, tail) * size / top
        if self._profile is not None:
            return float(self._profile(size))
        return None

    def set_profile(self, profile: Callable[[int], float] | None) -> None:
        self._profile = profile
