"""Load-driven model switching (Zhang et al., "Model-Switching", HotCloud'20).

Effective accuracy of a variant at arrival rate λ and deadline D is its accuracy times the
probability that a query meets D (the paper's eq. 1, valid because service time does not depend
on whether the prediction is right). The controller estimates the current rate from the most
recent arrivals (the paper's event-based window: youngest and oldest timestamp of the last N
arrivals) and picks, among every variant and every replicas x threads split of a fixed core
budget (R x T = C, Algorithm 1), the one with the highest effective accuracy. Deadline-meet
probabilities come from inferline's own estimator, computed once per (option, rate) on a grid so
that decisions at serving time are table look-ups.

Thread counts are read from the profiles: a variant profiled with T threads is stored under the
hardware name ``cpu-t{T}`` (``cpu`` counts as one thread).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    Hardware,
    HardwareCatalog,
    ModelConfig,
    Pipeline,
    Profiles,
    ValidationError,
    gamma_trace,
)

__all__ = [
    "RateEstimator",
    "SwitchDecision",
    "SwitchOption",
    "SwitchingConfig",
    "SwitchingController",
    "SwitchingTable",
    "Variant",
    "build_switching_table",
    "thread_hardware",
]


def thread_hardware(threads: int) -> str:
    return "cpu" if threads == 1 else f"cpu-t{threads}"


@dataclass(frozen=True)
class Variant:
    """A model variant of one stage and its (measured) accuracy in [0, 1]."""

    name: str
    accuracy: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy <= 1.0:
            raise ValidationError(
                f"variants.{self.name}.accuracy", "a number in [0, 1]", self.accuracy
            )


@dataclass(frozen=True)
class SwitchOption:
    variant: str
    replicas: int
    threads: int
    max_batch_size: int = 1

    @property
    def hardware(self) -> str:
        return thread_hardware(self.threads)

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "replicas": self.replicas,
            "threads": self.threads,
            "max_batch_size": self.max_batch_size,
        }


@dataclass(frozen=True)
class SwitchingConfig:
    deadline_s: float
    core_budget: int
    rate_window: int = 64  # arrivals used to estimate the rate
    rates_qps: tuple[float, ...] = ()  # grid; empty -> derived from the options' capacities
    cv: float = 1.0  # burstiness assumed when computing meet probabilities
    sim_queries: int = 3000
    seed: int = 0
    rule: str = "effective"  # or "paper": most accurate variant whose P99 meets D (Algorithm 1)
    max_batch_size: int = 1

    def __post_init__(self) -> None:
        if not self.deadline_s > 0:
            raise ValidationError("deadline_s", "a deadline > 0", self.deadline_s)
        if self.core_budget < 1:
            raise ValidationError("core_budget", "an integer >= 1", self.core_budget)
        if self.rule not in ("effective", "paper"):
            raise ValidationError("rule", "'effective' or 'paper'", self.rule)
        if self.rate_window < 2:
            raise ValidationError("rate_window", "an integer >= 2", self.rate_window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deadline_s": self.deadline_s,
            "core_budget": self.core_budget,
            "rate_window": self.rate_window,
            "rates_qps": list(self.rates_qps),
            "cv": self.cv,
            "sim_queries": self.sim_queries,
            "seed": self.seed,
            "rule": self.rule,
            "max_batch_size": self.max_batch_size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SwitchingConfig:
        d = dict(d)
        d["rates_qps"] = tuple(d.get("rates_qps", ()))
        return cls(**d)


@dataclass(frozen=True)
class SwitchingTable:
    """``meet[i][j]``: probability that option i meets the deadline at ``rates_qps[j]``;
    ``p99[i][j]`` the estimated P99 latency there."""

    options: tuple[SwitchOption, ...]
    accuracy: Mapping[str, float]
    rates_qps: tuple[float, ...]
    meet: tuple[tuple[float, ...], ...]
    p99_s: tuple[tuple[float, ...], ...]

    def rate_index(self, rate: float) -> int:
        # the first grid rate at or above the estimate: conservative
        j = int(np.searchsorted(np.asarray(self.rates_qps), rate, side="left"))
        return min(j, len(self.rates_qps) - 1)

    def effective_accuracy(self, i: int, rate: float) -> float:
        o = self.options[i]
        return self.accuracy[o.variant] * self.meet[i][self.rate_index(rate)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "options": [o.to_dict() for o in self.options],
            "accuracy": dict(self.accuracy),
            "rates_qps": list(self.rates_qps),
            "meet": [list(r) for r in self.meet],
            "p99_s": [list(r) for r in self.p99_s],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SwitchingTable:
        return cls(
            tuple(SwitchOption(**o) for o in d["options"]),
            dict(d["accuracy"]),
            tuple(d["rates_qps"]),
            tuple(tuple(r) for r in d["meet"]),
            tuple(tuple(r) for r in d["p99_s"]),
        )


def _options(
    variants: Sequence[Variant], profiles: Profiles, cfg: SwitchingConfig
) -> list[SwitchOption]:
    out = []
    for v in variants:
        for t in range(1, cfg.core_budget + 1):
            if cfg.core_budget % t:
                continue
            if profiles.has(v.name, thread_hardware(t)):
                out.append(SwitchOption(v.name, cfg.core_budget // t, t, cfg.max_batch_size))
    if not out:
        raise ValidationError(
            "profiles",
            "a 'cpu' or 'cpu-tT' profile for at least one variant",
            [v.name for v in variants],
        )
    return out


def build_switching_table(
    variants: Sequence[Variant],
    profiles: Profiles,
    config: SwitchingConfig,
    progress: Callable[[int, int], None] | None = None,
    extra_rates: Sequence[float] = (),
) -> SwitchingTable:
    """Estimate each option's deadline-meet probability over a grid of rates (the estimator,
    single-stage pipeline, gamma arrivals with the configured CV). ``extra_rates`` (a
    measured arrival rate, say) join the grid, so the table has a column exactly there."""
    from inferline.core import simulate  # the estimator; imported here to keep import time low

    options = _options(variants, profiles, config)
    # a T-thread CPU slot costs T cores; the estimator needs every hardware name in its catalog
    cpu = DEFAULT_CATALOG["cpu"].cost_per_hour
    catalog = DEFAULT_CATALOG.merged(
        HardwareCatalog({o.hardware: Hardware("cpu", cpu * o.threads) for o in options})
    )
    rates = config.rates_qps
    if not rates:
        cap = max(o.replicas * profiles.throughput(o.variant, o.hardware, 1) for o in options)
        rates = tuple(float(r) for r in np.geomspace(max(cap / 50, 0.1), cap * 1.5, 24))
    extra = [float(r) for r in extra_rates if math.isfinite(r) and r > 0]
    if extra:
        rates = tuple(sorted(set(rates) | set(extra)))
    rng_seed = config.seed
    meet: list[tuple[float, ...]] = []
    p99: list[tuple[float, ...]] = []
    total = len(options) * len(rates)
    done = 0
    for o in options:
        pipe = Pipeline(o.variant, (o.variant,))
        cfgs = {o.variant: ModelConfig(o.hardware, o.max_batch_size, o.replicas)}
        row_m, row_p = [], []
        for r in rates:
            duration = config.sim_queries / r
            trace = gamma_trace(r, config.cv, duration, np.random.default_rng(rng_seed))
            if trace.size < 2:
                row_m.append(1.0)
                row_p.append(profiles.latency(o.variant, o.hardware, 1))
                continue
            res = simulate(pipe, cfgs, profiles, trace, catalog=catalog)
            row_m.append(1.0 - res.miss_rate(config.deadline_s))
            row_p.append(res.percentile(99.0))
            done += 1
            if progress:
                progress(done, total)
        meet.append(tuple(row_m))
        p99.append(tuple(row_p))
    return SwitchingTable(
        tuple(options),
        {v.name: v.accuracy for v in variants},
        tuple(rates),
        tuple(meet),
        tuple(p99),
    )


@dataclass(frozen=True)
class RateEstimator:
    """The paper's event-based window: rate from the youngest and oldest of the last N arrivals."""

    window: int = 64
    times: tuple[float, ...] = field(default_factory=tuple)

    def add(self, arrivals: Sequence[float] | np.ndarray) -> RateEstimator:
        d: deque[float] = deque(self.times, maxlen=self.window)
        d.extend(float(t) for t in arrivals)
        return replace(self, times=tuple(d))

    def rate(self, now_s: float | None = None) -> float:
        if len(self.times) < 2:
            return 0.0
        span = self.times[-1] - self.times[0]
        if now_s is not None:
            # a lull since the last arrival lowers the estimate (otherwise it would freeze high)
            span = max(span, now_s - self.times[0])
        return (len(self.times) - 1) / span if span > 0 else math.inf


@dataclass(frozen=True)
class SwitchDecision:
    time_s: float
    option: SwitchOption
    rate_qps: float
    effective_accuracy: float
    reason: str


class SwitchingController:
    """Pure decision object: ``decide(now, estimator) -> SwitchDecision``."""

    def __init__(self, table: SwitchingTable, config: SwitchingConfig) -> None:
        self.table = table
        self.config = config

    def decide(self, now_s: float, estimator: RateEstimator) -> SwitchDecision:
        rate = estimator.rate(now_s)
        t = self.table
        j = t.rate_index(rate)
        if self.config.rule == "paper":
            best = self._paper_choice(j)
            why = (
                f"rate {rate:.1f} q/s: most accurate variant meeting the deadline, its "
                f"lowest-P99 split ({t.p99_s[best][j] * 1e3:.0f} ms)"
            )
        else:
            scores = [t.effective_accuracy(i, rate) for i in range(len(t.options))]
            # ties go to the more accurate variant, then to the split with the lower P99
            best = max(
                range(len(scores)),
                key=lambda i: (
                    round(scores[i], 9),
                    t.accuracy[t.options[i].variant],
                    -t.p99_s[i][j],
                ),
            )
            why = f"rate {rate:.1f} q/s: highest effective accuracy {scores[best]:.3f}"
        o = t.options[best]
        return SwitchDecision(
            now_s,
            o,
            rate,
            t.effective_accuracy(best, rate),
            f"{o.variant} R{o.replicas}xT{o.threads}; {why}",
        )

    def _paper_choice(self, j: int) -> int:
        """Algorithm 1: variants by descending accuracy; the first with a replicas x threads
        split whose P99 meets the deadline, served by its split with the *lowest* P99 (not the
        first feasible one). None feasible: the option with the lowest P99 overall."""
        t = self.table
        d = self.config.deadline_s
        for acc in sorted({t.accuracy[o.variant] for o in t.options}, reverse=True):
            feasible = [
                i
                for i, o in enumerate(t.options)
                if t.accuracy[o.variant] == acc and t.p99_s[i][j] <= d
            ]
            if feasible:
                return min(feasible, key=lambda i: t.p99_s[i][j])
        return min(range(len(t.options)), key=lambda i: t.p99_s[i][j])
