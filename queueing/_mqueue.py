"""The dispatcher's per-model state: queued-query layout, pullers and counters."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

from inferline.core.errors import BackendError
from inferline.core.protocols import ReplicaHandle

from ._batching import BatchingPolicy

__all__: list[str] = []  # private to the package

# A queued query is a tuple so the heap compares plain floats/ints; ``seq`` is unique, so the
# comparison never reaches the payload. Fields: deadline, arrival, rank (the caller's query id,
# else seq: same-arrival ties keep query order), seq, input, future, enqueue time, retries.
_DEADLINE, _ARRIVAL, _RANK, _SEQ, _X, _FUT, _ENQ, _RETRIES = range(8)
RECENT_BATCHES = 1024  # service times kept for ModelStats' recent quantiles


class _Puller:
    __slots__ = ("batch", "handle", "idle_since", "stopping", "task", "timer", "waiter")

    def __init__(self, handle: ReplicaHandle, now: float = -math.inf) -> None:
        self.handle = handle
        self.idle_since = now  # end of its last batch (or its start): who is warmest
        self.task: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stopping = False
        self.batch: list[tuple[Any, ...]] | None = None


class _ModelQueue:
    __slots__ = (
        "batch_sizes",
        "batches",
        "cancelled",
        "completed",
        "expire_late",
        "expired",
        "failed",
        "failed_batches",
        "handles",
        "heap",
        "idle",
        "in_flight",
        "in_flight_batches",
        "max_queue",
        "max_retries",
        "name",
        "needs_start",
        "policy",
        "pullers",
        "queue_delay_max",
        "queue_delay_sum",
        "recent_service",
        "rejected",
        "retried",
        "service_max",
        "service_sum",
        "submitted",
    )

    def __init__(
        self,
        name: str,
        policy: BatchingPolicy,
        max_queue: int,
        expire_late: bool,
        max_retries: int,
    ) -> None:
        self.name = name
        self.policy = policy
        self.max_queue = max_queue
        self.expire_late = expire_late
        self.max_retries = max_retries
        self.heap: list[tuple[Any, ...]] = []
        self.pullers: dict[str, _Puller] = {}
        self.handles: list[ReplicaHandle] = []
        self.needs_start = False
        self.idle: list[_Puller] = []
        self.in_flight = 0
        self.in_flight_batches = 0
        self.submitted = self.rejected = self.completed = self.failed = 0
        self.expired = self.cancelled = self.retried = 0
        self.batches = self.failed_batches = 0
        self.batch_sizes: dict[int, int] = {}
        self.queue_delay_sum = self.queue_delay_max = 0.0
        self.service_sum = self.service_max = 0.0
        # the last batches' service times: their quantiles are what an operator compares
        # with the profile (a sum and a max say nothing about the tail)
        # (batch size, service s) so the quantiles can also be read per batch size
        self.recent_service: deque[tuple[int, float]] = deque(maxlen=RECENT_BATCHES)


def _closed_error(model: str) -> BackendError:
    return BackendError("dispatcher", f"closed before model {model!r} answered the query")
