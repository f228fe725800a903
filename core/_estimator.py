"""Discrete-event latency estimator (the contract of DESIGN.md "Estimator semantics").

One EDF queue per model, pull-based identical replicas taking ``min(max_batch_size, queued)``
queries at once, all arrivals and completions of an instant applied before any replica takes
a batch, fan-out to visited children, joins on the last visited parent, seeded conditional
visits. Optional: per-hop overhead, delayed batching, replica activation delay, replica-count
schedules and a controller (tuner) called every ``interval_s`` of simulated time, which may
also switch a stage to another model variant (:class:`StageSwitch`).

The event loop is the compiled kernel in ``_estimator_kernel.py``; this module validates
inputs, lays out the arrays, drives the kernel segment by segment and summarizes the result.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

from . import _estimator_kernel as K
from ._hardware import DEFAULT_CATALOG, HardwareCatalog
from ._pipeline import Pipeline
from ._plan import ModelConfig, Plan
from ._profiles import BatchProfile, Profiles
from ._validate import as_float, as_int, as_mapping, as_str, no_extra_keys
from .errors import ValidationError

__all__ = [
    "MAX_SHARERS_PER_UNIT",
    "Controller",
    "EstimatorOptions",
    "ModelSimStats",
    "SimResult",
    "StageSwitch",
    "SystemState",
    "draw_visits",
    "simulate",
    "simulate_plan",
    "spread_floor",
]


# -- configuration and results ---------------------------------------------------------------
# Replicas that may share one core (or GPU) of a shared or pinned pool, at most: the planner
# grows a model no further there, and the bundled runtime refuses more when oversubscribing.
MAX_SHARERS_PER_UNIT = 16


@dataclass(frozen=True)
class EstimatorOptions:
    """Departures from the ideal system that the live one has (all off by default).

    ``hop_overhead_s``: fixed time before a query enters each model's queue (RPC per hop).
    ``batch_wait_s``: per model, an idle replica with fewer than ``max_batch_size`` queued
    starts only when the batch fills or the oldest queued query has waited this long.
    ``activation_delay_s``: time from requesting a replica to it serving.
    ``seed``: seed of the conditional-visit draws.
    ``wake_up``: a batch that starts on an idle replica also takes the profiled wake-up extra
    for that idle time (``Profiles.wake_up``; nothing where a pair has none).
    ``service_spread``: each batch's service time is drawn (seeded by ``seed``) from a
    log-normal through the profile's ``p50_s`` and ``p99_s`` for its size, clipped at its
    0.1th and 99.9th percentiles, instead of taking ``latency_s``. Batch sizes profiled
    without both quantiles (or with ``p99_s <= p50_s``) keep ``latency_s``.
    ``shared_units``: hardware name -> the units (cores, GPUs) that *all* replicas placed on
    it share, as when replicas outnumber a machine's cores. A busy replica takes
    ``replica_units`` of them (per model, its threads; default 1); while the busy replicas
    take more than there are, every one runs at the same fraction of its profiled speed
    (processor sharing). ``pinned_cores``: hardware name -> cores its replicas are pinned
    to, each replica to the least-used core (the lowest on ties) when it is requested, as
    the bundled runtime places them: the replicas on one core share it. A pinned replica is
    modelled on one core (threads beyond the first are not). Hardware named in neither gives
    each replica units of its own (the paper's cloud, the default).
    """

    hop_overhead_s: float = 0.0
    batch_wait_s: Mapping[str, float] = field(default_factory=dict)
    activation_delay_s: float = 0.0
    seed: int = 0
    wake_up: bool = True
    service_spread: bool = False
    shared_units: Mapping[str, float] = field(default_factory=dict)
    replica_units: Mapping[str, float] = field(default_factory=dict)
    pinned_cores: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_float(self.hop_overhead_s, "hop_overhead_s", nonneg=True)
        as_float(self.activation_delay_s, "activation_delay_s", nonneg=True)
        as_int(self.seed, "seed", minimum=0)
        if not isinstance(self.wake_up, bool):
            raise ValidationError("wake_up", "true or false", self.wake_up)
        if not isinstance(self.service_spread, bool):
            raise ValidationError("service_spread", "true or false", self.service_spread)
        as_mapping(self.batch_wait_s, "batch_wait_s")
        for k, v in self.batch_wait_s.items():
            as_float(v, f"batch_wait_s.{k}", nonneg=True)
        object.__setattr__(self, "batch_wait_s", dict(self.batch_wait_s))
        for name in ("shared_units", "replica_units"):
            object.__setattr__(self, name, _positive_map(getattr(self, name), name))
        pinned = {
            as_str(k, "pinned_cores"): as_int(v, f"pinned_cores.{k}", minimum=1)
            for k, v in as_mapping(self.pinned_cores, "pinned_cores").items()
        }
        object.__setattr__(self, "pinned_cores", pinned)
        for hw in pinned:
            if hw in self.shared_units:
                raise ValidationError(
                    f"pinned_cores.{hw}", "hardware not also in shared_units", pinned[hw]
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "hop_overhead_s": self.hop_overhead_s,
            "batch_wait_s": dict(self.batch_wait_s),
            "activation_delay_s": self.activation_delay_s,
            "seed": self.seed,
            "wake_up": self.wake_up,
            "service_spread": self.service_spread,
            "shared_units": dict(self.shared_units),
            "replica_units": dict(self.replica_units),
            "pinned_cores": dict(self.pinned_cores),
        }

    @classmethod
    def from_dict(cls, d: Any) -> EstimatorOptions:
        m = as_mapping(d, "options")
        no_extra_keys(
            m,
            {
                "hop_overhead_s",
                "batch_wait_s",
                "activation_delay_s",
                "seed",
                "wake_up",
                "service_spread",
                "shared_units",
                "replica_units",
                "pinned_cores",
            },
            "",
        )
        return cls(
            hop_overhead_s=as_float(m.get("hop_overhead_s", 0.0), "hop_overhead_s", nonneg=True),
            batch_wait_s={
                str(k): as_float(v, f"batch_wait_s.{k}", nonneg=True)
                for k, v in as_mapping(m.get("batch_wait_s", {}), "batch_wait_s").items()
            },
            activation_delay_s=as_float(
                m.get("activation_delay_s", 0.0), "activation_delay_s", nonneg=True
            ),
            seed=as_int(m.get("seed", 0), "seed", minimum=0),
            wake_up=m.get("wake_up", True),
            service_spread=m.get("service_spread", False),
            shared_units=m.get("shared_units", {}),
            replica_units=m.get("replica_units", {}),
            pinned_cores=m.get("pinned_cores", {}),
        )


def _positive_map(m: Any, where: str) -> dict[str, float]:
    return {
        as_str(k, where): as_float(v, f"{where}.{k}", positive=True)
        for k, v in as_mapping(m, where).items()
    }


@dataclass(frozen=True)
class ModelSimStats:
    """Per-model figures of one simulation.

    ``utilization``: busy replica-seconds over serving replica-seconds between the first
    arrival and the last event. Queue delay: from entering the queue to the batch starting.
    """

    visits: int
    batches: int
    mean_batch_size: float
    utilization: float
    mean_queue_delay_s: float
    p99_queue_delay_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "visits": self.visits,
            "batches": self.batches,
            "mean_batch_size": self.mean_batch_size,
            "utilization": self.utilization,
            "mean_queue_delay_s": self.mean_queue_delay_s,
            "p99_queue_delay_s": self.p99_queue_delay_s,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> ModelSimStats:
        m = as_mapping(d, where)
        no_extra_keys(m, set(cls.__dataclass_fields__), where)
        return cls(
            visits=as_int(m["visits"], f"{where}.visits", minimum=0),
            batches=as_int(m["batches"], f"{where}.batches", minimum=0),
            mean_batch_size=float(m["mean_batch_size"]),
            utilization=float(m["utilization"]),
            mean_queue_delay_s=float(m["mean_queue_delay_s"]),
            p99_queue_delay_s=float(m["p99_queue_delay_s"]),
        )


def _pct_key(p: float) -> str:
    return f"latency_p{float(p):g}_s"


@dataclass(frozen=True, eq=False)
class SimResult:
    """Per-query latencies (arrival order; inf for a query that never finished) and stats.

    ``replica_timeline``: ``(time_s, model, serving replicas)`` at the start and at every
    change. ``cost_per_hour``: replica cost integrated from request to removal, averaged over
    the trace span (first to last arrival). ``variant_switches``: ``(time_s, stage, variant)``
    for every :class:`StageSwitch` a controller made (at the decision; the variant serves
    from the activation delay later).
    """

    arrivals_s: np.ndarray
    latencies_s: np.ndarray
    models: Mapping[str, ModelSimStats]
    cost_per_hour: float
    replica_timeline: tuple[tuple[float, str, int], ...] = ()
    variant_switches: tuple[tuple[float, str, str], ...] = ()

    def percentile(self, p: float = 99.0) -> float:
        if self.latencies_s.size == 0:
            return 0.0
        return float(np.percentile(self.latencies_s, p))

    def miss_rate(self, slo_s: float) -> float:
        if self.latencies_s.size == 0:
            return 0.0
        return float(np.count_nonzero(self.latencies_s > slo_s) / self.latencies_s.size)

    def summary(self, slo_s: float, percentile: float = 99.0) -> dict[str, Any]:
        return {
            _pct_key(percentile): self.percentile(percentile),
            "slo_miss_rate": self.miss_rate(slo_s),
            "cost_per_hour": self.cost_per_hour,
            "queries": int(self.latencies_s.size),
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }


@dataclass(frozen=True)
class SystemState:
    """What a controller sees at a decision time (per model, keyed by model name)."""

    now_s: float
    queued: Mapping[str, int]
    in_service: Mapping[str, int]
    active_replicas: Mapping[str, int]
    pending_replicas: Mapping[str, int]
    in_system: int


@dataclass(frozen=True)
class StageSwitch:
    """A controller's value for a stage: serve it with model ``variant`` (one of the stage's
    variants given to :func:`simulate`) as ``config`` (on the stage's hardware).

    As the live tuner does it: ``config.replicas`` replicas of the variant are billed at once
    and serve after the activation delay, with ``config.max_batch_size``; the previous
    variant's replicas serve the stage's queue until then and leave at that time (busy ones
    after their batch). ``variant`` may be the stage's own name: its own profile (for a plan
    made with variants, the variant the plan chose).
    """

    variant: str
    config: ModelConfig


class Controller(Protocol):
    """A tuner in the loop: called every ``interval_s`` of simulated time.

    ``new_arrivals`` are the pipeline arrivals since the previous call (``[prev, now)``); the
    state reflects every event strictly before ``now_s``. Return desired absolute replica
    counts (only the models to change) or None. A value may also be a ``ModelConfig`` on the
    configured hardware: its ``max_batch_size`` applies to the next batch the model forms
    (at once; batches in service finish as they are), its ``replicas`` as a count; or a
    :class:`StageSwitch` to another variant of the stage.
    """

    interval_s: float

    def observe(
        self, now_s: float, new_arrivals: np.ndarray, state: SystemState
    ) -> Mapping[str, int] | None: ...


# -- preparation -----------------------------------------------------------------------------
def draw_visits(pipeline: Pipeline, n: int, seed: int) -> np.ndarray:
    """Visit matrix ``[n, M]`` (models in topological order), drawn up front.

    One ``rng.random(n)`` per model in topological order from ``default_rng(seed)``: a query
    visits a root with its scale factor, and any other model iff it visited at least one parent
    and the draw is below ``pipeline.visit_probability(model)``.
    """
    order = pipeline.topological_order
    pos = {m: j for j, m in enumerate(order)}
    rng = np.random.default_rng(seed)
    vis = np.zeros((n, len(order)), dtype=np.uint8)
    for j, m in enumerate(order):
        u = rng.random(n)
        ok = u < pipeline.visit_probability(m)
        ps = pipeline.parents[m]
        if ps:
            anyp = np.zeros(n, dtype=bool)
            for p in ps:
                anyp |= vis[:, pos[p]].astype(bool)
            ok &= anyp
        vis[:, j] = ok
    return vis


# Service spread: 200-odd profiling samples say little beyond their 99.9th percentile, and an
# unclipped log-normal fitted to a noisy p99 would now and then draw absurd service times.
_Z99 = NormalDist().inv_cdf(0.99)
SPREAD_Z_CLIP = NormalDist().inv_cdf(0.999)


def spread_params(bp: BatchProfile) -> tuple[float, float] | None:
    """(log median, log-sd) of the log-normal through the batch profile's p50 and p99, or
    None where it has not both or they show no spread."""
    p50, p99 = bp.p50_s, bp.p99_s
    if p50 is None or p99 is None or not 0.0 < p50 < p99:
        return None
    return math.log(p50), math.log(p99 / p50) / _Z99


def spread_floor(profiles: Profiles) -> Profiles:
    """``profiles`` with every ``latency_s`` lowered to the shortest service time the spread
    can draw for it: what a lower bound (the planner's :class:`MissBound`) must assume when the
    estimator draws service times."""
    models = {}
    for m, hws in profiles.models.items():
        models[m] = {}
        for hw, by_b in hws.items():
            models[m][hw] = {}
            for b, bp in by_b.items():
                sp = spread_params(bp)
                if sp is not None:
                    low = math.exp(sp[0] - SPREAD_Z_CLIP * sp[1])
                    bp = replace(bp, latency_s=min(bp.latency_s, low))
                models[m][hw][b] = bp
    return Profiles(models, profiles.wake_up)


def _check_arrivals(arrivals: Any) -> np.ndarray:
    a = np.asarray(arrivals, dtype=np.float64)
    if a.ndim != 1:
        raise ValidationError("arrivals", "a 1-D array of arrival times", f"shape {a.shape}")
    if a.size and not np.all(np.isfinite(a)):
        raise ValidationError("arrivals", "finite arrival times", "NaN or inf")
    if a.size > 1 and np.any(np.diff(a) < 0):
        i = int(np.argmax(np.diff(a) < 0))
        raise ValidationError(
            "arrivals", "non-decreasing arrival times", f"arrivals[{i + 1}] < arrivals[{i}]"
        )
    return np.ascontiguousarray(a)


@dataclass
class _Prep:
    order: tuple[str, ...]
    maxb: np.ndarray  # by table row
    table: np.ndarray  # rows 0..M-1 the stages, then the variants of ``rows``
    wake_g: np.ndarray  # by table row: WakeProfile points (see KState)
    wake_x: np.ndarray
    wake_n: np.ndarray
    spr_mu: np.ndarray  # by table row and batch size: see KState
    spr_sig: np.ndarray
    # shared cores: each table row's group of pools (-1: none) and units; per group its first
    # pool, its number of pools, whether pinned (a pool per core) or one pool; per pool units
    row_group: np.ndarray
    row_units: np.ndarray
    group_first: np.ndarray
    group_size: np.ndarray
    group_pinned: np.ndarray
    pool_cap: np.ndarray
    rows: Mapping[tuple[str, str], int]  # (stage, variant) -> table row
    waitv: np.ndarray
    replicas: np.ndarray
    price: np.ndarray
    ch_ptr: np.ndarray
    ch_idx: np.ndarray
    is_root: np.ndarray


def _prepare(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    options: EstimatorOptions,
    catalog: HardwareCatalog,
    resizable: bool = False,
    variants: Mapping[str, Sequence[str]] | None = None,
) -> _Prep:
    order = pipeline.topological_order
    pos = {m: j for j, m in enumerate(order)}
    for k in configs:
        if k not in pos:
            raise ValidationError("configs", f"model names from {list(pipeline.models)!r}", k)
    for k in options.batch_wait_s:
        if k not in pos:
            raise ValidationError(
                "options.batch_wait_s", f"model names from {list(pipeline.models)!r}", k
            )
    M = len(order)
    maxb = np.zeros(M, dtype=np.int64)
    replicas = np.zeros(M, dtype=np.int64)
    price = np.zeros(M, dtype=np.float64)
    for j, m in enumerate(order):
        c = configs.get(m)
        if not isinstance(c, ModelConfig):
            raise ValidationError(f"configs.{m}", "a ModelConfig", c)
        if c.hardware not in catalog:
            raise ValidationError(
                f"configs.{m}.hardware",
                f"hardware from the catalog {catalog.names()!r}",
                c.hardware,
            )
        if not profiles.has(m, c.hardware):
            have = sorted(profiles.models.get(m, {}))
            raise ValidationError(
                f"configs.{m}.hardware", f"a hardware profiled for {m!r} ({have!r})", c.hardware
            )
        largest = profiles.max_batch(m, c.hardware)
        if c.max_batch_size > largest:
            raise ValidationError(
                f"configs.{m}.max_batch_size",
                f"at most the largest profiled batch size {largest} on {c.hardware!r}",
                c.max_batch_size,
            )
        maxb[j] = c.max_batch_size
        replicas[j] = c.replicas
        price[j] = catalog.cost(c.hardware)
    # A controller may change batch sizes: tables then go up to the largest profiled batch.
    top = [
        profiles.max_batch(m, configs[m].hardware) if resizable else int(maxb[j])
        for j, m in enumerate(order)
    ]
    # the variants a controller may switch stages to: one more table row each
    rows: dict[tuple[str, str], int] = {}
    row_of: list[tuple[str, int, int]] = []  # (variant, stage index, largest batch)
    for stage, names in (variants or {}).items():
        if stage not in pos:
            raise ValidationError("variants", f"stages from {list(order)!r}", stage)
        hw = configs[stage].hardware
        for v in names:
            if not isinstance(v, str) or not profiles.has(v, hw):
                raise ValidationError(
                    f"variants.{stage}", f"models profiled on the stage's hardware {hw!r}", v
                )
            if (stage, v) not in rows:
                rows[(stage, v)] = M + len(row_of)
                row_of.append((v, pos[stage], profiles.max_batch(v, hw)))
    B = int(max([*top, *(r[2] for r in row_of)]))
    R = M + len(row_of)
    table = np.zeros((R, B + 1), dtype=np.float64)
    for j, m in enumerate(order):
        hw = configs[m].hardware
        table[j, : top[j] + 1] = _latency_table(profiles, m, hw, int(top[j]))
    rmaxb = np.concatenate([maxb, np.zeros(len(row_of), dtype=np.int64)])
    for k, (v, j, vtop) in enumerate(row_of):
        table[M + k, : vtop + 1] = _latency_table(profiles, v, configs[order[j]].hardware, vtop)
        rmaxb[M + k] = min(int(maxb[j]), vtop)  # until a switch names its batch size
    pairs = [(m, configs[m].hardware) for m in order]
    pairs += [(v, configs[order[j]].hardware) for v, j, _ in row_of]
    wakes = [profiles.wake(m, hw) if options.wake_up else None for m, hw in pairs]
    G = max([len(w.idle_s) for w in wakes if w is not None], default=1)
    wake_g = np.ones((R, G))
    wake_x = np.zeros((R, G))
    wake_n = np.zeros(R, dtype=np.int64)
    for r, w in enumerate(wakes):
        if w is not None and w.extra_s[-1] > 0.0:
            k = len(w.idle_s)
            wake_g[r, :k], wake_x[r, :k], wake_n[r] = w.idle_s, w.extra_s, k
    spr_mu = np.zeros((R, B + 1))
    spr_sig = np.zeros((R, B + 1))
    if options.service_spread:
        sizes = [*top, *(r[2] for r in row_of)]
        for r, (m, hw) in enumerate(pairs):
            for b in range(1, int(sizes[r]) + 1):
                sp = spread_params(profiles.batch_profile(m, hw, b))
                if sp is not None:
                    spr_mu[r, b], spr_sig[r, b] = sp
    for name in ("shared_units", "pinned_cores"):
        for hw in getattr(options, name):
            if hw not in catalog:
                raise ValidationError(
                    f"options.{name}", f"hardware from the catalog {catalog.names()!r}", hw
                )
    groups = sorted(
        {hw for _, hw in pairs if hw in options.shared_units or hw in options.pinned_cores}
    )
    row_group = np.array([groups.index(hw) if hw in groups else -1 for _, hw in pairs], np.int64)
    row_units = np.array([float(options.replica_units.get(m, 1.0)) for m, _ in pairs])
    sizes_g = [options.pinned_cores.get(hw, 1) for hw in groups]
    group_first = np.cumsum([0, *sizes_g])[:-1].astype(np.int64)
    group_pinned = np.array([hw in options.pinned_cores for hw in groups], dtype=bool)
    pool_cap = np.concatenate(
        [
            np.ones(options.pinned_cores[hw])
            if hw in options.pinned_cores
            else [float(options.shared_units[hw])]
            for hw in groups
        ]
        or [np.zeros(0)]
    ).astype(np.float64)
    waitv = np.array([float(options.batch_wait_s.get(m, 0.0)) for m in order])
    ch_ptr = np.zeros(M + 1, dtype=np.int64)
    kids: list[int] = []
    for j, m in enumerate(order):
        kids.extend(pos[c] for c in pipeline.children[m])
        ch_ptr[j + 1] = len(kids)
    is_root = np.array([not pipeline.parents[m] for m in order], dtype=np.uint8)
    return _Prep(
        order,
        rmaxb,
        table,
        wake_g,
        wake_x,
        wake_n,
        spr_mu,
        spr_sig,
        row_group,
        row_units,
        group_first,
        np.array(sizes_g, dtype=np.int64),
        group_pinned,
        pool_cap,
        rows,
        waitv,
        replicas,
        price,
        ch_ptr,
        np.array(kids, np.int64),
        is_root,
    )


_TABLES: dict[tuple[int, str, str, int], tuple[Profiles, np.ndarray]] = {}
# The kernel releases the GIL (the ladder plans its rate factors in threads); the caches'
# evictions are not atomic, so they are mutated under this lock.
_CACHE_LOCK = threading.Lock()


def _latency_table(profiles: Profiles, model: str, hw: str, maxb: int) -> np.ndarray:
    """``table[b]`` = latency of a batch of b (cached: the planner asks for the same ones often)."""
    key = (id(profiles), model, hw, maxb)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is profiles:  # identity check: ids are reused after GC
        return hit[1]
    t = np.array(profiles.latency_table(model, hw, maxb), dtype=np.float64)
    with _CACHE_LOCK:
        if len(_TABLES) > 4096:
            _TABLES.clear()
        _TABLES[key] = (profiles, t)
    return t


_VISITS: dict[tuple[int, int, int], tuple[Pipeline, np.ndarray, np.ndarray, np.ndarray]] = {}


def _visits(pipeline: Pipeline, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(visits [n, M], visited parents per visit, visits per query), cached by pipeline identity.

    The planner simulates one trace thousands of times; the draws depend only on these keys.
    Callers must copy the last two before the kernel mutates them.
    """
    key = (id(pipeline), n, seed)
    hit = _VISITS.get(key)
    if hit is not None and hit[0] is pipeline:
        return hit[1], hit[2], hit[3]
    vis = draw_visits(pipeline, n, seed)
    pos = {m: j for j, m in enumerate(pipeline.topological_order)}
    rem = np.zeros(vis.shape, dtype=np.int32)
    for j, m in enumerate(pipeline.topological_order):
        for q in pipeline.parents[m]:
            rem[:, j] += vis[:, pos[q]]
    rem *= vis  # only visited models wait for parents
    left = vis.sum(axis=1, dtype=np.int32)
    for a in (vis, rem, left):
        a.flags.writeable = False
    with _CACHE_LOCK:
        while len(_VISITS) >= 8:
            _VISITS.pop(next(iter(_VISITS)))
        _VISITS[key] = (pipeline, vis, rem, left)
    return vis, rem, left


def _normals(n: int, seed: int) -> np.ndarray:
    """The service-spread draws: one standard normal per visit (flat ``i * M + m``), clipped,
    from a stream of its own (the visit draws stay what they were)."""
    key = (n, seed)
    hit = _NORMALS.get(key)
    if hit is not None:
        return hit
    z = np.random.default_rng([seed, 1]).standard_normal(n)
    np.clip(z, -SPREAD_Z_CLIP, SPREAD_Z_CLIP, out=z)
    z.flags.writeable = False
    with _CACHE_LOCK:
        while len(_NORMALS) >= 4:
            _NORMALS.pop(next(iter(_NORMALS)))
        _NORMALS[key] = z
    return z


_NORMALS: dict[tuple[int, int], np.ndarray] = {}


def _new_state(
    p: _Prep,
    arr: np.ndarray,
    vis: np.ndarray,
    rem: np.ndarray,
    left: np.ndarray,
    hop: float,
    seed: int = 0,
) -> K.KState:
    N = arr.shape[0]
    M = len(p.order)
    B = int(p.table.shape[1] - 1)  # a controller may raise batch sizes up to the table's
    NM = N * M
    visf = np.ascontiguousarray(vis).reshape(-1)
    use_wait = bool(np.any(p.waitv > 0))
    S0 = int(p.replicas.sum())
    cap = max(16, 2 * S0)
    rep_m = np.full(cap, -1, dtype=np.int64)
    rep_m[:S0] = np.repeat(np.arange(M, dtype=np.int64), p.replicas)
    rep_row = rep_m.copy()  # every replica starts on its stage's own row
    rep_st = np.full(cap, K.REMOVED, dtype=np.int64)
    rep_st[:S0] = K.IDLE
    rep_next = np.full(cap, -1, dtype=np.int64)
    idle_head = np.full(M, -1, dtype=np.int64)
    for s in range(S0):  # build each model's idle stack
        m = rep_m[s]
        rep_next[s] = idle_head[m]
        idle_head[m] = s
    ist = np.zeros(8, dtype=np.int64)
    ist[K.I_NSLOTS] = S0
    fst = np.zeros(4, dtype=np.float64)
    fst[K.F_HOP] = hop
    P = p.pool_cap.shape[0]
    ecap = 2 * cap + M + 8  # per slot: a completion or activation, and a switch's retirement
    return K.KState(
        arr=arr,
        vis=visf,
        ch_ptr=p.ch_ptr,
        ch_idx=p.ch_idx,
        is_root=p.is_root,
        maxb=p.maxb.copy(),
        table=p.table,
        wake_g=p.wake_g,
        wake_x=p.wake_x,
        wake_n=p.wake_n,
        spr_mu=p.spr_mu,
        spr_sig=p.spr_sig,
        zs=_normals(NM, seed) if np.any(p.spr_sig > 0.0) else np.zeros(1),
        waitv=p.waitv,
        pool_cap=p.pool_cap,
        rem=rem.reshape(-1).copy(),
        left=left.copy(),
        fin=np.full(N, np.inf),
        enq=np.zeros(NM),
        qd=np.full(NM, np.nan),
        qheap=np.zeros(NM, dtype=np.int64),
        qlen=np.zeros(M, dtype=np.int64),
        fifo=np.zeros(NM if use_wait else 1, dtype=np.int64),
        fhead=np.zeros(M, dtype=np.int64),
        ftail=np.zeros(M, dtype=np.int64),
        wake_at=np.full(M, np.inf),
        hq_i=np.zeros(NM if hop > 0 else 1, dtype=np.int64),
        hq_m=np.zeros(NM if hop > 0 else 1, dtype=np.int64),
        hq_t=np.zeros(NM if hop > 0 else 1),
        ev_t=np.zeros(ecap),
        ev_k=np.zeros(ecap, dtype=np.int64),
        ev_a=np.zeros(ecap, dtype=np.int64),
        rep_m=rep_m,
        rep_row=rep_row,
        rep_st=rep_st,
        rep_b=np.zeros(cap, dtype=np.int64),
        rep_batch=np.zeros((cap, B), dtype=np.int64),
        rep_next=rep_next,
        rep_fin=np.where(np.arange(cap) < S0, -np.inf, np.inf),  # idle since ever: cold
        rep_req=np.where(np.arange(cap) < S0, -np.inf, np.inf),
        rep_act=np.where(np.arange(cap) < S0, -np.inf, np.inf),
        rep_stop=np.full(cap, np.inf),
        rep_end=np.full(cap, np.inf),
        idle_head=idle_head,
        cur_row=np.arange(M, dtype=np.int64),
        inflight=np.zeros(M, dtype=np.int64),
        nbatch=np.zeros(M, dtype=np.int64),
        busy=np.zeros(M),
        dirty=np.zeros(M, dtype=np.uint8),
        dlist=np.zeros(M, dtype=np.int64),
        pool_dem=np.zeros(P),
        pool_n=np.zeros(P, dtype=np.int64),
        pool_list=np.zeros((P, cap), dtype=np.int64),
        pool_next=np.full(P, np.inf),
        rep_pool=np.full(cap, -1, dtype=np.int64),
        rep_units=np.ones(cap),
        rep_ppos=np.zeros(cap, dtype=np.int64),
        rep_t0=np.zeros(cap),
        ist=ist,
        fst=fst,
    )


def _ensure_slots(S: K.KState, extra: int) -> K.KState:
    """Grow the replica-slot and event arrays so ``extra`` more slots fit."""
    cap = S.rep_m.shape[0]
    need = int(S.ist[K.I_NSLOTS]) + extra
    if need <= cap:
        return S
    new = max(2 * cap, need)

    def grow(a: np.ndarray, fill: float) -> np.ndarray:
        out = np.full((new, *a.shape[1:]), fill, dtype=a.dtype)
        out[:cap] = a
        return out

    M = S.cur_row.shape[0]
    S = _ensure_events(S, 2 * new + M + 8 - int(S.ist[K.I_EVN]))
    return S._replace(
        rep_m=grow(S.rep_m, -1),
        rep_row=grow(S.rep_row, -1),
        rep_st=grow(S.rep_st, K.REMOVED),
        rep_b=grow(S.rep_b, 0),
        rep_batch=grow(S.rep_batch, 0),
        rep_next=grow(S.rep_next, -1),
        rep_fin=grow(S.rep_fin, np.inf),
        rep_req=grow(S.rep_req, np.inf),
        rep_act=grow(S.rep_act, np.inf),
        rep_stop=grow(S.rep_stop, np.inf),
        rep_end=grow(S.rep_end, np.inf),
        rep_pool=grow(S.rep_pool, -1),
        rep_units=grow(S.rep_units, 1.0),
        rep_ppos=grow(S.rep_ppos, 0),
        rep_t0=grow(S.rep_t0, 0.0),
        pool_list=np.concatenate(
            [S.pool_list, np.zeros((S.pool_list.shape[0], new - cap), np.int64)], axis=1
        ),
    )


def _place(S: K.KState, p: _Prep | None, start: int) -> None:
    """Put replica slots ``start..`` (just requested) in their shared-core pools: a pinned
    replica on the least-used core of its hardware, lowest on ties (the bundled runtime's
    rule); an unpinned one in its hardware's one pool."""
    if p is None or p.pool_cap.shape[0] == 0:
        return
    ns = int(S.ist[K.I_NSLOTS])
    for s in range(start, ns):
        g = int(p.row_group[S.rep_row[s]])
        if g < 0:
            S.rep_pool[s] = -1
            continue
        lo = int(p.group_first[g])
        if not p.group_pinned[g]:
            S.rep_pool[s] = lo
            S.rep_units[s] = p.row_units[S.rep_row[s]]
            continue
        held = S.rep_pool[:s][S.rep_st[:s] != K.REMOVED]
        users = np.bincount(held[held >= lo] - lo, minlength=int(p.group_size[g]))
        S.rep_pool[s] = lo + int(np.argmin(users[: int(p.group_size[g])]))
        S.rep_units[s] = 1.0


def _ensure_events(S: K.KState, extra: int) -> K.KState:
    """Grow the event heap so ``extra`` more events fit."""
    n = int(S.ist[K.I_EVN])
    if n + extra <= S.ev_t.shape[0]:
        return S
    ecap = max(2 * S.ev_t.shape[0], n + extra)
    ev_t = np.zeros(ecap)
    ev_k = np.zeros(ecap, dtype=np.int64)
    ev_a = np.zeros(ecap, dtype=np.int64)
    ev_t[:n], ev_k[:n], ev_a[:n] = S.ev_t[:n], S.ev_k[:n], S.ev_a[:n]
    return S._replace(ev_t=ev_t, ev_k=ev_k, ev_a=ev_a)


def _system_state(S: K.KState, order: tuple[str, ...], now: float) -> SystemState:
    M = len(order)
    ns = int(S.ist[K.I_NSLOTS])
    rm, st = S.rep_m[:ns], S.rep_st[:ns]
    active = np.bincount(rm[(st == K.IDLE) | (st == K.BUSY)], minlength=M)
    pending = np.bincount(rm[st == K.PENDING], minlength=M)
    return SystemState(
        now_s=now,
        queued={m: int(S.qlen[j]) for j, m in enumerate(order)},
        in_service={m: int(S.inflight[j]) for j, m in enumerate(order)},
        active_replicas={m: int(active[j]) for j, m in enumerate(order)},
        pending_replicas={m: int(pending[j]) for j, m in enumerate(order)},
        in_system=int(S.ist[K.I_INSYS]),
    )


# -- the simulation --------------------------------------------------------------------------
def simulate(
    pipeline: Pipeline,
    configs: Mapping[str, ModelConfig],
    profiles: Profiles,
    arrivals: np.ndarray,
    *,
    options: EstimatorOptions = EstimatorOptions(),
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    schedule: Sequence[tuple[float, str, int]] = (),
    controller: Controller | None = None,
    variants: Mapping[str, Sequence[str]] | None = None,
) -> SimResult:
    """Simulate ``arrivals`` through ``pipeline`` served as ``configs``; see the module doc.

    Rules beyond DESIGN.md's contract (all exercised by tests/core/test_estimator.py):

    * Visits: see :func:`draw_visits`. A query that visits no model has latency 0; a query
      that never finishes (a model left without replicas) has latency inf.
    * ``options.hop_overhead_s`` is added before every model's queue, roots included.
    * ``schedule``: ``(time_s, model, replicas)`` on the time axis of ``arrivals``;
      ``controller``: called at ``arrivals[0] + k * interval_s`` (k = 1, 2, ...) until every
      query has finished. A change at time T is applied after every event before T and before
      the events at T. The count set is active + pending replicas. Scale-up: billed from T,
      serving from T + ``activation_delay_s``. Scale-down: cancel pending replicas (latest
      first), then remove idle ones, then retire busy ones finishing soonest; a retired replica
      finishes its batch and is billed until then.
    * ``variants``: stage -> models of ``profiles`` (on the stage's hardware) the controller
      may switch the stage to with a :class:`StageSwitch`; the stage starts on its own
      profile (``profiles[stage]``). Replicas are billed at the stage's hardware price.
    * Static configurations (no schedule, no controller) must give every visited model a
      replica; they run as one compiled segment.
    """
    arr = _check_arrivals(arrivals)
    prep = _prepare(pipeline, configs, profiles, options, catalog, controller is not None, variants)
    order = prep.order
    pos = {m: j for j, m in enumerate(order)}
    sched = _check_schedule(schedule, pos)
    interval = 0.0
    if controller is not None:
        interval = as_float(getattr(controller, "interval_s", None), "controller.interval_s")
        if interval <= 0:
            raise ValidationError("controller.interval_s", "a number > 0", interval)
    N = arr.shape[0]
    vis, rem, left = _visits(pipeline, N, options.seed)
    if not sched and controller is None:
        visited = vis.any(axis=0)
        for j, m in enumerate(order):
            if visited[j] and prep.replicas[j] == 0:
                raise ValidationError(
                    f"configs.{m}.replicas",
                    f"at least 1 replica ({m!r} receives traffic and nothing scales it)",
                    0,
                )
    S = _new_state(prep, arr, vis, rem, left, options.hop_overhead_s, options.seed)
    _place(S, prep, 0)
    delay = options.activation_delay_s
    switches: list[tuple[float, str, str]] = []
    if not sched and controller is None:
        K.run(S, np.inf)
    else:
        S = _drive(S, arr, order, pos, sched, controller, interval, delay, prep, configs, switches)
    return _result(S, prep, arr, vis, tuple(switches))


def _check_schedule(
    schedule: Sequence[tuple[float, str, int]], pos: Mapping[str, int]
) -> list[tuple[float, int, int]]:
    out = []
    for i, e in enumerate(schedule):
        if len(e) != 3:
            raise ValidationError(f"schedule[{i}]", "(time_s, model, replicas)", e)
        t = as_float(e[0], f"schedule[{i}][0]")
        if e[1] not in pos:
            raise ValidationError(f"schedule[{i}][1]", f"a model from {list(pos)!r}", e[1])
        n = as_int(
            int(e[2]) if isinstance(e[2], np.integer) else e[2], f"schedule[{i}][2]", minimum=0
        )
        out.append((t, pos[e[1]], n))
    out.sort(key=lambda x: x[0])  # stable: same-time entries apply in the given order
    return out


def _drive(
    S: K.KState,
    arr: np.ndarray,
    order: tuple[str, ...],
    pos: Mapping[str, int],
    sched: list[tuple[float, int, int]],
    controller: Controller | None,
    interval: float,
    delay: float,
    prep: _Prep | None = None,
    configs: Mapping[str, ModelConfig] | None = None,
    switches: list[tuple[float, str, str]] | None = None,
) -> K.KState:
    """Run in segments between schedule entries and controller calls (``switches`` collects
    the controller's variant switches)."""
    t0 = float(arr[0]) if arr.size else 0.0
    j = 0
    k = 1
    prev_ip = 0
    while True:
        ts = sched[j][0] if j < len(sched) else math.inf
        tc = t0 + k * interval if controller is not None else math.inf
        T = min(ts, tc)
        if T == math.inf:
            K.run(S, np.inf)
            return S
        nxt = K.run(S, T)
        finished = nxt == math.inf and S.ist[K.I_INSYS] == 0
        if finished and int(S.ist[K.I_AP]) >= arr.shape[0]:
            return S  # nothing left to serve; later changes cannot affect any query
        changed = False
        while j < len(sched) and sched[j][0] == T:
            _, m, n = sched[j]
            S = _ensure_slots(S, n)
            ns = int(S.ist[K.I_NSLOTS])
            K.apply_scale(S, m, n, T, delay)
            _place(S, prep, ns)
            j += 1
            changed = True
        if controller is not None and tc == T:
            ip = int(np.searchsorted(arr, T, side="left"))
            state = _system_state(S, order, T)
            want = controller.observe(T, arr[prev_ip:ip], state)
            prev_ip = ip
            k += 1
            if want:
                for name, n in want.items():
                    if name not in pos:
                        raise ValidationError(
                            "controller.observe()", f"model names from {list(order)!r}", name
                        )
                    if isinstance(n, StageSwitch):
                        row, n = _switch(S, prep, configs, pos[name], name, n)
                        S = _ensure_slots(S, n)
                        S = _ensure_events(S, S.rep_m.shape[0])
                        ns = int(S.ist[K.I_NSLOTS])
                        K.apply_switch(S, pos[name], row, n, T, delay)
                        _place(S, prep, ns)
                        if switches is not None:
                            switches.append((T, name, want[name].variant))
                        changed = True
                        continue
                    if isinstance(n, ModelConfig):
                        n = _resize(S, prep, configs, pos[name], name, n)
                    if isinstance(n, np.integer):
                        n = int(n)
                    n = as_int(n, f"controller.observe()[{name!r}]", minimum=0)
                    if n != state.active_replicas[name] + state.pending_replicas[name]:
                        changed = True
                    S = _ensure_slots(S, n)
                    ns = int(S.ist[K.I_NSLOTS])
                    K.apply_scale(S, pos[name], n, T, delay)
                    _place(S, prep, ns)
            if nxt == math.inf and not changed and j >= len(sched):
                return S  # starved (no replicas) and the controller does not react


def _resize(
    S: K.KState,
    prep: _Prep | None,
    configs: Mapping[str, ModelConfig] | None,
    j: int,
    name: str,
    c: ModelConfig,
) -> int:
    """A controller's ``ModelConfig`` for a model: its batch size applies to the next batch
    formed (batches in service finish as they are); returns the replica count to apply."""
    assert prep is not None and configs is not None
    where = f"controller.observe()[{name!r}]"
    if c.hardware != configs[name].hardware:
        raise ValidationError(
            f"{where}.hardware", f"the configured hardware {configs[name].hardware!r}", c.hardware
        )
    row = int(S.cur_row[j])
    top = prep.table.shape[1] - 1
    if c.max_batch_size > top or prep.table[row, c.max_batch_size] <= 0.0:
        raise ValidationError(
            f"{where}.max_batch_size", "at most the largest profiled batch size", c.max_batch_size
        )
    S.maxb[row] = c.max_batch_size
    return c.replicas


def _switch(
    S: K.KState,
    prep: _Prep | None,
    configs: Mapping[str, ModelConfig] | None,
    j: int,
    name: str,
    sw: StageSwitch,
) -> tuple[int, int]:
    """A controller's ``StageSwitch``: the variant's table row (its batch size set), and the
    replica count."""
    assert prep is not None and configs is not None
    where = f"controller.observe()[{name!r}]"
    if not isinstance(sw.config, ModelConfig):
        raise ValidationError(f"{where}.config", "a ModelConfig", sw.config)
    row = j if sw.variant == name else prep.rows.get((name, sw.variant))  # own profile
    if row is None:
        have = [name, *sorted(v for s, v in prep.rows if s == name)]
        raise ValidationError(
            f"{where}.variant",
            f"the stage or a variant given to simulate() for it ({have!r})",
            sw.variant,
        )
    c = sw.config
    if c.hardware != configs[name].hardware:
        raise ValidationError(
            f"{where}.config.hardware",
            f"the configured hardware {configs[name].hardware!r}",
            c.hardware,
        )
    top = prep.table.shape[1] - 1
    if c.max_batch_size > top or prep.table[row, c.max_batch_size] <= 0.0:
        raise ValidationError(
            f"{where}.config.max_batch_size",
            f"at most the largest batch size profiled for {sw.variant!r}",
            c.max_batch_size,
        )
    S.maxb[row] = c.max_batch_size
    return row, as_int(c.replicas, f"{where}.config.replicas", minimum=0)


def _result(
    S: K.KState,
    p: _Prep,
    arr: np.ndarray,
    vis: np.ndarray,
    switches: tuple[tuple[float, str, str], ...] = (),
) -> SimResult:
    N = arr.shape[0]
    M = len(p.order)
    lat = S.fin - arr
    lat[S.left > 0] = np.inf
    t0 = float(arr[0]) if N else 0.0
    t1 = float(arr[-1]) if N else 0.0
    fin_ok = S.fin[np.isfinite(S.fin)]
    t_end = max(t1, float(fin_ok.max()) if fin_ok.size else t1)
    ns = int(S.ist[K.I_NSLOTS])
    rm = S.rep_m[:ns]
    req, act, stop, end = S.rep_req[:ns], S.rep_act[:ns], S.rep_stop[:ns], S.rep_end[:ns]
    # cost: billed from request to removal, clipped to the trace span
    if t1 > t0:
        billed = np.clip(end, t0, t1) - np.clip(req, t0, t1)
        cost = float(np.sum(billed * p.price[rm]) / (t1 - t0))
    else:
        cost = float(np.sum(p.replicas * p.price))
    # serving capacity for utilization: from activation to gone, within [t0, t_end]
    avail_per = np.clip(end, t0, t_end) - np.clip(act, t0, t_end)
    avail = np.bincount(rm, weights=np.maximum(avail_per, 0.0), minlength=M)
    qd = S.qd.reshape(N, M)
    visits = vis.sum(axis=0)
    models: dict[str, ModelSimStats] = {}
    for j, m in enumerate(p.order):
        col = qd[:, j]
        col = col[~np.isnan(col)]
        started = col.size
        nb = int(S.nbatch[j])
        models[m] = ModelSimStats(
            visits=int(visits[j]),
            batches=nb,
            mean_batch_size=float(started / nb) if nb else 0.0,
            utilization=float(S.busy[j] / avail[j]) if avail[j] > 0 else 0.0,
            mean_queue_delay_s=float(col.mean()) if started else 0.0,
            p99_queue_delay_s=float(np.percentile(col, 99)) if started else 0.0,
        )
    return SimResult(
        arrivals_s=arr,
        latencies_s=lat,
        models=models,
        cost_per_hour=cost,
        replica_timeline=_timeline(rm, act, stop, p, t0),
        variant_switches=switches,
    )


def _timeline(
    rm: np.ndarray, act: np.ndarray, stop: np.ndarray, p: _Prep, t0: float
) -> tuple[tuple[float, str, int], ...]:
    """Serving replicas per model: the initial counts, then one entry per (time, model) change."""
    changes: list[tuple[float, int, int]] = []
    for s in range(rm.shape[0]):
        if np.isfinite(act[s]) and act[s] != -np.inf:
            changes.append((float(act[s]), int(rm[s]), 1))
        if np.isfinite(stop[s]) and act[s] != np.inf:
            changes.append((float(stop[s]), int(rm[s]), -1))
    start = min([t0, *(c[0] for c in changes)])
    count = [int(x) for x in p.replicas]
    out: list[tuple[float, str, int]] = [(start, m, count[j]) for j, m in enumerate(p.order)]
    changes.sort(key=lambda c: (c[0], c[1]))
    i = 0
    while i < len(changes):
        t, m, _ = changes[i]
        while i < len(changes) and changes[i][0] == t and changes[i][1] == m:
            count[m] += changes[i][2]
            i += 1
        out.append((t, p.order[m], count[m]))
    return tuple(out)


def simulate_plan(
    pipeline: Pipeline, plan: Plan, profiles: Profiles, arrivals: np.ndarray, **kw: Any
) -> SimResult:
    """:func:`simulate` with the plan's model configurations."""
    return simulate(pipeline, plan.models, profiles, arrivals, **kw)
