"""What the search walks over: a pipeline's configurations, their cost and the cached
feasibility judgement, the inventory's room, and each model's hardware and batch ladder.

:class:`SearchSpace` is the base of the search (``_search.py``, InferLine's Algorithms 1 and 2):
every feasibility judgement is the estimator's ``percentile``-th latency on the planning trace
being at most the SLO, cached by configuration, with the sound miss bound (``_bound.py``)
skipping simulations whose answer it knows, and a configuration that needs more than the
inventory never feasible. With ``PlannerOptions.admission`` every simulation has the
estimator's admission (the planning SLO) and a refused query is a miss (its latency inf), so
the judgement is SLO misses plus refusals within the percentile, and a run refusing more than
``max_refused`` of the queries is infeasible (:func:`admitted_percentile`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig
from .._profiles import Profiles
from .._trace import compress
from .._validate import as_float
from ..errors import ValidationError
from ..estimator import (
    MAX_SHARERS_PER_UNIT,
    EarlyStop,
    EstimatorAdmission,
    SimResult,
    simulate,
    spread_floor,
)
from ._bound import MissBound
from ._margin import resolve_margin
from ._nodes import bin_replicas, describe_nodes
from ._options import PlannerOptions, PlannerStats, PlanProgress, ProgressFn
from ._placement import (
    fastest_hardware,
    inventory_use,
    replica_items,
    replica_use,
    total_inventory,
    usable_hardware,
)
from ._screen import Screen, build_screen

__all__ = ["Configs", "Key", "SearchSpace", "admitted_percentile"]

# a refused query's latency in the percentile: above any SLO, finite so that numpy's
# interpolation next to it never gives inf - inf (nan) where the percentile is finite
_REFUSED_S = 1e300


def admitted_percentile(res: SimResult, percentile: float, max_refused: int | None) -> float:
    """The percentile a plan with admission is judged by: refused queries (and unfinished
    ones) count as misses; inf when more than ``max_refused`` were refused or the run
    stopped early."""
    assert res.refused_late is not None
    if res.stopped_early:
        return math.inf
    if max_refused is not None and np.count_nonzero(res.refused_late) > max_refused:
        return math.inf
    if res.latencies_s.size == 0:
        return 0.0
    lat = np.where(np.isinf(res.latencies_s), _REFUSED_S, res.latencies_s)
    v = float(np.percentile(lat, percentile))
    return math.inf if v >= 1e200 else v  # interpolated towards a refusal: above any SLO


_EPS = 1e-9

Configs = dict[str, ModelConfig]
Key = tuple[ModelConfig, ...]


class SearchSpace:
    """The planner's view of one pipeline, trace, SLO and percentile (see the module doc).

    ``latency(configs)`` and ``feasible(configs)`` expose the (cached) judgement the planner
    uses; ``stats()`` counts simulations, cache hits and pruned ones.
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
        # ``sample``: the planning trace as given (its envelope and rate are the tuner's
        # reference); ``trace``: what configurations are judged on, the sample compressed by
        # ``1 + rate_margin`` (the same array when the margin is 0).
        self.sample = np.ascontiguousarray(trace, dtype=np.float64)
        self.slo_s = as_float(slo_s, "slo_s", positive=True)
        self.percentile = as_float(percentile, "percentile", lo=0.0, hi=100.0)
        self.catalog = catalog
        self._progress = progress
        if self.sample.ndim != 1 or self.sample.size < 2:
            raise ValidationError("trace", "at least two arrival times", self.sample.size)
        # rate_margin "auto": the margin the sample's own variability asks for (_margin.py)
        self.options = resolve_margin(options or PlannerOptions(), self.sample)
        self.trace = compress(self.sample, 1.0 + self.options.rate_margin)
        self._max_refused: int | None = None
        if self.options.admission:  # the estimator refuses as the live queue (planning SLO)
            o = self.options
            adm = EstimatorAdmission(self.slo_s, o.admission_buffer_s)
            self.options = replace(o, estimator=replace(o.estimator, admission=adm))
            self.options = replace(self.options, batch_wait=False)  # not with admission
            if o.max_refused is not None:
                self._max_refused = math.floor(o.max_refused * self.trace.size + _EPS)
        self._init_screen()
        self._models = tuple(pipeline.models)
        self._index = {m: i for i, m in enumerate(self._models)}
        self._hw = {m: usable_hardware(profiles, m, catalog) for m in self._models}
        # Bounds must hold for the fastest service the estimator can give a batch: with the
        # service spread on, that is below ``latency_s``.
        self._fast = spread_floor(profiles) if self.options.estimator.service_spread else profiles
        self.bound = MissBound(
            pipeline,
            self._fast,
            self.trace,
            self.slo_s,
            self.percentile,
            self.options.estimator.seed,
            catalog,
            hop_s=self.options.estimator.hop_overhead_s,
        )
        self._cache: dict[Key, float] = {}
        self._sims = 0
        self._hits = 0
        self._pruned = 0
        self._actions: list[str] = []
        self._floors: dict[tuple[str, str, tuple[str, ...]], float] = {}
        # (model, hardware, batch, wait) -> most replicas known infeasible (``_search.py``,
        # reuse_verdicts); only while Algorithm 2 runs
        self._known_bad: dict[tuple[str, str, int, float], int] | None = None
        # with per-node inventories (``options.nodes``): their totals, and a configuration
        # fits only if its replicas also bin into the nodes (``_nodes.py``)
        self._inventory = total_inventory(self.options, catalog)
        self._node_rooms: dict[tuple[object, ...], int] = {}
        for hw in self._inventory:
            if hw not in catalog:
                raise ValidationError("inventory", f"hardware of the catalog {catalog.names()}", hw)

    def _init_screen(self) -> None:
        """Screening (``_screen.py``: judge on part of a long trace, confirm close verdicts)
        and its counters, and the workers' results."""
        o = self.options
        self._screen: Screen | None = None
        if o.screen and not o.admission and o.server is None:
            if self.trace.size >= o.screen_min_queries:
                self._screen = build_screen(self.trace, self.percentile, o.estimator.seed)
        self._exact: dict[Key, float] = {}  # whole-trace judgements (with or without screen)
        # raw results simulated ahead by worker processes (``_parallel.py``): taken instead
        # of simulating, so the search and its counters are those of one process
        self._pre_screen: dict[Key, tuple[float, float]] = {}
        self._pre_exact: dict[Key, float] = {}
        self._log: list[tuple[str, Key, object]] | None = None  # a worker's results
        # workers running ahead of the search (``_parallel.py``)
        self._running: list[tuple[object, object, object]] = []
        self.taken = 0  # simulations a worker ran ahead that the search took
        self.screened = 0  # screen simulations
        self.confirmed = 0  # whole-trace simulations asked for by a close screen verdict

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
        elif self._screen is not None:
            value = self._screened(key, configs, self._screen)
        else:
            value = self._exact_latency(key)
        self._cache[key] = value
        return value

    def _exact_latency(self, key: Key) -> float:
        """The judgement on the whole planning trace (cached apart from screen verdicts)."""
        hit = self._exact.get(key)
        if hit is not None:
            return hit
        self._sims += 1
        value = self._pre_exact.pop(key, None)
        if value is None:
            value = self._simulate_exact(key)
        else:
            self.taken += 1
        if self._log is not None:
            self._log.append(("x", key, value))
        self._exact[key] = value
        return value

    def _simulate_exact(self, key: Key) -> float:
        # a stopped run is certainly infeasible: its percentile is inf (same verdict)
        stop = None
        if self.options.early_stop:
            stop = EarlyStop(self.slo_s, self.percentile, max_refused=self._max_refused)
        res = simulate(
            self.pipeline,
            self._configs(key),
            self.profiles,
            self.trace,
            options=self.options.estimator,
            catalog=self.catalog,
            stop=stop,
        )
        if self.options.admission:
            return admitted_percentile(res, self.percentile, self._max_refused)
        return res.percentile(self.percentile)

    def _screened(self, key: Key, configs: Configs, screen: Screen) -> float:
        """The screen's weighted percentile, or the whole trace's when the screen's estimated
        miss share is close to the allowance (``_screen.py``)."""
        self._sims += 1
        self.screened += 1
        pre = self._pre_screen.pop(key, None)
        if pre is None:
            res = simulate(
                self.pipeline,
                configs,
                self.profiles,
                screen.trace,
                options=self.options.estimator,
                catalog=self.catalog,
            )
            pre = (screen.miss_share(res.latencies_s, self.slo_s), screen.value(res.latencies_s))
        else:
            self.taken += 1
        if self._log is not None:
            self._log.append(("s", key, pre))
        share, v = pre
        if screen.close(share, self.options.screen_margin):
            self.confirmed += 1
            return self._exact_latency(key)
        # the share decides; the value only orders candidates (widen), on the same side
        if share > screen.allowance:
            return max(v, math.nextafter(self.slo_s, math.inf))
        return min(v, self.slo_s)

    def confirm(self, key: Key) -> bool:
        """Whether ``key`` is feasible on the whole trace; if not, screening is turned off
        and the judgements made with it are forgotten (the caller searches again exactly)."""
        if self._screen is None or self._exact_latency(key) <= self.slo_s:
            return True
        self._screen = None
        self._cache = dict(self._exact)
        return False

    def feasible(self, configs: Mapping[str, ModelConfig]) -> bool:
        return self._feasible(self._key(configs))

    def _feasible(self, key: Key) -> bool:
        return self._fits(key) and self._latency(key) <= self.slo_s

    # -- the inventory ---------------------------------------------------------------------
    def _per_replica(self, model: str, hw: str) -> dict[str, int]:
        """Units of each kind one replica of ``model`` on ``hw`` takes."""
        o = self.options
        return replica_use(model, hw, self.catalog, o.replica_units, o.gpu_host_units)

    def _usage(self, key: Key, skip: str | None = None) -> dict[str, int]:
        cfg = {m: c for m, c in zip(self._models, key, strict=True) if m != skip}
        return inventory_use(
            cfg, self.catalog, self.options.replica_units, self.options.gpu_host_units
        )

    def _fits(self, key: Key) -> bool:
        return self._fits_configs(self._configs(key))

    def _fits_configs(self, configs: Mapping[str, ModelConfig]) -> bool:
        """Whether ``configs`` (all models or some) fit the inventory: the units of each kind,
        and with per-node inventories a binning of the replicas into the nodes."""
        if not self._inventory:
            return True
        o = self.options
        use = inventory_use(configs, self.catalog, o.replica_units, o.gpu_host_units)
        if any(use.get(h, 0) > n for h, n in self._inventory.items()):
            return False
        if not o.nodes:
            return True
        items = replica_items(configs, self.catalog, o.replica_units, o.gpu_host_units)
        return not isinstance(bin_replicas(items, o.nodes), str)

    def _node_room(self, key: Key, model: str, hw: str, room: int) -> int:
        """The most replicas of ``model`` on ``hw``, at most ``room``, that bin into the nodes
        with the other models as in ``key``."""
        others = {m: c for m, c in zip(self._models, key, strict=True) if m != model}
        ck = (tuple(others.values()), model, hw, room)
        hit = self._node_rooms.get(ck)
        if hit is not None:
            return hit

        def fits(n: int) -> bool:
            return self._fits_configs({**others, model: ModelConfig(hw, 1, n)})

        # bisect between a count that bins (lo) and one that does not (hi): O(log room)
        # binnings, and the answer always bins (first-fit decreasing is not monotone in
        # general, so this is the largest count found, not necessarily the largest there is)
        lo, hi = 0, room + 1
        if fits(room):
            lo = room
        else:
            hi = room
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        self._node_rooms[ck] = lo
        return lo

    def _room(self, key: Key, model: str, hw: str) -> int:
        """The most replicas ``model`` can have on ``hw`` with the other models as in ``key``."""
        used = self._usage(key, skip=model)
        room = self.options.max_replicas
        for h, per in self._per_replica(model, hw).items():
            if h in self._inventory and per > 0:
                room = min(room, max(0, self._inventory[h] - used.get(h, 0)) // per)
        if self.options.nodes and self._inventory and room > 0:
            room = self._node_room(key, model, hw, room)
        est = self.options.estimator
        units = est.pinned_cores.get(hw) or est.shared_units.get(hw)
        if units:
            # the estimate shares these cores: past a point more replicas add no throughput,
            # and the bundled runtime refuses them (so the search stops growing a model here)
            others = sum(
                c.replicas
                for m, c in zip(self._models, key, strict=True)
                if m != model and c.hardware == hw
            )
            room = min(room, max(0, int(MAX_SHARERS_PER_UNIT * units) - others))
        return room

    def _cores_taken(self, key: Key, hw: str) -> bool:
        """Whether ``hw``'s shared or pinned cores (``EstimatorOptions``) each have a replica."""
        est = self.options.estimator
        units = est.pinned_cores.get(hw) or est.shared_units.get(hw)
        return bool(units) and sum(c.replicas for c in key if c.hardware == hw) >= units

    def _describe_inventory(self) -> str:
        if self.options.nodes:
            units = self.options.replica_units
            return describe_nodes(self.options.nodes) + (
                f"; a replica cannot span nodes; cpu units per replica {dict(units)!r}"
                if units
                else "; a replica cannot span nodes"
            )
        parts = [f"{h}: {n}" for h, n in sorted(self._inventory.items())]
        est = self.options.estimator
        for h, n in sorted({**est.shared_units, **est.pinned_cores}.items()):
            k = int(MAX_SHARERS_PER_UNIT * n)
            parts.append(f"{h}: {n:g} shared cores, {k} replicas on them at most")
        return ", ".join(parts)

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

    def bottleneck(self, configs: Mapping[str, ModelConfig]) -> str:
        """The model with the least throughput for the traffic it sees (Algorithm 1's
        ``FindMinThru``): ``replicas * throughput(batch) / calls`` (``Pipeline.calls``); ties:
        pipeline order."""
        return min(
            self._models,
            key=lambda m: (
                configs[m].replicas * self._throughput(m, configs[m]) / self.pipeline.calls(m),
                self._index[m],
            ),
        )

    def _by_speed(self, model: str) -> list[str]:
        """The model's hardware, fastest batch-1 latency first (ties: cheaper, listed first)."""
        hws = self._hw[model]
        return sorted(
            hws,
            key=lambda h: (self.profiles.latency(model, h, 1), self._price(h), hws.index(h)),
        )

    def _batch_ladder(self, model: str, hw: str) -> list[int]:
        out = [1]
        while (nb := self.next_batch(model, hw, out[-1])) is not None:
            out.append(nb)
        return out

    def _with(self, key: Key, model: str, c: ModelConfig) -> Key:
        i = self._index[model]
        return (*key[:i], c, *key[i + 1 :])
