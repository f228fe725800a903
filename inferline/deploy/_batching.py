"""A model's batching policy as a deployment names it (``"batching"`` in a model entry).

::

    "models": [{"name": "m", "source": "...", "batching": {"policy": "aimd", "backoff": 0.9}}]

``fixed`` (the default; the planner's and the estimator's rule), ``delayed`` (Clipper's batch
delay: ``batch_wait_ms``), ``aimd`` (Clipper's adaptive maximum: ``increase``, ``backoff``,
``margin_ms``, ``minimum``; its ceiling is the plan's max batch size and its SLO the app's) and
``rafiki`` (Rafiki's greedy batching: ``delta_ms`` and ``latencies_ms``, the batch latency by
size that its rule needs). A plan or a tuner decision changes the policy's bound on the batch
size (``with_max_batch``) and keeps the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferline.core import ModelConfig, ValidationError, as_float, as_int, as_mapping, as_str
from inferline.queueing import (
    AIMDBatching,
    BatchingPolicy,
    DelayedBatching,
    FixedBatching,
    RafikiGreedyBatching,
    batching_from_dict,
)

__all__ = ["BATCHING_POLICIES", "BatchingSpec", "planned_policy", "with_max_batch"]

# each policy's parameters in a deployment (all optional)
BATCHING_POLICIES: dict[str, frozenset[str]] = {
    "fixed": frozenset(),
    "delayed": frozenset({"batch_wait_ms"}),
    "aimd": frozenset({"increase", "backoff", "margin_ms", "minimum"}),
    "rafiki": frozenset({"delta_ms", "latencies_ms"}),
}


@dataclass(frozen=True)
class BatchingSpec:
    """The policy and its parameters; ``build`` makes the live policy for a max batch size."""

    policy: str = "fixed"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in BATCHING_POLICIES:
            raise ValidationError(
                "batching.policy", f"one of {sorted(BATCHING_POLICIES)}", self.policy
            )
        extra = sorted(set(self.params) - BATCHING_POLICIES[self.policy])
        if extra:
            allowed = sorted(BATCHING_POLICIES[self.policy]) or "none"
            raise ValidationError(
                f"batching.{extra[0]}", f"{self.policy} parameters: {allowed}", extra
            )
        self.build(1, 1.0)  # parameters checked now, not when the first replica starts

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, **dict(self.params)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "batching") -> BatchingSpec:
        m = as_mapping(d, where)
        policy = as_str(m.get("policy", "fixed"), f"{where}.policy")
        params = {k: v for k, v in m.items() if k != "policy"}
        try:
            return cls(policy, params)
        except ValidationError as e:
            field_ = (
                e.field.replace("batching", where, 1) if e.field.startswith("batching") else e.field
            )
            raise ValidationError(field_, e.expected, e.got) from None

    def build(self, max_batch_size: int, slo_s: float) -> BatchingPolicy:
        p = self.params
        if self.policy == "delayed":
            wait = as_float(p.get("batch_wait_ms", 1.0), "batching.batch_wait_ms", nonneg=True)
            return DelayedBatching(max_batch_size, wait / 1e3)
        if self.policy == "aimd":
            return AIMDBatching(
                initial=1,
                slo_s=slo_s,
                margin_s=as_float(p.get("margin_ms", 0.0), "batching.margin_ms", nonneg=True) / 1e3,
                increase=as_int(p.get("increase", 1), "batching.increase", minimum=1),
                backoff=as_float(p.get("backoff", 0.9), "batching.backoff"),
                minimum=min(
                    max_batch_size, as_int(p.get("minimum", 1), "batching.minimum", minimum=1)
                ),
                maximum=max_batch_size,
            )
        if self.policy == "rafiki":
            lat = as_mapping(p.get("latencies_ms"), "batching.latencies_ms")
            try:
                table = {int(b): float(ms) / 1e3 for b, ms in lat.items()}
            except (TypeError, ValueError):
                raise ValidationError(
                    "batching.latencies_ms", "batch size -> milliseconds", dict(lat)
                ) from None
            if not table or min(table) < 1:
                raise ValidationError("batching.latencies_ms", "batch sizes >= 1", dict(lat))
            return _rafiki(
                table,
                as_float(p.get("delta_ms", 0.0), "batching.delta_ms", nonneg=True) / 1e3,
                max_batch_size,
            )
        return FixedBatching(max_batch_size)


def _rafiki(table: dict[int, float], delta_s: float, max_batch_size: int) -> RafikiGreedyBatching:
    sizes = sorted(b for b in table if b <= max_batch_size) or [min(table)]
    return batching_from_dict(  # type: ignore[return-value]
        {
            "policy": "rafiki",
            "candidate_sizes": sizes,
            "latencies_s": [table[b] for b in sizes],
            "delta_s": delta_s,
        }
    )


def with_max_batch(policy: BatchingPolicy, b: int) -> BatchingPolicy:
    """The same policy with ``b`` as its bound on the batch size (a new plan's or the tuner's
    max batch size): fixed and delayed take it as their size, AIMD as its ceiling (keeping its
    learned size below it), Rafiki keeps its candidate sizes up to it."""
    d = policy.to_dict()
    name = d.get("policy")
    if name in ("fixed", "delayed"):
        return batching_from_dict({**d, "max_batch_size": b})
    if name == "aimd":
        return batching_from_dict(
            {
                **d,
                "maximum": b,
                "size": min(int(d["size"]), b),
                "minimum": min(int(d["minimum"]), b),
            }
        )
    if name == "rafiki":
        table = dict(zip(d["candidate_sizes"], d["latencies_s"], strict=True))
        return _rafiki({int(k): float(v) for k, v in table.items()}, float(d["delta_s"]), b)
    return FixedBatching(b)


def planned_policy(config: ModelConfig) -> BatchingPolicy:
    """The policy a plan gives a model no deployment policy is named for: delayed batching
    with the planned batch wait (``batch_wait_ms`` above 0), otherwise fixed batching (the
    planner's and the estimator's greedy rule)."""
    if config.batch_wait_ms > 0:
        return DelayedBatching(config.max_batch_size, config.batch_wait_s)
    return FixedBatching(config.max_batch_size)
