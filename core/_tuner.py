"""The high-frequency tuner (InferLine §5): per-model replica scaling from traffic envelopes.

Reading of the paper, and the choices made where it is silent:

- **Detection.** The planner hands over the envelope of the planning trace (max arrivals per
  window, windows from the service time doubling to 60 s). The tuner maintains the envelope of
  the live traffic (:class:`~inferline.core.OnlineEnvelope`) and, at every tick, looks at the
  windows that *ended since the previous tick*. A window whose count is above the planned count
  for its size means the pipeline is under-provisioned at that time scale.
- **Scale up.** Among the windows above the plan, take the largest rate ``λ`` and give every
  model at least ``ceil(λ · s_m / (μ_m · ρ_m))`` replicas; counts only grow here. Which rate an
  exceeding window stands for is the one choice made differently from the paper by default:

  * ``up_rate="window"`` (the paper's literal rule): the window's own rate ``count / window``.
    The largest such rate nearly always comes from the shortest exceeding window, a *burst*
    rate (2-3x the mean at the service-time window even for Poisson traffic), while ``ρ_m`` was
    computed at the *mean* planned rate; so any short-window excess provisions the whole
    pipeline for the burst rate as if it were sustained (17 replicas for a 4x burst in the live
    test, about 2x the cost of the alternative in ``benchmarks/paper_tuner.py`` at equal miss
    rates).
  * ``up_rate="scaled"`` (default): the planned mean rate times the excess ratio of the
    window, ``λ_plan · count / planned_count``. The plan was shown to meet the SLO for the
    planned envelope; growing every capacity by the factor the envelope grew at some time scale
    keeps the plan's slack at that scale. For long windows both rules agree.
  * ``up_rate="curve"``: the earlier InferLine paper's description (fit a service curve to the
    arrival curve so the largest horizontal deviation, the queueing delay, stays as planned):
    per model, the rate ``max_w count(w) / (w + D_m)`` with ``D_m`` the planned envelope's
    deviation from the planned capacity. Cheapest, but it keeps no stochastic slack and missed
    the SLO more often in the benchmark.
- **Scale down.** Only when no change happened for ``stabilization_delay_s`` (15 s, three times
  the 5 s activation time). The rate is the largest 5 s-window count over the last 30 s divided
  by 5, and every model uses the smallest ``ρ`` of the pipeline (more replicas, conservative).
  Counts only shrink here, and never below (a) what the scale-up rule asks for the exceeding
  rates seen in the same 30 s, so a scale-down is never undone by the next tick, nor (b) the
  planned counts (``floor="plan"``, the default): the trigger compares with the *planned*
  envelope, which is only a valid reference while the configuration is at least the planned
  one; a lasting drop below the planning workload is the planner's job (re-plan), as the paper
  says. ``floor="one"`` allows scaling below the plan (down to one replica per model).
  Optional cap (``down_cap="plan"``; default ``"none"``, the issue's literal rule): while the
  largest ``down_window_s`` count of the horizon is within the planned envelope at that window,
  the rate asks no more than the plan. The plan's ``ρ_m`` differ (integer replica counts:
  0.49-0.92 in the benchmark plans), so ``ρ_min`` asks ``ceil(k_m ρ_m / ρ_min) > k_m``
  replicas even at the planned workload, and the 5 s peak rate is above the mean for it too:
  under the literal rule a scale-up is never fully undone while the traffic stays at the
  planned workload. The cap fixes that (1-19% lower mean cost in the benchmark) but then the
  10 s ramp starts from the bare plan and misses 5-7% (docs/tuner.md), so it is not default.
- **Ladder** (``reconfigure="ladder"``, the default when the plan has one; an extension).
  The paper's tuner changes replica counts only; the plan's ``tuner.ladder``
  (:mod:`inferline.core._ladder`) holds re-plans of the planned hardware for higher rates, and
  the tuner provisions a rate plus a headroom (``headroom`` x the plan's mean rate, or x
  ``headroom_rate_share`` of the rate far above the plan; ``headroom_basis``) with the
  cheapest step proven for it (``headroom`` 0.20: the measured rate lags and jumps within an activation time; the plan's
  ``rho`` plays this part for replica-only scaling): batch sizes change with the replicas (a
  batch size at once, so a scale-up never shrinks one). A trigger leaves the current
  configuration only once its room over the rate is below ``headroom - hysteresis`` (0.15),
  so a level rate at a step's boundary does not flap it. What starts a scale-up is the paper's
  trigger (a window above the planned envelope) or, with ``trigger="room"``, also a
  configuration whose room over the last 30 s of traffic is below that band inside the
  envelope (the plan may have almost none). Scale-down picks the step for the
  largest count of every window up to ``down_horizon_s`` over that horizon, each read as the
  planned rate scaled by its excess (the scale-up rule), and moves the configuration to it
  exactly (``down_to="step"``, the default), adding the replicas a model is short of: after
  the stabilization delay that also leaves a configuration without the headroom's room, the
  plan included (a delayed room trigger). ``down_to="saving"`` moves a model only where that
  saves a replica, and one that keeps its count takes the step's batch size (a step is
  proven at its own batch sizes, not at larger ones). ``settle_s`` (5 s, the activation
  time) after any change, the batch sizes settle on those of the step proven for the most
  traffic whose replicas the configuration holds (a scale-up raises batch sizes at once,
  its replicas serve later). So the tuner goes back to the plan only once the last 30 s fit
  the plan's envelope with the headroom at every time scale, not only at 5 s (the paper's scale-down
  window; an earlier version used it alone, plus the exceeding rates of the last 30 s).
  ``rho_min`` is not applied on top (the steps are estimator-proven configurations, not the
  proportional rule it makes conservative). ``lookahead_s`` (10 s)
  provisions a rising rate where it will be when new replicas serve: the rise of the
  ``down_window_s`` rate over the last window, extrapolated; after the stabilization delay
  it holds a configuration and sizes a move up but does not start one
  (``step_lookahead="hold"``): the measured rate must ask for the move, since a step change
  of the rate reads as a rise for one window's time. Replica-only scaling
  (``reconfigure="replicas"``) is the paper's tuner; ``down_rate="window"`` with it is the
  paper's literal scale-down (the default ``down_rate`` is ``"scaled"``: the 5 s peak over the
  planned envelope, so traffic at the planned workload asks for the plan).
- **Clock.** Pure: :meth:`TunerPolicy.step` takes the state, the time and the per-window peaks
  and returns the new state and the decision (or ``None``). :class:`Tuner` bundles a policy, its
  online envelope and its state for a caller that feeds arrival times and a clock.

Every decision carries its reason (which window, which rate) for logs and metrics.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._envelope import MAX_ENVELOPE_WINDOW_S, OnlineEnvelope
from ._plan import ModelConfig, Plan, TunerInputs
from ._validate import as_float, as_int, as_list, as_mapping, as_str, no_extra_keys, req
from .errors import ValidationError

__all__ = [
    "InferLineController",
    "Tuner",
    "TunerConfig",
    "TunerDecision",
    "TunerPolicy",
    "TunerState",
]

# Replica counts are ceilings of ratios that are integers at the planned rate; the slack keeps
# float noise (2.0000000001) from adding a replica.
_EPS = 1e-9
Floor = Literal["plan", "one"]
UpRate = Literal["window", "scaled", "curve"]
DownRate = Literal["window", "scaled"]  # a service curve is a scale-up rule only
DownRho = Literal["min", "model"]
DownCap = Literal["plan", "none"]
Reconfigure = Literal["ladder", "replicas"]
Trigger = Literal["room", "envelope"]
DownTo = Literal["saving", "step"]
StepLookahead = Literal["hold", "move"]
HeadroomBasis = Literal["rate", "plan"]


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


@dataclass(frozen=True)
class TunerConfig:
    """Knobs of the tuner (module doc). The paper's tuner is ``reconfigure="replicas"`` with
    ``up_rate="window"`` and ``down_rate="window"``; the defaults add the ladder and the
    extensions commented below."""

    stabilization_delay_s: float = 15.0
    down_horizon_s: float = 30.0
    down_window_s: float = 5.0
    max_window_s: float = MAX_ENVELOPE_WINDOW_S
    interval_s: float = 0.1  # how often a driver calls the tuner (simulation and live)
    resolution_s: float | None = 0.001  # arrival times snapped to this grid (bounds memory)
    floor: Floor = "plan"
    up_rate: UpRate = "scaled"  # "window" is the paper's literal rule (see _rate)
    down_rate: DownRate = "scaled"  # "window" is the paper's literal rule (see _down_rate)
    down_rho: DownRho = "min"
    # exceeding rates remembered against scale-down (0: none); replica-only scaling (a ladder
    # remembers every window's counts over down_horizon_s instead)
    keep_horizon_s: float = 30.0
    margin_sigmas: float = 0.0  # trigger only above planned + margin * sqrt(planned)
    # Scale-down: the rate's need is capped at the plan while the largest down_window_s count of
    # the horizon is within the planned envelope ("plan"), or not ("none", the literal rule).
    down_cap: DownCap = "none"
    # "ladder": configurations from the plan's ladder (batch sizes and replicas, see
    # core/_ladder.py) when it has one; "replicas": the paper's replica-only scaling.
    reconfigure: Reconfigure = "ladder"
    # Ladder: provision for the rate expected this far ahead (the rise of the down_window_s
    # rate over the last down_window_s, extrapolated); new replicas serve only after their
    # activation time, so a rising rate must be met where it will be, not where it was.
    lookahead_s: float = 10.0
    # Ladder: provision rate + headroom x basis (see headroom_basis). Steps are proven up to
    # their capacity, so a configuration chosen for exactly the measured rate has no room for
    # what the measurement lags behind; the paper's rho plays this part for replica-only scaling.
    headroom: float = 0.20
    # Ladder: a scale-up leaves the current configuration only when its headroom over the
    # rate falls below ``headroom - hysteresis`` (and then takes a step with the full
    # ``headroom``): the band keeps the rate's noise at a step's boundary from flapping the
    # configuration up and down (each flap pays a replica's activation for nothing).
    hysteresis: float = 0.05
    # Ladder: what starts a scale-up. "envelope" (default, the paper's): a window above the
    # planned envelope. "room": that, or the configuration's room over the traffic of the last
    # down_horizon_s (every window, as scale-down reads it, plus the look-ahead) below
    # ``headroom - hysteresis``. The plan is the cheapest configuration proven for the sample
    # and may have almost no room over it, so a rise overloads it before a window exceeds the
    # planned envelope; "room" leaves such a plan at once, at about 3% more mean cost in the
    # benchmark (1.032x against 1.002x the oracle's; docs/tuner.md).
    trigger: Trigger = "envelope"
    # Ladder: this long after the last change (the replica activation time) every model takes
    # the batch size of a step its replicas hold that is proven for the traffic ("settle"
    # decisions). A step is proven at its batch sizes: the same replicas at larger batches
    # form longer batches and have a higher tail (social-media azure-conv seed 4 missed 3.2%
    # for 70 s on a step's replicas with a higher step's batch sizes, 0.07% with its own).
    # None: batch sizes only change with replicas, larger ones kept (the earlier behaviour).
    settle_s: float | None = 5.0
    # Ladder: what a scale-down moves to. "step" (default): the configuration becomes the
    # step for the last down_horizon_s exactly, a model short of the step's replicas gets them,
    # so after the stabilization delay the tuner also leaves a configuration with less room
    # than the headroom (a delayed room trigger). Without it the plan, which may have almost
    # no room over the planned workload, is only left once a window exceeds the planned
    # envelope: ramps met from the plan missed >1% in 10 of 30 benchmark cells, 1 with it,
    # for about 2% more mean cost (4% when it became the default; docs/tuner.md). "saving":
    # a model takes the step's count only where that saves a replica.
    down_to: DownTo = "step"
    # Ladder: what the look-ahead does after the stabilization delay. "hold": it keeps a
    # configuration from being scaled down while the rate rises, and it sizes a move up, but
    # the measured rate (without it) must ask for the move, as a trigger's window must for a
    # scale-up; a rise that lasts soon does one or the other. A step change of the
    # rate (the minute-shaped traces change every 30 s) reads as a rise for one window's time,
    # and with "move" (the earlier behaviour) each such rise moved the configuration up for a
    # stabilization delay and back (docs/tuner.md).
    step_lookahead: StepLookahead = "hold"
    # Ladder: what the headroom is a share of. "plan" (default): the plan's mean rate, so a
    # configuration is chosen for rate + headroom x planned rate: the room is for what arrives
    # while the measurement lags and replicas activate, a number of queries per second that
    # does not grow with the level. "rate" (the earlier rule): (1 + headroom) x the rate, which
    # at a 250 q/s peak planned at 150 asked 50 q/s of room, crossed a GPU step and cost more
    # than the oracle in 26 of 30 rate cells (docs/tuner.md).
    headroom_basis: HeadroomBasis = "plan"
    # Ladder, headroom_basis="plan": far above the planned rate the room is a share of the rate
    # again, headroom x max(planned rate, headroom_rate_share x rate) (0.6: from 1.67x the
    # planned rate on, 12% of the rate at headroom 0.2). The scaled rate reads a level far above
    # the plan low (the planned envelope's burst margin, a share of each count, is read as
    # rate: 150 q/s as 142-145 q/s on a plan for 60), and a step proven for 6% more than the
    # traffic missed 1% of a 60 s hold there (benchmarks/variant_tuner.py). 0: the plan alone.
    headroom_rate_share: float = 0.6

    def __post_init__(self) -> None:
        as_float(self.stabilization_delay_s, "stabilization_delay_s", nonneg=True)
        as_float(self.down_horizon_s, "down_horizon_s", positive=True)
        as_float(self.down_window_s, "down_window_s", positive=True)
        as_float(self.max_window_s, "max_window_s", positive=True)
        as_float(self.interval_s, "interval_s", positive=True)
        if self.resolution_s is not None:
            as_float(self.resolution_s, "resolution_s", positive=True)
        if self.settle_s is not None:
            as_float(self.settle_s, "settle_s", nonneg=True)
        if self.floor not in ("plan", "one"):
            raise ValidationError("floor", "'plan' or 'one'", self.floor)
        if self.up_rate not in ("window", "scaled", "curve"):
            raise ValidationError("up_rate", "'window', 'scaled' or 'curve'", self.up_rate)
        if self.down_rate not in ("window", "scaled"):
            raise ValidationError("down_rate", "'window' or 'scaled'", self.down_rate)
        if self.down_rho not in ("min", "model"):
            raise ValidationError("down_rho", "'min' or 'model'", self.down_rho)
        as_float(self.keep_horizon_s, "keep_horizon_s", nonneg=True)
        as_float(self.margin_sigmas, "margin_sigmas", nonneg=True)
        as_float(self.lookahead_s, "lookahead_s", nonneg=True)
        as_float(self.headroom, "headroom", nonneg=True)
        as_float(self.hysteresis, "hysteresis", nonneg=True)
        as_float(self.headroom_rate_share, "headroom_rate_share", nonneg=True)
        if self.down_cap not in ("plan", "none"):
            raise ValidationError("down_cap", "'plan' or 'none'", self.down_cap)
        if self.reconfigure not in ("ladder", "replicas"):
            raise ValidationError("reconfigure", "'ladder' or 'replicas'", self.reconfigure)
        if self.trigger not in ("room", "envelope"):
            raise ValidationError("trigger", "'room' or 'envelope'", self.trigger)
        if self.step_lookahead not in ("hold", "move"):
            raise ValidationError("step_lookahead", "'hold' or 'move'", self.step_lookahead)
        if self.headroom_basis not in ("rate", "plan"):
            raise ValidationError("headroom_basis", "'rate' or 'plan'", self.headroom_basis)
        if self.down_to not in ("saving", "step"):
            raise ValidationError("down_to", "'saving' or 'step'", self.down_to)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stabilization_delay_s": self.stabilization_delay_s,
            "down_horizon_s": self.down_horizon_s,
            "down_window_s": self.down_window_s,
            "max_window_s": self.max_window_s,
            "interval_s": self.interval_s,
            "resolution_s": self.resolution_s,
            "floor": self.floor,
            "up_rate": self.up_rate,
            "down_rate": self.down_rate,
            "down_rho": self.down_rho,
            "keep_horizon_s": self.keep_horizon_s,
            "margin_sigmas": self.margin_sigmas,
            "down_cap": self.down_cap,
            "reconfigure": self.reconfigure,
            "lookahead_s": self.lookahead_s,
            "headroom": self.headroom,
            "hysteresis": self.hysteresis,
            "trigger": self.trigger,
            "settle_s": self.settle_s,
            "down_to": self.down_to,
            "step_lookahead": self.step_lookahead,
            "headroom_basis": self.headroom_basis,
            "headroom_rate_share": self.headroom_rate_share,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuner_config") -> TunerConfig:
        m = as_mapping(d, where)
        keys = {f for f in cls.__dataclass_fields__}
        no_extra_keys(m, keys, where)
        kw: dict[str, Any] = {}
        strs = {
            "floor",
            "up_rate",
            "down_rate",
            "down_rho",
            "down_cap",
            "reconfigure",
            "trigger",
            "down_to",
            "step_lookahead",
            "headroom_basis",
        }
        for k in keys - strs - {"resolution_s", "settle_s"}:
            if k in m:
                kw[k] = as_float(m[k], f"{where}.{k}", nonneg=True)
        if m.get("resolution_s") is not None:
            kw["resolution_s"] = as_float(m["resolution_s"], f"{where}.resolution_s", positive=True)
        elif "resolution_s" in m:
            kw["resolution_s"] = None
        if m.get("settle_s") is not None:
            kw["settle_s"] = as_float(m["settle_s"], f"{where}.settle_s", nonneg=True)
        elif "settle_s" in m:
            kw["settle_s"] = None
        for k in strs:
            if k in m:
                kw[k] = as_str(m[k], f"{where}.{k}")
        return cls(**kw)


@dataclass(frozen=True)
class TunerDecision:
    """A change of replica counts and why it was made."""

    time_s: float
    replicas: Mapping[str, int]  # the new absolute count of every model
    reason: str
    window_s: float  # the window whose rate drove the decision
    rate_qps: float  # that rate
    action: Literal["up", "down", "settle"] = "up"
    # the new max batch size of every model when the tuner manages them (ladder), else empty
    batch: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "replicas": dict(self.replicas),
            "reason": self.reason,
            "window_s": self.window_s,
            "rate_qps": self.rate_qps,
            "action": self.action,
            "batch": dict(self.batch),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "decision") -> TunerDecision:
        m = as_mapping(d, where)
        no_extra_keys(
            m, {"time_s", "replicas", "reason", "window_s", "rate_qps", "action", "batch"}, where
        )
        action = as_str(m.get("action", "up"), f"{where}.action")
        if action not in ("up", "down", "settle"):
            raise ValidationError(f"{where}.action", "'up', 'down' or 'settle'", action)
        return cls(
            time_s=as_float(req(m, "time_s", where), f"{where}.time_s"),
            replicas={
                as_str(k, f"{where}.replicas"): as_int(v, f"{where}.replicas.{k}", minimum=0)
                for k, v in as_mapping(req(m, "replicas", where), f"{where}.replicas").items()
            },
            reason=as_str(req(m, "reason", where), f"{where}.reason"),
            window_s=as_float(req(m, "window_s", where), f"{where}.window_s", nonneg=True),
            rate_qps=as_float(req(m, "rate_qps", where), f"{where}.rate_qps", nonneg=True),
            action=action,  # type: ignore[arg-type]
            batch=_counts(m.get("batch", {}), f"{where}.batch", 1),
        )


@dataclass(frozen=True)
class TunerState:
    """What the tuner remembers between ticks.

    ``down_peaks``: ``(time_s, count)`` of the largest ``down_window_s`` counts of the last
    ``down_horizon_s`` seconds, as a skyline (each entry larger than every later one, so the
    first is the maximum and each tick does amortized constant work). ``up_peaks``: the same
    for the rates that exceeded the plan over the last ``keep_horizon_s`` seconds.
    """

    replicas: Mapping[str, int]
    last_change_s: float
    down_peaks: tuple[tuple[float, float], ...] = ()
    up_peaks: tuple[tuple[float, float], ...] = ()
    batch: Mapping[str, int] = field(default_factory=dict)  # current max batch sizes (ladder)
    # (time_s, count) of the down_window_s window at each tick of the last down_window_s
    trend: tuple[tuple[float, float], ...] = ()
    started_s: float | None = None  # when the tuner started watching (its windows fill up)
    # Ladder: per planning window, the skyline of its counts over the last down_horizon_s
    recent: tuple[tuple[tuple[float, float], ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": dict(self.replicas),
            "last_change_s": self.last_change_s,
            "down_peaks": [list(h) for h in self.down_peaks],
            "up_peaks": [list(h) for h in self.up_peaks],
            "batch": dict(self.batch),
            "trend": [list(h) for h in self.trend],
            "started_s": self.started_s,
            "recent": [[list(h) for h in r] for r in self.recent],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "tuner_state") -> TunerState:
        m = as_mapping(d, where)
        keys = {
            "replicas",
            "last_change_s",
            "down_peaks",
            "up_peaks",
            "batch",
            "trend",
            "started_s",
            "recent",
        }
        no_extra_keys(m, keys, where)

        def pairs(d: Any, at: str) -> tuple[tuple[float, float], ...]:
            out = []
            for i, h in enumerate(as_list(d, at)):
                h = as_list(h, f"{at}[{i}]")
                if len(h) != 2:
                    raise ValidationError(f"{at}[{i}]", "a pair [time_s, value]", h)
                out.append(
                    (as_float(h[0], f"{at}[{i}][0]"), as_float(h[1], f"{at}[{i}][1]", nonneg=True))
                )
            return tuple(out)

        def peaks(key: str) -> tuple[tuple[float, float], ...]:
            return pairs(m.get(key, []), f"{where}.{key}")

        return cls(
            replicas={
                as_str(k, f"{where}.replicas"): as_int(v, f"{where}.replicas.{k}", minimum=0)
                for k, v in as_mapping(req(m, "replicas", where), f"{where}.replicas").items()
            },
            last_change_s=as_float(req(m, "last_change_s", where), f"{where}.last_change_s"),
            down_peaks=peaks("down_peaks"),
            up_peaks=peaks("up_peaks"),
            batch=_counts(m.get("batch", {}), f"{where}.batch", 1),
            trend=peaks("trend"),
            started_s=(
                as_float(m["started_s"], f"{where}.started_s")
                if m.get("started_s") is not None
                else None
            ),
            recent=tuple(
                pairs(r, f"{where}.recent[{i}]")
                for i, r in enumerate(as_list(m.get("recent", []), f"{where}.recent"))
            ),
        )


def _counts(d: Any, where: str, minimum: int) -> dict[str, int]:
    return {
        as_str(k, where): as_int(v, f"{where}.{k}", minimum=minimum)
        for k, v in as_mapping(d, where).items()
    }


def _push(
    peaks: tuple[tuple[float, float], ...], now_s: float, value: float, horizon_s: float
) -> tuple[tuple[float, float], ...]:
    """Sliding maximum: drop entries older than the horizon and those ``value`` dominates."""
    start = now_s - horizon_s
    lo = 0
    while lo < len(peaks) and peaks[lo][0] <= start:
        lo += 1
    hi = len(peaks)
    while hi > lo and peaks[hi - 1][1] <= value:
        hi -= 1
    return (*peaks[lo:hi], (float(now_s), float(value)))


class TunerPolicy:
    """The pure decision rule. ``windows`` lists the window sizes whose peaks :meth:`step`
    expects, in order: the planning envelope's windows, then the scale-down window if it is not
    one of them."""

    def __init__(
        self,
        inputs: TunerInputs,
        planned: Mapping[str, int],
        config: TunerConfig = TunerConfig(),
        planned_batch: Mapping[str, int] | None = None,
    ) -> None:
        """``planned_batch``: the plan's max batch sizes, needed to use ``inputs.ladder``
        (without them the tuner scales replicas only)."""
        if not inputs.envelope:
            raise ValidationError("tuner.envelope", "at least one (window_s, count)", [])
        missing = sorted(set(planned) - set(inputs.models))
        if missing:
            raise ValidationError("tuner.models", f"inputs for every planned model {missing!r}", [])
        self.inputs = inputs
        self.planned = {m: int(n) for m, n in planned.items()}
        self.config = config
        env_windows = tuple(w for w, _ in inputs.envelope)
        self._planned_counts = tuple(n for _, n in inputs.envelope)
        self._n_env = len(env_windows)
        if config.down_window_s in env_windows:
            self._down_idx = env_windows.index(config.down_window_s)
            self.windows = env_windows
        else:
            self._down_idx = len(env_windows)
            self.windows = (*env_windows, config.down_window_s)
        self._rho_min = min(inputs.models[m].max_provisioning_ratio for m in self.planned)
        # Trigger thresholds: the planned counts, plus an optional noise margin.
        self._thresholds = tuple(
            n + config.margin_sigmas * math.sqrt(n) for n in self._planned_counts
        )
        self._planned_down = _interpolate(inputs.envelope, config.down_window_s)
        # Service-curve view (up_rate="curve"): per model, the capacity the plan gives it in
        # pipeline queries/s and the largest horizontal deviation (queueing delay) of the
        # planned envelope from that rate; never below the shortest window.
        w_env = np.asarray(env_windows, dtype=np.float64)
        a_env = np.asarray(self._planned_counts, dtype=np.float64)
        self._capacity: dict[str, float] = {}
        self._delay: dict[str, float] = {}
        for m, k in self.planned.items():
            t = inputs.models[m]
            cap = max(k, 1) * t.throughput_qps / t.scale_factor
            self._capacity[m] = cap
            self._delay[m] = max(float(np.max(a_env / cap - w_env)), float(w_env.min()))
        self._w_env = w_env
        # Ladder (config.reconfigure="ladder"): step 0 is the plan, then the re-plans by rate.
        self.planned_batch = {m: int(b) for m, b in (planned_batch or {}).items()}
        self._steps: list[tuple[float, dict[str, int], dict[str, int]]] | None = None
        if config.reconfigure == "ladder" and inputs.ladder and planned_batch is not None:
            missing = sorted(set(self.planned) - set(self.planned_batch))
            if missing:
                raise ValidationError("planned_batch", f"a batch size for {missing!r}", [])
            self._steps = [(inputs.mean_rate_qps, dict(self.planned), dict(self.planned_batch))]
            for st in inputs.ladder:
                if set(st.models) != set(self.planned):
                    raise ValidationError(
                        "tuner.ladder", f"steps for exactly {sorted(self.planned)!r}", st.rate_qps
                    )
                self._steps.append(
                    (
                        st.rate_qps,
                        {m: c.replicas for m, c in st.models.items()},
                        {m: c.max_batch_size for m, c in st.models.items()},
                    )
                )

    @property
    def uses_ladder(self) -> bool:
        return self._steps is not None

    @classmethod
    def from_plan(cls, plan: Plan, config: TunerConfig = TunerConfig()) -> TunerPolicy:
        if plan.tuner is None:
            raise ValidationError("plan.tuner", "tuner inputs (re-run the planner)", None)
        return cls(
            plan.tuner,
            {m: c.replicas for m, c in plan.models.items()},
            config,
            {m: c.max_batch_size for m, c in plan.models.items()},
        )

    def initial_state(self, now_s: float = 0.0) -> TunerState:
        batch = dict(self.planned_batch) if self._steps is not None else {}
        return TunerState(dict(self.planned), float(now_s), batch=batch, started_s=float(now_s))

    def target(self, rate_qps: float) -> tuple[dict[str, int], dict[str, int], int]:
        """Ladder: the configuration provisioned for ``rate_qps`` and its step index.

        The first step (by rate) whose rate is at least ``rate_qps``; above the top step, its
        counts scaled by the rate ratio (the paper's rule with the top step as the plan);
        below the plan with ``floor="one"``, the plan's counts scaled down the same way."""
        assert self._steps is not None
        for i, (r, k, b) in enumerate(self._steps):
            if rate_qps <= r * (1 + _EPS):
                if i == 0 and self.config.floor == "one":
                    return {m: max(1, _ceil(n * rate_qps / r)) for m, n in k.items()}, b, 0
                if k == self.planned and b == self.planned_batch:
                    i = 0  # the plan itself, used up to its proven capacity
                return dict(k), dict(b), i
        r, k, b = self._steps[-1]
        return {m: _ceil(n * rate_qps / r) for m, n in k.items()}, dict(b), len(self._steps) - 1

    def _step_text(self, i: int) -> str:
        assert self._steps is not None
        return "the plan" if i == 0 else f"ladder step {i} ({self._steps[i][0]:.1f} q/s)"

    def need(self, rate_qps: float, rho: float | None = None) -> dict[str, int]:
        """Replicas each model needs for ``rate_qps``: ``ceil(λ s_m / (μ_m ρ))``."""
        out = {}
        for m in self.planned:
            t = self.inputs.models[m]
            r = t.max_provisioning_ratio if rho is None else rho
            out[m] = _ceil(rate_qps * t.scale_factor / (t.throughput_qps * r))
        return out

    def need_each(self, rates: Mapping[str, float]) -> dict[str, int]:
        """Like :meth:`need` with a rate per model."""
        out = {}
        for m in self.planned:
            t = self.inputs.models[m]
            out[m] = _ceil(
                rates[m] * t.scale_factor / (t.throughput_qps * t.max_provisioning_ratio)
            )
        return out

    def _curve_rates(self, peaks: Sequence[int]) -> tuple[dict[str, float], float]:
        """``up_rate="curve"``: per model, the service rate that keeps the current envelope
        within the plan's queueing delay ``D_m`` (``max_w count(w) / (w + D_m)``, the earlier
        InferLine paper's fitting of a service curve to the arrival curve), expressed as the
        equivalent planned rate ``λ_plan · C'_m / C_m`` so that :meth:`need_each` turns it into
        ``ceil(k_m · C'_m / C_m)`` replicas. Also returns the window that binds most often."""
        counts = np.asarray(peaks[: self._n_env], dtype=np.float64)
        out: dict[str, float] = {}
        binding = 0.0
        best = -1.0
        for m, d in self._delay.items():
            r = counts / (self._w_env + d)
            i = int(np.argmax(r))
            ratio = float(r[i]) / self._capacity[m]
            out[m] = self.inputs.mean_rate_qps * ratio
            if ratio > best:
                best, binding = ratio, float(self._w_env[i])
        return out, binding

    def _rate(self, count: int, planned_count: int, window_s: float) -> float:
        """The arrival rate an exceeding window asks to provision for.

        ``window`` (the paper): the window's own rate ``count / window_s``. ``scaled``: the
        planned mean rate times how far the envelope is exceeded at that window, ``λ_plan ·
        count / planned_count`` (a short window's rate is a burst rate, not a sustained one;
        scaling the plan by the excess keeps the plan's slack at that time scale).
        """
        if self.config.up_rate == "window":
            return count / window_s
        return self.inputs.mean_rate_qps * count / max(planned_count, 1)  # also the trigger
        # rate of "curve", replaced by the per-model rates of _curve_rates

    def _down_rate(self, count: int) -> float:
        """The scale-down rate from the largest ``down_window_s`` count of the horizon: its own
        rate (``window``, the paper) or the planned mean rate scaled by its ratio to the
        planning trace's envelope at that window (``scaled``)."""
        if self.config.down_rate == "window":
            return count / self.config.down_window_s
        return self.inputs.mean_rate_qps * count / max(self._planned_down, 1.0)

    def _down_need(
        self, down_peaks: Sequence[tuple[float, float]], up_peaks: Sequence[tuple[float, float]]
    ) -> dict[str, int]:
        """Replica-only scale-down: what each model keeps for the remembered traffic (the
        largest down-window count of the horizon, the exceeding rates of the keep horizon, the
        floor); a scale-down takes the smaller of this and the current count."""
        cfg = self.config
        down_count = int(down_peaks[0][1]) if down_peaks else 0
        rho = self._rho_min if cfg.down_rho == "min" else None
        need = self.need(self._down_rate(down_count), rho)
        # Traffic back within the planned envelope at the down window: the plan is proven
        # for it, so the rate asks no more than the plan. Without the cap, rho_min and the
        # 5 s burst rate ask more than the plan even at the planned workload itself
        # (ceil(k_m rho_m / rho_min) > k_m), and a burst is never undone.
        if cfg.down_cap == "plan" and down_count <= self._planned_down:
            need = {m: min(n, self.planned[m]) for m, n in need.items()}
        recent_up = up_peaks[0][1] if cfg.keep_horizon_s > 0 and up_peaks else 0.0
        keep = self.need(recent_up) if recent_up > 0 else {}
        floor = self.planned if cfg.floor == "plan" else dict.fromkeys(self.planned, 1)
        return {m: max(need[m], keep.get(m, 0), floor[m]) for m in self.planned}

    def traffic_need(self, state: TunerState, now_s: float) -> dict[str, int]:
        """The replicas this policy's scale-down would provision for the traffic ``state``
        remembers over its horizons (the stabilization delay aside). Whether a configuration
        still suffices for the recent traffic, over more than one tick: ``VariantTuner``
        returns to the plan's variants only when the plan's counts cover this."""
        if self._steps is None:
            return self._down_need(state.down_peaks, state.up_peaks)
        rate, _, _ = _ladder_rate(self, state.recent, state.trend, now_s)
        k, _, _ = self.target(self.room(rate, self.config.headroom))
        return k

    def within_envelope(self, state: TunerState, now_s: float, span_s: float = 1.0) -> bool:
        """No window's largest count of the last ``span_s`` (as ``state`` remembers it, with a
        ladder; one tick may see no arrival) exceeds the planned envelope: the traffic would
        trigger no scale-up now. A 60 s window holds a burst for a minute after it ends,
        longer than the scale-down's 30 s horizon."""
        start = now_s - span_s
        return all(
            max((v for t, v in r if t >= start), default=0.0) <= th
            for r, th in zip(state.recent, self._thresholds, strict=False)
        )

    def room(self, rate: float, frac: float) -> float:
        """``rate`` with ``frac`` of room: a share of the rate, or of the larger of the plan's
        mean rate and ``headroom_rate_share`` x the rate (``headroom_basis``)."""
        if self.config.headroom_basis == "plan":
            share = self.config.headroom_rate_share
            return rate + frac * max(self.inputs.mean_rate_qps, share * rate)
        return rate * (1.0 + frac)

    def step(
        self, state: TunerState, now_s: float, peaks: Sequence[int]
    ) -> tuple[TunerState, TunerDecision | None]:
        """One tick: ``peaks[i]`` is the largest count of a ``windows[i]`` window that ended
        since the previous tick."""
        if len(peaks) != len(self.windows):
            raise ValidationError("peaks", f"{len(self.windows)} counts (one per window)", peaks)
        cfg = self.config
        # The rate to provision for: the largest among the windows above the plan this tick.
        up_rate, up_window, up_count, up_planned = 0.0, 0.0, 0, 0
        for i in range(self._n_env):
            n, planned_n = int(peaks[i]), self._planned_counts[i]
            if n > self._thresholds[i]:
                w = self.windows[i]
                rate = self._rate(n, planned_n, w)
                if rate > up_rate:
                    up_rate, up_window, up_count, up_planned = rate, w, n, planned_n
        per_model: dict[str, float] | None = None
        if up_rate > 0 and cfg.up_rate == "curve":
            per_model, up_window = self._curve_rates(peaks)
            up_rate = max(per_model.values())
        down_peaks = _push(state.down_peaks, now_s, int(peaks[self._down_idx]), cfg.down_horizon_s)
        up_peaks = _push(state.up_peaks, now_s, up_rate, cfg.keep_horizon_s)
        cur = dict(state.replicas)

        if self._steps is not None:
            return _ladder_step(
                self,
                state,
                now_s,
                (up_rate, up_window, up_count, up_planned),
                peaks,
                down_peaks,
                up_peaks,
            )

        if up_rate > 0:
            need = self.need(up_rate) if per_model is None else self.need_each(per_model)
            new = {m: max(cur[m], need[m]) for m in cur}
            if new != cur:
                reason = (
                    f"scale up: {up_count} arrivals in a {up_window:g} s window "
                    f"({up_count / up_window:.1f} q/s) > planned {up_planned} "
                    f"({up_planned / up_window:.1f} q/s); provisioning for {up_rate:.1f} q/s: "
                    f"{_diff(cur, new)}"
                )
                decision = TunerDecision(float(now_s), new, reason, up_window, up_rate, "up")
                return _moved(state, now_s, new, down_peaks, up_peaks), decision

        if now_s - state.last_change_s >= cfg.stabilization_delay_s:
            down_count = int(down_peaks[0][1])
            down_rate = self._down_rate(down_count)
            within = cfg.down_cap == "plan" and down_count <= self._planned_down
            keep = self._down_need(down_peaks, up_peaks)
            new = {m: min(n, keep[m]) for m, n in cur.items()}
            if new != cur:
                reason = (
                    f"scale down: max rate over the last {cfg.down_horizon_s:g} s in "
                    f"{cfg.down_window_s:g} s windows is {down_rate:.1f} q/s "
                    f"({_rho_text(cfg.down_rho, self._rho_min)}"
                    f"{', within the planned envelope' if within else ''}), stable for "
                    f"{now_s - state.last_change_s:.1f} s: {_diff(cur, new)}"
                )
                decision = TunerDecision(
                    float(now_s), new, reason, cfg.down_window_s, down_rate, "down"
                )
                return _moved(state, now_s, new, down_peaks, up_peaks), decision

        return replace(state, down_peaks=down_peaks, up_peaks=up_peaks), None


def _ladder_step(
    self: TunerPolicy,
    state: TunerState,
    now_s: float,
    up: tuple[float, float, int, int],
    peaks: Sequence[int],
    down_peaks: tuple[tuple[float, float], ...],
    up_peaks: tuple[tuple[float, float], ...],
) -> tuple[TunerState, TunerDecision | None]:
    """:meth:`TunerPolicy.step` with a ladder: same triggers, configurations from the ladder.

    Scale-up: every model gets at least the target's replicas and batch size (a batch size
    applies at once, so never shrink one while replicas are pending). Scale-down (after the
    stabilization delay): the target for the largest count of every window up to the horizon
    over the horizon (each as the planned rate scaled by its excess): with ``down_to="step"``
    the configuration becomes that step (a model short of its replicas gets them); with
    ``"saving"`` it replaces a model's configuration only where that saves a replica. The
    ladder's configurations are estimator-proven for their rate, so the paper's extra
    conservatism (``rho_min``) is not applied on top.
    """
    cfg = self.config
    up_rate, up_window, up_count, up_planned = up
    cur = dict(state.replicas)
    cur_b = dict(state.batch) or dict(self.planned_batch)
    recent = state.recent or tuple(() for _ in range(self._n_env))
    recent = tuple(
        _push(r, now_s, float(n), cfg.down_horizon_s)
        for r, n in zip(recent, peaks[: self._n_env], strict=True)
    )
    w5 = cfg.down_window_s
    trend = state.trend
    # the window counts ramp up from zero while the tuner's first window fills: no trend yet
    warm = state.started_s is None or now_s >= state.started_s + w5
    if cfg.lookahead_s > 0 and warm:
        kept = tuple(h for h in trend if h[0] >= now_s - 2 * w5 - 1e-9)
        trend = (*kept, (float(now_s), float(down_peaks[-1][1])))
    state = replace(state, trend=trend, recent=recent)
    rise = _rise(trend, now_s, w5) if cfg.lookahead_s > 0 else 0.0
    if up_rate > 0 and rise > 0:
        # at most doubling: a step change of the rate is a steep rise for one window only
        up_rate += min(rise * cfg.lookahead_s, up_rate)
    hr, br = cfg.headroom, max(0.0, cfg.headroom - cfg.hysteresis)
    of_plan = " of the planned rate as" if cfg.headroom_basis == "plan" else ""

    def covers(rate: float) -> bool:
        """The configuration holds one proven for ``rate``: the target for it, or any step
        proven for at least it (a step above may have fewer replicas of a model than the
        target, at a larger batch)."""
        assert self._steps is not None
        k, b, _ = self.target(rate)
        configs = [(k, b)] + [(ks, bs) for r, ks, bs in self._steps if r >= rate * (1 - _EPS)]
        if cfg.settle_s is not None:  # a step holds at its own batch sizes only
            return any(
                all(cur[m] >= ks[m] and cur_b[m] == bs[m] for m in cur) for ks, bs in configs
            )
        return any(all(cur[m] >= ks[m] and cur_b[m] >= bs[m] for m in cur) for ks, bs in configs)

    def settled(rate: float) -> dict[str, int] | None:
        """The batch sizes of the configuration proven for the most traffic (at least
        ``rate``) whose replica counts the current ones hold; None when none is."""
        assert self._steps is not None
        k, b, _ = self.target(rate)
        configs = [(rate, k, b)] + [s for s in self._steps if s[0] >= rate * (1 - _EPS)]
        held = [(r, bs) for r, ks, bs in configs if all(cur[m] >= ks[m] for m in cur)]
        return dict(max(held, key=lambda x: x[0])[1]) if held else None

    rate, down_rate, j = _ladder_rate(self, recent, trend, now_s)
    if up_rate > 0:
        k, b, i = self.target(self.room(up_rate, hr))
        new = {m: max(cur[m], k[m]) for m in cur}
        new_b = {m: max(cur_b[m], b[m]) for m in cur}
        if not covers(self.room(up_rate, br)) and (new != cur or new_b != cur_b):
            ahead = (
                f" (rising {rise:.1f} q/s per s, {cfg.lookahead_s:g} s ahead)" if rise > 0 else ""
            )
            reason = (
                f"scale up: {up_count} arrivals in a {up_window:g} s window "
                f"({up_count / up_window:.1f} q/s) > planned {up_planned} "
                f"({up_planned / up_window:.1f} q/s); provisioning for {up_rate:.1f} q/s"
                f"{ahead} with {self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
            )
            d = TunerDecision(float(now_s), new, reason, up_window, up_rate, "up", new_b)
            return _moved(state, now_s, new, down_peaks, up_peaks, new_b), d
    elif cfg.trigger == "room" and rate > 0 and not covers(self.room(rate, br)):
        # Within the planned envelope, but the configuration has less room over the traffic
        # than the band (the plan itself may: it is the cheapest configuration for the sample,
        # and a rise from it overloads it before any window exceeds the planned envelope).
        k, b, i = self.target(self.room(rate, hr))
        new = {m: max(cur[m], k[m]) for m in cur}
        new_b = {m: max(cur_b[m], b[m]) for m in cur}
        if new != cur or new_b != cur_b:
            w = self.windows[j]
            reason = (
                f"scale up: the largest count of the last {cfg.down_horizon_s:g} s in {w:g} s "
                f"windows stands for {down_rate:.1f} q/s"
                + (f", rising {rise:.1f} q/s per s" if rise > 0 else "")
                + f"; less than {br:.0%}{of_plan} room for {rate:.1f} q/s: provisioning with "
                f"{self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
            )
            d = TunerDecision(float(now_s), new, reason, w, rate, "up", new_b)
            return _moved(state, now_s, new, down_peaks, up_peaks, new_b), d
    if now_s - state.last_change_s >= cfg.stabilization_delay_s:
        k, b, i = self.target(self.room(rate, hr))
        provision = rate
        if cfg.step_lookahead == "hold" and rate > down_rate and any(k[m] > cur[m] for m in cur):
            # the look-ahead sizes a move up but does not start one: a rise the measured rate
            # does not yet ask for only holds the configuration (no scale-down while rising)
            k0, _, _ = self.target(self.room(down_rate, hr))
            if all(k0[m] <= cur[m] for m in cur):
                k, b, provision, rise = dict(cur), dict(cur_b), down_rate, 0.0
        new, new_b = dict(cur), dict(cur_b)
        for m in cur:
            if k[m] < cur[m]:
                new[m], new_b[m] = k[m], b[m]
            elif cfg.down_to == "step":
                # the step exactly; a model short of its replicas gets them and keeps its
                # batch size until they serve (batch sizes settle, or the next decision)
                new[m], new_b[m] = k[m], b[m] if k[m] == cur[m] else max(cur_b[m], b[m])
            elif cfg.settle_s is not None and k[m] == cur[m]:
                # the step's batch size: the step is proven at it, not at a larger one
                new_b[m] = b[m]
            elif k[m] == cur[m]:
                # back at the plan (proven for this traffic) take its batch size; elsewhere a
                # smaller batch saves nothing and would only lower the model's capacity
                new_b[m] = b[m] if i == 0 else max(cur_b[m], b[m])
            elif i == 0:
                # fewer replicas at a larger batch than the plan: add the plan's replicas,
                # keep the batch until they serve (the next decision takes the plan's)
                new[m], new_b[m] = k[m], max(cur_b[m], b[m])
        if new != cur or new_b != cur_b:
            w = self.windows[j]
            why = (
                f"the largest count of the last {cfg.down_horizon_s:g} s in {w:g} s windows "
                f"stands for {down_rate:.1f} q/s"
            )
            if rise > 0:
                why += f", rising {rise:.1f} q/s per s ({cfg.lookahead_s:g} s ahead)"
            # a move to the step may add replicas (back at the plan, or down_to="step"); one
            # that removes none is an "up" for logs and metrics, though this rule made it
            adds = not any(new[m] < cur[m] for m in cur) and new != cur
            verb = "move up to the step" if adds else "scale down"
            reason = (
                f"{verb}: {why}, stable for {now_s - state.last_change_s:.1f} s; "
                f"{self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
            )
            action: Literal["up", "down"] = "up" if adds else "down"
            d = TunerDecision(
                float(now_s), new, reason, cfg.down_window_s, provision, action, new_b
            )
            return _moved(state, now_s, new, down_peaks, up_peaks, new_b), d
    # after a scale-down, which moves batch sizes with the replicas
    if cfg.settle_s is not None and now_s - state.last_change_s >= cfg.settle_s:
        need = self.room(max(up_rate, rate), br)
        bs = settled(need) if need > 0 else None
        if bs is not None and bs != cur_b:
            reason = (
                f"settle: {cfg.settle_s:g} s after the last change, the replicas hold a "
                f"configuration proven for {need:.1f} q/s at other batch sizes: "
                f"{_diff_config(cur, cur, cur_b, bs)}"
            )
            d = TunerDecision(float(now_s), dict(cur), reason, 0.0, need, "settle", bs)
            # a batch size is no replica change: the stabilization delay keeps running
            return replace(state, down_peaks=down_peaks, up_peaks=up_peaks, batch=bs), d
    return replace(state, down_peaks=down_peaks, up_peaks=up_peaks), None


def _ladder_rate(
    self: TunerPolicy,
    recent: Sequence[Sequence[tuple[float, float]]],
    trend: Sequence[tuple[float, float]],
    now_s: float,
) -> tuple[float, float, int]:
    """Ladder scale-down: ``(rate with the look-ahead, rate, index of the binding window)``.

    The largest count of every window up to the horizon over the horizon, as the planned
    rate scaled by its excess (the scale-up rule): the bursts of the last 30 s count as well
    as its rate. Scale-down provisions it with the headroom; while it still rises, ahead."""
    cfg = self.config
    ratios = [
        (r[0][1] if r else 0.0) / max(n, 1)
        for r, n, w in zip(recent, self._planned_counts, self.windows, strict=False)
        if w <= cfg.down_horizon_s * (1 + _EPS)
    ]
    if not ratios:
        return 0.0, 0.0, 0
    j = int(np.argmax(ratios))
    down_rate = self.inputs.mean_rate_qps * ratios[j]
    rise = _rise(trend, now_s, cfg.down_window_s) if cfg.lookahead_s > 0 else 0.0
    return down_rate + min(rise * cfg.lookahead_s, down_rate), down_rate, j


def _moved(
    state: TunerState,
    now_s: float,
    replicas: dict[str, int],
    down_peaks: tuple[tuple[float, float], ...],
    up_peaks: tuple[tuple[float, float], ...],
    batch: dict[str, int] | None = None,
) -> TunerState:
    """The state after a decision: the change restarts the stabilization delay; ``batch``
    only with a ladder (replica-only scaling keeps the state's)."""
    return replace(
        state,
        replicas=replicas,
        last_change_s=float(now_s),
        down_peaks=down_peaks,
        up_peaks=up_peaks,
        batch=state.batch if batch is None else batch,
    )


def _rise(trend: Sequence[tuple[float, float]], now_s: float, w: float) -> float:
    """How fast the ``w``-window rate rises, per second: the smaller of its rise over the last
    ``w`` and over the last ``2 w`` (two estimates that agree on a ramp; taking the smaller
    keeps a burst, which lifts one window's count for one window's time, from reading as a
    rise). 0 until ``2 w`` of history exist or when the rate is not rising."""
    if not trend or now_s - trend[0][0] < 2 * w * 0.99:
        return 0.0
    now_n = trend[-1][1]
    mid = next((n for t, n in trend if t >= now_s - w - 1e-9), now_n)
    short = (now_n - mid) / w / w
    long = (now_n - trend[0][1]) / w / (now_s - trend[0][0])
    return max(0.0, min(short, long))


def _diff_config(
    old: Mapping[str, int],
    new: Mapping[str, int],
    old_b: Mapping[str, int],
    new_b: Mapping[str, int],
) -> str:
    parts = []
    for m in new:
        if new[m] != old[m] or new_b[m] != old_b[m]:
            parts.append(f"{m} {old[m]}x b{old_b[m]}->{new[m]}x b{new_b[m]}")
    return ", ".join(parts)


def _rho_text(mode: str, rho_min: float) -> str:
    return f"rho_min={rho_min:.3f}" if mode == "min" else "per-model rho"


def _interpolate(envelope: Sequence[tuple[float, int]], window_s: float) -> float:
    """The planned count at ``window_s``: linear between the neighbouring envelope windows,
    proportional to the nearest one outside their range."""
    pts = sorted(envelope)
    for (w0, n0), (w1, n1) in itertools.pairwise(pts):
        if w0 <= window_s <= w1:
            return n0 + (n1 - n0) * (window_s - w0) / (w1 - w0)
    w, n = pts[0] if window_s < pts[0][0] else pts[-1]
    return n * window_s / w


def _diff(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    return ", ".join(f"{m} {old[m]}->{new[m]}" for m in new if new[m] != old[m])


@dataclass
class Tuner:
    """A policy with its online envelope and state: feed arrival times, call :meth:`tick`.

    Not pure (it holds the envelope and state) but clock-free: the caller passes the time.
    """

    policy: TunerPolicy
    start_s: float = 0.0
    state: TunerState = field(init=False)
    envelope: OnlineEnvelope = field(init=False)
    decisions: list[TunerDecision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.policy.initial_state(self.start_s)
        self.envelope = OnlineEnvelope(self.policy.windows, self.policy.config.resolution_s)

    @classmethod
    def from_plan(
        cls, plan: Plan, config: TunerConfig = TunerConfig(), start_s: float = 0.0
    ) -> Tuner:
        return cls(TunerPolicy.from_plan(plan, config), start_s)

    @property
    def replicas(self) -> dict[str, int]:
        return dict(self.state.replicas)

    def record(self, arrivals: npt.ArrayLike) -> None:
        self.envelope.extend(arrivals)

    def tick(self, now_s: float) -> TunerDecision | None:
        self.state, decision = self.policy.step(self.state, now_s, self.envelope.take_peaks())
        if decision is not None:
            self.decisions.append(decision)
        return decision


class InferLineController:
    """The tuner as the estimator's in-the-loop controller (``simulate(..., controller=)``)."""

    def __init__(
        self, plan: Plan, config: TunerConfig = TunerConfig(), start_s: float = 0.0
    ) -> None:
        self.interval_s = config.interval_s
        self.tuner = Tuner.from_plan(plan, config, start_s)
        self._hardware = {m: c.hardware for m, c in plan.models.items()}

    @property
    def decisions(self) -> list[TunerDecision]:
        return self.tuner.decisions

    def observe(
        self, now_s: float, new_arrivals: npt.NDArray[np.float64], state: Any = None
    ) -> dict[str, Any] | None:
        """Replica counts, or ``ModelConfig`` values when the tuner manages batch sizes."""
        self.tuner.record(new_arrivals)
        d = self.tuner.tick(now_s)
        if d is None:
            return None
        if not d.batch:
            return dict(d.replicas)
        return {m: ModelConfig(self._hardware[m], d.batch[m], n) for m, n in d.replicas.items()}
