"""Batch-wait timeouts chosen by the planner (an extension, ``PlannerOptions(batch_wait=True)``).

With greedy batching an idle replica starts a batch as soon as one query is queued. When a
model's per-batch cost is high and it has several replicas, the replicas then each run small
batches at low load and a burst finds them all busy; waiting a little for a fuller batch
(Clipper's delayed batching) keeps replicas free and can meet the SLO with fewer of them. The
estimator models the wait exactly as the live ``DelayedBatching`` runs it
(``ModelConfig.batch_wait_ms``; ``tests/queueing/test_estimator_match.py``).

:meth:`WaitSearch.add_waits` runs after the search (and its extensions) and only adopts a
result that is cheaper than the plan without waits, so a plan is never dearer with the
option on. Per model and wait of the ladder (fractions of the SLO) it tries two starts: the
fewest replicas of that model at any batch size of its ladder with the wait, and the same
configuration with the wait where that lowers the tail latency (slack other models can spend).
Algorithm 2 runs from each start; the cheapest result is adopted and the round repeats.
Finally a wait the plan stays feasible without is dropped: a plan carries a wait only where
it lowers the cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .._plan import ModelConfig
from ._search import PlannerCore
from ._space import _EPS, Configs, Key

__all__ = ["WAIT_FRACTIONS", "WaitSearch"]

# Waits tried, as fractions of the SLO: a wait spends latency budget, so above a quarter of
# the SLO it rarely pays; below 1/32 it rarely changes a batch.
WAIT_FRACTIONS: tuple[float, ...] = (1 / 32, 1 / 16, 1 / 8, 1 / 4)
_ROUNDS = 3
_FLOOR_QUERIES = 2_000_000


class WaitSearch(PlannerCore):
    """The batch-wait pass of the planner (see the module doc)."""

    def wait_ladder(self) -> list[float]:
        """The waits tried, in milliseconds (rounded to 0.1 ms, so plan files read well)."""
        return sorted({round(self.slo_s * f * 1e3, 1) for f in WAIT_FRACTIONS} - {0.0})

    def _no_waits(self) -> set[str]:
        """Models that get no wait of the planner's (a server batches them: ``_server.py``)."""
        return set()

    def add_waits(self, configs: Mapping[str, ModelConfig]) -> Configs:
        best = self._key(configs)
        best_cost = self._cost(best)
        fixed = set(self.options.estimator.batch_wait_s)  # waits the user set stay theirs
        fixed |= self._no_waits()
        budget = self._sims * 2 + _FLOOR_QUERIES / max(1, self.trace.size)
        for _ in range(_ROUNDS):
            found: Key | None = None
            for i, m in enumerate(self._models):
                if m in fixed or self._sims >= budget:
                    continue
                for start in self._starts(best, i, m):
                    found = self._cheapest_from(start, best_cost, found)
            if found is None:
                break
            best, best_cost = found, self._cost(found)
            self._actions.append("batch wait")
            self._report("batch-wait", len(self._actions), best, "a batch wait lowers the cost")
        return self._configs(self._drop_idle_waits(best))

    def _starts(self, key: Key, i: int, m: str) -> list[Key]:
        """Feasible starts for Algorithm 2 with a wait on ``m`` (see the module doc)."""
        c = key[i]
        starts: list[Key] = []
        ladder = self._batch_ladder(m, c.hardware)
        slack: tuple[float, Key] | None = None
        base = self._latency(key)
        for w in self.wait_ladder():
            if w == c.batch_wait_ms:
                continue
            fewer = self._local(key, m, c.hardware, ladder, c.replicas - 1, wait_ms=w)
            if fewer is not None:
                starts.append(fewer)
            same = self._with(key, m, replace(c, batch_wait_ms=w))
            lat = self._latency(same)
            if self._fits(same) and lat < base - _EPS and (slack is None or lat < slack[0]):
                slack = (lat, same)
        if slack is not None:
            starts.append(slack[1])
        return starts

    def _drop_idle_waits(self, key: Key) -> Key:
        """Each wait the plan meets the SLO without goes (greedy batching is the default)."""
        for i, m in enumerate(self._models):
            c = key[i]
            if c.batch_wait_ms > 0:
                k2 = self._with(key, m, replace(c, batch_wait_ms=0.0))
                if self._feasible(k2):
                    key = k2
        return key
