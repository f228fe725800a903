"""Traffic envelopes (network calculus) of arrival processes (InferLine §5).

The envelope of an arrival process maps a window size ``w`` to the largest number of arrivals in
any window of that size. The tuner compares the envelope of the live traffic with the envelope
of the trace the planner provisioned for, at several time scales at once: short windows detect
burstiness, long windows detect a higher mean rate.

Windows start at the pipeline's service time and double up to 60 s (the last window is 60 s
exactly, so the long-term rate is always measured over a minute).

Offline, :func:`trace_envelope` computes the envelope of a whole trace. Online,
:class:`OnlineEnvelope` ingests arrival times as they come: every arrival is the right end of
one window per size, and its count is found by binary search in a buffer of the recent arrivals
(O(log n) per arrival and window; entries older than the largest window are dropped, so memory
is bounded by the arrivals of the last ``max(windows)`` seconds, or by ``max(windows) /
resolution_s`` entries when arrival times are snapped to a grid).

Why the online maximum equals the offline one: the most arrivals in any window ``[t, t + w)``
are reached by a window that starts at an arrival (what :func:`max_arrivals_in_window` scans)
and equally by one that ends at an arrival; both scans test the same predicate
``x_k < x_j + w`` on pairs ``j <= k``, so their maxima coincide exactly, in floating point too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._trace import Trace, max_arrivals_in_window
from ._validate import as_float, as_int, as_list, as_mapping, no_extra_keys, req
from .errors import ValidationError

__all__ = [
    "MAX_ENVELOPE_WINDOW_S",
    "OnlineEnvelope",
    "TrafficEnvelope",
    "envelope_windows",
    "trace_envelope",
]

MAX_ENVELOPE_WINDOW_S = 60.0


def envelope_windows(
    service_time_s: float, max_window_s: float = MAX_ENVELOPE_WINDOW_S
) -> tuple[float, ...]:
    """Window sizes ``s, 2s, 4s, ...`` below ``max_window_s``, then ``max_window_s`` itself.

    A service time at or above ``max_window_s`` gives the single window ``service_time_s``.
    """
    s = as_float(service_time_s, "service_time_s", positive=True)
    top = as_float(max_window_s, "max_window_s", positive=True)
    if s >= top:
        return (s,)
    out: list[float] = []
    w = s
    # Stop doubling just short of the top so the last two windows are not nearly equal.
    while w < top * (1 - 1e-9):
        out.append(w)
        w *= 2.0
    out.append(top)
    return tuple(out)


@dataclass(frozen=True)
class TrafficEnvelope:
    """``((window_s, max_arrivals), ...)``, windows increasing."""

    points: tuple[tuple[float, int], ...]

    def __post_init__(self) -> None:
        pts = tuple((float(w), int(n)) for w, n in self.points)
        for i, (w, n) in enumerate(pts):
            if not (w > 0 and math.isfinite(w)):
                raise ValidationError(f"points[{i}].window_s", "a window > 0", w)
            if n < 0:
                raise ValidationError(f"points[{i}].max_arrivals", "a count >= 0", n)
            if i and w <= pts[i - 1][0]:
                raise ValidationError("points", "strictly increasing windows", [p[0] for p in pts])
        object.__setattr__(self, "points", pts)

    @property
    def windows(self) -> tuple[float, ...]:
        return tuple(w for w, _ in self.points)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.points)

    def rates(self) -> tuple[float, ...]:
        """Peak arrival rate at each time scale: ``max_arrivals / window_s``."""
        return tuple(n / w for w, n in self.points)

    def exceeded_by(self, other: TrafficEnvelope) -> list[tuple[float, int, int]]:
        """``(window_s, other_count, own_count)`` for every window where ``other`` has more."""
        if other.windows != self.windows:
            raise ValidationError("windows", f"the same windows {self.windows!r}", other.windows)
        return [
            (w, n_other, n_self)
            for (w, n_self), (_, n_other) in zip(self.points, other.points, strict=True)
            if n_other > n_self
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"points": [[w, n] for w, n in self.points]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "envelope") -> TrafficEnvelope:
        m = as_mapping(d, where)
        no_extra_keys(m, {"points"}, where)
        pts = []
        for i, p in enumerate(as_list(req(m, "points", where), f"{where}.points")):
            p = as_list(p, f"{where}.points[{i}]")
            if len(p) != 2:
                raise ValidationError(f"{where}.points[{i}]", "a pair [window_s, count]", p)
            pts.append(
                (
                    as_float(p[0], f"{where}.points[{i}][0]", positive=True),
                    as_int(p[1], f"{where}.points[{i}][1]", minimum=0),
                )
            )
        return cls(tuple(pts))


def trace_envelope(trace: Trace, windows: Iterable[float]) -> TrafficEnvelope:
    """The envelope of a whole trace at the given window sizes (offline)."""
    arr = np.asarray(trace, dtype=np.float64)
    return TrafficEnvelope(
        tuple((float(w), max_arrivals_in_window(arr, float(w))) for w in windows)
    )


class OnlineEnvelope:
    """The envelope of a stream of arrival times, maintained incrementally.

    Feed non-decreasing arrival times with :meth:`add` or :meth:`extend`. Three views:

    - :meth:`envelope`: the maximum count per window over everything seen (equals
      :func:`trace_envelope` of the same stream);
    - :meth:`take_peaks`: the maximum count per window among windows that end at an arrival
      fed since the previous call (what a periodic controller compares with its plan);
    - :meth:`counts_at`: arrivals in ``(now - w, now]`` per window (the current curve).

    ``resolution_s`` snaps arrival times down to a grid before counting, which bounds memory by
    ``max(windows) / resolution_s + 2`` entries whatever the arrival rate; counts are then
    exact for the snapped stream. With ``None`` times are kept exactly and memory is the number
    of distinct arrival times in the last ``max(windows)`` seconds.
    """

    def __init__(self, windows: Sequence[float], resolution_s: float | None = None) -> None:
        ws = tuple(float(w) for w in windows)
        if not ws:
            raise ValidationError("windows", "at least one window size", [])
        for i, w in enumerate(ws):
            if not (w > 0 and math.isfinite(w)):
                raise ValidationError(f"windows[{i}]", "a window > 0", w)
        if resolution_s is not None:
            as_float(resolution_s, "resolution_s", positive=True)
        self.windows = ws
        self.resolution_s = resolution_s
        self._w = np.asarray(ws, dtype=np.float64)
        self._kmax = int(np.argmax(self._w))
        cap = 1024
        # Run-length buffer of distinct times: ``_t[j]`` a time, ``_cum[j]`` arrivals up to and
        # including it since the start.
        self._t = np.empty(cap, dtype=np.float64)
        self._cum = np.empty(cap, dtype=np.int64)
        self._lo = 0  # first live entry
        self._hi = 0  # one past the last entry
        self._base = 0  # arrivals before entry ``_lo``
        self._total = 0
        self._max = np.zeros(len(ws), dtype=np.int64)
        self._peak = np.zeros(len(ws), dtype=np.int64)

    # -- ingest ----------------------------------------------------------------------------
    def add(self, t: float) -> None:
        self.extend(np.asarray([t], dtype=np.float64))

    def extend(self, times: npt.ArrayLike) -> None:
        """Ingest a non-decreasing batch of arrival times, none earlier than the last one."""
        x = np.asarray(times, dtype=np.float64).ravel()
        if x.size == 0:
            return
        if not np.all(np.isfinite(x)):
            raise ValidationError("arrival times", "finite numbers", "nan or inf")
        if self.resolution_s is not None:
            x = np.floor(x / self.resolution_s) * self.resolution_s
        if x.size > 1 and np.any(np.diff(x) < 0):
            raise ValidationError("arrival times", "non-decreasing times", "a decreasing batch")
        if self._hi > self._lo and x[0] < self._t[self._hi - 1]:
            raise ValidationError(
                "arrival times", f"times >= the last one ({self._t[self._hi - 1]!r})", x[0]
            )
        # Collapse equal times into runs.
        starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
        ut = x[starts]
        un = np.diff(np.append(starts, x.size))
        recount = ut.size  # entries whose windows end at a new arrival
        if self._hi > self._lo and ut[0] == self._t[self._hi - 1]:
            # Same instant as the last stored run: grow that run and recount it.
            self._cum[self._hi - 1] += un[0]
            self._total += int(un[0])
            ut, un = ut[1:], un[1:]
        if ut.size:
            self._append(ut, self._total + np.cumsum(un))
            self._total += int(un.sum())
        # Counted after appending, which may have moved the buffer.
        self._count(self._hi - recount)
        self._evict()

    def _append(self, t: npt.NDArray[np.float64], cum: npt.NDArray[np.int64]) -> None:
        n = t.size
        if self._hi + n > self._t.size:
            live = self._hi - self._lo
            cap = max(1024, 2 * (live + n))
            nt = np.empty(cap, dtype=np.float64)
            nc = np.empty(cap, dtype=np.int64)
            nt[:live] = self._t[self._lo : self._hi]
            nc[:live] = self._cum[self._lo : self._hi]
            self._t, self._cum = nt, nc
            self._lo, self._hi = 0, live
        self._t[self._hi : self._hi + n] = t
        self._cum[self._hi : self._hi + n] = cum
        self._hi += n

    def _first_inside(
        self, ends: npt.NDArray[np.float64], w: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.intp]:
        """For each pair (window ``w[k]``, end ``ends[b]``): the first live entry ``j`` with
        ``t_j + w > end`` (absolute index), i.e. where the window ``(end - w, end]`` starts.

        One binary search for every pair on ``end - w``, then a correction to the exact
        predicate ``t_j + w > end`` (what the offline scan compares), which can differ from
        ``t_j > end - w`` by rounding for entries within an ulp of the boundary.
        """
        lo, hi = self._lo, self._hi
        t = self._t[lo:hi]
        n = t.size
        wk = w[:, None]
        j = np.searchsorted(t, (ends[None, :] - wk).ravel(), side="right").reshape(wk.size, -1)
        while True:
            left = (j > 0) & (t[np.maximum(j - 1, 0)] + wk > ends)
            right = (j < n) & (t[np.minimum(j, n - 1)] + wk <= ends)
            if not (left.any() or right.any()):
                return j + lo
            j = j - left + right

    def _count(self, first: int) -> None:
        """Counts of the windows that end at entries ``first..hi-1``, folded into the maxima."""
        lo, hi = self._lo, self._hi
        ends = self._t[first:hi]
        j = self._first_inside(ends, self._w)  # [windows, ends]
        before = np.where(j > lo, self._cum[np.maximum(j - 1, lo)], self._base)
        best = np.max(self._cum[first:hi][None, :] - before, axis=1)
        np.maximum(self._max, best, out=self._max)
        np.maximum(self._peak, best, out=self._peak)

    def _evict(self) -> None:
        """Drop entries that no window ending at or after the newest time can contain."""
        if self._hi == self._lo:
            return
        newest = self._t[self._hi - 1 : self._hi]
        # Entry j is dead once t_j + w_max <= newest (same predicate as the counting).
        j = int(self._first_inside(newest, self._w[self._kmax : self._kmax + 1])[0, 0])
        if j > self._lo:
            self._base = int(self._cum[j - 1])
            self._lo = j

    # -- views -----------------------------------------------------------------------------
    def envelope(self) -> TrafficEnvelope:
        return TrafficEnvelope(
            tuple((w, int(n)) for w, n in zip(self.windows, self._max, strict=True))
        )

    def peaks(self) -> tuple[int, ...]:
        """Max count per window among windows ending at arrivals since the last take."""
        return tuple(int(n) for n in self._peak)

    def take_peaks(self) -> tuple[int, ...]:
        out = self.peaks()
        self._peak[:] = 0
        return out

    def counts_at(self, now_s: float) -> tuple[int, ...]:
        """Arrivals in ``(now_s - w, now_s]`` for each window (exact while ``now_s`` is no earlier
        than the newest arrival minus the largest window)."""
        lo, hi = self._lo, self._hi
        if hi == lo:
            return tuple(0 for _ in self.windows)
        k = lo + int(np.searchsorted(self._t[lo:hi], now_s, side="right"))
        upto = int(self._cum[k - 1]) if k > lo else self._base  # arrivals at or before now
        j = self._first_inside(np.asarray([float(now_s)]), self._w)[:, 0]
        before = np.where(j > lo, self._cum[np.maximum(j - 1, lo)], self._base)
        return tuple(max(0, upto - int(b)) for b in before)

    @property
    def total(self) -> int:
        """Arrivals ingested so far."""
        return self._total

    @property
    def last_time(self) -> float | None:
        return float(self._t[self._hi - 1]) if self._hi > self._lo else None

    @property
    def buffered(self) -> int:
        """Distinct arrival times held now (the memory in use, in entries)."""
        return self._hi - self._lo

    @property
    def capacity(self) -> int:
        """Entries allocated (never more than twice the live entries plus one batch)."""
        return int(self._t.size)
