"""What the planners share: options, progress reports, statistics, the hardware choices of
InferLine's initialization, and the tuner's inputs written into every plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._envelope import envelope_windows
from ._estimator import EstimatorOptions
from ._hardware import HardwareCatalog
from ._pipeline import Pipeline
from ._plan import ModelConfig, TunerInputs, TunerModel
from ._profiles import Profiles
from ._trace import max_arrivals_in_window, mean_rate
from ._validate import as_float, as_int, as_mapping, no_extra_keys
from .errors import NotFoundError, ValidationError

__all__ = [
    "PlanProgress",
    "PlannerOptions",
    "PlannerStats",
    "ProgressFn",
    "fastest_hardware",
    "inventory_use",
    "over_inventory",
    "tuner_inputs",
    "usable_hardware",
]


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
    ``rate_margin``: judge every configuration on the planning trace compressed in time by
    ``1 + rate_margin`` (the same burstiness at a higher rate), so the plan keeps that much
    throughput slack over the sample. 0 (the default) is the paper's test. The sample is one
    realization: the cheapest plan for it can sit so close to saturation that another
    realization of the same process misses the SLO (``benchmarks/plan_generalization.py``).
    ``inventory``: units of each hardware kind the deployment has (``{"cpu": 16, "gpu-k80":
    2}``, what ``Backend.inventory()`` reports); a plan never uses more. Kinds not listed are
    unlimited (the paper's cloud). ``replica_units``: per model, the units of a *cpu* kind one
    replica takes (its threads, default 1); a GPU replica takes one unit. ``gpu_host_units``:
    per model, the units of the ``cpu`` kind a GPU replica of it also holds for its host side
    (the bundled runtime pins a GPU replica's threads to cores of their own; Triton's GPU
    instances hold none, the default).
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
    rate_margin: float = 0.0
    inventory: Mapping[str, int] = field(default_factory=dict)
    replica_units: Mapping[str, int] = field(default_factory=dict)
    gpu_host_units: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.estimator, EstimatorOptions):
            raise ValidationError("estimator", "EstimatorOptions", self.estimator)
        as_int(self.max_replicas, "max_replicas", minimum=1)
        as_float(self.escape_cost_factor, "escape_cost_factor", lo=1.0)
        as_int(self.escape_rounds, "escape_rounds", minimum=0)
        as_float(self.escape_budget, "escape_budget", nonneg=True)
        as_float(self.rate_margin, "rate_margin", lo=0.0, hi=10.0)
        for name, lo in (("inventory", 0), ("replica_units", 1), ("gpu_host_units", 0)):
            m = as_mapping(getattr(self, name), name)
            object.__setattr__(
                self, name, {str(k): as_int(v, f"{name}.{k}", minimum=lo) for k, v in m.items()}
            )

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
            "rate_margin": self.rate_margin,
            "inventory": dict(self.inventory),
            "replica_units": dict(self.replica_units),
            "gpu_host_units": dict(self.gpu_host_units),
        }

    @classmethod
    def from_dict(cls, d: Any) -> PlannerOptions:
        m = as_mapping(d, "planner options")
        keys = {"estimator", "prune", "reuse_infeasible", "max_replicas", "escape", "widen"}
        extra = {"escape_cost_factor", "escape_rounds", "escape_budget", "rate_margin"}
        extra |= {"inventory", "replica_units", "gpu_host_units"}
        no_extra_keys(m, keys | extra, "")
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
            rate_margin=as_float(m.get("rate_margin", 0.0), "rate_margin", lo=0.0, hi=10.0),
            inventory=as_mapping(m.get("inventory", {}), "inventory"),
            replica_units=as_mapping(m.get("replica_units", {}), "replica_units"),
            gpu_host_units=as_mapping(m.get("gpu_host_units", {}), "gpu_host_units"),
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


def replica_use(
    model: str,
    hardware: str,
    catalog: HardwareCatalog,
    replica_units: Mapping[str, int] | None = None,
    gpu_host_units: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Units of each kind one replica of ``model`` on ``hardware`` takes: on a CPU kind its
    ``replica_units`` (threads, default 1); on a GPU one, plus its ``gpu_host_units`` of
    ``cpu`` when it has any."""
    if catalog[hardware].kind == "cpu":
        return {hardware: (replica_units or {}).get(model, 1)}
    use = {hardware: 1}
    host = (gpu_host_units or {}).get(model, 0)
    if host:
        use["cpu"] = host
    return use


def inventory_use(
    configs: Mapping[str, ModelConfig],
    catalog: HardwareCatalog,
    replica_units: Mapping[str, int] | None = None,
    gpu_host_units: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Units of each hardware kind ``configs`` take (:func:`replica_use` times replicas)."""
    use: dict[str, int] = {}
    for m, c in configs.items():
        for h, n in replica_use(m, c.hardware, catalog, replica_units, gpu_host_units).items():
            use[h] = use.get(h, 0) + c.replicas * n
    return use


def over_inventory(
    configs: Mapping[str, ModelConfig], catalog: HardwareCatalog, options: PlannerOptions
) -> str | None:
    """What ``configs`` need beyond ``options.inventory`` ("cpu: 6 > 4"), or None if they fit."""
    use = inventory_use(configs, catalog, options.replica_units, options.gpu_host_units)
    over = [
        f"{h}: {use[h]} > {n}" for h, n in sorted(options.inventory.items()) if use.get(h, 0) > n
    ]
    return ", ".join(over) or None


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
