"""Rafiki's inference scheduling (Wang et al., VLDB'18, §5): ensemble subset and batch size chosen
by reinforcement learning (actor-critic), compared with its two baselines.

The environment follows §5.2. Models run in parallel, one per worker; a decision dispatches the
oldest ``b`` queued requests to a subset ``v`` of the models, which start when all of them are
free; a request completes when the slowest selected model finishes. The reward of a batch is
Eq. 7: ``a(M[v]) * (b - beta * overdue)``, with ``a`` the validation accuracy of the subset's
ensemble. The state is the waiting time of the first ``queue_features`` requests (zero padded,
in units of tau, capped at a few tau) plus, per model, its batch latencies ``c(m, b)`` and the
time left on its current work; we add the (log) queue length, which the truncated wait vector
cannot show, and the recent arrival rate (``rate_feature``). The action space is ``(2^|M| - 1) x |B|``. Arrivals follow the paper's noisy sine
(Eqs. 8-9): the rate exceeds ``r_ref`` for 20% of each cycle and peaks at 1.1 ``r_ref``.

Decision points (documented against the paper, which invokes its simulator periodically): a
decision is taken whenever some model is idle and a request is queued, and it dispatches *now*
(``min(b, queue length)`` requests; a partial batch costs the latency of the smallest profiled
size that holds it). The agent has no explicit "wait" action; it can wait for a busy model by
selecting it. ``action_mask()`` marks the actions whose subset holds at least one idle model: a
subset of busy models only leaves the idle ones unused at that instant, and masking it out is
what lets the agent learn asynchronous dispatch under load (without the mask it collapses to a
fixed subset, see the tests).

Baselines: all models synchronously on every batch, and one model per batch asynchronously (the
earliest-free model); both form batches with Rafiki's greedy rule (Algorithm 3).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

_WAIT_CAP = 4.0
RATE_WINDOW = 4.0  # taus


def rate_feature(rate_qps: float, capacity_qps: float) -> float:
    """The arrival rate as a fraction of the all-models capacity (capped at 4).

    Dispatching whenever a model is idle keeps the queue at a request or two at any rate the
    models sustain, so the queue alone cannot tell a quiet period (all models affordable) from
    one near the all-models capacity; the rate can (the paper's periodic invocation sees it in
    the queue's growth between invocations)."""
    return min(rate_qps / capacity_qps, 4.0) if capacity_qps > 0 else 0.0


__all__ = [
    "EnsembleEnv",
    "EpisodeStats",
    "RafikiConfig",
    "greedy_batch",
    "run_baseline",
    "sine_arrivals",
    "sine_rate",
]


def sine_arrivals(
    r_ref: float,
    tau_s: float,
    duration_s: float,
    rng: np.random.Generator,
    step_s: float = 0.01,
    *,
    period_s: float | None = None,
    start_s: float = 0.0,
) -> np.ndarray:
    """Arrival times whose rate is ``k sin(2 pi t / T) + b`` times ``(1 + N(0, 0.1))``.

    Eqs. 8-9 fix k and b: the rate is above ``r_ref`` for 20% of each cycle and peaks at
    1.1 r_ref. ``T`` is 500 tau as in the paper unless ``period_s`` is given (shorter cycles keep
    tests fast). ``start_s`` shifts the window along the cycle (training on random phases); the
    returned times start at ``start_s``.
    """
    period = 500.0 * tau_s if period_s is None else float(period_s)
    if not (r_ref > 0 and tau_s > 0 and period > 0 and step_s > 0):
        raise ValidationError("sine_arrivals", "r_ref, tau_s, period_s, step_s > 0", r_ref)
    # the sine value crossed 20% of a cycle around the peak
    s = math.sin(math.pi / 2 - 0.2 * math.pi)
    k = 0.1 * r_ref / (1.0 - s)
    b = 1.1 * r_ref - k
    n_steps = max(0, math.ceil(duration_s / step_s - 1e-9))
    t = start_s + step_s * np.arange(n_steps)
    rate = (k * np.sin(2 * np.pi * t / period) + b) * (1.0 + rng.normal(0.0, 0.1, n_steps))
    counts = rng.poisson(np.maximum(rate, 0.0) * step_s)
    # each arrival uniform within its step; sorting within a step keeps the times ordered
    offsets = rng.random(int(counts.sum())) * step_s
    times = np.repeat(t, counts) + offsets
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    order = np.lexsort((offsets, starts))
    return times[order]


def sine_rate(r_ref: float, t_s: float, period_s: float) -> float:
    """The noiseless rate of ``sine_arrivals`` at time ``t_s`` (for plots and tables)."""
    s = math.sin(math.pi / 2 - 0.2 * math.pi)
    k = 0.1 * r_ref / (1.0 - s)
    return k * math.sin(2 * math.pi * t_s / period_s) + 1.1 * r_ref - k


def greedy_batch(
    queue_len: int,
    oldest_wait_s: float,
    sizes: Sequence[int],
    latency: Callable[[int], float],
    tau_s: float,
    delta_s: float,
) -> int:
    """Rafiki Algorithm 3: the batch to run now, or 0 to wait.

    Take ``max B`` when the queue holds that many; otherwise the largest size in B not above the
    queue length, but only once the oldest request is about to be overdue (c(b) + w(q0) + delta
    >= tau). With fewer queued than the smallest size, the whole queue runs at that point.
    """
    bmax = max(sizes)
    if queue_len >= bmax:
        return bmax
    if queue_len == 0:
        return 0
    fitting = [b for b in sizes if b <= queue_len]
    b = max(fitting) if fitting else queue_len
    return b if latency(b) + oldest_wait_s + delta_s >= tau_s else 0


@dataclass(frozen=True)
class RafikiConfig:
    batch_sizes: tuple[int, ...]
    tau_s: float
    beta: float = 1.0
    queue_features: int = 32
    max_queue: int = 10_000
    delta_frac: float = 0.1  # delta = 0.1 tau in the paper

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValidationError("batch_sizes", "positive batch sizes", self.batch_sizes)
        if not self.tau_s > 0:
            raise ValidationError("tau_s", "a latency SLO > 0", self.tau_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_sizes": list(self.batch_sizes),
            "tau_s": self.tau_s,
            "beta": self.beta,
            "queue_features": self.queue_features,
            "max_queue": self.max_queue,
            "delta_frac": self.delta_frac,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RafikiConfig:
        return cls(**{**d, "batch_sizes": tuple(d["batch_sizes"])})


@dataclass
class EpisodeStats:
    served: int = 0
    overdue: int = 0
    accuracy_sum: float = 0.0
    reward: float = 0.0
    dropped: int = 0
    batches: int = 0
    models_used: int = 0
    # per batch: finish time, requests, overdue requests, subset accuracy, models in the subset
    timeline: list[tuple[float, int, int, float, int]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.accuracy_sum / self.served if self.served else 0.0

    @property
    def overdue_rate(self) -> float:
        return self.overdue / self.served if self.served else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "served": self.served,
            "accuracy": self.accuracy,
            "overdue_fraction": self.overdue_rate,
            "mean_models_per_batch": self.models_used / self.batches if self.batches else 0.0,
            "reward": self.reward,
            "dropped": self.dropped,
        }


class EnsembleEnv:
    """Event-driven simulation of Rafiki's ensemble inference (see module docstring)."""

    def __init__(
        self,
        latency: Sequence[Mapping[int, float]],
        subset_accuracy: Mapping[tuple[int, ...], float],
        config: RafikiConfig,
        arrivals: np.ndarray,
    ) -> None:
        self.k = len(latency)
        self.lat = [dict(m) for m in latency]
        for i, m in enumerate(self.lat):
            missing = [b for b in config.batch_sizes if b not in m]
            if missing:
                raise ValidationError(
                    f"latency[{i}]",
                    f"a latency for every batch size {list(config.batch_sizes)}",
                    missing,
                )
        self.subsets = [
            s for r in range(1, self.k + 1) for s in itertools.combinations(range(self.k), r)
        ]
        for s in self.subsets:
            if s not in subset_accuracy:
                raise ValidationError(
                    "subset_accuracy", f"an accuracy for every non-empty subset, e.g. {s}", None
                )
        self.acc = dict(subset_accuracy)
        self.cfg = config
        self.actions = [(s, b) for s in self.subsets for b in config.batch_sizes]
        self.arrivals = np.asarray(arrivals, dtype=float)
        # _subset_masks[m, a]: model m is in action a's subset
        self._subset_masks = np.array(
            [[m in sub for sub, _ in self.actions] for m in range(self.k)], dtype=bool
        )
        self.static = (
            np.array([self.lat[m][b] for m in range(self.k) for b in config.batch_sizes])
            / config.tau_s
        )
        # arrival-rate feature: arrivals over the last RATE_WINDOW taus, as a fraction of what
        # all models on every batch serve (the slowest model's throughput at the largest batch)
        bmax = max(config.batch_sizes)
        self.capacity = min(bmax / m[bmax] for m in self.lat)
        self.reset()

    @property
    def state_dim(self) -> int:
        return self.cfg.queue_features + 2 + len(self.static) + self.k

    def recent_rate(self) -> float:
        """Arrivals per second over the last ``RATE_WINDOW`` taus (what a live server sees)."""
        w = RATE_WINDOW * self.cfg.tau_s
        first = int(np.searchsorted(self.arrivals, self.t - w, side="right"))
        return max(self.next_arrival - first, 0) / w

    def reset(self) -> np.ndarray:
        self.t = float(self.arrivals[0]) if self.arrivals.size else 0.0
        self.next_arrival = 0
        self.queue: deque[float] = deque()
        self.free_at = np.full(self.k, self.t)
        self.stats = EpisodeStats()
        self.elapsed_s = 0.0
        self.arrived = 0  # arrivals between the last decision and this one
        self.last_batch: tuple[int, int, float] = (0, 0, 0.0)
        self._admit(self.t)
        return self.state()

    def _admit(self, until: float) -> None:
        while self.next_arrival < self.arrivals.size and self.arrivals[self.next_arrival] <= until:
            if len(self.queue) < self.cfg.max_queue:
                self.queue.append(self.arrivals[self.next_arrival])
            else:
                self.stats.dropped += 1
            self.next_arrival += 1

    @property
    def done(self) -> bool:
        return self.next_arrival >= self.arrivals.size and not self.queue

    def state(self) -> np.ndarray:
        q = np.zeros(self.cfg.queue_features)
        waits = [self.t - a for a in itertools.islice(self.queue, self.cfg.queue_features)]
        # waits in units of tau; beyond a few tau everything is overdue anyway, and unbounded
        # inputs saturate the tanh layers during a backlog
        q[: len(waits)] = np.minimum(np.asarray(waits) / self.cfg.tau_s, _WAIT_CAP)
        left = np.maximum(self.free_at - self.t, 0.0) / self.cfg.tau_s
        # queue length beyond the padded window is otherwise invisible to the policy (log scale:
        # a backlog can be hundreds of batches)
        qlen = np.array([math.log1p(len(self.queue) / max(self.cfg.batch_sizes))])
        rate = np.array([rate_feature(self.recent_rate(), self.capacity)])
        return np.concatenate([q, qlen, rate, self.static, left]).astype(np.float32)

    def action_mask(self) -> np.ndarray:
        """Actions whose subset holds at least one idle model (see the module docstring)."""
        idle = self.free_at <= self.t + 1e-12
        return (
            self._subset_masks[idle].any(axis=0) if idle.any() else np.ones(len(self.actions), bool)
        )

    def _advance(self) -> None:
        """Move time to the next decision point: a model is free and a request is queued."""
        while not self.done:
            t_free = float(self.free_at.min())
            self.t = max(self.t, t_free)
            self._admit(self.t)
            if self.queue:
                return
            if self.next_arrival < self.arrivals.size:
                self.t = max(self.t, float(self.arrivals[self.next_arrival]))
                self._admit(self.t)
                if self.queue:
                    return

    def dispatch(self, subset: tuple[int, ...], batch: int) -> float:
        """Run the oldest ``batch`` requests on ``subset``; returns the batch's reward (Eq. 7)."""
        n = min(batch, len(self.queue))
        reqs = [self.queue.popleft() for _ in range(n)]
        start = max(self.t, *(float(self.free_at[m]) for m in subset))
        # a partial batch runs at the latency of the smallest profiled size that holds it
        size = min((b for b in self.cfg.batch_sizes if b >= n), default=batch)
        finish = 0.0
        for m in subset:
            self.free_at[m] = start + self.lat[m][size]
            finish = max(finish, self.free_at[m])
        overdue = sum(1 for a in reqs if finish - a > self.cfg.tau_s)
        acc = self.acc[subset]
        reward = acc * (n - self.cfg.beta * overdue)
        st = self.stats
        st.served += n
        st.overdue += overdue
        st.accuracy_sum += acc * n
        st.reward += reward
        st.batches += 1
        st.models_used += len(subset)
        st.timeline.append((finish, n, overdue, acc, len(subset)))
        self.last_batch = (n, overdue, acc)
        return reward

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        """Apply one action; ``self.elapsed_s`` is then the time to the next decision."""
        subset, batch = self.actions[action]
        t0, seen = self.t, self.next_arrival
        reward = self.dispatch(subset, batch)
        self._advance()
        self.elapsed_s = self.t - t0
        self.arrived = self.next_arrival - seen
        return self.state(), reward, self.done

    def start(self) -> np.ndarray:
        """Reset and move to the first decision point; returns its state."""
        self.reset()
        self._advance()
        return self.state()

    def clone(self, arrivals: np.ndarray | None = None) -> EnsembleEnv:
        """A fresh environment with the same models and config (and other arrivals)."""
        return EnsembleEnv(
            self.lat, self.acc, self.cfg, self.arrivals if arrivals is None else arrivals
        )

    def wait_until(self, t: float) -> None:
        self.t = t
        self._admit(t)


def run_baseline(env: EnsembleEnv, mode: str) -> EpisodeStats:
    """``sync``: every batch on all models; ``async``: one model per batch, the earliest free one.
    Batches formed by Rafiki's greedy rule (Algorithm 3)."""
    if mode not in ("sync", "async"):
        raise ValidationError("mode", "'sync' or 'async'", mode)
    env.reset()
    env._advance()
    cfg = env.cfg
    all_models = tuple(range(env.k))
    while not env.done:
        subset = all_models if mode == "sync" else (int(np.argmin(env.free_at)),)

        def lat(b: int, subset: tuple[int, ...] = subset) -> float:
            size = min((s for s in cfg.batch_sizes if s >= b), default=max(cfg.batch_sizes))
            return max(env.lat[m][size] for m in subset)

        oldest = env.t - env.queue[0]
        b = greedy_batch(
            len(env.queue), oldest, cfg.batch_sizes, lat, cfg.tau_s, cfg.delta_frac * cfg.tau_s
        )
        if b == 0:
            # wait for the next arrival or until the oldest request becomes urgent
            small = min(cfg.batch_sizes)
            urgent = env.queue[0] + cfg.tau_s - lat(small) - cfg.delta_frac * cfg.tau_s
            nxt = (
                env.arrivals[env.next_arrival] if env.next_arrival < env.arrivals.size else math.inf
            )
            env.wait_until(max(env.t, min(urgent, nxt)))
            if env.t >= urgent:
                size = max(
                    (s for s in cfg.batch_sizes if s <= len(env.queue)),
                    default=min(cfg.batch_sizes),
                )
                env.dispatch(subset, size)
                env._advance()
            continue
        size = min((s for s in cfg.batch_sizes if s >= b), default=max(cfg.batch_sizes))
        env.dispatch(subset, size)
        env._advance()
    return env.stats
