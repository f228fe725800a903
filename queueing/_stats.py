"""Per-model counters of the dispatcher and the events it reports to listeners."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ArrivalEvent", "BatchEvent", "ModelStats", "RecentService"]


@dataclass(frozen=True)
class ArrivalEvent:
    """A query was offered to a model's queue (``accepted`` False: refused as overloaded)."""

    model: str
    time: float
    accepted: bool
    queued: int


@dataclass(frozen=True)
class BatchEvent:
    """A batch left a replica: ``ok`` False when the whole batch failed (``ReplicaError``)."""

    model: str
    replica: str
    size: int
    start: float
    service_s: float
    queue_delays_s: tuple[float, ...]
    ok: bool
    # admission's predicted minus actual completion of the batch's predicted queries
    prediction_errors_s: tuple[float, ...] = ()
    # cut at its deadline by the backend (``DeadlineExceededError``: a late call, counted
    # as ``inferline_late_calls_total``), not a replica failure
    late: bool = False


@dataclass(frozen=True)
class RecentService:
    """Service times of one batch size among the last batches: how many, median, P99."""

    batches: int
    p50_s: float
    p99_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "p50_s": self.p50_s, "p99_s": self.p99_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecentService:
        return cls(int(d["batches"]), float(d["p50_s"]), float(d["p99_s"]))


@dataclass(frozen=True)
class ModelStats:
    """A snapshot of one model's queue. Times in seconds of the dispatcher's clock.

    ``queued`` waiting, ``in_flight`` queries inside replicas now, ``pending`` both (what
    ``max_queue`` bounds). ``batch_sizes`` maps a batch size to how many batches had it.
    ``queue_delay_*`` is the time from enqueue to dispatch, ``service_*`` a batch's time in
    its replica; ``service_s_p50_recent`` / ``service_s_p99_recent`` are over the last 1024
    batches (what to compare with the profile's ``p50_s`` / ``p99_s``), and
    ``service_recent_by_batch`` the same per batch size (what ``inferline calibrate`` reads).
    """

    model: str
    queued: int
    in_flight: int
    in_flight_batches: int
    replicas: int
    max_queue: int
    max_batch_size: int
    submitted: int
    rejected: int
    completed: int
    failed: int
    expired: int
    cancelled: int
    retried: int
    batches: int
    failed_batches: int
    batch_sizes: dict[int, int] = field(default_factory=dict)
    queue_delay_s_sum: float = 0.0
    queue_delay_s_max: float = 0.0
    service_s_sum: float = 0.0
    service_s_max: float = 0.0
    # over the last ``RECENT_BATCHES`` (1024) batches; 0 before the first
    service_s_p50_recent: float = 0.0
    service_s_p99_recent: float = 0.0
    service_recent_by_batch: dict[int, RecentService] = field(default_factory=dict)
    # admission by predicted completion: refused at arrival, dropped when a batch was cut
    refused_late: int = 0
    dropped_late: int = 0

    @property
    def pending(self) -> int:
        return self.queued + self.in_flight

    @property
    def mean_batch_size(self) -> float:
        n = sum(self.batch_sizes.values())
        return sum(b * c for b, c in self.batch_sizes.items()) / n if n else 0.0

    @property
    def mean_queue_delay_s(self) -> float:
        n = sum(b * c for b, c in self.batch_sizes.items())
        return self.queue_delay_s_sum / n if n else 0.0

    @property
    def mean_service_s(self) -> float:
        return self.service_s_sum / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["batch_sizes"] = {str(b): c for b, c in sorted(self.batch_sizes.items())}
        d["service_recent_by_batch"] = {
            str(b): r.to_dict() for b, r in sorted(self.service_recent_by_batch.items())
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelStats:
        kw = dict(d)
        kw["batch_sizes"] = {int(b): int(c) for b, c in d.get("batch_sizes", {}).items()}
        kw["service_recent_by_batch"] = {
            int(b): RecentService.from_dict(r)
            for b, r in d.get("service_recent_by_batch", {}).items()
        }
        return cls(**kw)
