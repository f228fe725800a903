"""The tuner's ladder rule (``reconfigure="ladder"``, the default when the plan has one; an
extension of InferLine §5, whose replica rule is in ``_policy.py``).

The paper's tuner changes replica counts only; the plan's ``tuner.ladder``
(:mod:`inferline.core.planning._ladder`) holds re-plans of the planned hardware for higher
rates, and the tuner provisions a rate plus a headroom (``headroom`` x the plan's mean rate, or
x ``headroom_rate_share`` of the rate far above the plan; ``headroom_basis``) with the cheapest
step proven for it (``headroom`` 0.20: the measured rate lags and jumps within an activation
time; the plan's ``rho`` plays this part for replica-only scaling): batch sizes change with the
replicas (a batch size at once, so a scale-up never shrinks one). A trigger leaves the current
configuration only once its room over the rate is below ``headroom - hysteresis`` (0.15), so a
level rate at a step's boundary does not flap it. What starts a scale-up is the paper's trigger
(a window above the planned envelope) or, with ``trigger="room"``, also a configuration whose
room over the last 30 s of traffic is below that band inside the envelope (the plan may have
almost none). Scale-down picks the step for the largest count of every window up to
``down_horizon_s`` over that horizon, each read as the planned rate scaled by its excess (the
scale-up rule), and moves the configuration to it exactly (``down_to="step"``, the default),
adding the replicas a model is short of: after the stabilization delay that also leaves a
configuration without the headroom's room, the plan included (a delayed room trigger).
``down_to="saving"`` moves a model only where that saves a replica, and one that keeps its
count takes the step's batch size (a step is proven at its own batch sizes, not at larger
ones). ``settle_s`` (5 s, the activation time) after any change, the batch sizes settle on
those of the step proven for the most traffic whose replicas the configuration holds (a
scale-up raises batch sizes at once, its replicas serve later). So the tuner goes back to the
plan only once the last 30 s fit the plan's envelope with the headroom at every time scale, not
only at 5 s (the paper's scale-down window; an earlier version used it alone, plus the
exceeding rates of the last 30 s). ``rho_min`` is not applied on top (the steps are
estimator-proven configurations, not the proportional rule it makes conservative).
``lookahead_s`` (10 s) provisions a rising rate where it will be when new replicas serve: the
rise of the ``down_window_s`` rate over the last window, extrapolated; after the stabilization
delay it holds a configuration and sizes a move up but does not start one
(``step_lookahead="hold"``): the measured rate must ask for the move, since a step change of
the rate reads as a rise for one window's time.

:class:`LadderRule` is the ladder half of :class:`~inferline.core.TunerPolicy` (its base
class): the policy's constructor sets the attributes declared here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from .._plan import TunerInputs
from ._config import TunerConfig
from ._state import EPS, TunerDecision, TunerState, ceil_count, moved, push

__all__ = ["LadderRule"]

Steps = list[tuple[float, dict[str, int], dict[str, int]]]  # (rate, replicas, batch sizes)
Decided = tuple[TunerState, TunerDecision]


@dataclass(frozen=True)
class _Tick:
    """What one ladder tick decides from: the state with this tick's trend and window
    skylines, the current configuration, the rise of the rate and the scale-down rate."""

    state: TunerState
    now_s: float
    cur: dict[str, int]
    cur_b: dict[str, int]
    down_peaks: tuple[tuple[float, float], ...]
    up_peaks: tuple[tuple[float, float], ...]
    rise: float
    rate: float  # the scale-down rate with the look-ahead
    down_rate: float  # without it
    j: int  # the window that binds the scale-down rate


class LadderRule:
    """Configurations from the plan's ladder (see the module doc)."""

    config: TunerConfig
    inputs: TunerInputs
    planned: dict[str, int]
    planned_batch: dict[str, int]
    windows: tuple[float, ...]
    _steps: Steps | None  # step 0 is the plan, then the re-plans by rate; None: no ladder
    _n_env: int
    _planned_counts: tuple[int, ...]

    def target(self, rate_qps: float) -> tuple[dict[str, int], dict[str, int], int]:
        """Ladder: the configuration provisioned for ``rate_qps`` and its step index.

        The first step (by rate) whose rate is at least ``rate_qps``; above the top step, its
        counts scaled by the rate ratio (the paper's rule with the top step as the plan);
        below the plan with ``floor="one"``, the plan's counts scaled down the same way."""
        assert self._steps is not None
        for i, (r, k, b) in enumerate(self._steps):
            if rate_qps <= r * (1 + EPS):
                if i == 0 and self.config.floor == "one":
                    return {m: max(1, ceil_count(n * rate_qps / r)) for m, n in k.items()}, b, 0
                if k == self.planned and b == self.planned_batch:
                    i = 0  # the plan itself, used up to its proven capacity
                return dict(k), dict(b), i
        r, k, b = self._steps[-1]
        return (
            {m: ceil_count(n * rate_qps / r) for m, n in k.items()},
            dict(b),
            len(self._steps) - 1,
        )

    def _step_text(self, i: int) -> str:
        assert self._steps is not None
        return "the plan" if i == 0 else f"ladder step {i} ({self._steps[i][0]:.1f} q/s)"

    def room(self, rate: float, frac: float) -> float:
        """``rate`` with ``frac`` of room: a share of the rate, or of the larger of the plan's
        mean rate and ``headroom_rate_share`` x the rate (``headroom_basis``)."""
        if self.config.headroom_basis == "plan":
            share = self.config.headroom_rate_share
            return rate + frac * max(self.inputs.mean_rate_qps, share * rate)
        return rate * (1.0 + frac)

    def _ladder_rate(
        self,
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
            if w <= cfg.down_horizon_s * (1 + EPS)
        ]
        if not ratios:
            return 0.0, 0.0, 0
        j = int(np.argmax(ratios))
        down_rate = self.inputs.mean_rate_qps * ratios[j]
        rise = _rise(trend, now_s, cfg.down_window_s) if cfg.lookahead_s > 0 else 0.0
        return down_rate + min(rise * cfg.lookahead_s, down_rate), down_rate, j

    def _ladder_step(
        self,
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
        stabilization delay): the target for the largest count of every window up to the
        horizon over the horizon (each as the planned rate scaled by its excess): with
        ``down_to="step"`` the configuration becomes that step (a model short of its replicas
        gets them); with ``"saving"`` it replaces a model's configuration only where that saves
        a replica. The ladder's configurations are estimator-proven for their rate, so the
        paper's extra conservatism (``rho_min``) is not applied on top.
        """
        cfg = self.config
        up_rate, up_window, up_count, up_planned = up
        recent = state.recent or tuple(() for _ in range(self._n_env))
        recent = tuple(
            push(r, now_s, float(n), cfg.down_horizon_s)
            for r, n in zip(recent, peaks[: self._n_env], strict=True)
        )
        w5 = cfg.down_window_s
        trend = state.trend
        # the window counts ramp up from zero while the tuner's first window fills: no trend yet
        warm = state.started_s is None or now_s >= state.started_s + w5
        if cfg.lookahead_s > 0 and warm:
            kept = tuple(h for h in trend if h[0] >= now_s - 2 * w5 - 1e-9)
            trend = (*kept, (float(now_s), float(down_peaks[-1][1])))
        rise = _rise(trend, now_s, w5) if cfg.lookahead_s > 0 else 0.0
        if up_rate > 0 and rise > 0:
            # at most doubling: a step change of the rate is a steep rise for one window only
            up_rate += min(rise * cfg.lookahead_s, up_rate)
        rate, down_rate, j = self._ladder_rate(recent, trend, now_s)
        t = _Tick(
            replace(state, trend=trend, recent=recent),
            now_s,
            dict(state.replicas),
            dict(state.batch) or dict(self.planned_batch),
            down_peaks,
            up_peaks,
            rise,
            rate,
            down_rate,
            j,
        )
        done: Decided | None = None
        if up_rate > 0:
            done = self._scale_up(t, (up_rate, up_window, up_count, up_planned))
        elif cfg.trigger == "room" and rate > 0:
            done = self._room_trigger(t)
        since = now_s - state.last_change_s
        if done is None and since >= cfg.stabilization_delay_s:
            done = self._scale_down(t)
        # after a scale-down, which moves batch sizes with the replicas
        if done is None and cfg.settle_s is not None and since >= cfg.settle_s:
            done = self._settle(t, up_rate)
        if done is not None:
            return done
        return replace(t.state, down_peaks=down_peaks, up_peaks=up_peaks), None

    def _scale_up(self, t: _Tick, up: tuple[float, float, int, int]) -> Decided | None:
        """A window above the planned envelope: the target for its rate with the headroom,
        unless the configuration still covers the rate with the band's room."""
        cfg = self.config
        up_rate, up_window, up_count, up_planned = up
        hr, br = cfg.headroom, _band(cfg)
        cur, cur_b = t.cur, t.cur_b
        k, b, i = self.target(self.room(up_rate, hr))
        new = {m: max(cur[m], k[m]) for m in cur}
        new_b = {m: max(cur_b[m], b[m]) for m in cur}
        if self._covers(self.room(up_rate, br), cur, cur_b) or (new == cur and new_b == cur_b):
            return None
        ahead = (
            f" (rising {t.rise:.1f} q/s per s, {cfg.lookahead_s:g} s ahead)" if t.rise > 0 else ""
        )
        reason = (
            f"scale up: {up_count} arrivals in a {up_window:g} s window "
            f"({up_count / up_window:.1f} q/s) > planned {up_planned} "
            f"({up_planned / up_window:.1f} q/s); provisioning for {up_rate:.1f} q/s"
            f"{ahead} with {self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
        )
        d = TunerDecision(float(t.now_s), new, reason, up_window, up_rate, "up", new_b)
        return moved(t.state, t.now_s, new, t.down_peaks, t.up_peaks, new_b), d

    def _room_trigger(self, t: _Tick) -> Decided | None:
        """``trigger="room"``: within the planned envelope, but the configuration has less
        room over the traffic than the band (the plan itself may: it is the cheapest
        configuration for the sample, and a rise from it overloads it before any window
        exceeds the planned envelope)."""
        cfg = self.config
        hr, br = cfg.headroom, _band(cfg)
        of_plan = " of the planned rate as" if cfg.headroom_basis == "plan" else ""
        cur, cur_b, rate = t.cur, t.cur_b, t.rate
        if self._covers(self.room(rate, br), cur, cur_b):
            return None
        k, b, i = self.target(self.room(rate, hr))
        new = {m: max(cur[m], k[m]) for m in cur}
        new_b = {m: max(cur_b[m], b[m]) for m in cur}
        if new == cur and new_b == cur_b:
            return None
        w = self.windows[t.j]
        reason = (
            f"scale up: the largest count of the last {cfg.down_horizon_s:g} s in {w:g} s "
            f"windows stands for {t.down_rate:.1f} q/s"
            + (f", rising {t.rise:.1f} q/s per s" if t.rise > 0 else "")
            + f"; less than {br:.0%}{of_plan} room for {rate:.1f} q/s: provisioning with "
            f"{self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
        )
        d = TunerDecision(float(t.now_s), new, reason, w, rate, "up", new_b)
        return moved(t.state, t.now_s, new, t.down_peaks, t.up_peaks, new_b), d

    def _scale_down(self, t: _Tick) -> Decided | None:
        """After the stabilization delay: the step for the horizon's traffic (see the module
        doc), exactly (``down_to="step"``) or where it saves a replica (``"saving"``)."""
        cfg = self.config
        hr = cfg.headroom
        cur, cur_b, rate, down_rate, rise = t.cur, t.cur_b, t.rate, t.down_rate, t.rise
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
        if new == cur and new_b == cur_b:
            return None
        w = self.windows[t.j]
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
            f"{verb}: {why}, stable for {t.now_s - t.state.last_change_s:.1f} s; "
            f"{self._step_text(i)}: {_diff_config(cur, new, cur_b, new_b)}"
        )
        action: Literal["up", "down"] = "up" if adds else "down"
        d = TunerDecision(float(t.now_s), new, reason, cfg.down_window_s, provision, action, new_b)
        return moved(t.state, t.now_s, new, t.down_peaks, t.up_peaks, new_b), d

    def _settle(self, t: _Tick, up_rate: float) -> Decided | None:
        """``settle_s`` after the last change: the batch sizes of the configuration proven for
        the most traffic whose replicas the current ones hold."""
        cfg = self.config
        need = self.room(max(up_rate, t.rate), _band(cfg))
        bs = self._settled(need, t.cur) if need > 0 else None
        if bs is None or bs == t.cur_b:
            return None
        reason = (
            f"settle: {cfg.settle_s:g} s after the last change, the replicas hold a "
            f"configuration proven for {need:.1f} q/s at other batch sizes: "
            f"{_diff_config(t.cur, t.cur, t.cur_b, bs)}"
        )
        d = TunerDecision(float(t.now_s), dict(t.cur), reason, 0.0, need, "settle", bs)
        # a batch size is no replica change: the stabilization delay keeps running
        return replace(t.state, down_peaks=t.down_peaks, up_peaks=t.up_peaks, batch=bs), d

    def _covers(self, rate: float, cur: Mapping[str, int], cur_b: Mapping[str, int]) -> bool:
        """The configuration holds one proven for ``rate``: the target for it, or any step
        proven for at least it (a step above may have fewer replicas of a model than the
        target, at a larger batch)."""
        assert self._steps is not None
        k, b, _ = self.target(rate)
        configs = [(k, b)] + [(ks, bs) for r, ks, bs in self._steps if r >= rate * (1 - EPS)]
        if self.config.settle_s is not None:  # a step holds at its own batch sizes only
            return any(
                all(cur[m] >= ks[m] and cur_b[m] == bs[m] for m in cur) for ks, bs in configs
            )
        return any(all(cur[m] >= ks[m] and cur_b[m] >= bs[m] for m in cur) for ks, bs in configs)

    def _settled(self, rate: float, cur: Mapping[str, int]) -> dict[str, int] | None:
        """The batch sizes of the configuration proven for the most traffic (at least
        ``rate``) whose replica counts the current ones hold; None when none is."""
        assert self._steps is not None
        k, b, _ = self.target(rate)
        configs = [(rate, k, b)] + [s for s in self._steps if s[0] >= rate * (1 - EPS)]
        held = [(r, bs) for r, ks, bs in configs if all(cur[m] >= ks[m] for m in cur)]
        return dict(max(held, key=lambda x: x[0])[1]) if held else None


def _band(cfg: TunerConfig) -> float:
    """The room below which a trigger leaves the configuration: ``headroom - hysteresis``."""
    return max(0.0, cfg.headroom - cfg.hysteresis)


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
