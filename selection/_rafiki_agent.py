"""Rafiki's actor-critic (Wang et al., VLDB'18, §5.2) over the ensemble environment.

The policy ``pi(a | s)`` and the value ``V(s)`` are two small MLPs; the policy gradient uses the
advantage ``R_t - V(s_t)`` (the actor-critic the paper applies). The reward is Eq. 7 unchanged,
only divided by ``max(B)`` so one batch is worth at most ~1. What we add to make it learn, all
standard and none of it reward shaping:

- synchronous advantage actor-critic over several environments in lockstep (A2C), each with its
  own draw of the noisy sine, with generalized advantage estimation (GAE) for the returns;
- discounting by elapsed time, ``gamma ** (dt / tau)`` between decisions (a semi-Markov
  discount): decisions at the same instant are not discounted against each other, so the agent
  is not pushed toward large batches merely because they need fewer decisions per request;
- the critic learns returns normalized by their running mean and spread, with its last layer
  rescaled whenever those move (PopArt); advantages normalized per update, gradient clipping,
  a small entropy bonus;
- the action mask of ``EnsembleEnv.action_mask`` (subsets with at least one idle model);
- centering: the agent learns from Eq. 7's reward minus ``a_bar x (requests that arrived
  since the previous decision)``, ``a_bar`` the mean subset accuracy. The arrivals do not
  depend on the actions, so this is a baseline, not shaping: an episode's centered return is
  Eq. 7's minus a constant (``a_bar x`` the episode's arrivals, up to discounting) and the same
  policies are best. Without it the returns are dominated by how many requests happen to arrive
  (exogenous, and invisible in the state), the critic explains none of their variance and the
  policy drifts to the myopically best action (all models on every batch). Centering on the
  *served* batch size instead would reward dropping and postponing requests;
- training episodes that start at random phases of the sine, so the parallel environments do
  not all sit in the same part of the cycle at once (otherwise every update sees only low load,
  then only overload, and the policy swings with the phase);
- optional validation episodes during training that keep the best parameters seen (standard
  model selection; the test episode is never used for it).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

from ._rafiki import EnsembleEnv, EpisodeStats

__all__ = ["RafikiAgent", "RafikiTrainConfig", "TrainLog"]

log = logging.getLogger(__name__)

EnvSource = EnsembleEnv | Callable[[int], EnsembleEnv]


@dataclass(frozen=True)
class RafikiTrainConfig:
    hidden: int = 64
    lr: float = 1e-3
    gamma_per_tau: float = 0.95  # discount per tau of simulated time (horizon ~20 tau)
    gae_lambda: float = 0.95
    entropy: float = 0.01
    value_coef: float = 0.5
    n_envs: int = 8
    n_steps: int = 64
    max_grad_norm: float = 0.5
    mask: bool = True
    seed: int = 0
    torch_threads: int = 1  # tiny networks: more intra-op threads only add overhead
    center: bool = True  # learn from Eq. 7 minus (mean subset accuracy x arrivals), see above

    def __post_init__(self) -> None:
        for name in ("gamma_per_tau", "gae_lambda"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ValidationError(name, "a number in (0, 1]", v)
        for name in ("hidden", "n_envs", "n_steps", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValidationError(name, "an integer >= 1", getattr(self, name))
        if not self.lr > 0:
            raise ValidationError("lr", "a learning rate > 0", self.lr)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RafikiTrainConfig:
        return cls(**d)


@dataclass
class TrainLog:
    """Per training episode: its summary; per validation: (update, reward); the best update."""

    episodes: list[dict[str, float]] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)
    best_update: int | None = None
    updates: int = 0


class RafikiAgent:
    """Advantage actor-critic over Rafiki's (subset x batch size) actions."""

    def __init__(
        self,
        state_dim: int,
        n_actions: int,
        config: RafikiTrainConfig | None = None,
        **overrides: Any,
    ) -> None:
        import torch  # optional dependency (the "models" extra); imported on use

        cfg = config or RafikiTrainConfig()
        if overrides:
            cfg = RafikiTrainConfig.from_dict({**cfg.to_dict(), **overrides})
        self.config = cfg
        self.state_dim = state_dim
        self.n_actions = n_actions
        self._torch = torch
        self._gen = torch.Generator().manual_seed(cfg.seed)
        # parameters are initialized from their own seeded generator, not the global one
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.actor = self._mlp(state_dim, n_actions)
            self.critic = self._mlp(state_dim, 1)
            with torch.no_grad():
                # near-uniform initial policy: exploration starts from every action
                self.actor[-1].weight.mul_(0.01)
                self.actor[-1].bias.zero_()
        self._params = [*self.actor.parameters(), *self.critic.parameters()]
        self.opt = torch.optim.Adam(self._params, lr=cfg.lr)
        self._ret_mean, self._ret_sd, self._norm_init = 0.0, 1.0, False
        self.explained_variance = 0.0

    def _mlp(self, n_in: int, n_out: int) -> Any:
        nn = self._torch.nn
        h = self.config.hidden
        return nn.Sequential(
            nn.Linear(n_in, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, n_out)
        )

    # -- acting ---------------------------------------------------------------------------
    def _logits(self, states: Any, masks: Any) -> Any:
        lg = self.actor(states)
        return lg.masked_fill(~masks, -1e9) if self.config.mask else lg

    def act(self, state: np.ndarray, mask: np.ndarray | None = None, greedy: bool = False) -> int:
        torch = self._torch
        m = torch.from_numpy(mask if mask is not None else np.ones(self.n_actions, bool))
        with torch.no_grad():
            lg = self._logits(torch.from_numpy(state), m)
            if greedy:
                return int(torch.argmax(lg))
            return int(torch.multinomial(torch.softmax(lg, -1), 1, generator=self._gen))

    def run(self, env: EnsembleEnv, greedy: bool = True) -> EpisodeStats:
        """One whole episode on ``env``'s arrivals; returns its statistics."""
        with self._threads():
            s = env.start()
            while not env.done:
                s, _, _ = env.step(self.act(s, env.action_mask(), greedy=greedy))
        return env.stats

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """torch's thread count is process-wide: set it for the duration of a call only."""
        torch = self._torch
        before = torch.get_num_threads()
        torch.set_num_threads(self.config.torch_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    # -- learning -------------------------------------------------------------------------
    def train(
        self,
        envs: EnvSource,
        *,
        updates: int | None = None,
        episodes: int | None = None,
        validate: EnsembleEnv | None = None,
        validate_every: int = 25,
        progress: Callable[[TrainLog], None] | None = None,
    ) -> TrainLog:
        """Train until ``updates`` updates or ``episodes`` finished episodes (whichever first).

        ``envs`` is an environment (its arrivals are replayed in every slot) or a factory
        ``i -> EnsembleEnv`` called for the i-th episode (fresh arrivals each time). With
        ``validate``, a greedy episode runs there every ``validate_every`` updates and the best
        parameters are kept at the end.
        """
        if updates is None and episodes is None:
            raise ValidationError("train", "updates or episodes", None)
        with self._threads():
            return self._train(envs, updates, episodes, validate, validate_every, progress)

    def _train(
        self,
        envs: EnvSource,
        updates: int | None,
        episodes: int | None,
        validate: EnsembleEnv | None,
        validate_every: int,
        progress: Callable[[TrainLog], None] | None,
    ) -> TrainLog:
        torch = self._torch
        cfg = self.config
        make: Callable[[int], EnsembleEnv] = (
            (lambda i, e=envs: e.clone()) if isinstance(envs, EnsembleEnv) else envs
        )
        n = cfg.n_envs
        slots = [make(i) for i in range(n)]
        next_id = n
        states = [e.start() for e in slots]
        tau = slots[0].cfg.tau_s
        scale = 1.0 / max(slots[0].cfg.batch_sizes)
        center = float(np.mean(list(slots[0].acc.values()))) if cfg.center else 0.0
        tl = TrainLog()
        best: tuple[float, dict[str, Any]] | None = None
        while (updates is None or tl.updates < updates) and (
            episodes is None or len(tl.episodes) < episodes
        ):
            S, A, R, D, G, M = [], [], [], [], [], []
            for _ in range(cfg.n_steps):
                st = torch.from_numpy(np.stack(states))
                mk = torch.from_numpy(np.stack([e.action_mask() for e in slots]))
                with torch.no_grad():
                    probs = torch.softmax(self._logits(st, mk), -1)
                    a = torch.multinomial(probs, 1, generator=self._gen).squeeze(1).numpy()
                r = np.zeros(n, np.float32)
                d = np.zeros(n, np.float32)
                g = np.zeros(n, np.float32)
                for i, e in enumerate(slots):
                    s2, rew, done = e.step(int(a[i]))
                    r[i] = (rew - center * e.arrived) * scale
                    g[i] = cfg.gamma_per_tau ** (e.elapsed_s / tau)
                    if done:
                        d[i] = 1.0
                        tl.episodes.append(e.stats.summary())
                        slots[i] = e = make(next_id)
                        next_id += 1
                        s2 = e.start()
                    states[i] = s2
                S.append(st)
                A.append(a)
                R.append(r)
                D.append(d)
                G.append(g)
                M.append(mk)
            self._update(S, A, R, D, G, M, states)
            tl.updates += 1
            if validate is not None and tl.updates % validate_every == 0:
                reward = self.run(validate, greedy=True).reward
                tl.validation.append((tl.updates, reward))
                if best is None or reward > best[0]:
                    best = (reward, self._snapshot())
                    tl.best_update = tl.updates
            if progress:
                progress(tl)
        if validate is not None:
            reward = self.run(validate, greedy=True).reward
            tl.validation.append((tl.updates, reward))
            if best is not None and best[0] > reward:
                self._restore(best[1])
            else:
                tl.best_update = tl.updates
        return tl

    def _update(
        self,
        S: list[Any],
        A: list[np.ndarray],
        R: list[np.ndarray],
        D: list[np.ndarray],
        G: list[np.ndarray],
        M: list[Any],
        last_states: list[np.ndarray],
    ) -> None:
        torch = self._torch
        cfg = self.config
        T, n = len(S), len(S[0])
        st = torch.stack(S)
        flat = st.reshape(T * n, -1)
        mu, sd = self._ret_mean, self._ret_sd
        with torch.no_grad():
            v = self.critic(flat).reshape(T, n) * sd + mu
            v_last = self.critic(torch.from_numpy(np.stack(last_states))).squeeze(-1) * sd + mu
        r = torch.from_numpy(np.stack(R))
        nd = 1.0 - torch.from_numpy(np.stack(D))
        g = torch.from_numpy(np.stack(G))
        adv = torch.zeros(T, n)
        run = torch.zeros(n)
        for k in reversed(range(T)):
            v_next = v_last if k == T - 1 else v[k + 1]
            delta = r[k] + g[k] * nd[k] * v_next - v[k]
            run = delta + g[k] * cfg.gae_lambda * nd[k] * run
            adv[k] = run
        ret = (adv + v).reshape(-1)
        # fraction of the returns' variance the critic explains (diagnostics, TrainLog)
        self.explained_variance = float(1 - (ret - v.reshape(-1)).var() / (ret.var() + 1e-8))
        self._renormalize(ret)
        a = torch.from_numpy(np.stack(A)).reshape(-1).long()
        masks = torch.stack(M).reshape(T * n, -1)
        adv_f = adv.reshape(-1)
        adv_f = (adv_f - adv_f.mean()) / (adv_f.std() + 1e-8)
        logp = torch.log_softmax(self._logits(flat, masks), -1)
        pg = -(logp.gather(1, a[:, None]).squeeze(1) * adv_f).mean()
        p = logp.exp()
        ent = -(p * logp).masked_fill(~masks, 0.0).sum(-1).mean()
        v_pred = self.critic(flat).squeeze(-1)
        v_loss = torch.nn.functional.mse_loss(v_pred, (ret - self._ret_mean) / self._ret_sd)
        loss = pg + cfg.value_coef * v_loss - cfg.entropy * ent
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm)
        self.opt.step()

    def _renormalize(self, ret: Any) -> None:
        """Track the returns' mean and spread (the critic learns normalized returns) and rescale
        the critic's last layer so its denormalized outputs do not jump (PopArt, van Hasselt et
        al. 2016): without this the critic cannot follow returns of a few hundred batches'
        reward, its advantages degenerate to a few decisions' reward and the policy turns
        myopic (all models on every batch)."""
        torch = self._torch
        m, var = float(ret.mean()), float(ret.var()) if ret.numel() > 1 else 0.0
        if not self._norm_init:
            new_mu, new_sd = m, max(math.sqrt(var), 1e-2)
            self._norm_init = True
        else:
            beta = 0.05
            new_mu = (1 - beta) * self._ret_mean + beta * m
            second = (1 - beta) * (self._ret_sd**2 + self._ret_mean**2) + beta * (var + m * m)
            new_sd = max(math.sqrt(max(second - new_mu**2, 0.0)), 1e-2)
        last = self.critic[-1]
        with torch.no_grad():
            last.weight.mul_(self._ret_sd / new_sd)
            last.bias.mul_(self._ret_sd).add_(self._ret_mean - new_mu).div_(new_sd)
        self._ret_mean, self._ret_sd = new_mu, new_sd

    def _snapshot(self) -> dict[str, Any]:
        return {
            "actor": copy.deepcopy(self.actor.state_dict()),
            "critic": copy.deepcopy(self.critic.state_dict()),
            "norm": (self._ret_mean, self._ret_sd, self._norm_init),
        }

    def _restore(self, snap: Mapping[str, Any]) -> None:
        self.actor.load_state_dict(snap["actor"])
        self.critic.load_state_dict(snap["critic"])
        self._ret_mean, self._ret_sd, self._norm_init = snap["norm"]
