"""Batching policies: pure decision objects, one per model queue.

A policy answers one question for a free replica: given the queue's state *now*, take how many
queries, or wait until when? It never reads a clock (the dispatcher passes ``now``) and never
mutates itself: ``observe`` returns the next policy value, so a policy is a plain value that
can be compared, logged and replayed in tests with numbers for times.

Protocol (``BatchingPolicy``):

- ``decide(now, queued, oldest_deadline, oldest_arrival) -> BatchDecision``: ``queued`` is the
  number of waiting queries (at least 1), ``oldest_deadline`` and ``oldest_arrival`` are the
  deadline and the enqueue time of the queue's head (the earliest deadline). The decision is
  ``take > 0`` (form a batch of that many now) or ``wait_until`` (ask again at that time, or
  earlier when another query arrives).
- ``observe(batch_size, latency_s) -> policy``: the policy after a batch of ``batch_size``
  took ``latency_s`` on a replica.
- ``max_batch_size``: the current upper bound on a batch (for stats and the tuner).

Policies:

- ``FixedBatching``: the planner's and the estimator's rule, ``min(max_batch_size, queued)``
  as soon as a replica is free.
- ``DelayedBatching``: Clipper's Nagle-like batch delay; with fewer than ``max_batch_size``
  queued, wait until the head has waited ``batch_wait_s`` for a fuller batch.
- ``AIMDBatching``: Clipper's adaptive maximum batch size. Additive increase while the measured
  batch latency is under ``slo_s - margin_s``; multiplicative back-off by 10% when over.
- ``RafikiGreedyBatching``: Rafiki's Algorithm 3. Take the largest candidate size when that
  many are queued; otherwise the largest candidate not above the queue length, but only once
  the head would otherwise miss its deadline (``now + c(b) + delta >= deadline``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from inferline.core.errors import ValidationError

__all__ = [
    "AIMDBatching",
    "BatchDecision",
    "BatchingPolicy",
    "DelayedBatching",
    "FixedBatching",
    "RafikiGreedyBatching",
    "batching_from_dict",
]


@dataclass(frozen=True)
class BatchDecision:
    """Take ``take`` queries now (``take > 0``), or wait until ``wait_until``."""

    take: int = 0
    wait_until: float | None = None

    def __post_init__(self) -> None:
        if self.take < 0 or (self.take == 0) == (self.wait_until is None):
            raise ValidationError("BatchDecision", "take > 0 xor a wait_until time", self)


@runtime_checkable
class BatchingPolicy(Protocol):
    @property
    def max_batch_size(self) -> int: ...

    def decide(
        self, now: float, queued: int, oldest_deadline: float, oldest_arrival: float
    ) -> BatchDecision: ...

    def observe(self, batch_size: int, latency_s: float) -> BatchingPolicy: ...

    def to_dict(self) -> dict[str, Any]: ...


def _pos_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValidationError(name, "an int >= 1", v)
    return v


def _nonneg(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValidationError(name, "a finite number >= 0", v)
    return float(v)


@dataclass(frozen=True)
class FixedBatching:
    """``min(max_batch_size, queued)`` at once; never waits (the estimator's semantics)."""

    max_batch_size: int = 1

    def __post_init__(self) -> None:
        _pos_int(self.max_batch_size, "max_batch_size")

    def decide(
        self, now: float, queued: int, oldest_deadline: float, oldest_arrival: float
    ) -> BatchDecision:
        return BatchDecision(take=min(self.max_batch_size, queued))

    def observe(self, batch_size: int, latency_s: float) -> FixedBatching:
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"policy": "fixed", "max_batch_size": self.max_batch_size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FixedBatching:
        return cls(max_batch_size=d["max_batch_size"])


@dataclass(frozen=True)
class DelayedBatching:
    """Clipper's delayed batching: wait up to ``batch_wait_s`` (from the head's enqueue time)
    for a full batch; dispatch at once when ``max_batch_size`` are queued."""

    max_batch_size: int = 1
    batch_wait_s: float = 0.0

    def __post_init__(self) -> None:
        _pos_int(self.max_batch_size, "max_batch_size")
        _nonneg(self.batch_wait_s, "batch_wait_s")

    def decide(
        self, now: float, queued: int, oldest_deadline: float, oldest_arrival: float
    ) -> BatchDecision:
        if queued >= self.max_batch_size:
            return BatchDecision(take=self.max_batch_size)
        until = oldest_arrival + self.batch_wait_s
        if now >= until:
            return BatchDecision(take=queued)
        return BatchDecision(wait_until=until)

    def observe(self, batch_size: int, latency_s: float) -> DelayedBatching:
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": "delayed",
            "max_batch_size": self.max_batch_size,
            "batch_wait_s": self.batch_wait_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DelayedBatching:
        return cls(max_batch_size=d["max_batch_size"], batch_wait_s=d["batch_wait_s"])


@dataclass(frozen=True)
class AIMDBatching:
    """Clipper's AIMD maximum batch size.

    After each batch: if its latency is at most ``slo_s - margin_s`` and the batch was full
    (it used the whole current maximum), grow the maximum by ``increase``; if its latency is
    over, shrink it to ``floor(size * backoff)`` (at least 1 smaller, at least ``minimum``).
    A partial batch under the bound teaches nothing about a larger size, so it does not grow
    the maximum (otherwise light load would inflate it without limit).
    """

    initial: int = 1
    slo_s: float = 0.1
    margin_s: float = 0.0
    increase: int = 1
    backoff: float = 0.9
    minimum: int = 1
    maximum: int = 1024
    size: int = field(default=0)  # current maximum batch size; 0 means "start at initial"

    def __post_init__(self) -> None:
        _pos_int(self.initial, "initial")
        _pos_int(self.increase, "increase")
        _pos_int(self.minimum, "minimum")
        _pos_int(self.maximum, "maximum")
        if self.slo_s <= 0 or not math.isfinite(self.slo_s):
            raise ValidationError("slo_s", "a finite number > 0", self.slo_s)
        _nonneg(self.margin_s, "margin_s")
        if not 0 < self.backoff < 1:
            raise ValidationError("backoff", "a factor in (0, 1)", self.backoff)
        if self.minimum > self.maximum:
            raise ValidationError("minimum", f"at most maximum={self.maximum}", self.minimum)
        if self.size == 0:
            object.__setattr__(self, "size", min(self.maximum, max(self.minimum, self.initial)))
        _pos_int(self.size, "size")

    @property
    def max_batch_size(self) -> int:
        return self.size

    def decide(
        self, now: float, queued: int, oldest_deadline: float, oldest_arrival: float
    ) -> BatchDecision:
        return BatchDecision(take=min(self.size, queued))

    def observe(self, batch_size: int, latency_s: float) -> AIMDBatching:
        if latency_s > self.slo_s - self.margin_s:
            new = min(self.size - 1, math.floor(self.size * self.backoff))
            return replace(self, size=max(self.minimum, new))
        if batch_size >= self.size and self.size < self.maximum:
            return replace(self, size=min(self.maximum, self.size + self.increase))
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": "aimd",
            "initial": self.initial,
            "slo_s": self.slo_s,
            "margin_s": self.margin_s,
            "increase": self.increase,
            "backoff": self.backoff,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "size": self.size,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AIMDBatching:
        return cls(**{k: v for k, v in d.items() if k != "policy"})


@dataclass(frozen=True)
class RafikiGreedyBatching:
    """Rafiki's greedy batching (Algorithm 3).

    ``candidate_sizes`` is the list B; ``latency_fn(b)`` is c(b), the processing time of a batch
    of b; ``delta_s`` is the back-off constant δ (the paper suggests 0.1·τ). The paper's test
    ``c(b) + w(q0) + δ >= τ`` is written with the head's deadline (arrival + SLO), which is the
    same test for a single model and the right one inside a pipeline. When fewer queries are
    queued than the smallest candidate, the whole queue is the batch once the head is due (the
    paper leaves this case open; waiting longer could only make the head late), with c(b)
    taken as the smallest candidate's time.

    ``latency_fn`` is a function, so ``to_dict`` records the latencies of the candidate sizes
    and ``from_dict`` rebuilds a step function from them.
    """

    candidate_sizes: tuple[int, ...] = (1,)
    latency_fn: Callable[[int], float] = field(default=lambda b: 0.0, compare=False)
    delta_s: float = 0.0

    def __post_init__(self) -> None:
        sizes = tuple(sorted({_pos_int(b, "candidate_sizes[]") for b in self.candidate_sizes}))
        if not sizes:
            raise ValidationError("candidate_sizes", "at least one batch size", ())
        object.__setattr__(self, "candidate_sizes", sizes)
        _nonneg(self.delta_s, "delta_s")

    @property
    def max_batch_size(self) -> int:
        return self.candidate_sizes[-1]

    def decide(
        self, now: float, queued: int, oldest_deadline: float, oldest_arrival: float
    ) -> BatchDecision:
        sizes = self.candidate_sizes
        if queued >= sizes[-1]:
            return BatchDecision(take=sizes[-1])
        i = bisect.bisect_right(sizes, queued)
        b = sizes[i - 1] if i > 0 else queued
        # below the smallest candidate, c(b) is taken as c(smallest): only candidates' times
        # are known (the profiles' rule: the smallest profiled size at least as large)
        c = float(self.latency_fn(b if i > 0 else sizes[0]))
        latest_start = oldest_deadline - c - self.delta_s
        if now >= latest_start:
            return BatchDecision(take=b)
        return BatchDecision(wait_until=latest_start)

    def observe(self, batch_size: int, latency_s: float) -> RafikiGreedyBatching:
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": "rafiki",
            "candidate_sizes": list(self.candidate_sizes),
            "latencies_s": [float(self.latency_fn(b)) for b in self.candidate_sizes],
            "delta_s": self.delta_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RafikiGreedyBatching:
        sizes: Sequence[int] = d["candidate_sizes"]
        lat = dict(zip(sizes, d["latencies_s"], strict=True))
        ordered = sorted(lat)

        def step(b: int) -> float:
            # smallest candidate at least b (the profiles' rule); beyond the largest, the largest
            j = bisect.bisect_left(ordered, b)
            return lat[ordered[min(j, len(ordered) - 1)]]

        return cls(candidate_sizes=tuple(sizes), latency_fn=step, delta_s=d["delta_s"])


_POLICIES: dict[str, Any] = {
    "fixed": FixedBatching,
    "delayed": DelayedBatching,
    "aimd": AIMDBatching,
    "rafiki": RafikiGreedyBatching,
}


def batching_from_dict(d: Any) -> BatchingPolicy:
    """Rebuild a policy from its ``to_dict()`` (``{"policy": name, ...}``)."""
    if not isinstance(d, dict) or d.get("policy") not in _POLICIES:
        raise ValidationError("policy", f"one of {sorted(_POLICIES)!r}", d)
    return _POLICIES[d["policy"]].from_dict(d)
