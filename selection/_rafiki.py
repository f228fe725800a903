"""Rafiki's inference scheduling (Wang et al., VLDB'18, §5): ensemble subset and batch size chosen
by reinforcement learning (actor-critic), compared with its two baselines.

The environment follows §5.2. Models run in parallel, one per worker; a decision dispatches the
oldest ``b`` queued requests to a subset ``v`` of the models, which start when all of them are
free; a request completes when the slowest selected model finishes. The reward of a batch is
Eq. 7: ``a(M[v]) * (b - beta * overdue)``, with ``a`` the validation accuracy of the subset's
ensemble. The state is the waiting time of the first ``queue_features`` requests (zero padded)
plus, per model, its batch latencies ``c(m, b)`` and the time left on its current work. The
action space is ``(2^|M| - 1) x |B|``. Arrivals follow the paper's noisy sine (Eqs. 8-9): the rate
exceeds ``r_ref`` for 20% of each cycle and peaks at 1.1 ``r_ref``.

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

__all__ = [
    "EnsembleEnv",
    "EpisodeStats",
    "RafikiAgent",
    "RafikiConfig",
    "greedy_batch",
    "run_baseline",
    "sine_arrivals",
]


def sine_arrivals(
    r_ref: float, tau_s: float, duration_s: float, rng: np.random.Generator, step_s: float = 0.01
) -> np.ndarray:
    """Arrival times whose rate is ``k sin(2 pi t / T) + b`` with T = 500 tau, noise N(0, 0.1).

    Eqs. 8-9 fix k and b: the rate is above ``r_ref`` for 20% of each cycle and peaks at 1.1 r_ref.
    """
    period = 500.0 * tau_s
    s = math.sin(
        math.pi / 2 - 0.2 * math.pi
    )  # the sine value crossed 20% of a cycle around the peak
    k = 0.1 * r_ref / (1.0 - s)
    b = 1.1 * r_ref - k
    out: list[np.ndarray] = []
    t = 0.0
    while t < duration_s:
        rate = max(0.0, (k * math.sin(2 * math.pi * t / period) + b) * (1.0 + rng.normal(0.0, 0.1)))
        n = rng.poisson(rate * step_s)
        if n:
            out.append(np.sort(t + rng.random(n) * step_s))
        t += step_s
    return np.concatenate(out) if out else np.empty(0)


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
    timeline: list[tuple[float, int, int, float]] = field(
        default_factory=list
    )  # t, served, overdue, acc

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
        self.static = (
            np.array([self.lat[m][b] for m in range(self.k) for b in config.batch_sizes])
            / config.tau_s
        )
        self.reset()

    @property
    def state_dim(self) -> int:
        return self.cfg.queue_features + 1 + len(self.static) + self.k

    def reset(self) -> np.ndarray:
        self.t = float(self.arrivals[0]) if self.arrivals.size else 0.0
        self.next_arrival = 0
        self.queue: deque[float] = deque()
        self.free_at = np.full(self.k, self.t)
        self.stats = EpisodeStats()
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
        q[: len(waits)] = np.asarray(waits) / self.cfg.tau_s
        left = np.maximum(self.free_at - self.t, 0.0) / self.cfg.tau_s
        # queue length beyond the padded window is otherwise invisible to the policy
        qlen = np.array([len(self.queue) / max(self.cfg.batch_sizes)])
        return np.concatenate([q, qlen, self.static, left]).astype(np.float32)

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
        st.timeline.append((finish, n, overdue, acc))
        return reward

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        subset, batch = self.actions[action]
        reward = self.dispatch(subset, batch)
        self._advance()
        return self.state(), reward, self.done

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


class RafikiAgent:
    """Advantage actor-critic (one-step TD advantage, n-step updates) over Rafiki's actions."""

    def __init__(
        self,
        state_dim: int,
        n_actions: int,
        *,
        hidden: int = 64,
        lr: float = 3e-3,
        gamma: float = 0.9,
        entropy: float = 0.01,
        seed: int = 0,
    ) -> None:
        import torch

        self._torch = torch
        self.gamma = gamma
        self.entropy = entropy
        self._gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.actor = torch.nn.Sequential(
            torch.nn.Linear(state_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_actions)
        )
        self.critic = torch.nn.Sequential(
            torch.nn.Linear(state_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        )
        self.opt = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=lr)

    def act(self, state: np.ndarray, greedy: bool = False) -> int:
        torch = self._torch
        with torch.no_grad():
            logits = self.actor(torch.from_numpy(state))
            if greedy:
                return int(torch.argmax(logits))
            return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=self._gen))

    def update(
        self,
        states: list[np.ndarray],
        actions: list[int],
        rewards: list[float],
        next_states: list[np.ndarray],
        dones: list[bool],
    ) -> float:
        torch = self._torch
        s = torch.from_numpy(np.stack(states))
        s2 = torch.from_numpy(np.stack(next_states))
        a = torch.tensor(actions)
        r = torch.tensor(rewards, dtype=torch.float32)
        d = torch.tensor(dones, dtype=torch.float32)
        v = self.critic(s).squeeze(-1)
        with torch.no_grad():
            target = r + self.gamma * (1 - d) * self.critic(s2).squeeze(-1)
        adv = target - v
        a_n = adv.detach()
        if a_n.numel() > 1:
            a_n = (a_n - a_n.mean()) / (a_n.std() + 1e-6)
        logp = torch.log_softmax(self.actor(s), -1)
        pg = -(logp.gather(1, a[:, None]).squeeze(1) * a_n).mean()
        ent = -(logp.exp() * logp).sum(-1).mean()
        loss = pg + 0.5 * adv.pow(2).mean() - self.entropy * ent
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def train(
        self, env: EnsembleEnv, episodes: int, n_steps: int = 32, reward_scale: float | None = None
    ) -> list[float]:
        """Train on ``env``'s arrivals; returns the reward per episode."""
        scale = reward_scale or 1.0 / max(env.cfg.batch_sizes)
        history = []
        for _ in range(episodes):
            s = env.reset()
            env._advance()
            s = env.state()
            buf: tuple[list[Any], ...] = ([], [], [], [], [])
            while not env.done:
                a = self.act(s)
                s2, r, done = env.step(a)
                for lst, val in zip(buf, (s, a, r * scale, s2, done), strict=True):
                    lst.append(val)
                s = s2
                if len(buf[0]) >= n_steps or done:
                    self.update(*buf)
                    buf = ([], [], [], [], [])
            history.append(env.stats.reward)
        return history

    def run(self, env: EnsembleEnv, greedy: bool = True) -> EpisodeStats:
        env.reset()
        env._advance()
        s = env.state()
        while not env.done:
            s, _, _ = env.step(self.act(s, greedy=greedy))
        return env.stats
