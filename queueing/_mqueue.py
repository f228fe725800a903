"""The dispatcher's per-model state: the queued-query record, pullers and counters, and what both
the submitting and the pulling side do to it (wake idle pullers, compact the heap, tell a
query's hand-off that its call was answered)."""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from inferline.core.errors import BackendError
from inferline.core.protocols import ReplicaHandle

from ._batching import BatchingPolicy

if TYPE_CHECKING:
    from ._admission import AdmissionConfig
    from ._batch_latency import BatchLatency
    from ._instant import Handoff

__all__: list[str] = []  # private to the package

RECENT_BATCHES = 1024  # service times kept for ModelStats' recent quantiles


class _QueuedFields(NamedTuple):
    klass: int  # -priority (``_priority``): a higher priority sorts first
    deadline: float
    arrival: float
    # the caller's query id, else ``seq``: same-arrival ties keep query order
    rank: int
    seq: int  # unique per dispatcher: ends every comparison
    x: Any
    fut: asyncio.Future[Any]
    enqueued: float  # clock time it entered the queue (queue delay, batching policy)
    # the calling query's hand-off (None outside a PipelineRunner)
    handoff: Handoff | None
    # admission's predicted completion (clock time; inf: not predicted)
    predicted: float
    retries: int  # times put back after a failed batch (``max_retries``)


class QueuedQuery(_QueuedFields):
    """One query in a model's heap.

    A NamedTuple, not a dataclass: it is built and read once per query on the hot path, and
    the heap orders entries by plain tuple comparison (C speed). Fields compare in order:
    ``klass`` (priority class), then ``deadline``, ``arrival``, ``rank``, ``seq``; ``seq`` is
    unique, so the comparison never reaches the payload. Keep the order of the first five
    fields. With every query in class 0 the first comparison is one identity check (small
    ints are shared), so the default path pays next to nothing for priorities.

    The constructor takes the class last (optional), as records were built before classes;
    the dispatcher builds records with ``tuple.__new__`` in field order.
    """

    __slots__ = ()

    def __new__(
        cls,
        deadline: float,
        arrival: float,
        rank: int,
        seq: int,
        x: Any,
        fut: asyncio.Future[Any],
        enqueued: float,
        handoff: Handoff | None,
        retries: int = 0,
        klass: int = 0,
        predicted: float = math.inf,
    ) -> QueuedQuery:
        fields = (klass, deadline, arrival, rank, seq, x, fut, enqueued, handoff, predicted)
        return tuple.__new__(cls, (*fields, retries))

    def retried(self) -> QueuedQuery:
        """This query put back after a failed batch: the same place in the order, one more
        retry."""
        return self._replace(retries=self.retries + 1)


class StageGate(Protocol):
    """A stage's shared queue as its member queues see it (``_shared.SharedQueue``; a
    protocol here so that ``_shared`` may import this module)."""

    def may_cut(self, model: str) -> bool: ...

    def wake(self) -> None: ...

    def reporter(self) -> str: ...


class Puller:
    __slots__ = (
        "batch",
        "busy_until",
        "handle",
        "idle_since",
        "stopping",
        "task",
        "timer",
        "waiter",
    )

    def __init__(self, handle: ReplicaHandle, now: float = -math.inf) -> None:
        self.handle = handle
        self.idle_since = now  # end of its last batch (or its start): who is warmest
        self.task: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stopping = False
        self.batch: list[QueuedQuery] | None = None
        # predicted end of its batch in flight (admission's replica free time; -inf: free)
        self.busy_until = -math.inf


class ModelQueue:
    __slots__ = (
        "admission",
        "batch_sizes",
        "batches",
        "cancelled",
        "completed",
        "dropped_late",
        "expire_grace_s",
        "expire_late",
        "expired",
        "expiry_deadline",
        "expiry_timer",
        "failed",
        "failed_batches",
        "group",
        "handles",
        "heap",
        "idle",
        "in_flight",
        "in_flight_batches",
        "latency",
        "max_queue",
        "max_retries",
        "mixed",
        "name",
        "needs_start",
        "policy",
        "pullers",
        "queue_delay_max",
        "queue_delay_sum",
        "recent_service",
        "refused_late",
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
        expire_grace_s: float = 0.05,
    ) -> None:
        self.name = name
        self.policy = policy
        self.max_queue = max_queue
        self.expire_late = expire_late
        self.expire_grace_s = expire_grace_s
        # the expiry timer (``_expiry``): armed for the earliest queued deadline plus the
        # grace while ``expire_late`` is on; ``expiry_deadline`` is the deadline it is armed
        # for (inf: none armed)
        self.expiry_timer: asyncio.TimerHandle | None = None
        self.expiry_deadline = math.inf
        self.max_retries = max_retries
        self.heap: list[QueuedQuery] = []
        self.pullers: dict[str, Puller] = {}
        self.handles: list[ReplicaHandle] = []
        self.needs_start = False
        self.idle: list[Puller] = []
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
        # admission by predicted completion (``_admission``): None when off, so the hot
        # path tests one attribute; ``latency`` is its batch-latency learner
        self.admission: AdmissionConfig | None = None
        self.latency: BatchLatency | None = None
        self.refused_late = self.dropped_late = 0
        # a query of a class other than 0 was ever queued: the head is then not always the
        # earliest deadline, and expiry scans (``_expiry``)
        self.mixed = False
        # the stage's shared queue this model is a variant of (``_shared``): its ``heap`` is
        # then the stage's, and the gate says when its replicas may cut; None: its own queue
        self.group: StageGate | None = None


def closed_error(model: str) -> BackendError:
    return BackendError("dispatcher", f"closed before model {model!r} answered the query")


def _idle_since(p: Puller) -> float:
    return p.idle_since


def wake(q: ModelQueue) -> None:
    """Wake the model's idle pullers (new work arrived or was put back)."""
    # Warmest first (most recently idle; the later-idled of a tie): the first woken takes
    # the batch, so replicas that just served keep serving and the others stay idle; a
    # replica idle for long runs its next batch slower (the profiles' wake-up extra). The
    # estimator's idle stack picks the same replica.
    for p in sorted(reversed(q.idle), key=_idle_since, reverse=True):
        w = p.waiter
        if w is not None and not w.done():
            w.set_result(None)
    q.idle.clear()


def wake_queue(q: ModelQueue) -> None:
    """New work in ``q``'s heap: wake its idle pullers, or for a stage's shared queue the
    active variants' (``_shared``)."""
    g = q.group
    if g is not None:
        g.wake()
    elif q.idle:
        wake(q)


def compact(q: ModelQueue) -> int:
    """Drop the entries already answered elsewhere (a query that got its default or whose
    client left cancels its future, and leaves the entry until a puller reaches it), so
    that they do not count against ``max_queue``; returns the live count. O(n), only when
    the queue looks full."""
    heap = q.heap
    live = [e for e in heap if not e.fut.done()]
    if len(live) < len(heap):
        q.cancelled += len(heap) - len(live)
        heapq.heapify(live)
        heap[:] = live  # in place: pullers hold this list
    return len(heap)


def deliver(item: QueuedQuery) -> None:
    """Tell the calling query's hand-off that ``item``'s future was just answered."""
    h = item.handoff
    if h is not None:
        h.delivered()
