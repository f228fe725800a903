"""InferLine's cost-minimizing planner, Algorithms 1 and 2 (InferLine §4.3; thesis ch. 4).

:class:`PlannerCore` holds the paper's algorithm on top of :class:`SearchSpace` (``_space.py``:
configurations, their cost and the cached judgement); ``_inferline.py`` adds the extensions.

How the paper's description is read here. Every feasibility judgement is the estimator's
``percentile``-th latency on the planning trace being at most the SLO.

Initialization (Algorithm 1)
    Every model gets batch size 1, one replica and its lowest-latency hardware (the smallest
    batch-1 latency; ties go to the cheaper hardware). If the best achievable latency exceeds
    the SLO the planner stops with :class:`InfeasibleError` naming it. The paper's test is the
    service time (the longest path of batch-1 latencies); here it is the ``percentile`` of each
    query's own critical path, which equals the longest path when every model sees every query
    and does not reject an SLO that only a rare conditional branch would break. Then, until the
    estimator says the SLO holds, one replica is added to the throughput bottleneck: the model
    with the least ``replicas * throughput(batch) / scale_factor`` (ties: pipeline order).

Inventory (an extension, ``PlannerOptions.inventory``; empty, as in the paper, by default)
    A configuration that needs more units of a hardware kind than the deployment has is
    infeasible, whatever its latency. Initialization then places each model on the fastest
    hardware that still has room, and a bottleneck whose hardware is full gets the next batch
    size of its ladder instead of a replica (more throughput without units), or past its
    largest batch moves to the next slower hardware with room (one replica, batch 1; a model
    only ever moves to slower hardware, so this ends); when none is possible it stops with
    :class:`InfeasibleError` naming the inventory. Algorithm 2's
    actions only ever free units, except a downgrade, whose replica count is capped by the
    room on the cheaper hardware. A plan that does not fit is never "feasible": on a shared
    machine the replicas would slow each other down and the estimate would not hold.

Cost minimization (Algorithm 2)
    Each iteration builds, per model, the candidate actions, drops the infeasible ones and
    applies the one that leaves the lowest cost; it stops when no feasible action cuts the cost.

    * Remove replicas: as many of the model's replicas as can go with the SLO still held (the
      paper removes one per iteration; taking the rest in the same step saves iterations).
    * Increase the batch size: the paper doubles the batch at equal cost and relies on later
      iterations to remove the replicas this frees ("removing replicas is feasible when a
      previous iteration ... increased the batch size"). Here the doubling and those removals
      are one action: the cheapest (batch, replicas) with a larger batch on the doubling
      ladder and fewer replicas. A doubling that frees nothing only spends latency budget and
      is never taken, so the final plan keeps its slack.
    * Downgrade the hardware: with the other models frozen, the model moves to a cheaper
      hardware with its batch size and replicas re-optimized there (the paper runs the
      initialization for that model and then a localized cost minimization; the result is the
      cheapest (batch, replicas) on that hardware). Rejected unless feasible and cheaper. The
      paper tries only the next cheaper hardware, assuming hardware is totally ordered by
      latency; every cheaper hardware is a candidate here, so a cheap CPU that beats a
      mid-priced GPU for a light model is found too.
    * The batch ladder is 1, 2, 4, ... (capped at the largest profiled size), keeping only
      sizes that raise the single-replica throughput.
    * Ties between equal-cost candidates: removal, then larger batch, then downgrade, then
      pipeline order.

    At termination no single action (one replica fewer, a larger batch with fewer replicas, a
    cheaper hardware) lowers the cost and keeps the SLO: guarantee 2 of the paper.

Speed (none of this changes a decision):

* every estimator result is cached by configuration;
* :class:`MissBound` (``_bound.py``) proves some configurations infeasible without a
  simulation, and a no-queueing latency floor rules out hardware that is too slow; both are
  sound, so they only skip simulations whose answer is known;
* candidates are evaluated lazily in order of a lower bound on their cost, so a feasible
  action that cuts the most ends the iteration before the others are simulated;
* the localized searches find the fewest feasible replicas by galloping and bisection,
  which gives the paper's one-replica-at-a-time answer whenever one more replica never
  breaks the SLO, in a logarithmic number of simulations;
* with ``reuse_infeasible`` an action found infeasible is not re-simulated while the only
  changes since were replica removals elsewhere (which only take capacity away); before the
  planner stops, one full iteration without that memory re-checks every action, so
  guarantee 2 holds exactly.

Reusing verdicts (``PlannerOptions.reuse_verdicts``, on by default; issue 48). This one rests
on an assumption, so it can change the search's path (never guarantee 2):

* *Assumption (monotone in resources):* every action Algorithm 2 applies takes latency slack
  from the pipeline (it is applied because it is cheaper and still feasible: fewer replicas,
  a larger batch with fewer replicas, slower hardware), so a model configuration ``(hw,
  batch, n)`` that was infeasible with the other models as they were stays infeasible after
  the others have only gone through such actions. (The replica searches already assume the
  same in ``n`` for one model, the others frozen.)
* So within one ``minimize_cost`` the largest infeasible replica count per (model, hardware,
  batch, wait) is kept, the localized searches start above it (a downgrade or larger batch
  whose every batch size is known infeasible up to its replica cap costs no simulation), and
  a re-resolved action tries its last answer first (one simulation when it still holds).
* Nothing that adds resources keeps them: each ``minimize_cost`` (the escape's perturbed
  starts, the run after widen) starts empty, and before it stops it forgets them and runs one
  full iteration exactly, so at the end no single action lowers the cost, as without it.
  ``benchmarks/planning_scale.py`` compares the plans with the full search's.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .._plan import ModelConfig
from ..errors import InfeasibleError, ValidationError
from ._parallel import PARALLEL_MIN_QUERIES, collect, start
from ._space import _EPS, Configs, Key, SearchSpace

__all__ = ["PlannerCore"]


@dataclass(frozen=True, order=True)
class _Cand:
    cost: float  # exact, or a lower bound while ``pending``
    rank: int  # 0 remove, 1 batch, 2 downgrade
    index: int  # model position in the pipeline
    kind: str = field(compare=False)
    model: str = field(compare=False)
    key: Key | None = field(compare=False, default=None)
    pending: bool = field(compare=False, default=False)
    hardware: str = field(compare=False, default="")  # downgrade target


class PlannerCore(SearchSpace):
    """InferLine's two-phase planner for one pipeline, trace, SLO and percentile.

    ``initialize()`` and ``minimize_cost()`` are the paper's two algorithms (:class:`Planner`
    adds ``plan()``). ``latency(configs)`` and ``feasible(configs)`` expose the (cached)
    judgement the planner uses (:class:`SearchSpace`); ``stats()`` counts simulations, cache
    hits and pruned ones.
    """

    # -- Algorithm 1 ---------------------------------------------------------------------
    def initialize(self) -> Configs:
        """A feasible configuration: batch 1, fastest hardware, replicas added to the
        throughput bottleneck until the estimator says the SLO holds."""
        best = self.bound.best_latency_s(self.percentile)
        if best > self.slo_s + _EPS:
            raise InfeasibleError(
                f"SLO {self.slo_s:g} s is infeasible for pipeline {self.pipeline.name!r}: even "
                f"with unlimited batch-1 replicas on the fastest hardware its P{self.percentile:g} "
                f"latency is {best:.4g} s (the best achievable service time)",
                best,
            )
        cfg = self._initial_placement(best)
        step = 0
        while True:
            key = self._key(cfg)
            self._check_reachable(key, best)
            if self._feasible(key):
                self._report("initialize", step, key, "feasible initial configuration")
                return cfg
            m = self.bottleneck(cfg)
            c = cfg[m]
            if c.replicas >= self.options.max_replicas:
                raise InfeasibleError(
                    f"no feasible configuration for SLO {self.slo_s:g} s with at most "
                    f"{self.options.max_replicas} replicas of {m!r}",
                    best,
                )
            grow = self._room(key, m, c.hardware) > c.replicas
            b = self.next_batch(m, c.hardware, c.max_batch_size)
            if grow and b is not None and self._cores_taken(key, c.hardware):
                # every shared core has a replica: one more adds little throughput
                cfg[m] = replace(c, max_batch_size=b)
                what = f"batch {b} (the shared {c.hardware} cores are taken)"
            elif grow:
                cfg[m] = replace(c, replicas=c.replicas + 1)
                what = f"{cfg[m].replicas} replicas"
            elif b is not None:
                cfg[m] = replace(c, max_batch_size=b)  # its hardware is full: batch instead
                what = f"batch {b} ({c.hardware} is full)"
            elif (h := self._next_with_room(key, m, c.hardware)) is not None:
                cfg[m] = ModelConfig(h, 1, 1)  # and at its largest batch: slower hardware
                what = f"moved to {h} ({c.hardware} is full)"
            else:
                use = ", ".join(f"{h}: {n}" for h, n in sorted(self._usage(key).items()))
                raise InfeasibleError(
                    f"no feasible configuration for SLO {self.slo_s:g} s within the inventory "
                    f"({self._describe_inventory()}): with {use} in use, {m!r} is still the "
                    f"throughput bottleneck at its largest batch size on {c.hardware!r}, and "
                    f"no slower hardware has room",
                    best,
                )
            step += 1
            self._report("initialize", step, key, f"bottleneck {m}: {what}")

    def _check_reachable(self, key: Key, best: float) -> None:
        """With an inventory a model can land on hardware too slow for the SLO however many
        replicas it gets (without one, the fastest hardware passed this test already): say so
        now instead of adding replicas up to ``max_replicas``."""
        if not self._inventory:
            return
        lat = {
            m: min(
                self._fast.latency(m, c.hardware, b) for b in self._fast.batch_sizes(m, c.hardware)
            )
            for m, c in zip(self._models, key, strict=True)
        }
        floor = self.bound.best_latency_with_s(lat, self.percentile)
        if floor > self.slo_s + _EPS:
            where = ", ".join(
                f"{m} on {c.hardware}" for m, c in zip(self._models, key, strict=True)
            )
            raise InfeasibleError(
                f"no feasible configuration for SLO {self.slo_s:g} s within the inventory "
                f"({self._describe_inventory()}): the hardware with room ({where}) gives a "
                f"P{self.percentile:g} of {floor:.4g} s even without queueing",
                best,
            )

    def _next_with_room(self, key: Key, model: str, hw: str) -> str | None:
        """The next slower hardware after ``hw`` with room for a replica of ``model``."""
        order = self._by_speed(model)
        for h in order[order.index(hw) + 1 :]:
            if self._room(key, model, h) >= 1:
                return h
        return None

    def _regret(self, model: str) -> float:
        """Batch-1 latency ``model`` loses on its second-fastest hardware (0 with one kind)."""
        if not self._inventory:
            return 0.0  # everything fits: keep the paper's pipeline order
        lat = [self.profiles.latency(model, h, 1) for h in self._by_speed(model)[:2]]
        return lat[1] - lat[0] if len(lat) == 2 else 0.0

    def _initial_placement(self, best: float) -> Configs:
        """One replica at batch 1 per model on its fastest hardware (Algorithm 1), or with an
        inventory, on the fastest hardware that still has room. Models that lose the most
        batch-1 latency on their second-fastest hardware choose first (ties: pipeline order):
        a scarce GPU goes to the CNN, not to a preprocessing step it speeds up by 0.3 ms."""
        cfg: Configs = {}
        for m in sorted(self._models, key=lambda m: -self._regret(m)):
            hws = self._by_speed(m)
            for h in hws:
                if self._fits_configs({**cfg, m: ModelConfig(h, 1, 1)}):
                    cfg[m] = ModelConfig(h, 1, 1)
                    break
            else:
                raise InfeasibleError(
                    f"no room for a replica of {m!r} in the inventory "
                    f"({self._describe_inventory()}): it runs on {hws}",
                    best,
                )
        return {m: cfg[m] for m in self._models}

    # -- Algorithm 2 ---------------------------------------------------------------------
    def _cheapest_from(self, start: Key, best_cost: float, found: Key | None) -> Key | None:
        """Minimize the cost from ``start``: the result if it beats both ``best_cost`` (by
        more than rounding) and the round's ``found`` so far, else ``found`` (the improving
        rounds of the extensions)."""
        out = self._key(self.minimize_cost(self._configs(start)))
        cost = self._cost(out)
        if cost < best_cost - _EPS and (found is None or cost < self._cost(found)):
            return out
        return found

    def minimize_cost(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Greedy cost minimization from a feasible configuration (see the module doc)."""
        key = self._key(configs)
        if not self._feasible(key):
            raise ValidationError("configs", "a feasible starting configuration", dict(configs))
        memo: dict[tuple[str, str, str], int] = {}
        epoch = 0
        iteration = 0
        self._known_bad = None  # verdicts of an earlier search: not for this start
        try:
            while True:
                cand = self._next_action(key, memo, epoch)
                if cand is None:
                    break
                key, iteration, epoch = self._apply(key, cand, iteration, epoch)
        finally:
            self._known_bad = None  # the extensions' own searches (waits, servers) keep none
        return self._configs(key)

    def _next_action(
        self, key: Key, memo: dict[tuple[str, str, str], int], epoch: int
    ) -> _Cand | None:
        """The best action with the verdicts kept so far; when there is none, the verdicts
        are forgotten and every action is checked again (the final exact sweep)."""
        use_memo = self.options.reuse_infeasible
        if self._known_bad is None and self.options.reuse_verdicts:
            self._known_bad = {}
        cand = self._best_action(key, memo if use_memo else None, epoch)
        if cand is None and ((use_memo and memo) or self._known_bad):
            memo.clear()  # final exact sweep: re-check every action
            self._known_bad = None
            cand = self._best_action(key, memo if use_memo else None, epoch)
        return cand

    def _apply(self, key: Key, cand: _Cand, iteration: int, epoch: int) -> tuple[Key, int, int]:
        """Apply ``cand``: the new key, iteration and memo epoch."""
        assert cand.key is not None
        key = cand.key
        iteration += 1
        self._actions.append(f"{cand.kind} {cand.model}")
        if cand.kind != "remove":
            epoch += 1  # the memo only survives capacity removals
        c = self._configs(key)[cand.model]
        self._report(
            "minimize",
            iteration,
            key,
            f"{cand.kind} {cand.model} -> {c.hardware} b={c.max_batch_size} r={c.replicas}",
        )
        return key, iteration, epoch

    def _candidates(self, key: Key) -> list[_Cand]:
        cost = self._cost(key)
        cap = self.options.max_replicas
        out: list[_Cand] = []
        for i, m in enumerate(self._models):
            c = key[i]
            price = self._price(c.hardware)
            if c.replicas > 1:
                need = self.bound.min_replicas(m, c.hardware, c.max_batch_size, cap)
                if need < c.replicas:
                    bound = cost - (c.replicas - max(1, need)) * price
                    out.append(_Cand(bound, 0, i, "remove", m, None, pending=True))
                ladder = [b for b in self._batch_ladder(m, c.hardware) if b > c.max_batch_size]
                if ladder:
                    need = min(self.bound.min_replicas(m, c.hardware, b, cap) for b in ladder)
                    if need < c.replicas:
                        bound = cost - (c.replicas - need) * price
                        out.append(_Cand(bound, 1, i, "batch", m, None, pending=True))
            for h2 in self.cheaper_hardware(m, c.hardware):
                lb = self._downgrade_lower_bound(m, h2)
                bound = cost - c.replicas * price + lb * self._price(h2)
                if bound < cost - _EPS:
                    out.append(_Cand(bound, 2, i, "downgrade", m, None, pending=True, hardware=h2))
        return out

    def _best_action(
        self, key: Key, memo: dict[tuple[str, str, str], int] | None, epoch: int
    ) -> _Cand | None:
        """The feasible candidate of least (cost, tie-break), evaluated lazily by bound."""
        cost = self._cost(key)
        heap = [
            c
            for c in self._candidates(key)
            if memo is None or memo.get((c.kind, c.model, c.hardware)) != epoch
        ]
        heapq.heapify(heap)
        started: set[tuple[str, str, str]] = set()
        while heap:
            c = heapq.heappop(heap)
            if c.pending:
                self._start_ahead(key, heap, started)
                if self._running:  # a worker on this one: its results, not a second run
                    self._running = collect(
                        self, self._running, wait_for=(key, c.kind, c.model, c.hardware)
                    )
                k2 = self._resolve(key, c)
                if k2 is None:
                    if memo is not None:
                        memo[(c.kind, c.model, c.hardware)] = epoch
                    continue
                heapq.heappush(heap, replace(c, cost=self._cost(k2), key=k2, pending=False))
                continue
            assert c.key is not None
            if c.cost < cost - _EPS and self._feasible(c.key):
                return c
            if memo is not None:
                memo[(c.kind, c.model, c.hardware)] = epoch
        return None

    def _start_ahead(self, key: Key, heap: list[_Cand], started: set[tuple[str, str, str]]) -> None:
        """Workers on the pending candidates after the one being resolved, while fewer than
        ``workers - 1`` run; first the results of those done (``_parallel.py``)."""
        n = self.options.workers - 1
        if n < 1 or self.trace.size < PARALLEL_MIN_QUERIES:
            return
        self._running = collect(self, self._running)
        n -= len(self._running)
        nxt = [c for c in heapq.nsmallest(max(0, n), heap) if c.pending]
        nxt = [c for c in nxt if (c.kind, c.model, c.hardware) not in started]
        started.update((c.kind, c.model, c.hardware) for c in nxt)
        self._running += start(
            self,
            [((key, c.kind, c.model, c.hardware), lambda c=c: self._resolve(key, c)) for c in nxt],
        )

    def _resolve(self, key: Key, c: _Cand) -> Key | None:
        if c.kind == "batch":
            return self._grow_batch(key, c.model)
        if c.kind == "remove":
            return self._remove(key, c.model)
        return self._downgrade(key, c.model, c.hardware)

    def _remove(self, key: Key, model: str) -> Key | None:
        """Remove replicas while the SLO holds (None if not even one can go)."""
        c = key[self._index[model]]
        return self._local(key, model, c.hardware, [c.max_batch_size], c.replicas - 1)

    def _grow_batch(self, key: Key, model: str) -> Key | None:
        """A larger batch with the replica removals it makes feasible (None if none does)."""
        c = key[self._index[model]]
        ladder = [b for b in self._batch_ladder(model, c.hardware) if b > c.max_batch_size]
        return self._local(key, model, c.hardware, ladder, c.replicas - 1)

    def _downgrade(self, key: Key, model: str, hw: str) -> Key | None:
        """Cheaper hardware with the model's batch size and replicas re-optimized there."""
        cur = key[self._index[model]]
        prev_cost = cur.replicas * self._price(cur.hardware)
        price = self._price(hw)
        r_max = self.options.max_replicas
        if price > 0:
            r_max = min(r_max, math.floor((prev_cost - _EPS) / price))
        return self._local(key, model, hw, self._batch_ladder(model, hw), r_max)

    def _local(
        self,
        key: Key,
        model: str,
        hw: str,
        batches: list[int],
        r_max: int,
        wait_ms: float | None = None,
    ) -> Key | None:
        """Localized re-optimization of one model, the others frozen: the cheapest feasible
        (batch, replicas) on ``hw`` with a batch from ``batches`` and at most ``r_max``
        replicas (ties keep the smaller batch); None if there is none. The model keeps its
        batch-wait timeout on the same hardware (``wait_ms`` sets one; another hardware
        starts without).

        Same result as the paper's local steps (batch 1 and replicas added until feasible,
        then replicas removed while feasible, else the batch doubled) whenever one more
        replica never makes the pipeline infeasible; it takes a logarithmic number of
        simulations per batch size instead of one per replica.
        """
        r_max = min(r_max, self._room(key, model, hw))
        if r_max < 1 or not batches:
            return None
        if self._latency_floor(key, model, hw) > self.slo_s:
            return None  # too slow on ``hw`` even without any queueing
        if wait_ms is None:
            cur = key[self._index[model]]
            wait_ms = cur.batch_wait_ms if cur.hardware == hw else 0.0
        best: tuple[int, int] | None = None
        for b in batches:
            if r_max < 1:
                break
            known = self._bad_below(model, hw, b, wait_ms)
            lo = max(self.bound.min_replicas(model, hw, b, r_max), known + 1)
            if lo > r_max:
                continue

            def ok(n: int, b: int = b) -> bool:
                k = self._with(key, model, ModelConfig(hw, b, n, wait_ms))
                good = self._feasible(k)
                if not good and self._fits(k):  # too slow; units freed later change no latency
                    self._note_bad(model, hw, b, wait_ms, n)
                return good

            if known > 0 and lo < r_max:  # the last answer first: lo - 1 is known infeasible
                if ok(lo):
                    best, r_max = (b, lo), lo - 1
                    continue
                lo += 1
            if not ok(r_max):
                continue
            hi, bad, step = r_max, lo - 1, 1
            while hi - step > bad:  # gallop down from the top, then bisect
                if ok(hi - step):
                    hi -= step
                    step *= 2
                else:
                    bad = hi - step
                    break
            while hi - bad > 1:
                mid = (bad + hi) // 2
                if ok(mid):
                    hi = mid
                else:
                    bad = mid
            best = (b, hi)
            r_max = hi - 1
        if best is None:
            return None
        return self._with(key, model, ModelConfig(hw, best[0], best[1], wait_ms))

    def _latency_floor(self, key: Key, model: str, hw: str) -> float:
        """The percentile latency with no queueing at all: every model at its fastest batch
        on its (frozen) hardware, ``model`` on ``hw``. A configuration above it is hopeless."""
        hws = tuple(c.hardware for c in key)
        fkey = (model, hw, hws)
        v = self._floors.get(fkey)
        if v is None:
            fast = self._fast
            lat = {
                m: min(fast.latency(m, h, x) for x in fast.batch_sizes(m, h))
                for m, h in zip(self._models, hws, strict=True)
            }
            lat[model] = min(fast.latency(model, hw, x) for x in fast.batch_sizes(model, hw))
            v = self.bound.best_latency_with_s(lat, self.percentile)
            self._floors[fkey] = v
        return v

    # -- verdicts kept within one minimize_cost (reuse_verdicts) ----------------------------
    def _bad_below(self, model: str, hw: str, batch: int, wait_ms: float) -> int:
        """The most replicas of ``model`` at (``hw``, ``batch``, ``wait_ms``) known infeasible
        while the other models only lost slack (0: none known; module doc)."""
        if self._known_bad is None:
            return 0
        return self._known_bad.get((model, hw, batch, wait_ms), 0)

    def _note_bad(self, model: str, hw: str, batch: int, wait_ms: float, n: int) -> None:
        if self._known_bad is not None:
            k = (model, hw, batch, wait_ms)
            self._known_bad[k] = max(n, self._known_bad.get(k, 0))

    # -- helpers ---------------------------------------------------------------------------
    def _downgrade_lower_bound(self, model: str, hw: str) -> int:
        cap = self.options.max_replicas
        return min(
            self.bound.min_replicas(model, hw, b, cap) for b in self._batch_ladder(model, hw)
        )
