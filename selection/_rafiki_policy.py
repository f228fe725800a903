"""Rafiki's actor-critic ensemble selector as a serving policy (``"policy": "rafiki"``).

The agent (``RafikiAgent``) is pretrained at construction in Rafiki's simulator
(``EnsembleEnv``) from the deployment's model profiles: per-model batch latencies
``latency_ms``, the accuracy of every subset's ensemble ``subset_accuracy`` and the SLO
``tau_ms``, on the paper's noisy sine (Eqs. 8-9) around ``rate_ref`` (default: the rate the
slowest model sustains at its largest batch, i.e. what all models synchronously can serve), as
Rafiki trains its scheduler in simulation before use. Trained agents are cached per
configuration, so validating a deployment and then starting it trains once.

Serving. Every query is one decision. The state fed to the actor is the simulator's, built from
what the policy sees live: the queries in flight (selected, not yet combined) stand for the
queue (their waits in units of tau, oldest first, and the log queue length), the static
latency profile, and per model the work left, estimated as its outstanding queries times its
per-query latency at the largest batch, counted from the least-loaded model's (the simulator
decides when a model frees up, so some model is always idle there). The action mask keeps the
subsets holding such an idle model, as in training. The action's subset is queried; the batch size of the
action is left to the models' own batching. ``status()`` reports the recent models per query
and the arrival rate (``GET /apps/{app}/selection``). Randomness: none at serving time (the
greedy action); training is seeded by ``seed``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

from ._policy import Combined, WeightState, check_models, combine_votes
from ._rafiki import _WAIT_CAP, RATE_WINDOW, EnsembleEnv, RafikiConfig, rate_feature, sine_arrivals
from ._rafiki_agent import RafikiAgent, RafikiTrainConfig

__all__ = ["RafikiPolicy"]

# training defaults of the served policy: more entropy and a shorter horizon than the library
# defaults; on benchmarks/rafiki_live.py's profile the library defaults settle on one model at
# every rate, these started to use all models at low rate within 200 updates (docs/selection.md)
SERVE_TRAINING: dict[str, Any] = {"entropy": 0.05, "gamma_per_tau": 0.9}

_AGENTS: dict[str, RafikiAgent] = {}
_AGENTS_LOCK = threading.Lock()


def _profile(models: Sequence[str], latency_ms: Any) -> tuple[list[dict[int, float]], list[int]]:
    if not isinstance(latency_ms, Mapping):
        raise ValidationError("latency_ms", "per model, {batch size: latency in ms}", latency_ms)
    unknown = sorted(set(latency_ms) - set(models))
    if unknown:
        raise ValidationError("latency_ms", f"profiles of the models {list(models)}", unknown)
    lat: list[dict[int, float]] = []
    for m in models:
        prof = latency_ms.get(m)
        if not isinstance(prof, Mapping) or not prof:
            raise ValidationError(f"latency_ms.{m}", "{batch size: latency in ms}", prof)
        d: dict[int, float] = {}
        for b, v in prof.items():
            try:
                bi = int(b)
            except (TypeError, ValueError):
                raise ValidationError(f"latency_ms.{m}", "integer batch sizes", b) from None
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            if bi < 1 or not ok or v <= 0:
                raise ValidationError(f"latency_ms.{m}.{b}", "a latency in ms > 0", v)
            d[bi] = float(v) / 1e3
        lat.append(d)
    sizes = sorted(set.intersection(*(set(d) for d in lat)))
    if not sizes:
        raise ValidationError("latency_ms", "batch sizes profiled for every model", None)
    return lat, sizes


def _accuracies(models: Sequence[str], subset_accuracy: Any) -> dict[tuple[int, ...], float]:
    if not isinstance(subset_accuracy, Mapping):
        raise ValidationError(
            "subset_accuracy", 'accuracy per subset, e.g. {"a": 0.9, "a+b": 0.93}', subset_accuracy
        )
    acc: dict[tuple[int, ...], float] = {}
    for key, v in subset_accuracy.items():
        names = str(key).split("+")
        if any(n not in models for n in names) or len(set(names)) != len(names):
            raise ValidationError("subset_accuracy", f"'+'-joined names of {list(models)}", key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            raise ValidationError(f"subset_accuracy.{key}", "an accuracy in [0, 1]", v)
        acc[tuple(sorted(models.index(n) for n in names))] = float(v)
    for r in range(1, len(models) + 1):
        for sub in itertools.combinations(range(len(models)), r):
            if sub not in acc:
                name = "+".join(models[i] for i in sub)
                raise ValidationError(
                    "subset_accuracy", f"an accuracy for every subset ({name})", None
                )
    return acc


class RafikiPolicy:
    """Actor-critic ensemble selection (Rafiki, VLDB'18 §5), pretrained in simulation."""

    name = "rafiki"
    observes_missing = False

    def __init__(
        self,
        models: Sequence[str],
        rng: random.Random | None = None,
        *,
        latency_ms: Mapping[str, Mapping[Any, float]] | None = None,
        subset_accuracy: Mapping[str, float] | None = None,
        tau_ms: float | None = None,
        beta: float = 1.0,
        rate_ref: float | None = None,
        train_updates: int = 150,
        seed: int = 0,
        window_s: float = 5.0,
        train: Mapping[str, Any] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.models = check_models(models)
        if tau_ms is None or isinstance(tau_ms, bool) or not isinstance(tau_ms, int | float):
            raise ValidationError("tau_ms", "the latency SLO in ms (> 0)", tau_ms)
        if not tau_ms > 0:
            raise ValidationError("tau_ms", "the latency SLO in ms (> 0)", tau_ms)
        if isinstance(beta, bool) or not isinstance(beta, int | float) or beta < 0:
            raise ValidationError("beta", "a number >= 0", beta)
        if (
            not isinstance(train_updates, int)
            or isinstance(train_updates, bool)
            or train_updates < 1
        ):
            raise ValidationError("train_updates", "an integer >= 1", train_updates)
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) or window_s <= 0:
            raise ValidationError("window_s", "a number of seconds > 0", window_s)
        if train is not None and not isinstance(train, Mapping):
            raise ValidationError("train", 'RafikiTrainConfig fields, e.g. {"lr": 0.001}', train)
        try:
            tcfg = RafikiTrainConfig.from_dict(
                {"seed": int(seed), **SERVE_TRAINING, **dict(train or {})}
            )
        except TypeError as e:
            raise ValidationError("train", "RafikiTrainConfig fields", str(e)) from None
        except ValidationError as e:
            raise ValidationError(f"train.{e.field}", e.expected, e.got) from None
        self.lat, sizes = _profile(self.models, latency_ms)
        self.acc = _accuracies(self.models, subset_accuracy)
        self.cfg = RafikiConfig(tuple(sizes), tau_s=float(tau_ms) / 1e3, beta=float(beta))
        bmax = max(sizes)
        if rate_ref is None:
            rate_ref = min(bmax / d[bmax] for d in self.lat)
        elif isinstance(rate_ref, bool) or not isinstance(rate_ref, int | float) or rate_ref <= 0:
            raise ValidationError("rate_ref", "a rate in queries/s > 0", rate_ref)
        self.params: dict[str, Any] = {
            "latency_ms": {
                m: {str(b): v * 1e3 for b, v in d.items()}
                for m, d in zip(self.models, self.lat, strict=True)
            },
            "subset_accuracy": {
                "+".join(self.models[i] for i in k): v for k, v in self.acc.items()
            },
            "tau_ms": float(tau_ms),
            "beta": float(beta),
            "rate_ref": float(rate_ref),
            "train_updates": train_updates,
            "seed": int(seed),
            "window_s": float(window_s),
            "train": {k: v for k, v in tcfg.to_dict().items() if k != "seed"},
        }
        self._tcfg = tcfg
        self._clock = clock or time.monotonic
        self._env = self._make_env(np.zeros(1))
        self.agent = self._trained()
        # live tracking: in-flight queries by input identity, outstanding queries per model
        self._inflight: dict[int, deque[tuple[float, tuple[int, ...]]]] = {}
        self._outstanding = np.zeros(len(self.models), dtype=int)
        self._recent: deque[tuple[float, int]] = deque()
        self._arrivals: deque[float] = deque()  # within the last RATE_WINDOW taus
        self._decisions = 0
        self._per_query = np.array([d[bmax] / bmax for d in self.lat])

    # -- training -------------------------------------------------------------------------
    def _make_env(self, arrivals: np.ndarray) -> EnsembleEnv:
        return EnsembleEnv(self.lat, self.acc, self.cfg, arrivals)

    def _sine_env(self, seed: int) -> EnsembleEnv:
        tau = self.cfg.tau_s
        period = 500.0 * tau
        rng = np.random.default_rng(seed)
        start = float(rng.uniform(0, period))
        arr = sine_arrivals(self.params["rate_ref"], tau, period, rng, start_s=start)
        return self._make_env(arr)

    def _trained(self) -> RafikiAgent:
        key = json.dumps({"models": list(self.models), **self.params}, sort_keys=True)
        with _AGENTS_LOCK:
            agent = _AGENTS.get(key)
            if agent is None:
                seed = self.params["seed"]
                agent = RafikiAgent(self._env.state_dim, len(self._env.actions), self._tcfg)
                agent.train(
                    lambda i: self._sine_env(seed * 100_003 + 1000 + i),
                    updates=self.params["train_updates"],
                    validate=self._sine_env(seed * 100_003 + 1),
                )
                _AGENTS[key] = agent
        return agent

    def act(self, state: np.ndarray, mask: np.ndarray) -> int:
        """The greedy action over subsets: the subset with the most probability summed over its
        batch sizes, then its most probable batch size. (An argmax over single actions splits
        a subset's probability across its |B| batch sizes and under-picks it; serving uses only
        the subset.)"""
        torch = self.agent._torch
        with torch.no_grad():
            lg = self.agent._logits(torch.from_numpy(state), torch.from_numpy(mask))
            p = torch.softmax(lg, -1).numpy()
        nb = len(self.cfg.batch_sizes)
        best = int(np.argmax(p.reshape(-1, nb).sum(axis=1)))
        return best * nb + int(np.argmax(p[best * nb : (best + 1) * nb]))

    def simulate(self, env: EnsembleEnv) -> Any:
        """One episode of ``env`` with this policy's greedy subsets (``EpisodeStats``)."""
        with self.agent._threads():
            s = env.start()
            while not env.done:
                s, _, _ = env.step(self.act(s, env.action_mask()))
        return env.stats

    def config(self) -> dict[str, Any]:
        return {"policy": self.name, "models": list(self.models), **self.params}

    # -- the Clipper interface ------------------------------------------------------------
    def init(self) -> WeightState:
        return WeightState.fresh(self.models)

    def state_from_dict(self, d: Mapping[str, Any]) -> WeightState:
        return WeightState.from_dict(d)

    def live_state(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """The simulator's state vector and action mask, from the queries in flight."""
        cfg = self.cfg
        arrivals = sorted(a for q in self._inflight.values() for a, _ in q)
        q = np.zeros(cfg.queue_features)
        waits = [now - a for a in arrivals[: cfg.queue_features]]
        q[: len(waits)] = np.minimum(np.asarray(waits) / cfg.tau_s, _WAIT_CAP)
        qlen = np.array([math.log1p(len(arrivals) / max(cfg.batch_sizes))])
        w = RATE_WINDOW * cfg.tau_s
        while self._arrivals and self._arrivals[0] <= now - w:
            self._arrivals.popleft()
        rate = np.array([rate_feature(len(self._arrivals) / w, self._env.capacity)])
        work = self._outstanding * self._per_query
        # the simulator decides when a model frees up: seen from the least-loaded model's
        # free time, it is idle and the others have the difference left (a state of the
        # training distribution, where some model is always idle)
        left = (work - work.min()) / cfg.tau_s
        state = np.concatenate([q, qlen, rate, self._env.static, left]).astype(np.float32)
        idle = left <= 1e-12
        masks = self._env._subset_masks
        mask = masks[idle].any(axis=0) if idle.any() else np.ones(len(self._env.actions), bool)
        return state, mask

    def select(self, state: Any, x: Any) -> list[str]:
        now = self._clock()
        self._arrivals.append(now)
        s, mask = self.live_state(now)
        subset, _batch = self._env.actions[self.act(s, mask)]
        self._inflight.setdefault(id(x), deque()).append((now, subset))
        for m in subset:
            self._outstanding[m] += 1
        self._recent.append((now, len(subset)))
        self._decisions += 1
        self._trim(now)
        return [self.models[m] for m in subset]

    def combine(self, state: Any, x: Any, predictions: Mapping[str, Any]) -> Combined:
        q = self._inflight.get(id(x))
        if q:
            _, subset = q.popleft()
            if not q:
                del self._inflight[id(x)]
            for m in subset:
                self._outstanding[m] -= 1
            selected = [self.models[m] for m in subset]
        else:
            selected = list(predictions)
        return combine_votes(predictions, {}, selected)

    def observe(self, state: Any, x: Any, feedback: Any, predictions: Mapping[str, Any]) -> Any:
        # the agent learns from the simulator, not from labels: feedback only counts steps
        return WeightState(
            state.models, state.log_weights, state.counts, state.total_loss, state.steps + 1
        )

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.params["window_s"]:
            self._recent.popleft()

    def status(self) -> dict[str, Any]:
        """Recent models per query and arrival rate (the last ``window_s``), queries in flight."""
        now = self._clock()
        self._trim(now)
        n = len(self._recent)
        return {
            "policy": self.name,
            "window_s": self.params["window_s"],
            "rate_qps": n / self.params["window_s"],
            "models_per_query": (sum(k for _, k in self._recent) / n) if n else None,
            "in_flight": int(sum(len(q) for q in self._inflight.values())),
            "outstanding": dict(zip(self.models, self._outstanding.tolist(), strict=True)),
            "decisions": self._decisions,
            "rate_ref": self.params["rate_ref"],
        }
