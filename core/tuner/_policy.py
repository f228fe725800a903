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
- **Ladder** (``reconfigure="ladder"``, the default when the plan has one; an extension): the
  tuner provisions a rate with the cheapest of the plan's re-plans for higher rates, batch
  sizes included; see ``_ladder_rule.py``. Replica-only scaling (``reconfigure="replicas"``) is
  the paper's tuner; ``down_rate="window"`` with it is the paper's literal scale-down (the
  default ``down_rate`` is ``"scaled"``: the 5 s peak over the planned envelope, so traffic at
  the planned workload asks for the plan).
- **Clock.** Pure: :meth:`TunerPolicy.step` takes the state, the time and the per-window peaks
  and returns the new state and the decision (or ``None``). :class:`Tuner` bundles a policy, its
  online envelope and its state for a caller that feeds arrival times and a clock.

Every decision carries its reason (which window, which rate) for logs and metrics.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from .._plan import Plan, TunerInputs
from ..errors import ValidationError
from ._config import TunerConfig
from ._ladder_rule import LadderRule
from ._state import TunerDecision, TunerState, ceil_count, moved, push

__all__ = ["TunerPolicy"]


class TunerPolicy(LadderRule):
    """The pure decision rule. ``windows`` lists the window sizes whose peaks :meth:`step`
    expects, in order: the planning envelope's windows, then the scale-down window if it is not
    one of them."""

    def __init__(
        self,
        inputs: TunerInputs,
        planned: Mapping[str, int],
        config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
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
    def from_plan(
        cls,
        plan: Plan,
        config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
    ) -> TunerPolicy:
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

    def need(self, rate_qps: float, rho: float | None = None) -> dict[str, int]:
        """Replicas each model needs for ``rate_qps``: ``ceil(λ s_m / (μ_m ρ))``."""
        out = {}
        for m in self.planned:
            t = self.inputs.models[m]
            r = t.max_provisioning_ratio if rho is None else rho
            out[m] = ceil_count(rate_qps * t.scale_factor / (t.throughput_qps * r))
        return out

    def need_each(self, rates: Mapping[str, float]) -> dict[str, int]:
        """Like :meth:`need` with a rate per model."""
        out = {}
        for m in self.planned:
            t = self.inputs.models[m]
            out[m] = ceil_count(
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
        rate, _, _ = self._ladder_rate(state.recent, state.trend, now_s)
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
        down_peaks = push(state.down_peaks, now_s, int(peaks[self._down_idx]), cfg.down_horizon_s)
        up_peaks = push(state.up_peaks, now_s, up_rate, cfg.keep_horizon_s)
        cur = dict(state.replicas)

        if self._steps is not None:
            return self._ladder_step(
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
                return moved(state, now_s, new, down_peaks, up_peaks), decision

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
                return moved(state, now_s, new, down_peaks, up_peaks), decision

        return replace(state, down_peaks=down_peaks, up_peaks=up_peaks), None


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
