"""The coarse-grained AutoScale baseline (Gandhi et al., TOCS 2012), as InferLine §6 uses it.

InferLine compares its tuner with coarse-grained pipelines (CG-Mean/CG-Peak plans: the whole
pipeline profiled as one black box and replicated as a unit) scaled by AutoScale's algorithm.
Our reading of AutoScale, applied to pipeline *units* instead of servers:

- **Packing factor** ``p``: the number of requests one server (here: one pipeline unit) holds
  at once when it runs at the highest load that still meets the latency objective. AutoScale
  measures it offline under load; :func:`packing_factor` measures it in the estimator (highest
  rate meeting the SLO percentile, then ``p`` = requests in system by Little's law).
- **Scale up** on the number of requests in the system (queued plus in service, the signal
  AutoScale prefers to the arrival rate because it reflects the load actually present): the
  required count is ``k = ceil(n_sys / p)``; when it exceeds the units on or starting, the
  difference is started at once (it serves after the activation delay).
- **Scale down** with a timer per unit: AutoScale routes to the lowest-index server with room
  (packing), so high-index servers go idle first; an idle server waits ``t_wait`` before it is
  turned off and is kept if work reaches it meanwhile. Here unit ``i`` counts as idle while
  ``i > ceil(n_sys / p)`` (what index-based packing would leave it with); units are removed
  from the top once their timer has run for ``t_wait_s``. Default ``t_wait_s = 15 s``, the same
  as the InferLine tuner's stabilization delay, so neither side gets a longer memory.

The decision rule is pure (state in, decision and new state out, clock injected);
:class:`AutoScaleController` runs it in the estimator's control loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import numpy as np
import numpy.typing as npt

from .._hardware import DEFAULT_CATALOG, HardwareCatalog
from .._pipeline import Pipeline
from .._plan import ModelConfig, Plan
from .._profiles import Profiles
from .._trace import gamma_trace
from .._validate import as_float, as_int, as_list, as_mapping, as_str, no_extra_keys, req
from ..errors import ValidationError
from ..estimator import EstimatorOptions, SystemState, simulate

__all__ = [
    "AutoScaleConfig",
    "AutoScaleController",
    "AutoScaleDecision",
    "AutoScalePolicy",
    "AutoScaleState",
    "packing_factor",
    "pipeline_unit",
]


@dataclass(frozen=True)
class AutoScaleConfig:
    packing_factor: float  # requests in system one pipeline unit holds within the SLO
    t_wait_s: float = 15.0
    interval_s: float = 0.1
    min_units: int = 1

    def __post_init__(self) -> None:
        as_float(self.packing_factor, "packing_factor", positive=True)
        as_float(self.t_wait_s, "t_wait_s", nonneg=True)
        as_float(self.interval_s, "interval_s", positive=True)
        as_int(self.min_units, "min_units", minimum=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "packing_factor": self.packing_factor,
            "t_wait_s": self.t_wait_s,
            "interval_s": self.interval_s,
            "min_units": self.min_units,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "autoscale") -> AutoScaleConfig:
        m = as_mapping(d, where)
        no_extra_keys(m, {"packing_factor", "t_wait_s", "interval_s", "min_units"}, where)
        return cls(
            packing_factor=as_float(
                req(m, "packing_factor", where), f"{where}.packing_factor", positive=True
            ),
            t_wait_s=as_float(m.get("t_wait_s", 15.0), f"{where}.t_wait_s", nonneg=True),
            interval_s=as_float(m.get("interval_s", 0.1), f"{where}.interval_s", positive=True),
            min_units=as_int(m.get("min_units", 1), f"{where}.min_units", minimum=1),
        )


@dataclass(frozen=True)
class AutoScaleState:
    """``idle_since[i]``: since when unit ``i + 1`` has been idle (None: busy)."""

    units: int
    idle_since: tuple[float | None, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"units": self.units, "idle_since": list(self.idle_since)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "autoscale_state") -> AutoScaleState:
        m = as_mapping(d, where)
        no_extra_keys(m, {"units", "idle_since"}, where)
        idle = tuple(
            None if v is None else as_float(v, f"{where}.idle_since[{i}]")
            for i, v in enumerate(as_list(m.get("idle_since", []), f"{where}.idle_since"))
        )
        return cls(as_int(req(m, "units", where), f"{where}.units", minimum=0), idle)


@dataclass(frozen=True)
class AutoScaleDecision:
    time_s: float
    units: int
    replicas: Mapping[str, int]
    reason: str
    in_system: int
    action: str = "up"

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "units": self.units,
            "replicas": dict(self.replicas),
            "reason": self.reason,
            "in_system": self.in_system,
            "action": self.action,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "decision") -> AutoScaleDecision:
        m = as_mapping(d, where)
        no_extra_keys(m, set(cls.__dataclass_fields__), where)
        return cls(
            time_s=as_float(req(m, "time_s", where), f"{where}.time_s"),
            units=as_int(req(m, "units", where), f"{where}.units", minimum=0),
            replicas={
                as_str(k, f"{where}.replicas"): as_int(v, f"{where}.replicas.{k}", minimum=0)
                for k, v in as_mapping(req(m, "replicas", where), f"{where}.replicas").items()
            },
            reason=as_str(req(m, "reason", where), f"{where}.reason"),
            in_system=as_int(req(m, "in_system", where), f"{where}.in_system", minimum=0),
            action=as_str(m.get("action", "up"), f"{where}.action"),
        )


def pipeline_unit(models: Mapping[str, ModelConfig]) -> tuple[dict[str, int], int]:
    """Split a coarse-grained configuration into ``(replicas per unit, units)``.

    The unit is the configuration divided by the greatest common divisor of the counts (one
    replica of each model when all counts are equal, as in a CG plan).
    """
    counts = [c.replicas for c in models.values()]
    if not counts or min(counts) < 1:
        raise ValidationError("plan.models", "at least one replica of every model", counts)
    units = reduce(math.gcd, counts)
    return {m: c.replicas // units for m, c in models.items()}, units


def packing_factor(
    pipeline: Pipeline,
    unit: Mapping[str, ModelConfig],
    profiles: Profiles,
    slo_s: float,
    *,
    percentile: float = 99.0,
    cv: float = 1.0,
    duration_s: float = 60.0,
    seed: int = 0,
    options: EstimatorOptions = EstimatorOptions(),  # noqa: B008 (frozen)
    catalog: HardwareCatalog = DEFAULT_CATALOG,
) -> float:
    """Requests in the system of one unit at the highest load it serves within the SLO.

    AutoScale profiles a server under increasing load and takes the concurrency at which the
    response-time target is just met. Here: bisection on the arrival rate of a gamma process
    (``cv``) through one unit, keeping the highest rate whose ``percentile`` latency meets
    ``slo_s``; ``p`` is then the mean number of queries in the system at that rate (Little's
    law: rate x mean latency).
    """
    as_float(slo_s, "slo_s", positive=True)
    opts = replace(options, activation_delay_s=0.0)
    # No unit can go faster than its slowest model's full-batch throughput.
    cap = min(
        profiles.throughput(m, c.hardware, c.max_batch_size) * c.replicas / pipeline.calls(m)
        for m, c in unit.items()
    )

    def run(rate: float) -> tuple[bool, float]:
        rng = np.random.default_rng(seed)
        arr = gamma_trace(rate, cv, duration_s, rng)
        r = simulate(pipeline, unit, profiles, arr, options=opts, catalog=catalog)
        lat = r.latencies_s
        ok = bool(np.all(np.isfinite(lat)) and r.percentile(percentile) <= slo_s)
        return ok, float(rate * np.mean(lat)) if np.all(np.isfinite(lat)) else math.inf

    lo, hi = 0.0, cap
    best = 1.0
    for _ in range(14):
        mid = (lo + hi) / 2
        ok, n_sys = run(mid)
        if ok:
            lo, best = mid, n_sys
        else:
            hi = mid
    return max(1.0, best)


class AutoScalePolicy:
    """AutoScale's rule over whole-pipeline units (pure)."""

    def __init__(self, unit: Mapping[str, int], initial_units: int, config: AutoScaleConfig):
        if not unit or min(unit.values()) < 1:
            raise ValidationError("unit", "at least one replica of every model", dict(unit))
        self.unit = {m: int(n) for m, n in unit.items()}
        self.initial_units = as_int(initial_units, "initial_units", minimum=1)
        self.config = config

    @classmethod
    def from_plan(cls, plan: Plan, config: AutoScaleConfig) -> AutoScalePolicy:
        unit, units = pipeline_unit(plan.models)
        return cls(unit, units, config)

    def replicas(self, units: int) -> dict[str, int]:
        return {m: n * units for m, n in self.unit.items()}

    def initial_state(self) -> AutoScaleState:
        return AutoScaleState(self.initial_units, (None,) * self.initial_units)

    def step(
        self, state: AutoScaleState, now_s: float, in_system: int
    ) -> tuple[AutoScaleState, AutoScaleDecision | None]:
        cfg = self.config
        need = max(cfg.min_units, math.ceil(in_system / cfg.packing_factor))
        k = state.units
        if need > k:
            reason = (
                f"scale up: {in_system} requests in the system need ceil({in_system}/"
                f"{cfg.packing_factor:g}) = {need} units > {k}"
            )
            new = AutoScaleState(need, (None,) * need)
            return new, AutoScaleDecision(
                float(now_s), need, self.replicas(need), reason, int(in_system), "up"
            )
        # Units above ``need`` sit idle under index-based packing; their timers run.
        idle = tuple(
            None if i < need else (t if t is not None else float(now_s))
            for i, t in enumerate(state.idle_since)
        )
        keep = k
        while keep > need and idle[keep - 1] is not None and now_s - idle[keep - 1] >= cfg.t_wait_s:  # type: ignore[operator]
            keep -= 1
        if keep < k:
            reason = (
                f"scale down: units {keep + 1}..{k} idle for {cfg.t_wait_s:g} s "
                f"({in_system} requests in the system need {need})"
            )
            new = AutoScaleState(keep, idle[:keep])
            return new, AutoScaleDecision(
                float(now_s), keep, self.replicas(keep), reason, int(in_system), "down"
            )
        return AutoScaleState(k, idle), None


class AutoScaleController:
    """AutoScale as the estimator's in-the-loop controller (``simulate(..., controller=)``)."""

    def __init__(self, plan: Plan, config: AutoScaleConfig) -> None:
        self.interval_s = config.interval_s
        self.policy = AutoScalePolicy.from_plan(plan, config)
        self.state = self.policy.initial_state()
        self.decisions: list[AutoScaleDecision] = []

    def observe(
        self, now_s: float, new_arrivals: npt.NDArray[np.float64], state: SystemState
    ) -> dict[str, int] | None:
        self.state, d = self.policy.step(self.state, now_s, int(state.in_system))
        if d is None:
            return None
        self.decisions.append(d)
        return dict(d.replicas)
