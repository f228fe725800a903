"""The planner InferLine runs: the search of Algorithms 1 and 2 (``_search.py``) plus two
extensions that only ever lower the cost or add slack, and :func:`plan_inferline`.

Escape (an extension, ``PlannerOptions(escape=False)`` turns it off)
    Algorithm 2 stops in local optima where moving one model to cheaper hardware (or a larger
    batch) would need replicas elsewhere. :meth:`Planner.escape` restarts Algorithm 2 from
    perturbed configurations (one model moved, the pipeline repaired with Algorithm 1's
    bottleneck loop) and keeps a result only if it is cheaper, so the answer is still a fixed
    point of Algorithm 2 with both guarantees.

Batch waits (an extension, ``PlannerOptions(batch_wait=True)`` turns it on)
    A batch-wait timeout per model where it lowers the cost (``_waits.py``).

Server batchers (an extension, ``PlannerOptions(server="triton" | "tfserving")``)
    The serving system's own batcher per model, its knobs searched and every configuration
    judged with it (``_server.py``).

Widen (an extension, ``PlannerOptions(widen=False)`` turns it off)
    Equal-cost configurations differ in slack: the greedy keeps the first batch size that
    reached a replica count, which can leave a model just below saturation (a fragile plan on
    a fresh trace). :meth:`Planner.widen` moves each model to the batch size with the lowest
    tail latency at the same hardware and replicas, then Algorithm 2 runs again in case the
    slack lets a replica go; the result is still a fixed point of Algorithm 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig, Plan
from .._profiles import Profiles
from ..estimator import simulate
from ._options import PlannerOptions, ProgressFn
from ._parallel import stop
from ._server import ServerSearch
from ._space import Configs, Key, admitted_percentile
from ._tuner_inputs import tuner_inputs

__all__ = ["Planner", "plan_inferline"]

_ESCAPE_FLOOR_QUERIES = 2_000_000


class Planner(ServerSearch):
    """InferLine's planner: ``plan()`` runs Algorithm 1, Algorithm 2, then the extensions
    enabled in :class:`PlannerOptions` (escape and widen on by default, batch waits off,
    server batchers with ``server``), and returns a :class:`Plan` with the tuner's inputs."""

    # -- leaving a local optimum (an extension; off with escape=False) --------------------
    def escape(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Iterated local search around Algorithm 2's result.

        Algorithm 2 freezes the other models when it evaluates a downgrade or a larger batch,
        so it stops where such a move pays off only with more replicas elsewhere. Each escape
        start moves one model (to a cheaper hardware at batch size 1, or to a larger batch on
        its hardware) with the fewest replicas the miss bound allows, repairs the pipeline
        with Algorithm 1's loop (a replica to the throughput bottleneck until the SLO holds,
        given up past ``escape_cost_factor`` times the current cost), then runs Algorithm 2
        from there. The cheapest result that beats the current plan is adopted and the round
        repeats (at most ``escape_rounds``, within ``escape_budget``); the answer is still a
        fixed point of Algorithm 2, so the guarantees hold.
        """
        best = self._key(configs)
        best_cost = self._cost(best)
        budget = (
            self._sims
            + self.options.escape_budget * self._sims
            + _ESCAPE_FLOOR_QUERIES / max(1, self.trace.size)
        )
        rounds = 0
        while rounds < self.options.escape_rounds:
            rounds += 1
            found: Key | None = None
            for i, m in enumerate(self._models):
                c = best[i]
                moves = [(hw, 1) for hw in self.cheaper_hardware(m, c.hardware)]
                moves += [
                    (c.hardware, b)
                    for b in self._batch_ladder(m, c.hardware)
                    if b > c.max_batch_size
                ]
                for hw, b in moves:
                    if self._sims >= budget:
                        break
                    lat = {m: self._fast.latency(m, hw, b)}
                    if self.bound.best_latency_with_s(lat, self.percentile) > self.slo_s:
                        continue  # hopeless on this hardware whatever the replica counts
                    r0 = self.bound.min_replicas(m, hw, b, self.options.max_replicas)
                    if r0 > self._room(best, m, hw):
                        continue  # does not fit the inventory
                    start = self._with(best, m, ModelConfig(hw, b, r0))
                    cap = self.options.escape_cost_factor * best_cost
                    start2 = self._repair(start, cap)
                    if start2 is None:
                        continue
                    self._report("escape", rounds, start2, f"escape via {m} on {hw} b={b}")
                    found = self._cheapest_from(start2, best_cost, found)
            if found is None:
                break
            best, best_cost = found, self._cost(found)
            self._actions.append("escape")
        return self._configs(best)

    def _repair(self, key: Key, cost_cap: float) -> Key | None:
        """Algorithm 1's loop from ``key``: a replica to the bottleneck until feasible."""
        while not self._feasible(key):
            cfg = self._configs(key)
            m = self.bottleneck(cfg)
            c = cfg[m]
            if c.replicas >= min(self.options.max_replicas, self._room(key, m, c.hardware)):
                return None
            key = self._with(key, m, replace(c, replicas=c.replicas + 1))
            if self._cost(key) > cost_cap:
                return None
        return key

    # -- equal-cost polish -------------------------------------------------------------------
    def widen(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Among configurations of the same cost, prefer the one with the most slack.

        Ties in cost leave the batch sizes underdetermined: a replica count that is feasible
        at batch 2 is often feasible at batch 8 too, and the greedy keeps the first it found.
        The two differ in how much they can absorb: near saturation the larger batch has the
        throughput headroom, while a latency-bound model wants the smaller one. For each model
        in turn this picks, at the same hardware and replica count, the batch size of the
        ladder with the lowest ``percentile`` latency on the planning trace, until none moves.
        """
        key = self._key(configs)
        lat = self._latency(key)
        moved = True
        while moved:
            moved = False
            for i, m in enumerate(self._models):
                c = key[i]
                for b in self._batch_ladder(m, c.hardware):
                    if b == key[i].max_batch_size:
                        continue
                    k2 = self._with(key, m, replace(c, max_batch_size=b))
                    v = self._latency(k2)
                    if v < lat - 1e-12:
                        key, lat, moved = k2, v, True
        return self._configs(key)

    # -- everything ----------------------------------------------------------------------
    def plan(self) -> Plan:
        try:
            final = self._search_within_inventory() if self._inventory else self._search()
            if not self.confirm(self._key(final)):  # screened plan infeasible: search exactly
                self._actions.append("screen fallback")
                stop(self._running)  # their results are screened ones
                self._running = []
                final = self._search_within_inventory() if self._inventory else self._search()
        finally:
            stop(self._running)  # workers ahead of a search that has ended
            self._running = []
        key = self._key(final)
        self._report("done", len(self._actions), key, "plan ready")
        plan = Plan(
            pipeline=self.pipeline.name,
            slo_s=self.slo_s,
            models=final,
            percentile=self.percentile,
            cost_per_hour=self._cost(key),
            estimated_latency_s=self._sample_latency(key),
            strategy="inferline",
            tuner=tuner_inputs(self.pipeline, self.profiles, final, self.sample),
        )
        return self.server_plan(plan, key)  # with its server batchers (_server.py)

    def _search_within_inventory(self) -> Configs:
        """The search without the inventory first: the greedy descends from the fastest
        hardware, and a limit on the way down can strand it far above a cheaper plan that fits
        (an inventory holding exactly the unlimited plan gave a plan 1.8x its cost). Only if
        that plan does not fit does the search run again within the inventory. Latencies do
        not depend on the inventory, so the second search reuses the first one's cache."""
        inventory, self._inventory = self._inventory, {}
        try:
            free = self._search()  # an SLO infeasible without limits is infeasible with them
        finally:
            self._inventory = inventory
        if self._fits(self._key(free)):
            return free
        return self._search()

    def _search(self) -> Configs:
        init = self.initialize()
        final = self.minimize_cost(init)
        if self.options.escape:
            final = self.escape(final)
        if self.options.widen:
            while True:
                wide = self.widen(final)
                if wide == final:
                    break
                final = self.minimize_cost(wide)  # the slack may let a replica go
                if final == wide:
                    break
        if self._server:
            final = self.add_knobs(final)  # only ever a cheaper plan (_server.py)
        if self.options.batch_wait:
            final = self.add_waits(final)  # only ever a cheaper plan (_waits.py)
        return final

    def _sample_latency(self, key: Key) -> float:
        """The plan's estimate on the sample itself (what a user compares with a measurement);
        with a rate margin the search judged it on the compressed trace."""
        if self.trace is self.sample:
            # the server batchers' judgement is their own (never screened); the rest exact
            return self._latency(key) if self._server else self._exact_latency(key)
        if self._server:
            return self._judge(self._simulate(key, self.sample))
        r = simulate(
            self.pipeline,
            self._configs(key),
            self.profiles,
            self.sample,
            options=self.options.estimator,
            catalog=self.catalog,
        )
        if self.options.admission:  # refusals are misses (max_refused: the search's test)
            return admitted_percentile(r, self.percentile, None)
        return r.percentile(self.percentile)


def plan_inferline(
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    slo_s: float,
    *,
    percentile: float = 99.0,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    options: PlannerOptions | None = None,
    progress: ProgressFn | None = None,
) -> Plan:
    """Plan with InferLine's algorithm; raises :class:`InfeasibleError` if no plan exists."""
    return Planner(
        pipeline,
        profiles,
        trace,
        slo_s,
        percentile=percentile,
        catalog=catalog,
        options=options,
        progress=progress,
    ).plan()
