"""The interposed queue: one EDF queue per model, one puller task per replica.

Semantics (docs/design.md "The estimator contract", so that plans transfer):

- Every model has one queue shared by all its replicas, ordered by deadline (earliest first);
  ties keep pipeline-arrival order, then submission order.
- Each replica handle gets one puller (``_puller``): a free puller takes a batch as its
  model's batching policy says, and has at most one batch in flight.
- "At one instant, arrivals and completions are applied before an idle replica takes a
  batch": a puller about to cut a batch waits at a barrier (``_instant``) that ends the
  instant once no query is between two model calls and the queue saw no activity for a loop
  iteration (at most ``coalesce_rounds`` iterations). The barrier counts hand-offs instead of
  reading the event loop's internals, so it works the same on asyncio's loop, on uvloop and
  on the tests' virtual-time loop (where latencies equal the estimator's bit for bit).

This module is the submitting and configuring side: queues, routes, replica sets (a backend's
subscription or ``set_replicas``), admission (``max_queue``), statistics and ``close()``.
Every accepted query ends in a result or an exception: ``close()`` answers queued and
in-flight queries with ``BackendError``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from inferline.core.errors import (
    BackendError,
    InferlineError,
    NotFoundError,
    OverloadedError,
    ValidationError,
)
from inferline.core.protocols import Backend, ReplicaHandle

from ._admission import AdmissionConfig, PredictedLate
from ._batch_latency import BatchLatency
from ._batching import BatchingPolicy, FixedBatching
from ._expiry import DEFAULT_EXPIRE_GRACE_S, _check_grace, _Expiry
from ._gate import check_arrival
from ._instant import Handoff, _Instant
from ._mqueue import ModelQueue, QueuedQuery, closed_error, compact, deliver, wake, wake_queue
from ._priority import check_priority
from ._puller import Listener, _PullerPool
from ._shared import SharedQueue, check_members, merge_heaps
from ._stats import ArrivalEvent, ModelStats, RecentService

__all__ = ["Dispatcher", "Listener"]

_new_tuple = tuple.__new__


class Dispatcher:
    """Per-model EDF queues feeding replica handles in batches. See the module docstring.

    ``clock`` gives the time for deadlines, arrivals and policy decisions (the same units as
    the deadlines callers pass). It must advance at the event loop's rate, because policy
    waits are armed as loop timers of ``wait_until - clock()`` seconds.

    ``coalesce_rounds`` bounds one instant in event-loop iterations (``_instant``): 0 lets a
    puller cut its batch as soon as it is free, without waiting for the instant's other
    arrivals and completions. ``retry_cooldown_s`` is the pause of a puller whose replica
    failed a batch and is still alive. ``expire_grace_s`` is the default grace of models
    added with ``expire_late`` (``add_model``).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        coalesce_rounds: int = 16,
        retry_cooldown_s: float = 0.005,
        expire_grace_s: float = DEFAULT_EXPIRE_GRACE_S,
    ) -> None:
        if isinstance(coalesce_rounds, bool) or not isinstance(coalesce_rounds, int):
            raise ValidationError("coalesce_rounds", "an int >= 0", coalesce_rounds)
        if coalesce_rounds < 0:
            raise ValidationError("coalesce_rounds", "an int >= 0", coalesce_rounds)
        self._clock = clock
        self._expire_grace_s = _check_grace(expire_grace_s)
        self._instant = _Instant(coalesce_rounds)
        self._listeners: list[Listener] = []
        self._expiry = _Expiry(clock, self._instant)
        self._pool = _PullerPool(
            clock, self._instant, float(retry_cooldown_s), self._listeners, self._expiry
        )
        self._queues: dict[str, ModelQueue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backends: list[Backend] = []
        self._known: dict[str, list[ReplicaHandle]] = {}  # handles of models not added yet
        self._routes: dict[str, str] = {}  # stage -> the model whose queue serves it
        self._shared: dict[str, SharedQueue] = {}  # stage -> its variants' one queue
        self._seq = 0

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @property
    def models(self) -> list[str]:
        return list(self._queues)

    # -- configuration ------------------------------------------------------------------
    def add_model(
        self,
        model: str,
        *,
        batching: BatchingPolicy | None = None,
        max_queue: int = 10_000,
        expire_late: bool = False,
        max_retries: int = 1,
        expire_grace_s: float | None = None,
        admission: AdmissionConfig | None = None,
        profile: Callable[[int], float] | None = None,
    ) -> None:
        """Create ``model``'s queue. ``max_queue`` bounds the queries accepted and not yet
        answered (queued plus in flight), so retried queries never overflow it.

        ``expire_late``: a query still queued at its deadline plus ``expire_grace_s``
        (default: the dispatcher's, 50 ms) is answered then with ``DeadlineExceededError``,
        by a timer (``_expiry``), and a replica never takes a query whose deadline passed.

        ``admission`` (mode ``"predicted"``): a query predicted to finish after its deadline
        is refused at once, and a queued one that a batch cut finds late is dropped, both
        with ``PredictedLate`` (``_admission``). Batch latencies come from the live timings,
        else ``profile(batch_size)`` (seconds) or the batching policy's ``latency_fn``."""
        if not isinstance(model, str) or not model:
            raise ValidationError("model", "a non-empty str", model)
        if model in self._queues:
            raise ValidationError("model", "a model not added yet", model)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValidationError("max_queue", "an int >= 1", max_queue)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValidationError("max_retries", "an int >= 0", max_retries)
        grace = self._expire_grace_s if expire_grace_s is None else _check_grace(expire_grace_s)
        policy = batching if batching is not None else FixedBatching(1)
        self._check_policy(policy)
        q = ModelQueue(model, policy, max_queue, bool(expire_late), max_retries, grace)
        self._set_admission(q, admission, profile)
        self._queues[model] = q
        handles = self._known.pop(model, None)
        if handles is None:
            for b in self._backends:
                try:
                    handles = list(b.replicas(model))
                except InferlineError:
                    continue
                break
        if handles:
            self._sync(q, handles)

    @staticmethod
    def _set_admission(
        q: ModelQueue, admission: AdmissionConfig | None, profile: Callable[[int], float] | None
    ) -> None:
        if admission is not None and not isinstance(admission, AdmissionConfig):
            raise ValidationError("admission", "an AdmissionConfig", admission)
        if admission is None or not admission.enabled:
            q.admission = q.latency = None
            return
        if profile is None:  # Rafiki's policy carries its profiled c(b)
            profile = getattr(q.policy, "latency_fn", None)
        q.admission = admission
        q.latency = BatchLatency(
            admission.window, admission.min_samples, profile, admission.tail_quantile
        )

    def admission(self, model: str) -> AdmissionConfig:
        """The model queue's admission settings (mode ``"off"`` when none)."""
        return self._queue(model).admission or AdmissionConfig()

    def set_batching(self, model: str, batching: BatchingPolicy) -> None:
        """Replace a model's policy (e.g. a new plan's max batch size); applies to the next
        batch formed."""
        self._check_policy(batching)
        self._queue(model).policy = batching

    def batching(self, model: str) -> BatchingPolicy:
        return self._queue(model).policy

    def route(self, name: str, model: str | None) -> None:
        """Serve queries submitted for ``name`` (a pipeline stage) from ``model``'s queue from
        now on, or from ``name``'s own queue again with ``None``. Model variants switch this
        way; queries already queued finish where they are, unless the stage's variants
        share one queue (``share``): then ``model`` becomes the one variant whose replicas
        cut batches, and the queued queries go to it."""
        g = self._shared.get(name)
        target = name if model is None else model
        if g is not None and target not in g.members:
            raise NotFoundError("variant", target, sorted(g.members))
        if model is None or model == name:
            self._routes.pop(name, None)
        elif model not in self._queues:
            raise NotFoundError("model", model, list(self._queues))
        else:
            self._routes[name] = model
        if g is not None:
            g.set_active((target,))

    def share(self, name: str, models: Sequence[str]) -> None:
        """Give stage ``name``'s variants ``models`` one EDF queue (``_shared``): queries
        submitted for the stage or any of them wait in one deadline order, and a batch is cut
        by a replica of an active variant, at that variant's batch size. The variant the
        stage is routed to (``resolve``; else the first of ``models``) starts active.
        Refused for models with admission, with different expiry settings, or already
        sharing. Queries already queued on the models join the one queue."""
        if name in self._shared:
            raise ValidationError("name", "a stage without a shared queue yet", name)
        members = [self._queue(m) for m in dict.fromkeys(models)]
        check_members(name, members)
        merge_heaps(members)
        routed = self.resolve(name)
        first = routed if routed in {m.name for m in members} else members[0].name
        g = SharedQueue(name, members, (first,))
        for m in members:
            m.group = g
            if m.expire_late:
                self._expiry.arm(m)  # the shared head: every member's timer reads it
        self._shared[name] = g
        for m in members:
            wake(m)  # idle pullers re-read the shared heap; gated ones wait again

    def set_active(self, name: str, models: Sequence[str]) -> None:
        """Let the replicas of several of stage ``name``'s variants cut batches from its
        shared queue (e.g. the old variant drains alongside the new); ``route`` makes one
        active."""
        g = self._shared.get(name)
        if g is None:
            raise NotFoundError("shared queue", name, sorted(self._shared))
        g.set_active(models)

    @property
    def shared(self) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Stages whose variants share one queue: ``{stage: (variants, active)}``."""
        return {n: (tuple(g.members), g.active) for n, g in self._shared.items()}

    @property
    def routes(self) -> dict[str, str]:
        return dict(self._routes)

    def resolve(self, name: str) -> str:
        """The model whose queue serves queries submitted for ``name``."""
        return self._routes.get(name, name)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every ``ArrivalEvent`` and ``BatchEvent`` (metrics,
        the tuner's arrival log). Listeners run on the event loop and must be quick."""
        self._listeners.append(listener)

    def attach(self, backend: Backend) -> None:
        """Subscribe to ``backend``'s replica changes and sync the models already added."""
        self._backends.append(backend)
        backend.subscribe(self._on_backend_change)
        for name, q in self._queues.items():
            try:
                handles = list(backend.replicas(name))
            except InferlineError:
                continue
            self._sync(q, handles)

    def set_replicas(self, model: str, handles: Iterable[ReplicaHandle]) -> None:
        """Make ``handles`` the model's replicas: a new handle gets a puller; a puller whose
        handle is gone finishes its in-flight batch and exits."""
        self._sync(self._queue(model), list(handles))

    def _on_backend_change(self, model: str, handles: Sequence[ReplicaHandle]) -> None:
        handles = list(handles)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:  # a backend thread: hop onto the dispatcher's loop
                loop.call_soon_threadsafe(self._apply_change, model, handles)
                return
        self._apply_change(model, handles)

    def _apply_change(self, model: str, handles: list[ReplicaHandle]) -> None:
        q = self._queues.get(model)
        if q is None:
            self._known[model] = handles
        elif not self._pool.closed:
            self._sync(q, handles)

    @staticmethod
    def _check_policy(policy: Any) -> None:
        if not isinstance(policy, BatchingPolicy):
            raise ValidationError("batching", "a batching policy (decide/observe)", policy)

    def _queue(self, model: str) -> ModelQueue:
        q = self._queues.get(model)
        if q is None:
            raise NotFoundError("model", model, list(self._queues))
        return q

    # -- pullers ------------------------------------------------------------------------
    def _sync(self, q: ModelQueue, handles: list[ReplicaHandle]) -> None:
        q.handles = handles
        if self._pool.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            q.needs_start = True  # no loop yet: start the pullers at the first submit
            return
        self._bind_loop(loop)
        q.needs_start = False
        wanted = {h.id: h for h in handles}
        pool = self._pool
        for rid, p in list(q.pullers.items()):
            if wanted.get(rid) is not p.handle or p.task is None or p.task.done():
                pool.retire(p)
                del q.pullers[rid]
        for rid, h in wanted.items():
            if rid not in q.pullers:
                q.pullers[rid] = pool.start(q, h, loop)

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop = loop
            self._expiry.loop = loop
        elif self._loop is not loop:
            raise BackendError("dispatcher", "used from a second event loop")

    # -- submitting ---------------------------------------------------------------------
    def _enqueue(
        self,
        q: ModelQueue,
        x: Any,
        deadline: float,
        arrival: float | None,
        query_id: int | None = None,
        handoff: Handoff | None = None,
        priority: int = 0,
    ) -> asyncio.Future[Any]:
        if self._pool.closed:
            raise closed_error(q.name)
        loop = self._loop
        if loop is None:
            loop = asyncio.get_running_loop()
            self._bind_loop(loop)
        if q.needs_start:
            self._sync(q, q.handles)
        if not deadline <= math.inf:  # NaN or not a number would corrupt the heap order
            raise ValidationError("deadline", "a number (clock time)", deadline)
        now = self._clock()
        if len(q.heap) + q.in_flight >= q.max_queue and compact(q) + q.in_flight >= q.max_queue:
            q.rejected += 1
            if self._listeners:
                self._pool.emit(ArrivalEvent(q.name, now, False, len(q.heap)))
            raise OverloadedError(q.name, q.max_queue)
        self._seq += 1
        seq = self._seq
        klass = 0
        if priority:
            klass = -check_priority(priority)
            q.mixed = True
        if arrival is None:
            arrival = now
        rank = seq if query_id is None else query_id
        predicted = math.inf
        if q.admission is not None:  # raises PredictedLate before anything is queued
            predicted = self._admit(q, (klass, deadline, arrival, rank, seq), now)
        fut = loop.create_future()
        # QueuedQuery's fields in order, built without the record's Python-level ``__new__``
        # (half the record's cost on this path)
        entry: QueuedQuery = _new_tuple(
            QueuedQuery,
            (klass, deadline, arrival, rank, seq, x, fut, now, handoff, predicted, 0),
        )
        heapq.heappush(q.heap, entry)
        q.submitted += 1
        if q.expire_late and deadline < q.expiry_deadline:
            self._expiry.arm(q)  # the earliest deadline now: its timer
        if q.admission is not None:
            self._pool.doom_arrival(q, deadline)  # answered once it cannot make it
        self._instant.activity += 1  # an arrival: part of the current instant
        if q.idle or q.group is not None:
            wake_queue(q)
        if self._listeners:
            self._pool.emit(ArrivalEvent(q.name, now, True, len(q.heap)))
        return fut

    def _admit(self, q: ModelQueue, key: tuple[int, float, float, int, int], now: float) -> float:
        """The predicted completion of the query whose order key is ``key`` (``inf``: not
        predicted), or ``PredictedLate``."""
        assert q.admission is not None and q.latency is not None
        try:
            return check_arrival(q, q.admission, q.latency, key, now)
        except InferlineError:
            if self._listeners:
                self._pool.emit(ArrivalEvent(q.name, now, False, len(q.heap)))
            raise

    async def submit(
        self,
        model: str,
        x: Any,
        *,
        deadline: float,
        arrival: float | None = None,
        query_id: int | None = None,
        priority: int = 0,
    ) -> Any:
        """Queue ``x`` for ``model`` and return its output (or raise its error).

        ``deadline`` orders the queue (clock time); ``arrival`` (default now) breaks deadline
        ties, then ``query_id`` (pipeline queries numbered in arrival order; default: order of
        submission), so queries that arrived together keep their order at every model as in
        the estimator. ``priority`` (``_priority``): a higher class is served first. Raises
        ``OverloadedError`` at once when the queue is full (``PredictedLate``, one, when
        admission predicts it late), ``NotFoundError`` for an unknown model. Cancelling the
        caller removes the query (it is skipped)."""
        return await self.submit_nowait(model, x, deadline, arrival, query_id, None, priority)

    def submit_nowait(
        self,
        model: str,
        x: Any,
        deadline: float,
        arrival: float | None = None,
        query_id: int | None = None,
        handoff: Handoff | None = None,
        priority: int = 0,
    ) -> asyncio.Future[Any]:
        """``submit`` without awaiting: queue ``x`` at once and return the future of its
        output. Raises what ``submit`` raises at once (``OverloadedError``,
        ``NotFoundError``); cancelling the future removes the query.

        ``handoff`` (from ``open_handoff``) is the calling query's: it learns when the
        dispatcher answers this call. ``PipelineRunner`` passes its query's; other callers
        leave it ``None``. Arguments are positional-or-keyword so that the runner's call,
        once per model call, stays a plain positional call."""
        q = self._queues.get(self._routes.get(model, model))
        if q is None:
            raise NotFoundError("model", model, list(self._queues))
        return self._enqueue(q, x, deadline, arrival, query_id, handoff, priority)

    def open_handoff(self) -> Handoff:
        """A new, open hand-off for one pipeline query (``_instant``): while it is open and
        the query has no model call unanswered, pullers wait before cutting batches. The
        caller passes it to every ``submit_nowait`` of the query and must ``close()`` it
        when the query ends, or batches wait the instant's bound at every cut."""
        return Handoff(self._instant)

    async def submit_many(
        self,
        model: str,
        xs: Sequence[Any],
        *,
        deadline: float,
        arrival: float | None = None,
        priority: int = 0,
    ) -> list[Any]:
        """Queue all of ``xs`` at once (admitted all or none) and return one entry per input:
        the output, or the exception instance for an input that failed (the narrow waist's
        convention), so one bad input does not hide the others' results. ``priority``: as
        ``submit``'s, for every input."""
        q = self._queue(self._routes.get(model, model))
        if (
            len(q.heap) + q.in_flight + len(xs) > q.max_queue
            and compact(q) + q.in_flight + len(xs) > q.max_queue
        ):
            q.rejected += len(xs)
            raise OverloadedError(q.name, q.max_queue)
        futs = [self._enqueue_or_refusal(q, x, deadline, arrival, priority) for x in xs]
        return list(await asyncio.gather(*futs, return_exceptions=True))

    def _enqueue_or_refusal(
        self, q: ModelQueue, x: Any, deadline: float, arrival: float | None, priority: int = 0
    ) -> asyncio.Future[Any]:
        """``_enqueue``, with admission's refusal as the input's own answer (the others of a
        ``submit_many`` stay queued)."""
        try:
            return self._enqueue(q, x, deadline, arrival, None, None, priority)
        except PredictedLate as e:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
            return fut

    # -- observing ----------------------------------------------------------------------
    def queued(self, model: str) -> int:
        """Queries waiting (not those answered elsewhere while queued). A stage's shared
        queue is counted on its first active variant (0 on the others)."""
        return _live(self._queue(model))

    def stats(self, model: str) -> ModelStats:
        q = self._queue(model)
        return ModelStats(
            model=q.name,
            queued=_live(q),
            in_flight=q.in_flight,
            in_flight_batches=q.in_flight_batches,
            replicas=sum(1 for p in q.pullers.values() if not p.stopping),
            max_queue=q.max_queue,
            max_batch_size=q.policy.max_batch_size,
            submitted=q.submitted,
            rejected=q.rejected,
            completed=q.completed,
            failed=q.failed,
            expired=q.expired,
            cancelled=q.cancelled,
            retried=q.retried,
            refused_late=q.refused_late,
            dropped_late=q.dropped_late,
            batches=q.batches,
            failed_batches=q.failed_batches,
            batch_sizes=dict(q.batch_sizes),
            queue_delay_s_sum=q.queue_delay_sum,
            queue_delay_s_max=q.queue_delay_max,
            service_s_sum=q.service_sum,
            service_s_max=q.service_max,
            **_recent_quantiles(q.recent_service),
        )

    # -- shutdown -----------------------------------------------------------------------
    async def close(self) -> None:
        """Stop all pullers. Queued queries and batches still in flight are answered with
        ``BackendError`` (never dropped). Idempotent."""
        self._pool.closed = True
        for q in self._queues.values():
            self._expiry.disarm(q)
            items = list(q.heap)
            q.heap.clear()  # in place: pullers hold this list
            for item in items:
                fut = item.fut
                if fut.done():
                    q.cancelled += 1
                else:
                    fut.set_exception(closed_error(q.name))
                    deliver(item)
                    q.failed += 1
        tasks = list(self._pool.tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for q in self._queues.values():
            q.pullers.clear()
            q.idle.clear()


def _live(q: ModelQueue) -> int:
    g = q.group
    if g is not None and g.reporter() != q.name:
        return 0
    return sum(1 for e in q.heap if not e.fut.done())


def _recent_quantiles(recent: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """Median and P99 of the last batches' service times, overall and per batch size (empty
    before any batch)."""
    if not recent:
        return {}
    sizes = np.fromiter((b for b, _ in recent), np.int64, len(recent))
    service = np.fromiter((x for _, x in recent), float, len(recent))
    p50, p99 = np.percentile(service, [50, 99])
    by_size = {}
    for b in np.unique(sizes).tolist():
        xs = service[sizes == b]
        q50, q99 = np.percentile(xs, [50, 99])
        by_size[int(b)] = RecentService(int(xs.size), float(q50), float(q99))
    return {
        "service_s_p50_recent": float(p50),
        "service_s_p99_recent": float(p99),
        "service_recent_by_batch": by_size,
    }
