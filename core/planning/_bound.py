"""A sound lower bound on SLO misses, used by the planners to skip hopeless simulations.

The planner asks the estimator about many configurations that are plainly under-provisioned
(a replica removed from a saturated model, too few replicas while initializing). For those a
cheap, *sound* argument already proves that the ``percentile``-th latency exceeds the SLO, so
the simulation can be skipped without changing any decision: a configuration the bound rejects
is one the estimator would reject too.

The argument, for one model ``m`` served by ``r`` replicas with per-replica peak throughput
``mu`` (the best ``b / latency(b)`` over the batch sizes it may run):

* Which queries visit ``m`` is known exactly: the estimator draws the visits up front with
  :func:`draw_visits` and the same seed.
* A query visiting ``m`` cannot enter ``m``'s queue before ``arrival + d_up`` (the fastest
  latencies of the parents it visits, on any hardware, joins waiting for the slowest, plus the
  per-hop overhead before each queue), and after leaving ``m`` it still needs ``d_down`` (the
  same for the children it visits). So it meets the SLO only if ``m`` finishes it in the window
  ``[a + d_up, a + slo - d_down]``.
* Each replica runs batches one after another and a batch of ``b`` takes at least ``b / mu``;
  spreading each batch's queries evenly over its run time gives a schedule on one machine of rate
  ``c = r * mu`` in which every query is processed inside its real batch's run time, so each
  on-time query stays inside its window. Hence at most as many queries can be on time as a
  single machine of rate ``c`` can serve inside their windows with jobs of size ``1 / c``.
* Shrinking every window to a common offset (the smallest ``d_up`` and ``d_down`` among the
  visitors; queries whose own offsets already exceed the SLO are counted late outright) makes
  release times and deadlines ordered alike. For equal-size jobs with such agreeable windows
  the greedy "serve in arrival order, drop a job that would finish late" keeps the most jobs on
  time (Kise et al. 1978: with equal sizes the job to drop is always the newest one).

The greedy's drop count is therefore a lower bound on the queries that miss the SLO; once it
reaches ``N - floor((N - 1) p / 100)`` the ``p``-th percentile of ``numpy.percentile`` (linear
interpolation) lies strictly above the SLO. Batch-wait timeouts only add latency, so the bound
stays sound when the estimator is given them; the hop overhead is part of the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numba
import numpy as np

from .._hardware import HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig
from .._profiles import Profiles
from ..estimator import draw_visits

__all__ = ["MissBound"]


@numba.njit(cache=True, nogil=True)
def _greedy_misses(arr: np.ndarray, d_up: float, window: float, c: float, stop_at: int) -> int:
    """Jobs of size 1/c released at ``a + d_up``, due at ``a + window``; count those dropped."""
    p = 1.0 / c
    free = -np.inf
    late = 0
    tol = 1e-9  # float slack in favour of "on time" keeps the bound sound
    for i in range(arr.shape[0]):
        a = arr[i]
        start = a + d_up
        if free > start:
            start = free
        fin = start + p
        if fin <= a + window + tol:
            free = fin
        else:
            late += 1
            if late >= stop_at:
                return late
    return late


class MissBound:
    """Lower bounds on SLO misses for one pipeline, trace, SLO, percentile and visit seed."""

    def __init__(
        self,
        pipeline: Pipeline,
        profiles: Profiles,
        trace: np.ndarray,
        slo_s: float,
        percentile: float,
        seed: int,
        catalog: HardwareCatalog,
        hop_s: float = 0.0,
    ) -> None:
        self.pipeline = pipeline
        self.profiles = profiles
        self.slo_s = float(slo_s)
        n = int(trace.shape[0])
        self.n = n
        hh = (n - 1) * (percentile / 100.0)
        # misses needed for the percentile to exceed the SLO (tiny slack keeps it sound)
        self.threshold = max(1, n - math.floor(hh - 1e-9)) if n else 1
        order = pipeline.topological_order
        pos = {m: j for j, m in enumerate(order)}
        vis = draw_visits(pipeline, n, seed).astype(bool) if n else np.zeros((0, len(order)), bool)
        self.usable = {
            m: [h for h in profiles.hardware_for(m) if h in catalog] if m in profiles.models else []
            for m in pipeline.models
        }
        # fastest batch of any size on any usable hardware: a floor on the model's latency
        lmin = {
            m: min(
                (
                    profiles.latency(m, h, b)
                    for h in self.usable[m]
                    for b in profiles.batch_sizes(m, h)
                ),
                default=math.inf,
            )
            for m in pipeline.models
        }
        self._vis = vis
        self._pos = pos
        hop = self.hop_s = float(hop_s)  # every model visit waits this long before its queue
        # up[m]: time from arrival until the last visited parent of m has finished
        up: dict[str, np.ndarray] = {}
        for m in order:
            u = np.zeros(n)
            for p in pipeline.parents[m]:
                v = vis[:, pos[p]]
                u = np.where(v, np.maximum(u, up[p] + hop + lmin[p]), u)  # joins: the slowest
            up[m] = u
        # down[m]: time the query still needs after m finishes (the children it visits)
        down: dict[str, np.ndarray] = {}
        for m in reversed(order):
            d = np.zeros(n)
            for c in pipeline.children[m]:
                v = vis[:, pos[c]]
                d = np.where(v, np.maximum(d, down[c] + hop + lmin[c]), d)
            down[m] = d
        self._lmin = lmin
        self._arr: dict[str, np.ndarray] = {}
        self._d_up: dict[str, float] = {}
        self._window: dict[str, float] = {}
        self._definite: dict[str, int] = {}
        path = np.zeros(n)
        for m in order:
            v = vis[:, pos[m]]
            own = up[m] + hop + lmin[m] + down[m]
            path = np.where(v, np.maximum(path, own), path)
            sure = v & (own > self.slo_s + 1e-9)
            rest = v & ~sure
            self._definite[m] = int(np.count_nonzero(sure))
            self._arr[m] = np.ascontiguousarray(trace[rest], dtype=np.float64)
            self._d_up[m] = hop + (float(up[m][rest].min()) if rest.any() else 0.0)
            self._window[m] = self.slo_s - (float(down[m][rest].min()) if rest.any() else 0.0)
        self.path_lower_s = path  # per query: its visited critical path at the fastest latencies
        self._late: dict[tuple[str, float], int] = {}
        self._peak: dict[tuple[str, str, int], float] = {}
        self._minrep: dict[tuple[str, str, int], int] = {}

    # -- per-model figures ---------------------------------------------------------------
    def peak_throughput(self, model: str, hardware: str, max_batch: int) -> float:
        """Best queries/s of one replica that may run any batch size up to ``max_batch``."""
        key = (model, hardware, max_batch)
        v = self._peak.get(key)
        if v is None:
            v = max(b / self.profiles.latency(model, hardware, b) for b in range(1, max_batch + 1))
            self._peak[key] = v
        return v

    def misses(self, model: str, capacity_qps: float) -> int:
        """Lower bound on queries missing the SLO because of ``model`` at this capacity."""
        key = (model, capacity_qps)
        v = self._late.get(key)
        if v is None:
            sure = self._definite[model]
            arr = self._arr[model]
            if arr.size == 0 or sure >= self.threshold:
                v = sure
            else:
                v = sure + int(
                    _greedy_misses(
                        arr,
                        self._d_up[model],
                        self._window[model],
                        float(capacity_qps),
                        self.threshold - sure,
                    )
                )
            self._late[key] = v
        return v

    def model_infeasible(self, model: str, config: ModelConfig) -> bool:
        if config.replicas <= 0:
            return self._definite[model] + self._arr[model].size >= self.threshold
        cap = config.replicas * self.peak_throughput(model, config.hardware, config.max_batch_size)
        return self.misses(model, cap) >= self.threshold

    def infeasible(self, configs: Mapping[str, ModelConfig]) -> bool:
        """True only if the SLO is certainly missed at the percentile (sound)."""
        return any(self.model_infeasible(m, configs[m]) for m in self.pipeline.models)

    def min_replicas(self, model: str, hardware: str, max_batch: int, cap: int) -> int:
        """Fewest replicas the bound does not rule out (``cap + 1`` if even ``cap`` is)."""
        key = (model, hardware, max_batch)
        v = self._minrep.get(key)
        if v is not None and v <= cap:
            return v
        mu = self.peak_throughput(model, hardware, max_batch)

        def bad(r: int) -> bool:
            return self.misses(model, r * mu) >= self.threshold

        if not bad(1):
            v = 1
        elif bad(cap):
            return cap + 1
        else:
            lo, hi = 1, cap  # bad(lo), not bad(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if bad(mid):
                    lo = mid
                else:
                    hi = mid
            v = hi
        self._minrep[key] = v
        return v

    def best_latency_s(self, percentile: float) -> float:
        """The ``percentile`` of per-query critical paths at the fastest latencies: what an
        unlimited number of batch-1 replicas on the fastest hardware would achieve."""
        if self.path_lower_s.size == 0:
            return 0.0
        return float(np.percentile(self.path_lower_s, percentile))

    def fastest_latency_s(self, model: str) -> float:
        return self._lmin[model]

    def best_latency_with_s(self, latency_s: Mapping[str, float], percentile: float) -> float:
        """Like :meth:`best_latency_s` with some models' latencies fixed (e.g. to their batch-1
        latency on a given hardware): a floor on what any replica counts can achieve."""
        lat = {m: float(latency_s.get(m, self._lmin[m])) for m in self.pipeline.models}
        order = self.pipeline.topological_order
        fin: dict[str, np.ndarray] = {}
        end = np.zeros(self.n)
        for m in order:
            v = self._vis[:, self._pos[m]]
            start = np.zeros(self.n)
            for p in self.pipeline.parents[m]:
                start = np.where(self._vis[:, self._pos[p]], np.maximum(start, fin[p]), start)
            fin[m] = np.where(v, start + self.hop_s + lat[m], 0.0)
            end = np.maximum(end, fin[m])
        return float(np.percentile(end, percentile)) if self.n else 0.0
