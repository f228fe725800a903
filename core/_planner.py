"""InferLine's cost-minimizing planner (InferLine §4.3, Algorithms 1 and 2; thesis ch. 4).

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

Escape (an extension, ``PlannerOptions(escape=False)`` turns it off)
    Algorithm 2 stops in local optima where moving one model to cheaper hardware (or a larger
    batch) would need replicas elsewhere. :meth:`Planner.escape` restarts Algorithm 2 from
    perturbed configurations (one model moved, the pipeline repaired with Algorithm 1's
    bottleneck loop) and keeps a result only if it is cheaper, so the answer is still a fixed
    point of Algorithm 2 with both guarantees.

Widen (an extension, ``PlannerOptions(widen=False)`` turns it off)
    Equal-cost configurations differ in slack: the greedy keeps the first batch size that
    reached a replica count, which can leave a model just below saturation (a fragile plan on
    a fresh trace). :meth:`Planner.widen` moves each model to the batch size with the lowest
    tail latency at the same hardware and replicas, then Algorithm 2 runs again in case the
    slack lets a replica go; the result is still a fixed point of Algorithm 2.

Speed (none of this changes a decision):

* every estimator result is cached by configuration;
* :class:`MissBound` (``_planbound.py``) proves some configurations infeasible without a
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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._envelope import envelope_windows
from ._estimator import EstimatorOptions, simulate
from ._hardware import DEFAULT_CATALOG, HardwareCatalog
from ._pipeline import Pipeline
from ._plan import ModelConfig, Plan, TunerInputs, TunerModel
from ._planbound import MissBound
from ._profiles import Profiles
from ._trace import max_arrivals_in_window, mean_rate
from ._validate import as_float, as_int, as_mapping, no_extra_keys
from .errors import InfeasibleError, NotFoundError, ValidationError

__all__ = [
    "PlanProgress",
    "Planner",
    "PlannerOptions",
    "PlannerStats",
    "fastest_hardware",
    "plan_inferline",
    "tuner_inputs",
    "usable_hardware",
]

_EPS = 1e-9
_ESCAPE_FLOOR_QUERIES = 2_000_000

Configs = dict[str, ModelConfig]
Key = tuple[ModelConfig, ...]


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of the search; the defaults reproduce the paper's algorithm.

    ``estimator``: passed to every simulation (seed of the conditional visits, hop overhead...).
    ``prune``: skip simulations that :class:`MissBound` proves infeasible.
    ``reuse_infeasible``: see the module doc.
    ``max_replicas``: per model; reaching it while initializing raises InfeasibleError.
    ``escape``: after Algorithm 2 converges, try to leave its local optimum (see
    :meth:`Planner.escape`); ``False`` gives the paper's algorithm exactly.
    ``escape_cost_factor``: an escape start may cost at most this times the current plan.
    ``escape_rounds``, ``escape_budget``: escaping stops after this many improving rounds, or
    once it has run ``escape_budget`` times as many simulations as Algorithms 1-2 did (plus
    two million simulated queries, so small problems are always searched well).
    ``widen``: finally move each model to the batch size with the most latency slack at the
    same cost (:meth:`Planner.widen`).
    """

    estimator: EstimatorOptions = field(default_factory=EstimatorOptions)
    prune: bool = True
    reuse_infeasible: bool = True
    max_replicas: int = 1024
    escape: bool = True
    escape_cost_factor: float = 3.0
    escape_rounds: int = 3
    escape_budget: float = 1.0
    widen: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.estimator, EstimatorOptions):
            raise ValidationError("estimator", "EstimatorOptions", self.estimator)
        as_int(self.max_replicas, "max_replicas", minimum=1)
        as_float(self.escape_cost_factor, "escape_cost_factor", lo=1.0)
        as_int(self.escape_rounds, "escape_rounds", minimum=0)
        as_float(self.escape_budget, "escape_budget", nonneg=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_dict(),
            "prune": self.prune,
            "reuse_infeasible": self.reuse_infeasible,
            "max_replicas": self.max_replicas,
            "escape": self.escape,
            "escape_cost_factor": self.escape_cost_factor,
            "escape_rounds": self.escape_rounds,
            "escape_budget": self.escape_budget,
            "widen": self.widen,
        }

    @classmethod
    def from_dict(cls, d: Any) -> PlannerOptions:
        m = as_mapping(d, "planner options")
        keys = {"estimator", "prune", "reuse_infeasible", "max_replicas", "escape", "widen"}
        no_extra_keys(m, keys | {"escape_cost_factor", "escape_rounds", "escape_budget"}, "")
        for k in ("prune", "reuse_infeasible", "escape", "widen"):
            if k in m and not isinstance(m[k], bool):
                raise ValidationError(k, "true or false", m[k])
        return cls(
            estimator=EstimatorOptions.from_dict(m.get("estimator", {})),
            prune=m.get("prune", True),
            reuse_infeasible=m.get("reuse_infeasible", True),
            max_replicas=as_int(m.get("max_replicas", 1024), "max_replicas", minimum=1),
            escape=m.get("escape", True),
            escape_cost_factor=as_float(
                m.get("escape_cost_factor", 3.0), "escape_cost_factor", lo=1.0
            ),
            escape_rounds=as_int(m.get("escape_rounds", 3), "escape_rounds", minimum=0),
            escape_budget=as_float(m.get("escape_budget", 1.0), "escape_budget", nonneg=True),
            widen=m.get("widen", True),
        )


@dataclass(frozen=True)
class PlanProgress:
    """One progress report: the phase, how far it is, and the current cost."""

    phase: str  # "initialize" | "minimize" | "done"
    iteration: int
    simulations: int
    cost_per_hour: float
    message: str


@dataclass(frozen=True)
class PlannerStats:
    simulations: int  # estimator runs
    cache_hits: int  # configurations answered from the cache
    pruned: int  # configurations the sound bound rejected without a simulation
    iterations: int  # cost-minimization iterations that applied an action
    actions: tuple[str, ...]  # the applied actions, in order ("remove yolo", ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "simulations": self.simulations,
            "cache_hits": self.cache_hits,
            "pruned": self.pruned,
            "iterations": self.iterations,
            "actions": list(self.actions),
        }


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


ProgressFn = Callable[[PlanProgress], None]


class Planner:
    """InferLine's two-phase planner for one pipeline, trace, SLO and percentile.

    ``initialize()`` and ``minimize_cost()`` are the paper's two algorithms; ``plan()`` runs
    both and returns a :class:`Plan` with the tuner's inputs. ``latency(configs)`` and
    ``feasible(configs)`` expose the (cached) judgement the planner uses.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        profiles: Profiles,
        trace: np.ndarray,
        slo_s: float,
        *,
        percentile: float = 99.0,
        catalog: HardwareCatalog = DEFAULT_CATALOG,
        options: PlannerOptions | None = None,
        progress: ProgressFn | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.profiles = profiles
        self.trace = np.ascontiguousarray(trace, dtype=np.float64)
        self.slo_s = as_float(slo_s, "slo_s", positive=True)
        self.percentile = as_float(percentile, "percentile", lo=0.0, hi=100.0)
        self.catalog = catalog
        self.options = options if options is not None else PlannerOptions()
        self._progress = progress
        if self.trace.ndim != 1 or self.trace.size < 2:
            raise ValidationError("trace", "at least two arrival times", self.trace.size)
        self._models = tuple(pipeline.models)
        self._index = {m: i for i, m in enumerate(self._models)}
        self._hw = {m: usable_hardware(profiles, m, catalog) for m in self._models}
        self.bound = MissBound(
            pipeline,
            profiles,
            self.trace,
            self.slo_s,
            self.percentile,
            self.options.estimator.seed,
            catalog,
        )
        self._cache: dict[Key, float] = {}
        self._sims = 0
        self._hits = 0
        self._pruned = 0
        self._actions: list[str] = []
        self._floors: dict[tuple[str, str, tuple[str, ...]], float] = {}

    # -- the estimator, cached -----------------------------------------------------------
    def _key(self, configs: Mapping[str, ModelConfig]) -> Key:
        return tuple(configs[m] for m in self._models)

    def _configs(self, key: Key) -> Configs:
        return dict(zip(self._models, key, strict=True))

    def latency(self, configs: Mapping[str, ModelConfig]) -> float:
        """The estimator's ``percentile``-th latency on the planning trace (``inf`` when the
        bound proves it above the SLO without simulating)."""
        return self._latency(self._key(configs))

    def _latency(self, key: Key) -> float:
        hit = self._cache.get(key)
        if hit is not None:
            self._hits += 1
            return hit
        configs = self._configs(key)
        if self.options.prune and self.bound.infeasible(configs):
            self._pruned += 1
            value = math.inf
        else:
            self._sims += 1
            res = simulate(
                self.pipeline,
                configs,
                self.profiles,
                self.trace,
                options=self.options.estimator,
                catalog=self.catalog,
            )
            value = res.percentile(self.percentile)
        self._cache[key] = value
        return value

    def feasible(self, configs: Mapping[str, ModelConfig]) -> bool:
        return self._feasible(self._key(configs))

    def _feasible(self, key: Key) -> bool:
        return self._latency(key) <= self.slo_s

    def cost(self, configs: Mapping[str, ModelConfig]) -> float:
        return self._cost(self._key(configs))

    def _cost(self, key: Key) -> float:
        return float(sum(c.replicas * self.catalog.cost(c.hardware) for c in key))

    def stats(self) -> PlannerStats:
        return PlannerStats(
            self._sims, self._hits, self._pruned, len(self._actions), tuple(self._actions)
        )

    def _report(self, phase: str, iteration: int, key: Key | None, message: str) -> None:
        if self._progress is not None:
            cost = self._cost(key) if key is not None else 0.0
            self._progress(PlanProgress(phase, iteration, self._sims, cost, message))

    # -- profile helpers -----------------------------------------------------------------
    def _price(self, hw: str) -> float:
        return self.catalog.cost(hw)

    def fastest_hardware(self, model: str) -> str:
        return fastest_hardware(self.profiles, model, self.catalog)

    def cheaper_hardware(self, model: str, hw: str) -> list[str]:
        """Profiled hardware strictly cheaper than ``hw``, the next cheapest first (ties: lower
        batch-1 latency first)."""
        price = self._price(hw)
        cheaper = [h for h in self._hw[model] if self._price(h) < price - _EPS]
        return sorted(cheaper, key=lambda h: (-self._price(h), self.profiles.latency(model, h, 1)))

    def next_batch(self, model: str, hw: str, batch: int) -> int | None:
        """The next size on the doubling ladder with a higher single-replica throughput."""
        top = self.profiles.max_batch(model, hw)
        base = self.profiles.throughput(model, hw, batch)
        b = batch
        while b < top:
            b = min(2 * b, top)
            if self.profiles.throughput(model, hw, b) > base * (1 + 1e-9):
                return b
        return None

    def _throughput(self, model: str, c: ModelConfig) -> float:
        return self.profiles.throughput(model, c.hardware, c.max_batch_size)

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
        cfg: Configs = {m: ModelConfig(self.fastest_hardware(m), 1, 1) for m in self._models}
        step = 0
        while True:
            key = self._key(cfg)
            if self._feasible(key):
                self._report("initialize", step, key, "feasible initial configuration")
                return cfg
            m = min(
                self._models,
                key=lambda x: (
                    cfg[x].replicas * self._throughput(x, cfg[x]) / self.pipeline.scale_factor(x),
                    self._index[x],
                ),
            )
            if cfg[m].replicas >= self.options.max_replicas:
                raise InfeasibleError(
                    f"no feasible configuration for SLO {self.slo_s:g} s with at most "
                    f"{self.options.max_replicas} replicas of {m!r}",
                    best,
                )
            cfg[m] = replace(cfg[m], replicas=cfg[m].replicas + 1)
            step += 1
            self._report("initialize", step, key, f"bottleneck {m}: {cfg[m].replicas} replicas")

    # -- Algorithm 2 ---------------------------------------------------------------------
    def minimize_cost(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Greedy cost minimization from a feasible configuration (see the module doc)."""
        key = self._key(configs)
        if not self._feasible(key):
            raise ValidationError("configs", "a feasible starting configuration", dict(configs))
        memo: dict[tuple[str, str, str], int] = {}
        epoch = 0
        iteration = 0
        while True:
            use_memo = self.options.reuse_infeasible
            cand = self._best_action(key, memo if use_memo else None, epoch)
            if cand is None and use_memo and memo:
                memo.clear()  # final exact sweep: re-check every action
                cand = self._best_action(key, memo, epoch)
            if cand is None:
                break
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
        return self._configs(key)

    def candidates(self, configs: Mapping[str, ModelConfig]) -> list[tuple[str, str, Configs]]:
        """Every single action from ``configs`` as (kind, model, new configs), downgrades
        already locally re-optimized (None-valued downgrades are left out). For tests."""
        key = self._key(configs)
        out = []
        for c in self._candidates(key):
            if c.pending:
                k2 = self._resolve(key, c)
                if k2 is None:
                    continue
                out.append((c.kind, c.model, self._configs(k2)))
            elif c.key is not None:
                out.append((c.kind, c.model, self._configs(c.key)))
        return out

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
        while heap:
            c = heapq.heappop(heap)
            if c.pending:
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

    def _local(self, key: Key, model: str, hw: str, batches: list[int], r_max: int) -> Key | None:
        """Localized re-optimization of one model, the others frozen: the cheapest feasible
        (batch, replicas) on ``hw`` with a batch from ``batches`` and at most ``r_max``
        replicas (ties keep the smaller batch); None if there is none.

        Same result as the paper's local steps (batch 1 and replicas added until feasible,
        then replicas removed while feasible, else the batch doubled) whenever one more
        replica never makes the pipeline infeasible; it takes a logarithmic number of
        simulations per batch size instead of one per replica.
        """
        if r_max < 1 or not batches:
            return None
        if self._latency_floor(key, model, hw) > self.slo_s:
            return None  # too slow on ``hw`` even without any queueing
        best: tuple[int, int] | None = None
        for b in batches:
            if r_max < 1:
                break
            lo = self.bound.min_replicas(model, hw, b, r_max)
            if lo > r_max:
                continue

            def ok(n: int, b: int = b) -> bool:
                return self._feasible(self._with(key, model, ModelConfig(hw, b, n)))

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
        return self._with(key, model, ModelConfig(hw, best[0], best[1]))

    def _latency_floor(self, key: Key, model: str, hw: str) -> float:
        """The percentile latency with no queueing at all: every model at its fastest batch
        on its (frozen) hardware, ``model`` on ``hw``. A configuration above it is hopeless."""
        hws = tuple(c.hardware for c in key)
        fkey = (model, hw, hws)
        v = self._floors.get(fkey)
        if v is None:
            lat = {
                m: min(self.profiles.latency(m, h, x) for x in self.profiles.batch_sizes(m, h))
                for m, h in zip(self._models, hws, strict=True)
            }
            lat[model] = min(
                self.profiles.latency(model, hw, x) for x in self.profiles.batch_sizes(model, hw)
            )
            v = self.bound.best_latency_with_s(lat, self.percentile)
            self._floors[fkey] = v
        return v

    # -- helpers ---------------------------------------------------------------------------
    def _batch_ladder(self, model: str, hw: str) -> list[int]:
        out = [1]
        while (nb := self.next_batch(model, hw, out[-1])) is not None:
            out.append(nb)
        return out

    def _downgrade_lower_bound(self, model: str, hw: str) -> int:
        cap = self.options.max_replicas
        return min(
            self.bound.min_replicas(model, hw, b, cap) for b in self._batch_ladder(model, hw)
        )

    def _with(self, key: Key, model: str, c: ModelConfig) -> Key:
        i = self._index[model]
        return (*key[:i], c, *key[i + 1 :])

    # -- leaving a local optimum (an extension; off with escape=False) --------------------
    def escape(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Iterated local search around Algorithm 2's result.

        Algorithm 2 freezes the other models when it evaluates a downgrade, so it stops where
        moving one model to cheaper hardware would need more replicas elsewhere. Each escape
        start moves one model to a cheaper hardware at batch size 1 and repairs the pipeline
        with Algorithm 1's loop (a replica to the throughput bottleneck until the SLO holds,
        given up past ``escape_cost_factor`` times the current cost), then runs Algorithm 2
        from there. The cheapest result that beats the current plan is adopted and the round
        repeats; the answer is still a fixed point of Algorithm 2, so the guarantees hold.
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
                    lat = {m: self.profiles.latency(m, hw, b)}
                    if self.bound.best_latency_with_s(lat, self.percentile) > self.slo_s:
                        continue  # hopeless on this hardware whatever the replica counts
                    r0 = self.bound.min_replicas(m, hw, b, self.options.max_replicas)
                    start = self._with(best, m, ModelConfig(hw, b, r0))
                    cap = self.options.escape_cost_factor * best_cost
                    start2 = self._repair(start, cap)
                    if start2 is None:
                        continue
                    self._report("escape", rounds, start2, f"escape via {m} on {hw} b={b}")
                    out = self._key(self.minimize_cost(self._configs(start2)))
                    cost = self._cost(out)
                    if cost < best_cost - _EPS and (found is None or cost < self._cost(found)):
                        found = out
            if found is None:
                break
            best, best_cost = found, self._cost(found)
            self._actions.append("escape")
        return self._configs(best)

    def _repair(self, key: Key, cost_cap: float) -> Key | None:
        """Algorithm 1's loop from ``key``: a replica to the bottleneck until feasible."""
        while not self._feasible(key):
            cfg = self._configs(key)
            m = min(
                self._models,
                key=lambda x: (
                    cfg[x].replicas * self._throughput(x, cfg[x]) / self.pipeline.scale_factor(x),
                    self._index[x],
                ),
            )
            c = cfg[m]
            if c.replicas >= self.options.max_replicas:
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
        key = self._key(final)
        self._report("done", len(self._actions), key, "plan ready")
        return Plan(
            pipeline=self.pipeline.name,
            slo_s=self.slo_s,
            models=final,
            percentile=self.percentile,
            cost_per_hour=self._cost(key),
            estimated_latency_s=self._latency(key),
            strategy="inferline",
            tuner=tuner_inputs(self.pipeline, self.profiles, final, self.trace),
        )


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


def usable_hardware(profiles: Profiles, model: str, catalog: HardwareCatalog) -> list[str]:
    """The hardware ``model`` is profiled on that the catalog prices (profile order)."""
    if model not in profiles.models:
        raise NotFoundError("profiled model", model, sorted(profiles.models))
    hws = [h for h in profiles.hardware_for(model) if h in catalog]
    if not hws:
        raise ValidationError(
            f"profiles.{model}",
            f"a profile on hardware from the catalog {catalog.names()!r}",
            profiles.hardware_for(model),
        )
    return hws


def fastest_hardware(profiles: Profiles, model: str, catalog: HardwareCatalog) -> str:
    """Lowest batch-1 latency; ties go to the cheaper, then the earlier-listed hardware."""
    hws = usable_hardware(profiles, model, catalog)
    return min(hws, key=lambda h: (profiles.latency(model, h, 1), catalog.cost(h), hws.index(h)))


# -- the tuner's inputs (InferLine §5 "Initialization") -------------------------------------
def tuner_inputs(
    pipeline: Pipeline,
    profiles: Profiles,
    configs: Mapping[str, ModelConfig],
    trace: np.ndarray,
) -> TunerInputs:
    """Traffic envelope of the planning trace and per-model figures for the tuner.

    Service time: the critical path of the planned batch latencies. Envelope: max arrivals in
    windows from the service time doubling up to 60 s. Per model: scale factor, single-replica
    throughput at the planned batch size and hardware (``Profiles.throughput``), and the
    max-provisioning ratio ``rho = mean_rate * s / (replicas * throughput)``.
    """
    lat = {
        m: profiles.latency(m, configs[m].hardware, configs[m].max_batch_size)
        for m in pipeline.models
    }
    service, _ = pipeline.critical_path(lat)
    rate = mean_rate(trace)
    envelope = tuple((w, max_arrivals_in_window(trace, w)) for w in envelope_windows(service))
    models = {}
    for m in pipeline.models:
        c = configs[m]
        mu = profiles.throughput(m, c.hardware, c.max_batch_size)
        s = pipeline.scale_factor(m)
        rho = rate * s / (max(1, c.replicas) * mu)
        models[m] = TunerModel(scale_factor=s, throughput_qps=mu, max_provisioning_ratio=rho)
    return TunerInputs(service_time_s=service, envelope=envelope, mean_rate_qps=rate, models=models)
