"""Planning the serving system's own batchers (``PlannerOptions.server``): Triton's dynamic
batcher and TF Serving's batch scheduler, judged by the estimator's exact rules for them
(``EstimatorOptions.server_batchers``, ``core/estimator/_batchers.py``).

The knobs and how they are searched, per model:

* instances (replicas), hardware and ``max_batch_size``: InferLine's search as it is
  (Algorithms 1-2, escape, widen), every configuration judged with the server's batcher;
* Triton ``preferred_batch_size`` (unset, or one size of the batch ladder below the max) and
  ``max_queue_delay_microseconds`` (0 or a fraction of the SLO, the ladder of ``_waits.py``),
  TF Serving ``batch_timeout_micros`` (the same ladder): :meth:`ServerSearch.add_knobs`, a
  pass like the batch waits' (a start per knob setting, Algorithm 2 from each, the cheapest
  result adopted), after which a knob the plan stays feasible without is dropped;
* derived, not searched: with ``refuse_late`` Triton's ``default_timeout_microseconds`` is the
  SLO minus the fastest path of batches through the pipeline that passes the model (a request
  that has waited that long in its queue cannot make the SLO, so only such requests are
  rejected, and as early as that is certain), and TF Serving's ``max_enqueued_batches`` is the
  queue past which a request cannot make it either; TF Serving's ``num_batch_threads`` is the
  instance count (fewer threads leave instances idle that could be removed at lower cost,
  more run nothing); ``allowed_batch_sizes`` are the profiled sizes up to the max (a batch is
  padded to a size whose latency is known; a coarser ladder pads more and never costs less
  with latencies rising in the batch size), and TF Serving's batch ladder only takes
  profiled sizes.

Configurations carry the searched knobs as :class:`ServerConfig` (a :class:`ModelConfig`
with ``preferred`` and ``delay_us``), so every cache and move of the search sees them; a
plain ``ModelConfig`` the search builds (a replica count, a batch size) keeps the model's
knobs on the same hardware, as a batch wait does. Without ``server`` nothing here runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._plan import ModelConfig, Plan
from ..errors import ValidationError
from ..estimator import (
    EarlyStop,
    EstimatorOptions,
    ServerBatcher,
    SimResult,
    TFServingBatcher,
    TritonBatcher,
    batcher_from_dict,
    simulate,
)
from ._space import _EPS, Configs, Key
from ._waits import WAIT_FRACTIONS, WaitSearch

__all__ = ["ServerConfig", "ServerSearch", "plan_estimator_options", "plan_server_batchers"]

_ROUNDS = 3
_FLOOR_QUERIES = 2_000_000
_TF_UNBOUNDED = 1_000_000  # max_enqueued_batches without refuse_late: a queue never full


@dataclass(frozen=True)
class ServerConfig(ModelConfig):
    """A model's configuration with its server batcher's searched knobs: ``preferred``
    (Triton's preferred batch size; 0, or one at least the max: unset) and ``delay_us``
    (Triton's ``max_queue_delay_microseconds``, TF Serving's ``batch_timeout_micros``)."""

    preferred: int = 0
    delay_us: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preferred >= self.max_batch_size:  # the max itself is Triton's unset
            object.__setattr__(self, "preferred", 0)

    def knobs(self) -> tuple[int, int]:
        return (self.preferred, self.delay_us)

    def plain(self) -> ModelConfig:
        return ModelConfig(self.hardware, self.max_batch_size, self.replicas)


class ServerSearch(WaitSearch):
    """The search over server batchers (see the module doc): configurations judged with
    their batchers, and :meth:`add_knobs`. With ``PlannerOptions.server`` None every
    override falls through to the plain search."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self._server = {m: k for m in self._models if (k := o.server_of(m)) is not None}
        if isinstance(o.server, Mapping):
            for m in o.server:
                if m not in self._index:
                    raise ValidationError("server", f"model names from {list(self._models)!r}", m)
        for m in self._server:
            for name in ("server_batchers", "batch_wait_s"):
                if m in getattr(o.estimator, name):
                    raise ValidationError(
                        f"estimator.{name}.{m}", f"none for a model planned for {o.server_of(m)}", m
                    )
        if self._server and not o.drops_are_misses:
            # The bound counts drops as misses. With them not counted, a feasible plan misses
            # at most 100 - percentile percent of the served and drops as many again: twice
            # the misses (plus rounding) keeps the bound sound.
            self.bound.threshold = 2 * self.bound.threshold + 2

    # -- configurations carry their knobs --------------------------------------------------
    def _lift(self, model: str, c: ModelConfig, like: ModelConfig | None) -> ModelConfig:
        if model not in self._server or isinstance(c, ServerConfig):
            return c
        if isinstance(like, ServerConfig) and like.hardware == c.hardware:
            return ServerConfig(
                c.hardware, c.max_batch_size, c.replicas, 0.0, like.preferred, like.delay_us
            )
        return ServerConfig(c.hardware, c.max_batch_size, c.replicas)

    def _key(self, configs: Mapping[str, ModelConfig]) -> Key:
        key = super()._key(configs)
        if not self._server:
            return key
        return tuple(self._lift(m, c, None) for m, c in zip(self._models, key, strict=True))

    def _with(self, key: Key, model: str, c: ModelConfig) -> Key:
        if self._server:
            c = self._lift(model, c, key[self._index[model]])
        return super()._with(key, model, c)

    def next_batch(self, model: str, hw: str, batch: int) -> int | None:
        """TF Serving pads to allowed sizes, which must be profiled: its ladder's step is
        rounded up to the next profiled size that still raises the throughput."""
        b = super().next_batch(model, hw, batch)
        if b is None or self._server.get(model) != "tfserving":
            return b
        base = self.profiles.throughput(model, hw, batch)
        for s in self.profiles.batch_sizes(model, hw):
            if s >= b and self.profiles.throughput(model, hw, s) > base * (1 + 1e-9):
                return s
        return None

    def _no_waits(self) -> set[str]:
        return set(self._server)  # the server batches these: no wait of inferline's

    # -- the batchers and the judgement ------------------------------------------------------
    def batchers(self, key: Key) -> dict[str, ServerBatcher]:
        """The server batcher of each planned model in ``key``."""
        out: dict[str, ServerBatcher] = {}
        floors = self._path_floors(key)
        for m, c in zip(self._models, key, strict=True):
            kind = self._server.get(m)
            if kind is None:
                continue
            assert isinstance(c, ServerConfig)
            out[m] = self._triton(c, floors[m]) if kind == "triton" else self._tfserving(m, c)
        return out

    def _path_floors(self, key: Key) -> dict[str, float]:
        """Per model, the fastest a query can go through the longest path of fastest batches
        that passes through it: a query that has waited in the model's queue longer than the
        SLO minus this cannot make the SLO (it arrived after its upstream path, and its
        downstream path is still ahead), so Triton may refuse it there and then."""
        fast = {m: self._fastest(m, c) for m, c in zip(self._models, key, strict=True)}
        pl = self.pipeline
        up: dict[str, float] = {}
        for m in pl.topological_order:
            up[m] = fast.get(m, 0.0) + max((up[p] for p in pl.parents[m]), default=0.0)
        down: dict[str, float] = {}
        for m in reversed(pl.topological_order):
            down[m] = fast.get(m, 0.0) + max((down[c] for c in pl.children[m]), default=0.0)
        return {m: up[m] + down[m] - fast.get(m, 0.0) for m in pl.topological_order}

    def _triton(self, c: ServerConfig, floor_s: float) -> TritonBatcher:
        tmo = 0
        if self.options.refuse_late:
            tmo = max(1, math.ceil((self.slo_s - floor_s) * 1e6 - 1e-6))
        return TritonBatcher(
            max_batch_size=c.max_batch_size,
            preferred_batch_size=(c.preferred,) if c.preferred else (),
            max_queue_delay_microseconds=c.delay_us,
            default_timeout_microseconds=tmo,
        )

    def _tfserving(self, m: str, c: ServerConfig) -> TFServingBatcher:
        threads = max(1, c.replicas)
        enq = _TF_UNBOUNDED
        if self.options.refuse_late:
            # a request refused has ``enq`` full batches ahead on ``threads`` threads: it
            # waits at least enq // threads of them, so at least the SLO
            full = self._fast.latency(m, c.hardware, c.max_batch_size)
            enq = threads * max(1, math.ceil(self.slo_s / full - 1e-9))
        sizes = [b for b in self.profiles.batch_sizes(m, c.hardware) if b <= c.max_batch_size]
        covered = sizes == list(range(1, c.max_batch_size + 1))
        allowed = () if covered or c.max_batch_size not in sizes else tuple(sizes)
        return TFServingBatcher(
            max_batch_size=c.max_batch_size,
            batch_timeout_micros=c.delay_us,
            num_batch_threads=threads,
            max_enqueued_batches=enq,
            allowed_batch_sizes=allowed,
        )

    def _fastest(self, m: str, c: ModelConfig) -> float:
        fast = self._fast
        return min(fast.latency(m, c.hardware, b) for b in fast.batch_sizes(m, c.hardware))

    def _estimator_for(self, key: Key) -> EstimatorOptions:
        est = self.options.estimator
        if not self._server:
            return est
        return replace(est, server_batchers={**est.server_batchers, **self.batchers(key)})

    def _simulate(self, key: Key, trace: np.ndarray, stop: EarlyStop | None = None) -> SimResult:
        cfg = {
            m: (c.plain() if isinstance(c, ServerConfig) else c)
            for m, c in self._configs(key).items()
        }
        return simulate(
            self.pipeline,
            cfg,
            self.profiles,
            trace,
            options=self._estimator_for(key),
            catalog=self.catalog,
            stop=stop,
        )

    def _stop(self) -> EarlyStop | None:
        """The early stop matching ``_judge``'s rule (drops as misses, or a drop allowance
        of the served-only judgement); None with ``early_stop`` off."""
        if not self.options.early_stop:
            return None
        if self.options.drops_are_misses:
            return EarlyStop(self.slo_s, self.percentile)
        allowed = math.floor((1 - self.percentile / 100) * self.trace.size + _EPS)
        return EarlyStop(self.slo_s, self.percentile, drops_are_misses=False, max_drops=allowed)

    def _judge(self, res: SimResult) -> float:
        """The percentile a plan is judged by: drops are misses (inf), or with
        ``drops_are_misses`` off the served requests' percentile if few enough were dropped."""
        if res.stopped_early:  # certainly infeasible (the estimator's EarlyStop)
            return math.inf
        if self.options.drops_are_misses:
            with np.errstate(invalid="ignore"):  # inf - inf between two drops: nan
                v = res.percentile(self.percentile)
            return math.inf if math.isnan(v) else v
        assert res.rejected is not None and res.refused is not None
        dropped = res.rejected | res.refused
        if np.count_nonzero(dropped) > (1 - self.percentile / 100) * dropped.size + _EPS:
            return math.inf
        served = res.latencies_s[~dropped]
        return float(np.percentile(served, self.percentile)) if served.size else 0.0

    def _latency(self, key: Key) -> float:
        if not self._server:
            return super()._latency(key)
        hit = self._cache.get(key)
        if hit is not None:
            self._hits += 1
            return hit
        if self.options.prune and self.bound.infeasible(self._configs(key)):
            self._pruned += 1
            value = math.inf
        else:
            self._sims += 1
            value = self._judge(self._simulate(key, self.trace, self._stop()))
        self._cache[key] = value
        return value

    # -- the knob pass -----------------------------------------------------------------------
    def knob_ladder(self, model: str, c: ModelConfig) -> list[tuple[int, int]]:
        """The (preferred, delay_us) settings tried for ``model`` at ``c``'s hardware."""
        delays = sorted({round(self.slo_s * f * 1e6) for f in WAIT_FRACTIONS} - {0})
        prefs = [0]
        if self._server[model] == "triton":
            prefs += [b for b in self._batch_ladder(model, c.hardware) if b < c.max_batch_size]
        return [(p, d) for p in prefs for d in [0, *delays] if (p, d) != (0, 0)]

    def add_knobs(self, configs: Mapping[str, ModelConfig]) -> Configs:
        """Server knobs where they make the plan cheaper (see the module doc)."""
        best = self._key(configs)
        best_cost = self._cost(best)
        budget = self._sims * 2 + _FLOOR_QUERIES / max(1, self.trace.size)
        for _ in range(_ROUNDS):
            found: Key | None = None
            for i, m in enumerate(self._models):
                if m not in self._server or self._sims >= budget:
                    continue
                for start in self._knob_starts(best, i, m):
                    found = self._cheapest_from(start, best_cost, found)
            if found is None:
                break
            best, best_cost = found, self._cost(found)
            self._actions.append("server knobs")
            self._report("server", len(self._actions), best, "server knobs lower the cost")
        return self._configs(self._drop_idle_knobs(best))

    def _knob_starts(self, key: Key, i: int, m: str) -> list[Key]:
        """Feasible starts with other knobs on ``m``: its fewest replicas at any batch size
        of its ladder with them, and the same configuration with them where that lowers the
        tail latency (slack other models can spend)."""
        c = key[i]
        assert isinstance(c, ServerConfig)
        ladder = self._batch_ladder(m, c.hardware)
        starts: list[Key] = []
        slack: tuple[float, Key] | None = None
        base = self._latency(key)
        for p, d in self.knob_ladder(m, c):
            if (p, d) == c.knobs():
                continue
            k2 = self._with(key, m, replace(c, preferred=p, delay_us=d))
            fewer = self._local(k2, m, c.hardware, ladder, c.replicas - 1)
            if fewer is not None:
                starts.append(fewer)
            lat = self._latency(k2)
            if self._fits(k2) and lat < base - _EPS and (slack is None or lat < slack[0]):
                slack = (lat, k2)
        if slack is not None:
            starts.append(slack[1])
        return starts

    def _drop_idle_knobs(self, key: Key) -> Key:
        """Each knob the plan meets the SLO without goes (the server's defaults)."""
        for i, m in enumerate(self._models):
            c = key[i]
            if isinstance(c, ServerConfig) and c.knobs() != (0, 0):
                k2 = self._with(key, m, replace(c, preferred=0, delay_us=0))
                if self._feasible(k2):
                    key = k2
        return key

    # -- the plan ----------------------------------------------------------------------------
    def server_plan(self, plan: Plan, key: Key) -> Plan:
        """``plan`` with plain model configurations and its server batchers' documents."""
        if not self._server:
            return plan
        models = {
            m: (c.plain() if isinstance(c, ServerConfig) else c) for m, c in plan.models.items()
        }
        docs = {m: b.to_dict() for m, b in self.batchers(key).items()}
        return replace(plan, models=models, server_batchers=docs)


def plan_server_batchers(plan: Plan) -> dict[str, ServerBatcher]:
    """The server batchers a plan carries, parsed (a ValidationError names the field)."""
    return {
        m: batcher_from_dict(d, f"server_batchers.{m}") for m, d in plan.server_batchers.items()
    }


def plan_estimator_options(plan: Plan, options: EstimatorOptions | None = None) -> EstimatorOptions:
    """``options`` (default: the defaults) with the plan's server batchers: what the plan is
    estimated with (``simulate(..., options=plan_estimator_options(plan))``)."""
    est = options or EstimatorOptions()
    if not plan.server_batchers:
        return est
    return replace(est, server_batchers={**est.server_batchers, **plan_server_batchers(plan)})
