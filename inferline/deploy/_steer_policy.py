"""The steer loop's decisions from the server's counters (``inferline attach --steer``).

Each tick the loop hands :class:`SteerController` the server's cumulative counters per model
(``server_counters()``: request_success, request_failure, inference_count, exec_count,
queue_us, compute_us, request_us, optionally request_p99_us) and the time. The controller
turns the difference with the previous tick into figures (arrival rate, mean batch, service
time per batch) and the app's arrivals, which it spreads over the tick (uniformly at random,
the server says how many, not when) and feeds to InferLine's tuner (``core.Tuner``); the
tuner's decision is the new instance count per model. Clock-free: the caller passes the time
and the random generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferline.core import Plan, Tuner, TunerConfig, TunerDecision, ValidationError

__all__ = [
    "ModelFigures",
    "SteerController",
    "SteerTick",
    "counter_delta",
    "spread_arrivals",
]

Counters = Mapping[str, Mapping[str, float]]
_CUMULATIVE = (
    "request_success",
    "request_failure",
    "inference_count",
    "exec_count",
    "queue_us",
    "compute_us",
    "request_us",
)


def counter_delta(prev: Counters, cur: Counters) -> dict[str, dict[str, float]]:
    """Per model, how much each cumulative counter grew. A counter that went back (the model
    reloaded, the server restarted) counts from zero: its current value is the growth."""
    out: dict[str, dict[str, float]] = {}
    for m, row in cur.items():
        before = prev.get(m, {})
        d = {}
        for k in _CUMULATIVE:
            if k in row:
                v, b = float(row[k]), float(before.get(k, 0.0))
                d[k] = v - b if v >= b else v
        out[m] = d
    return out


@dataclass(frozen=True)
class ModelFigures:
    """One model over one tick: requests (served and failed), items and batches executed,
    and the means the counters give (0 where nothing ran)."""

    requests: float
    failures: float
    items: float
    batches: float
    rate_qps: float
    mean_batch: float
    service_s: float  # per batch
    queue_s: float  # per request
    latency_s: float  # per request, in the server

    @classmethod
    def of(cls, d: Mapping[str, float], interval_s: float) -> ModelFigures:
        ok, bad = d.get("request_success", 0.0), d.get("request_failure", 0.0)
        items, batches = d.get("inference_count", 0.0), d.get("exec_count", 0.0)
        n = ok + bad
        return cls(
            requests=n,
            failures=bad,
            items=items,
            batches=batches,
            rate_qps=n / interval_s if interval_s > 0 else 0.0,
            mean_batch=items / batches if batches else 0.0,
            # Triton and TF Serving add a batch's compute once per request in it, so the sum
            # over requests (not over batches) gives the mean run a request sat in.
            service_s=d.get("compute_us", 0.0) / ok / 1e6 if ok else 0.0,
            queue_s=d.get("queue_us", 0.0) / n / 1e6 if n else 0.0,
            latency_s=d.get("request_us", 0.0) / ok / 1e6 if ok else 0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def spread_arrivals(n: int, t0: float, t1: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times in ``(t0, t1]``, sorted: uniform at random (the counters say how
    many arrived in the tick, not when; a Poisson process's arrivals given their count are
    uniform)."""
    if n <= 0 or t1 <= t0:
        return np.zeros(0)
    return np.sort(t1 - rng.random(n) * (t1 - t0))


@dataclass(frozen=True)
class SteerTick:
    """What one tick saw and decided: per model figures, the app's arrivals (times), the
    app's measured P99 (the server's summary; None where it exports none) and the tuner's
    decision (None: keep the counts)."""

    time_s: float
    interval_s: float
    figures: dict[str, ModelFigures]
    arrivals: np.ndarray
    measured_p99_s: float | None
    decision: TunerDecision | None = None


@dataclass
class SteerController:
    """The tuner over the server's counters: feed :meth:`observe` the counters and the time.

    ``app_model``: the model clients call (the ensemble, or the one model), whose requests
    are the pipeline's arrivals; ``models``: the planned (composing) models."""

    plan: Plan
    app_model: str
    tuner_config: TunerConfig = field(default_factory=TunerConfig)
    start_s: float = 0.0
    tuner: Tuner = field(init=False)
    _prev: dict[str, dict[str, float]] | None = field(init=False, default=None)
    _prev_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.plan.tuner is None:
            raise ValidationError("plan.tuner", "tuner inputs (re-run the planner)", None)
        self.tuner = Tuner.from_plan(self.plan, self.tuner_config, self.start_s)
        self._prev_s = self.start_s

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.plan.models)

    @property
    def replicas(self) -> dict[str, int]:
        return self.tuner.replicas

    def replan(self, plan: Plan, now_s: float) -> None:
        """Follow a new plan (the drift loop's): its envelope and counts."""
        self.plan = plan
        self.tuner = Tuner.from_plan(plan, self.tuner_config, now_s)

    def observe(self, counters: Counters, now_s: float, rng: np.random.Generator) -> SteerTick:
        """One tick. The first call only sets the baseline (no arrivals, no decision)."""
        cur = {m: dict(v) for m, v in counters.items()}
        prev, t0 = self._prev, self._prev_s
        self._prev, self._prev_s = cur, now_s
        p99 = cur.get(self.app_model, {}).get("request_p99_us")
        measured = None if p99 is None else p99 / 1e6
        if prev is None:
            return SteerTick(now_s, 0.0, {}, np.zeros(0), measured)
        dt = now_s - t0
        delta = counter_delta(prev, cur)
        figures = {m: ModelFigures.of(d, dt) for m, d in delta.items()}
        app = figures.get(self.app_model)
        n = round(app.requests) if app is not None else 0
        arrivals = spread_arrivals(n, t0, now_s, rng)
        self.tuner.record(arrivals)
        decision = self.tuner.tick(now_s)
        return SteerTick(now_s, dt, figures, arrivals, measured, decision)
