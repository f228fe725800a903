"""What every planner takes and reports: options, progress reports and statistics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._validate import as_float, as_int, as_mapping, no_extra_keys
from ..errors import ValidationError
from ..estimator import DEFAULT_BUFFER_S, EstimatorOptions
from ._nodes import NodeInventory, nodes_from_dicts

__all__ = [
    "AUTO_MARGIN",
    "SERVER_KINDS",
    "PlanProgress",
    "PlannerOptions",
    "PlannerStats",
    "ProgressFn",
]

AUTO_MARGIN = "auto"  # PlannerOptions.rate_margin from the sample's variability (_margin.py)
SERVER_KINDS = ("triton", "tfserving")  # PlannerOptions.server: whose batcher is planned


def check_server(v: object) -> str | dict[str, str] | None:
    """``None``, a server kind, or per model a server kind (models not named: none)."""
    if v is None:
        return None
    if isinstance(v, str):
        if v not in SERVER_KINDS:
            raise ValidationError("server", f"one of {list(SERVER_KINDS)!r} or null", v)
        return v
    out = {}
    for k, kind in as_mapping(v, "server").items():
        if kind not in SERVER_KINDS:
            raise ValidationError(f"server.{k}", f"one of {list(SERVER_KINDS)!r}", kind)
        out[str(k)] = str(kind)
    return out


def check_rate_margin(v: object) -> float | str:
    """``"auto"`` or a number in [0, 10]."""
    if v == AUTO_MARGIN:
        return AUTO_MARGIN
    if isinstance(v, str):
        raise ValidationError("rate_margin", f"{AUTO_MARGIN!r} or a number in [0, 10]", v)
    return as_float(v, "rate_margin", lo=0.0, hi=10.0)


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of the search; the defaults reproduce the paper's algorithm.

    ``estimator``: passed to every simulation (seed of the conditional visits, hop overhead...).
    ``prune``: skip simulations that :class:`MissBound` proves infeasible.
    ``reuse_infeasible``: see the search's module doc (``_search.py``).
    ``reuse_verdicts``: keep the infeasible replica counts Algorithm 2 found while the other
    models only lose slack, and start the replica searches above them (an assumption:
    the search's module doc, ``_search.py``; a final exact sweep keeps guarantee 2).
    ``max_replicas``: per model; reaching it while initializing raises InfeasibleError.
    ``escape``: after Algorithm 2 converges, try to leave its local optimum (see
    :meth:`Planner.escape`); ``False`` gives the paper's algorithm exactly.
    ``escape_cost_factor``: an escape start may cost at most this times the current plan.
    ``escape_rounds``, ``escape_budget``: escaping stops after this many improving rounds, or
    once it has run ``escape_budget`` times as many simulations as Algorithms 1-2 did (plus
    two million simulated queries, so small problems are always searched well).
    ``widen``: finally move each model to the batch size with the most latency slack at the
    same cost (:meth:`Planner.widen`).
    ``batch_wait``: then give a model a batch-wait timeout (delayed batching, from a ladder
    of fractions of the SLO) where that makes the plan cheaper (``_waits.py``); a plan is never
    dearer with it. Off by default in the library (the paper's planner and the exhaustive
    comparisons know no waits); ``inferline plan`` turns it on (``--no-batch-wait`` off).
    ``rate_margin``: judge every configuration on the planning trace compressed in time by
    ``1 + rate_margin`` (the same burstiness at a higher rate), so the plan keeps that much
    throughput slack over the sample. ``"auto"`` (the default) derives it from the spread of
    the sample's windowed rates (``_margin.py``: about 5.6% for 120 s of Poisson traffic at
    100 q/s, 13% at CV 4); a number overrides it, 0 being the paper's test. The sample is one
    realization: the cheapest plan for it can sit so close to saturation that another
    realization of the same process misses the SLO (``benchmarks/plan_generalization.py``).
    ``inventory``: units of each hardware kind the deployment has (``{"cpu": 16, "gpu-k80":
    2}``, what ``Backend.inventory()`` reports); a plan never uses more. Kinds not listed are
    unlimited (the paper's cloud). ``replica_units``: per model, the units of a *cpu* kind one
    replica takes (its threads, default 1); a GPU replica takes one unit. ``gpu_host_units``:
    per model, the units of the ``cpu`` kind a GPU replica of it also holds for its host side
    (the bundled runtime pins a GPU replica's threads to cores of their own; Triton's GPU
    instances hold none, the default).
    ``nodes``: the deployment's machines (:class:`NodeInventory`, ``_nodes.py``), instead of a
    flat ``inventory``: a plan must also bin into them, each replica (its ``replica_units`` or
    ``gpu_host_units`` cores and its accelerator) on one node, first-fit decreasing; kinds no
    node has cannot be used. Then no node is oversubscribed and every replica has cores of its
    own on its node, which is the estimator's default; the estimator's ``shared_units`` and
    ``pinned_cores`` pool one kind's cores over the whole deployment, not per node, so they
    are refused together with ``nodes``.
    ``server``: plan the serving system's own batcher (``_server.py``): ``"triton"``
    (instances, ``max_batch_size``, ``preferred_batch_size``, ``max_queue_delay_microseconds``)
    or ``"tfserving"`` (instances, ``max_batch_size``, ``batch_timeout_micros``,
    ``num_batch_threads``, ``allowed_batch_sizes``) for every model, or per model
    (``{"a": "triton"}``; models not named keep inferline's batching). ``None``, the
    default, is the planner without them. ``refuse_late``: with ``server``, set Triton's
    ``default_timeout_microseconds`` and TF Serving's ``max_enqueued_batches`` from the SLO
    so that only requests that cannot make it are dropped (off: no Triton timeout, a TF
    Serving queue that never fills). ``drops_are_misses``: a dropped request counts as a
    miss in the percentile (off: the percentile of the served requests, with at most
    ``100 - percentile`` percent dropped). ``early_stop``: a candidate's simulation stops
    once more queries have certainly missed the SLO than the percentile allows (the
    estimator's ``EarlyStop``: the same verdict, the same plan, less simulation; off: every
    candidate runs the whole trace).
    ``admission``: plan for the live queue with admission by predicted completion on
    (``queue.admission: "predicted"``, docs/deadlines.md): every candidate is simulated with
    the estimator's admission (the planning SLO, ``admission_buffer_s``), and a refused query
    counts as a miss, so a plan is feasible when SLO misses plus refusals stay within the
    percentile. ``max_refused``: with admission, also at most this share of the queries
    refused (``None``: no bound beyond the percentile's). Not with ``server`` (the servers'
    batchers have their own rules) and without batch waits (``batch_wait`` is skipped).
    ``screen``: on a planning trace of at least ``screen_min_queries`` queries, judge
    candidates on a representative part of it (the busiest windows and a random sample of the
    rest, ``_screen.py``), confirming on the whole trace every candidate whose estimated miss
    share is within ``screen_margin`` (relative) of the percentile's allowance, and the final
    plan; a final plan that fails that is searched again exactly. Not with ``admission`` or
    ``server`` (those run every candidate on the whole trace). ``workers``: processes that
    evaluate the search's next candidates ahead of it on a trace of 200,000 queries or more
    (``_parallel.py``; the plan does not depend on their number; 1: one process).
    """

    estimator: EstimatorOptions = field(default_factory=EstimatorOptions)
    prune: bool = True
    reuse_infeasible: bool = True
    reuse_verdicts: bool = True
    max_replicas: int = 1024
    escape: bool = True
    escape_cost_factor: float = 3.0
    escape_rounds: int = 3
    escape_budget: float = 1.0
    widen: bool = True
    batch_wait: bool = False
    rate_margin: float | str = AUTO_MARGIN
    inventory: Mapping[str, int] = field(default_factory=dict)
    replica_units: Mapping[str, int] = field(default_factory=dict)
    gpu_host_units: Mapping[str, int] = field(default_factory=dict)
    nodes: tuple[NodeInventory, ...] = ()
    server: str | Mapping[str, str] | None = None
    refuse_late: bool = True
    drops_are_misses: bool = True
    early_stop: bool = True
    admission: bool = False
    admission_buffer_s: float = DEFAULT_BUFFER_S
    max_refused: float | None = None
    screen: bool = True
    screen_min_queries: int = 500_000
    screen_margin: float = 0.5
    workers: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.estimator, EstimatorOptions):
            raise ValidationError("estimator", "EstimatorOptions", self.estimator)
        as_int(self.max_replicas, "max_replicas", minimum=1)
        as_float(self.escape_cost_factor, "escape_cost_factor", lo=1.0)
        as_int(self.escape_rounds, "escape_rounds", minimum=0)
        as_float(self.escape_budget, "escape_budget", nonneg=True)
        object.__setattr__(self, "rate_margin", check_rate_margin(self.rate_margin))
        for name, lo in (("inventory", 0), ("replica_units", 1), ("gpu_host_units", 0)):
            m = as_mapping(getattr(self, name), name)
            object.__setattr__(
                self, name, {str(k): as_int(v, f"{name}.{k}", minimum=lo) for k, v in m.items()}
            )
        self._check_nodes()
        object.__setattr__(self, "server", check_server(self.server))
        for k in ("refuse_late", "drops_are_misses"):
            if not isinstance(getattr(self, k), bool):
                raise ValidationError(k, "true or false", getattr(self, k))
        self._check_admission()
        if not isinstance(self.screen, bool):
            raise ValidationError("screen", "true or false", self.screen)
        as_int(self.screen_min_queries, "screen_min_queries", minimum=2)
        as_float(self.screen_margin, "screen_margin", nonneg=True)
        as_int(self.workers, "workers", minimum=1)

    def _check_admission(self) -> None:
        if not isinstance(self.admission, bool):
            raise ValidationError("admission", "true or false", self.admission)
        b = as_float(self.admission_buffer_s, "admission_buffer_s", lo=0.0, hi=10.0)
        object.__setattr__(self, "admission_buffer_s", b)
        if self.max_refused is not None:
            v = as_float(self.max_refused, "max_refused", lo=0.0, hi=1.0)
            object.__setattr__(self, "max_refused", v)
            if not self.admission:
                raise ValidationError("max_refused", "null unless admission is on", v)
        if self.estimator.admission is not None and not self.admission:
            # the planner sets it from the SLO it plans for (``SearchSpace``)
            raise ValidationError("estimator.admission", "null unless admission is on", "set")
        if self.admission and self.server is not None:
            raise ValidationError("admission", "false with a server batcher (server)", True)

    def server_of(self, model: str) -> str | None:
        """The server whose batcher is planned for ``model`` (None: inferline's batching)."""
        if self.server is None or isinstance(self.server, str):
            return self.server
        return self.server.get(model)

    def _check_nodes(self) -> None:
        nodes = tuple(self.nodes)
        if not all(isinstance(n, NodeInventory) for n in nodes):
            raise ValidationError("nodes", "NodeInventory items", self.nodes)
        object.__setattr__(self, "nodes", nodes)
        if not nodes:
            return
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValidationError("nodes", "nodes with distinct names", names)
        if self.inventory:
            raise ValidationError(
                "inventory", "no flat inventory with per-node ones (nodes)", dict(self.inventory)
            )
        est = self.estimator
        pooled = sorted({*est.shared_units, *est.pinned_cores})
        if pooled:
            raise ValidationError(
                "estimator.shared_units/pinned_cores",
                "none with per-node inventories (they pool the cores of all nodes; binned "
                "replicas each have cores of their own on their node)",
                pooled,
            )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "estimator": self.estimator.to_dict(),
            "prune": self.prune,
            "reuse_infeasible": self.reuse_infeasible,
            "max_replicas": self.max_replicas,
            "escape": self.escape,
            "escape_cost_factor": self.escape_cost_factor,
            "escape_rounds": self.escape_rounds,
            "escape_budget": self.escape_budget,
            "widen": self.widen,
            "batch_wait": self.batch_wait,
            "rate_margin": self.rate_margin,
            "inventory": dict(self.inventory),
            "replica_units": dict(self.replica_units),
            "gpu_host_units": dict(self.gpu_host_units),
            "nodes": [n.to_dict() for n in self.nodes],
        }
        if not self.early_stop:  # only when off: documents from before stay as they were
            out["early_stop"] = False
        if self.admission:  # the same: only when on
            out["admission"] = True
            out["admission_buffer_s"] = self.admission_buffer_s
            out["max_refused"] = self.max_refused
        if (self.screen, self.screen_min_queries, self.screen_margin) != (True, 500_000, 0.5):
            out["screen"] = self.screen  # only when changed, as above
            out["screen_min_queries"] = self.screen_min_queries
            out["screen_margin"] = self.screen_margin
        if self.workers != 2:
            out["workers"] = self.workers
        if not self.reuse_verdicts:  # only when off, as above
            out["reuse_verdicts"] = False
        if self.server is not None:  # only when set: documents from before stay as they were
            out["server"] = self.server if isinstance(self.server, str) else dict(self.server)
            out["refuse_late"] = self.refuse_late
            out["drops_are_misses"] = self.drops_are_misses
        return out

    @classmethod
    def from_dict(cls, d: Any) -> PlannerOptions:
        m = as_mapping(d, "planner options")
        keys = {"estimator", "prune", "reuse_infeasible", "max_replicas", "escape", "widen"}
        keys.add("batch_wait")
        extra = {"escape_cost_factor", "escape_rounds", "escape_budget", "rate_margin"}
        extra |= {"inventory", "replica_units", "gpu_host_units", "nodes"}
        extra |= {"server", "refuse_late", "drops_are_misses", "early_stop"}
        extra |= {"admission", "admission_buffer_s", "max_refused"}
        extra |= {"screen", "screen_min_queries", "screen_margin", "workers", "reuse_verdicts"}
        no_extra_keys(m, keys | extra, "")
        flags = ("prune", "reuse_infeasible", "escape", "widen", "batch_wait", "refuse_late")
        for k in (*flags, "drops_are_misses", "early_stop", "screen", "reuse_verdicts"):
            if k in m and not isinstance(m[k], bool):
                raise ValidationError(k, "true or false", m[k])
        return cls(
            estimator=EstimatorOptions.from_dict(m.get("estimator", {})),
            prune=m.get("prune", True),
            reuse_infeasible=m.get("reuse_infeasible", True),
            reuse_verdicts=m.get("reuse_verdicts", True),
            max_replicas=as_int(m.get("max_replicas", 1024), "max_replicas", minimum=1),
            escape=m.get("escape", True),
            escape_cost_factor=as_float(
                m.get("escape_cost_factor", 3.0), "escape_cost_factor", lo=1.0
            ),
            escape_rounds=as_int(m.get("escape_rounds", 3), "escape_rounds", minimum=0),
            escape_budget=as_float(m.get("escape_budget", 1.0), "escape_budget", nonneg=True),
            widen=m.get("widen", True),
            batch_wait=m.get("batch_wait", False),
            rate_margin=check_rate_margin(m.get("rate_margin", AUTO_MARGIN)),
            inventory=as_mapping(m.get("inventory", {}), "inventory"),
            replica_units=as_mapping(m.get("replica_units", {}), "replica_units"),
            gpu_host_units=as_mapping(m.get("gpu_host_units", {}), "gpu_host_units"),
            nodes=nodes_from_dicts(m.get("nodes", []), "nodes"),
            server=check_server(m.get("server")),
            refuse_late=m.get("refuse_late", True),
            drops_are_misses=m.get("drops_are_misses", True),
            early_stop=m.get("early_stop", True),
            admission=m.get("admission", False),
            admission_buffer_s=m.get("admission_buffer_s", DEFAULT_BUFFER_S),
            max_refused=m.get("max_refused"),
            screen=m.get("screen", True),
            screen_min_queries=as_int(
                m.get("screen_min_queries", 500_000), "screen_min_queries", minimum=2
            ),
            screen_margin=as_float(m.get("screen_margin", 0.5), "screen_margin", nonneg=True),
            workers=as_int(m.get("workers", 2), "workers", minimum=1),
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


ProgressFn = Callable[[PlanProgress], None]
