"""The replica side of the dispatcher: one puller task per replica handle.

- A free puller asks its model's batching policy; with ``FixedBatching`` it takes
  ``min(max_batch_size, queued)`` at once. A puller has at most one batch in flight, so the
  dispatcher never has more batches in flight to a backend than replicas and the backend's
  own queue stays empty.
- A puller about to cut a batch (woken by an arrival, or just done with one) first waits for
  the end of the instant (``_instant``), so that the instant's arrivals and completions are all
  queued before any replica takes a batch.
- Pullers block on futures, never poll: an arrival wakes the idle pullers of its model; a
  policy that asks to wait (delayed batching, Rafiki) also arms one timer.

Failures: a ``ReplicaError`` from ``predict_batch`` (or a ``CancelledError`` from the call
itself, e.g. its channel closed under it, while the puller is not being stopped) puts the
batch's queries back in the queue (they keep their deadlines and order) up to
``max_retries`` times, then fails them with that error. A puller whose handle reports
``alive == False`` after an error exits (the backend's subscription brings the restarted
replica); one whose replica is still alive pauses ``retry_cooldown_s`` so that another replica
gets the retried queries first. An error value in the output list fails just its query. A
puller cancelled mid-batch (``close()``) answers the batch's queries with ``BackendError``.

Deadlines downstream: for a model with ``expire_late`` the call runs with
``core.BATCH_DEADLINE`` set to the batch's earliest deadline plus the grace (when its first
query would expire if still queued); a handle carries what is left of it to its server and
answers ``DeadlineExceededError`` past it, which fails the batch's queries without a retry.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Callable
from typing import Any

from inferline.core.errors import (
    BackendError,
    DeadlineExceededError,
    InferlineError,
    ReplicaError,
)
from inferline.core.protocols import BATCH_DEADLINE, ReplicaHandle

from ._admission import PredictedLate, doom_time, doomed, late_at_dispatch, shortest_batch
from ._expiry import _Expiry
from ._gate import busy_until, dispatch_latency, free_times, prediction_errors
from ._instant import _Instant
from ._mqueue import ModelQueue, Puller, QueuedQuery, closed_error, deliver, wake_queue
from ._stats import ArrivalEvent, BatchEvent

__all__: list[str] = []  # private to the package

log = logging.getLogger(__name__)

Listener = Callable[[ArrivalEvent | BatchEvent], None]


class _PullerPool:
    """The pullers of one dispatcher and what they share: the clock, the same-instant
    barrier, the retry cooldown, the listeners, the expiry timers and the dispatcher's
    ``closed`` flag (set by
    ``Dispatcher.close``: pullers stop at their next step and failed batches are no longer
    retried)."""

    def __init__(
        self,
        clock: Callable[[], float],
        instant: _Instant,
        cooldown_s: float,
        listeners: list[Listener],
        expiry: _Expiry,
    ) -> None:
        self.clock = clock
        self.instant = instant
        self.expiry = expiry
        self.cooldown_s = cooldown_s
        self.listeners = listeners  # the dispatcher's list, shared
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        # admission's doom timer per model queue: (when, handle), armed for the earliest
        # time a queued query becomes ``doomed`` (``_admission``)
        self.doom: dict[str, tuple[float, asyncio.TimerHandle, float | None]] = {}

    # -- lifecycle ----------------------------------------------------------------------
    def start(
        self, q: ModelQueue, handle: ReplicaHandle, loop: asyncio.AbstractEventLoop
    ) -> Puller:
        """A new puller for ``handle`` on ``loop``, running."""
        p = Puller(handle, self.clock())
        p.task = loop.create_task(
            self._pull(q, p, loop), name=f"inferline-pull-{q.name}-{handle.id}"
        )
        self.tasks.add(p.task)
        p.task.add_done_callback(self.tasks.discard)
        return p

    @staticmethod
    def retire(p: Puller) -> None:
        """Let ``p`` finish its in-flight batch and exit."""
        p.stopping = True
        if p.waiter is not None and not p.waiter.done():
            p.waiter.set_result(None)

    def emit(self, event: ArrivalEvent | BatchEvent) -> None:
        for cb in self.listeners:
            try:
                cb(event)
            except Exception:
                log.exception("dispatcher listener %r failed", cb)

    # -- waiting ------------------------------------------------------------------------
    @staticmethod
    def _wake_one(p: Puller) -> None:
        p.timer = None
        w = p.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _idle_wait(
        self, q: ModelQueue, p: Puller, until: float | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        w = loop.create_future()
        p.waiter = w
        q.idle.append(p)
        if until is not None:
            p.timer = loop.call_later(max(0.0, until - self.clock()), self._wake_one, p)
        try:
            await w
        finally:
            p.waiter = None
            if p.timer is not None:
                p.timer.cancel()
                p.timer = None
            if p in q.idle:
                q.idle.remove(p)

    # -- cutting batches ----------------------------------------------------------------
    def _purge_head(self, q: ModelQueue, now: float) -> None:
        heap = q.heap
        while heap:
            head = heap[0]
            if head.fut.done():
                heapq.heappop(heap)
                q.cancelled += 1
            elif q.expire_late and head.deadline < now:
                heapq.heappop(heap)
                self.expiry.expire(q, head, now)
            else:
                return

    async def _pull(self, q: ModelQueue, p: Puller, loop: asyncio.AbstractEventLoop) -> None:
        heap = q.heap
        pop = heapq.heappop
        instant = self.instant
        try:
            while not (p.stopping or self.closed):
                if q.group is not None:  # a stage's shared heap; gated replicas wait
                    heap = q.heap
                    if not q.group.may_cut(q.name):
                        await self._idle_wait(q, p, None, loop)
                        continue
                if not heap:
                    await self._idle_wait(q, p, None, loop)
                    continue
                await instant.wait(loop)
                if p.stopping or self.closed:
                    return
                if q.group is not None and not q.group.may_cut(q.name):
                    continue  # the gate closed during the instant
                now = self.clock()
                self._purge_head(q, now)
                if q.expire_late:
                    self.expiry.arm(q)  # the head may have moved on
                if not heap:
                    continue
                head = heap[0]
                d = q.policy.decide(now, len(heap), head.deadline, head.enqueued)
                if d.take <= 0:
                    await self._idle_wait(q, p, d.wait_until, loop)
                    continue
                batch: list[QueuedQuery] = []
                if q.admission is not None:
                    batch = self._cut_admitted(q, d.take, now)
                while heap and len(batch) < d.take:
                    item = pop(heap)
                    if item.fut.done():
                        q.cancelled += 1
                    elif q.expire_late and item.deadline < now:
                        self.expiry.expire(q, item, now)
                    else:
                        batch.append(item)
                if q.expire_late:
                    self.expiry.arm(q)  # the head moved on
                if batch:
                    await self._run_batch(q, p, batch)
        finally:
            if p.batch is not None:  # cancelled mid-batch (close): answer, never drop
                q.in_flight -= len(p.batch)
                q.in_flight_batches -= 1
                for item in p.batch:
                    fut = item.fut
                    if not fut.done():
                        fut.set_exception(closed_error(q.name))
                        deliver(item)
                        q.failed += 1
                p.batch = None

    def _cut_admitted(self, q: ModelQueue, take: int, now: float) -> list[QueuedQuery]:
        """A batch of up to ``take`` under Clockwork's dispatch rule: a query whose deadline
        is earlier than now plus this batch's predicted execution time is dropped with
        ``PredictedLate`` (run, it could only be late; the replica goes to the others)."""
        config = q.admission
        assert config is not None
        heap = q.heap
        lat = dispatch_latency(q, take)
        batch: list[QueuedQuery] = []
        while heap and len(batch) < take:
            item = heapq.heappop(heap)
            if item.fut.done():
                q.cancelled += 1
            elif q.expire_late and item.deadline < now:
                self.expiry.expire(q, item, now)
            elif lat is not None and late_at_dispatch(
                config, now, item.deadline, lat, item.predicted
            ):
                q.dropped_late += 1
                q.failed += 1
                late = now + lat - item.deadline
                item.fut.set_exception(PredictedLate(q.name, "dispatch", late, late))
                deliver(item)
                self.instant.activity += 1
            else:
                batch.append(item)
        return batch

    # -- doomed queries (admission) -----------------------------------------------------
    def drop_doomed(self, q: ModelQueue, now: float) -> None:
        """Answer at once every queued query that is ``doomed`` (it cannot make its deadline
        even in the next batch), then arm the doom timer for the next one. O(queued): the
        queue under admission holds only what was predicted to fit."""
        config = q.admission
        if config is None or q.latency is None:
            return
        shortest = shortest_batch(q.latency.estimate, q.policy.max_batch_size)
        free = free_times(q)
        heap = q.heap
        keep: list[QueuedQuery] = []
        due = math.inf
        for e in heap:
            if e.fut.done():
                q.cancelled += 1
            elif doomed(config, now, e.deadline, free, shortest, e.predicted):
                q.dropped_late += 1
                q.failed += 1
                assert shortest is not None
                late = max(0.0, max(now, min(free)) + shortest - e.deadline)
                e.fut.set_exception(PredictedLate(q.name, "dispatch", late, late))
                deliver(e)
                self.instant.activity += 1
            else:
                keep.append(e)
                due = min(due, doom_time(config, e.deadline, shortest, e.predicted))
        if len(keep) < len(heap):
            heapq.heapify(keep)
            heap[:] = keep  # in place: pullers hold this list
            if q.expire_late:
                self.expiry.arm(q)
        self._arm_doom(q, due, shortest, replace=True)

    def doom_arrival(self, q: ModelQueue, deadline: float) -> None:
        """A query was admitted: the doom timer no later than when it becomes doomed.
        Cheap when the armed timer is due first (the usual case: deadlines in order)."""
        config = q.admission
        if config is None or q.latency is None:
            return
        armed = self.doom.get(q.name)
        if armed is not None and armed[0] <= doom_time(config, deadline, armed[2]):
            return
        shortest = shortest_batch(q.latency.estimate, q.policy.max_batch_size)
        self._arm_doom(q, doom_time(config, deadline, shortest), shortest)

    def _arm_doom(
        self, q: ModelQueue, when: float, shortest: float | None, replace: bool = False
    ) -> None:
        """The doom timer due at ``when`` (clock time) unless one is due earlier (``replace``:
        whatever is armed). A microsecond past ``when``: at ``when`` itself the query could
        still just make it."""
        armed = self.doom.get(q.name)
        if armed is not None:
            if not replace and armed[0] <= when:
                return
            armed[1].cancel()
            del self.doom[q.name]
        loop = self.expiry.loop
        if when == math.inf or loop is None or self.closed:
            return
        at = when + 1e-6
        delay = max(0.0, at - self.clock())
        handle = loop.call_at(loop.time() + delay, self._doom_fire, q, at)
        self.doom[q.name] = (when, handle, shortest)

    def _doom_fire(self, q: ModelQueue, at: float) -> None:
        self.doom.pop(q.name, None)
        if self.closed:
            return
        # the loop's timer may run a hair early against ``clock`` (uvloop rounds to ms)
        self.drop_doomed(q, max(self.clock(), at))

    # -- a batch past its deadline (admission) -------------------------------------------
    def _arm_cut(
        self, q: ModelQueue, batch: list[QueuedQuery], cut: list[QueuedQuery]
    ) -> list[asyncio.TimerHandle] | None:
        """With admission on, a query whose batch still runs at its deadline plus the grace
        is answered ``DeadlineExceededError`` then (counted as expired), not awaited: the
        replica stays busy until the call returns, so its free time stays true. One timer,
        re-armed for the batch's next deadline; the returned cell holds it."""
        loop = self.expiry.loop
        if loop is None:
            return None
        cell: list[asyncio.TimerHandle] = []

        def arm() -> None:
            due = min((e.deadline for e in batch if not e.fut.done()), default=math.inf)
            if due == math.inf:
                return
            delay = max(0.0, due + q.expire_grace_s - self.clock())
            cell[:] = [loop.call_at(loop.time() + delay, fire, due + q.expire_grace_s)]

        def fire(at: float) -> None:
            now = max(self.clock(), at)  # the loop's timer may run a hair early
            for e in batch:
                if not e.fut.done() and e.deadline + q.expire_grace_s <= now:
                    cut.append(e)
                    self.expiry.expire(q, e, now)
            arm()

        arm()
        return cell if cell else None

    # -- running batches ----------------------------------------------------------------
    async def _run_batch(self, q: ModelQueue, p: Puller, batch: list[QueuedQuery]) -> None:
        n = len(batch)
        p.batch = batch
        q.in_flight += n
        q.in_flight_batches += 1
        clock = self.clock
        t0 = clock()
        if q.latency is not None:  # admission predicts with this replica's free time
            p.busy_until = busy_until(q, t0, n)
            if q.heap:  # what is left: answered now if it cannot make it after this batch
                self.drop_doomed(q, t0)
        error: BaseException | None = None
        outs: Any = None
        # the batch is worth nothing past its earliest deadline plus the grace (its queries
        # expire then): the handle carries that to its server (core.BATCH_DEADLINE)
        token = None
        if q.expire_late:
            due = min(item.deadline for item in batch) + q.expire_grace_s - t0
            token = BATCH_DEADLINE.set(asyncio.get_running_loop().time() + due)
        cut: list[QueuedQuery] = []  # answered DeadlineExceeded while the batch still ran
        cut_timer = self._arm_cut(q, batch, cut) if q.admission is not None else None
        try:
            outs = await p.handle.predict_batch([item.x for item in batch])
        except InferlineError as e:
            error = e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this puller is being stopped
            # the handle's own call was cancelled under it (a gRPC channel closed while the
            # batch was out): a replica failure, retried like one, not the puller's end
            error = ReplicaError(f"replica {p.handle.id}", p.handle.id, "batch call cancelled")
        except Exception as e:  # a handle that breaks the protocol: answer, don't crash
            log.exception("replica %s of %r raised a non-inferline error", p.handle.id, q.name)
            error = BackendError(f"replica {p.handle.id}", f"{type(e).__name__}: {e}")
        finally:
            if token is not None:
                BATCH_DEADLINE.reset(token)
            if cut_timer is not None:
                cut_timer[0].cancel()
        t1 = clock()
        p.idle_since = t1
        p.busy_until = -math.inf
        p.batch = None
        q.in_flight -= n
        q.in_flight_batches -= 1
        service = t1 - t0
        if error is None and (not isinstance(outs, list | tuple) or len(outs) != n):
            error = BackendError(
                f"replica {p.handle.id}",
                f"returned {len(outs) if isinstance(outs, list | tuple) else type(outs).__name__}"
                f" outputs for a batch of {n}",
            )
        delays: list[float] = []
        if error is None:
            delays = self._answer_batch(q, batch, outs, t0, service)
        else:
            q.failed_batches += 1
            self._fail_or_retry(q, batch, error)
        q.cancelled -= len(cut)  # answered at their deadline, not cancelled by a caller
        self.instant.activity += 1  # a completion: its hand-offs belong to this instant
        if self.listeners:
            errs = prediction_errors(batch, t1) if q.admission and error is None else ()
            late = isinstance(error, DeadlineExceededError)
            self.emit(
                BatchEvent(
                    q.name, p.handle.id, n, t0, service, tuple(delays), error is None, errs, late
                )
            )
        if isinstance(error, ReplicaError):
            if not p.handle.alive:
                log.info("replica %s of %r is down; its puller exits", p.handle.id, q.name)
                p.stopping = True
            elif self.cooldown_s > 0:
                await asyncio.sleep(self.cooldown_s)

    @staticmethod
    def _answer_batch(
        q: ModelQueue, batch: list[QueuedQuery], outs: Any, t0: float, service: float
    ) -> list[float]:
        """Answer a batch that ran (one output per query) and count it; its queue delays."""
        n = len(batch)
        q.batches += 1
        q.batch_sizes[n] = q.batch_sizes.get(n, 0) + 1
        q.service_sum += service
        q.recent_service.append((n, service))
        if q.latency is not None:
            q.latency.observe(n, service)
        if service > q.service_max:
            q.service_max = service
        delays: list[float] = []
        for item, out in zip(batch, outs, strict=True):
            delay = t0 - item.enqueued
            delays.append(delay)
            q.queue_delay_sum += delay
            if delay > q.queue_delay_max:
                q.queue_delay_max = delay
            fut = item.fut
            if fut.done():
                q.cancelled += 1
                continue
            if isinstance(out, Exception):
                fut.set_exception(out)
                q.failed += 1
            else:
                fut.set_result(out)
                q.completed += 1
            h = item.handoff  # ``deliver``, inline on the hot path
            if h is not None:
                h.delivered()
        q.policy = q.policy.observe(n, service)
        return delays

    def _fail_or_retry(self, q: ModelQueue, batch: list[QueuedQuery], error: BaseException) -> None:
        retry = isinstance(error, ReplicaError) and not self.closed
        requeued = False
        for item in batch:
            fut = item.fut
            if fut.done():
                q.cancelled += 1
            elif retry and item.retries < q.max_retries:
                heapq.heappush(q.heap, item.retried())
                q.retried += 1
                requeued = True
            else:
                fut.set_exception(error)
                deliver(item)
                q.failed += 1
        if requeued:
            if q.expire_late:
                self.expiry.arm(q)  # a retried query may now be the earliest deadline
            wake_queue(q)
