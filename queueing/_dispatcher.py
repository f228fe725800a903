"""The interposed queue: one EDF queue per model, one puller task per replica.

Semantics (DESIGN.md "Estimator semantics", so that plans transfer):

- Every model has one queue shared by all its replicas, ordered by deadline (earliest first);
  ties keep pipeline-arrival order, then submission order.
- Each replica handle gets one puller task. A free puller asks the model's batching policy;
  with ``FixedBatching`` it takes ``min(max_batch_size, queued)`` at once. A puller has at most
  one batch in flight, so the dispatcher never has more batches in flight to a backend than
  replicas and the backend's own queue stays empty.
- "At one instant, arrivals and completions are applied before an idle replica takes a batch":
  an asyncio program has no instants, so the dispatcher ends an instant when the event loop
  runs out of runnable work. A puller about to cut a batch (woken by an arrival, or just done
  with one) waits at a shared barrier: a callback that re-schedules itself while the loop's
  ready queue holds other work and releases every waiting puller once it is the last runnable
  thing (at most ``coalesce_rounds`` loop iterations, so a busy loop never starves a replica).
  By then a burst submitted by one ``gather``, the continuations of a finished upstream batch
  (however many task hops the pipeline code takes to reach its next ``predict``) and tasks
  woken by timers due at the same time are all enqueued. On a virtual-time loop this is
  exactly the estimator's instant (tests compare per-query latencies bit for bit). Loops
  without a visible ready queue (uvloop) get ``min(coalesce_rounds, 2)`` plain yields instead.
- Pullers block on futures, never poll: an arrival wakes the idle pullers of its model; a
  policy that asks to wait (delayed batching, Rafiki) also arms one timer.

Failures: a ``ReplicaError`` from ``predict_batch`` (or a ``CancelledError`` from the call
itself, e.g. its channel closed under it, while the puller is not being stopped) puts the
batch's queries back in the queue (they keep their deadlines and order) up to ``max_retries`` times, then fails them with that
error. A puller whose handle reports ``alive == False`` after an error exits (the backend's
subscription brings the restarted replica); one whose replica is still alive pauses
``retry_cooldown_s`` so that another replica gets the retried queries first. An error value in
the output list fails just its query. Every accepted query ends in a result or an exception:
``close()`` answers queued and in-flight queries with ``BackendError``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from inferline.core.errors import (
    BackendError,
    DeadlineExceededError,
    InferlineError,
    NotFoundError,
    OverloadedError,
    ReplicaError,
    ValidationError,
)
from inferline.core.protocols import Backend, ReplicaHandle

from ._batching import BatchingPolicy, FixedBatching
from ._mqueue import (
    _DEADLINE,
    _ENQ,
    _FUT,
    _RETRIES,
    _X,
    _closed_error,
    _ModelQueue,
    _Puller,
)
from ._stats import ArrivalEvent, BatchEvent, ModelStats, RecentService

__all__ = ["Dispatcher", "Listener"]

log = logging.getLogger(__name__)

Listener = Callable[[ArrivalEvent | BatchEvent], None]


def _idle_since(p: _Puller) -> float:
    return p.idle_since


class Dispatcher:
    """Per-model EDF queues feeding replica handles in batches. See the module docstring.

    ``clock`` gives the time for deadlines, arrivals and policy decisions (the same units as
    the deadlines callers pass). It must advance at the event loop's rate, because policy
    waits are armed as loop timers of ``wait_until - clock()`` seconds.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        coalesce_rounds: int = 16,
        retry_cooldown_s: float = 0.005,
    ) -> None:
        if isinstance(coalesce_rounds, bool) or not isinstance(coalesce_rounds, int):
            raise ValidationError("coalesce_rounds", "an int >= 0", coalesce_rounds)
        if coalesce_rounds < 0:
            raise ValidationError("coalesce_rounds", "an int >= 0", coalesce_rounds)
        self._clock = clock
        self._coalesce = coalesce_rounds
        self._forming: list[asyncio.Future[None]] = []  # pullers waiting for the instant's end
        self._barrier_armed = False
        self._barrier_rounds = 0
        self._cooldown = float(retry_cooldown_s)
        self._queues: dict[str, _ModelQueue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[Listener] = []
        self._backends: list[Backend] = []
        self._known: dict[str, list[ReplicaHandle]] = {}  # handles of models not added yet
        self._routes: dict[str, str] = {}  # stage -> the model whose queue serves it
        self._seq = 0
        self._closed = False

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
    ) -> None:
        """Create ``model``'s queue. ``max_queue`` bounds the queries accepted and not yet
        answered (queued plus in flight), so retried queries never overflow it."""
        if not isinstance(model, str) or not model:
            raise ValidationError("model", "a non-empty str", model)
        if model in self._queues:
            raise ValidationError("model", "a model not added yet", model)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValidationError("max_queue", "an int >= 1", max_queue)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValidationError("max_retries", "an int >= 0", max_retries)
        policy = batching if batching is not None else FixedBatching(1)
        self._check_policy(policy)
        q = _ModelQueue(model, policy, max_queue, bool(expire_late), max_retries)
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
        way; queries already queued finish where they are."""
        if model is None or model == name:
            self._routes.pop(name, None)
            return
        if model not in self._queues:
            raise NotFoundError("model", model, list(self._queues))
        self._routes[name] = model

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
        elif not self._closed:
            self._sync(q, handles)

    @staticmethod
    def _check_policy(policy: Any) -> None:
        if not isinstance(policy, BatchingPolicy):
            raise ValidationError("batching", "a batching policy (decide/observe)", policy)

    def _queue(self, model: str) -> _ModelQueue:
        q = self._queues.get(model)
        if q is None:
            raise NotFoundError("model", model, list(self._queues))
        return q

    # -- pullers ------------------------------------------------------------------------
    def _sync(self, q: _ModelQueue, handles: list[ReplicaHandle]) -> None:
        q.handles = handles
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            q.needs_start = True  # no loop yet: start the pullers at the first submit
            return
        self._bind_loop(loop)
        q.needs_start = False
        wanted = {h.id: h for h in handles}
        for rid, p in list(q.pullers.items()):
            if wanted.get(rid) is not p.handle or p.task is None or p.task.done():
                self._retire(p)
                del q.pullers[rid]
        for rid, h in wanted.items():
            if rid not in q.pullers:
                p = _Puller(h, self._clock())
                p.task = loop.create_task(self._pull(q, p), name=f"inferline-pull-{q.name}-{rid}")
                self._tasks.add(p.task)
                p.task.add_done_callback(self._tasks.discard)
                q.pullers[rid] = p

    @staticmethod
    def _retire(p: _Puller) -> None:
        p.stopping = True
        if p.waiter is not None and not p.waiter.done():
            p.waiter.set_result(None)

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise BackendError("dispatcher", "used from a second event loop")

    @staticmethod
    def _wake(q: _ModelQueue) -> None:
        # Warmest first (most recently idle; the later-idled of a tie): the first woken takes
        # the batch, so replicas that just served keep serving and the others stay idle; a
        # replica idle for long runs its next batch slower (the profiles' wake-up extra). The
        # estimator's idle stack picks the same replica.
        for p in sorted(reversed(q.idle), key=_idle_since, reverse=True):
            w = p.waiter
            if w is not None and not w.done():
                w.set_result(None)
        q.idle.clear()

    @staticmethod
    def _wake_one(p: _Puller) -> None:
        p.timer = None
        w = p.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _idle_wait(self, q: _ModelQueue, p: _Puller, until: float | None) -> None:
        assert self._loop is not None
        w = self._loop.create_future()
        p.waiter = w
        q.idle.append(p)
        if until is not None:
            p.timer = self._loop.call_later(max(0.0, until - self._clock()), self._wake_one, p)
        try:
            await w
        finally:
            p.waiter = None
            if p.timer is not None:
                p.timer.cancel()
                p.timer = None
            if p in q.idle:
                q.idle.remove(p)

    async def _end_of_instant(self) -> None:
        loop = self._loop
        assert loop is not None
        if getattr(loop, "_ready", None) is None:
            for _ in range(min(self._coalesce, 2)):
                await asyncio.sleep(0)
            return
        w = loop.create_future()
        self._forming.append(w)
        if not self._barrier_armed:
            self._barrier_armed = True
            self._barrier_rounds = 0
            loop.call_soon(self._barrier)
        await w

    def _barrier(self) -> None:
        loop = self._loop
        assert loop is not None
        # ``_ready`` holds what is still to run in this iteration plus what was scheduled
        # during it: empty means this callback is the last runnable thing of the instant.
        if loop._ready and self._barrier_rounds < self._coalesce:  # type: ignore[attr-defined]
            self._barrier_rounds += 1
            loop.call_soon(self._barrier)
            return
        self._barrier_armed = False
        waiters, self._forming = self._forming, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    @staticmethod
    def _compact(q: _ModelQueue) -> int:
        """Drop the entries already answered elsewhere (a query that got its default or whose
        client left cancels its future, and leaves the entry until a puller reaches it), so
        that they do not count against ``max_queue``; returns the live count. O(n), only when
        the queue looks full."""
        heap = q.heap
        live = [e for e in heap if not e[_FUT].done()]
        if len(live) < len(heap):
            q.cancelled += len(heap) - len(live)
            heapq.heapify(live)
            heap[:] = live  # in place: pullers hold this list
        return len(heap)

    def _purge_head(self, q: _ModelQueue, now: float) -> None:
        heap = q.heap
        while heap:
            head = heap[0]
            if head[_FUT].done():
                heapq.heappop(heap)
                q.cancelled += 1
            elif q.expire_late and head[_DEADLINE] < now:
                heapq.heappop(heap)
                self._expire(q, head, now)
            else:
                return

    @staticmethod
    def _expire(q: _ModelQueue, item: tuple[Any, ...], now: float) -> None:
        q.expired += 1
        q.failed += 1
        item[_FUT].set_exception(DeadlineExceededError(q.name, now - item[_DEADLINE]))

    async def _pull(self, q: _ModelQueue, p: _Puller) -> None:
        heap = q.heap
        pop = heapq.heappop
        try:
            while not (p.stopping or self._closed):
                if not heap:
                    await self._idle_wait(q, p, None)
                    continue
                if self._coalesce:
                    await self._end_of_instant()
                if p.stopping or self._closed:
                    return
                now = self._clock()
                self._purge_head(q, now)
                if not heap:
                    continue
                head = heap[0]
                d = q.policy.decide(now, len(heap), head[_DEADLINE], head[_ENQ])
                if d.take <= 0:
                    await self._idle_wait(q, p, d.wait_until)
                    continue
                batch: list[tuple[Any, ...]] = []
                while heap and len(batch) < d.take:
                    item = pop(heap)
                    if item[_FUT].done():
                        q.cancelled += 1
                    elif q.expire_late and item[_DEADLINE] < now:
                        self._expire(q, item, now)
                    else:
                        batch.append(item)
                if batch:
                    await self._run_batch(q, p, batch, now)
        finally:
            if p.batch is not None:  # cancelled mid-batch (close): answer, never drop
                q.in_flight -= len(p.batch)
                q.in_flight_batches -= 1
                for item in p.batch:
                    fut = item[_FUT]
                    if not fut.done():
                        fut.set_exception(_closed_error(q.name))
                        q.failed += 1
                p.batch = None

    async def _run_batch(
        self, q: _ModelQueue, p: _Puller, batch: list[tuple[Any, ...]], now: float
    ) -> None:
        n = len(batch)
        p.batch = batch
        q.in_flight += n
        q.in_flight_batches += 1
        clock = self._clock
        t0 = clock()
        error: BaseException | None = None
        outs: Any = None
        try:
            outs = await p.handle.predict_batch([item[_X] for item in batch])
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
        t1 = clock()
        p.idle_since = t1
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
            q.batches += 1
            q.batch_sizes[n] = q.batch_sizes.get(n, 0) + 1
            q.service_sum += service
            q.recent_service.append((n, service))
            if service > q.service_max:
                q.service_max = service
            for item, out in zip(batch, outs, strict=True):
                delay = t0 - item[_ENQ]
                delays.append(delay)
                q.queue_delay_sum += delay
                if delay > q.queue_delay_max:
                    q.queue_delay_max = delay
                fut = item[_FUT]
                if fut.done():
                    q.cancelled += 1
                elif isinstance(out, Exception):
                    fut.set_exception(out)
                    q.failed += 1
                else:
                    fut.set_result(out)
                    q.completed += 1
            q.policy = q.policy.observe(n, service)
        else:
            q.failed_batches += 1
            self._fail_or_retry(q, batch, error)
        if self._listeners:
            self._emit(
                BatchEvent(q.name, p.handle.id, n, t0, service, tuple(delays), error is None)
            )
        if isinstance(error, ReplicaError):
            if not p.handle.alive:
                log.info("replica %s of %r is down; its puller exits", p.handle.id, q.name)
                p.stopping = True
            elif self._cooldown > 0:
                await asyncio.sleep(self._cooldown)

    def _fail_or_retry(
        self, q: _ModelQueue, batch: list[tuple[Any, ...]], error: BaseException
    ) -> None:
        retry = isinstance(error, ReplicaError) and not self._closed
        requeued = False
        for item in batch:
            fut = item[_FUT]
            if fut.done():
                q.cancelled += 1
            elif retry and item[_RETRIES] < q.max_retries:
                heapq.heappush(q.heap, (*item[:_RETRIES], item[_RETRIES] + 1))
                q.retried += 1
                requeued = True
            else:
                fut.set_exception(error)
                q.failed += 1
        if requeued and q.idle:
            self._wake(q)

    def _emit(self, event: ArrivalEvent | BatchEvent) -> None:
        for cb in self._listeners:
            try:
                cb(event)
            except Exception:
                log.exception("dispatcher listener %r failed", cb)

    # -- submitting ---------------------------------------------------------------------
    def _enqueue(
        self,
        q: _ModelQueue,
        x: Any,
        deadline: float,
        arrival: float | None,
        query_id: int | None = None,
    ) -> asyncio.Future[Any]:
        if self._closed:
            raise _closed_error(q.name)
        loop = self._loop
        if loop is None:
            loop = asyncio.get_running_loop()
            self._bind_loop(loop)
        if q.needs_start:
            self._sync(q, q.handles)
        if not deadline <= math.inf:  # NaN or not a number would corrupt the heap order
            raise ValidationError("deadline", "a number (clock time)", deadline)
        now = self._clock()
        if (
            len(q.heap) + q.in_flight >= q.max_queue
            and self._compact(q) + q.in_flight >= q.max_queue
        ):
            q.rejected += 1
            if self._listeners:
                self._emit(ArrivalEvent(q.name, now, False, len(q.heap)))
            raise OverloadedError(q.name, q.max_queue)
        fut = loop.create_future()
        self._seq += 1
        seq = self._seq
        heapq.heappush(
            q.heap,
            (
                deadline,
                now if arrival is None else arrival,
                seq if query_id is None else query_id,
                seq,
                x,
                fut,
                now,
                0,
            ),
        )
        q.submitted += 1
        if q.idle:
            self._wake(q)
        if self._listeners:
            self._emit(ArrivalEvent(q.name, now, True, len(q.heap)))
        return fut

    async def submit(
        self,
        model: str,
        x: Any,
        *,
        deadline: float,
        arrival: float | None = None,
        query_id: int | None = None,
    ) -> Any:
        """Queue ``x`` for ``model`` and return its output (or raise its error).

        ``deadline`` orders the queue (clock time); ``arrival`` (default now) breaks deadline
        ties, then ``query_id`` (pipeline queries numbered in arrival order; default: order of
        submission), so queries that arrived together keep their order at every model as in
        the estimator. Raises ``OverloadedError`` at once when the queue is full, ``NotFoundError`` for
        an unknown model. Cancelling the caller removes the query (it is skipped)."""
        q = self._queues.get(self._routes.get(model, model))
        if q is None:
            raise NotFoundError("model", model, list(self._queues))
        return await self._enqueue(q, x, deadline, arrival, query_id)

    async def submit_many(
        self, model: str, xs: Sequence[Any], *, deadline: float, arrival: float | None = None
    ) -> list[Any]:
        """Queue all of ``xs`` at once (admitted all or none) and return one entry per input:
        the output, or the exception instance for an input that failed (the narrow waist's
        convention), so one bad input does not hide the others' results."""
        q = self._queue(self._routes.get(model, model))
        if (
            len(q.heap) + q.in_flight + len(xs) > q.max_queue
            and self._compact(q) + q.in_flight + len(xs) > q.max_queue
        ):
            q.rejected += len(xs)
            raise OverloadedError(q.name, q.max_queue)
        futs = [self._enqueue(q, x, deadline, arrival) for x in xs]
        return list(await asyncio.gather(*futs, return_exceptions=True))

    # -- observing ----------------------------------------------------------------------
    def queued(self, model: str) -> int:
        """Queries waiting (not those answered elsewhere while queued)."""
        return sum(1 for e in self._queue(model).heap if not e[_FUT].done())

    def stats(self, model: str) -> ModelStats:
        q = self._queue(model)
        return ModelStats(
            model=q.name,
            queued=sum(1 for e in q.heap if not e[_FUT].done()),
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
        self._closed = True
        for q in self._queues.values():
            items = list(q.heap)
            q.heap.clear()  # in place: pullers hold this list
            for item in items:
                fut = item[_FUT]
                if fut.done():
                    q.cancelled += 1
                else:
                    fut.set_exception(_closed_error(q.name))
                    q.failed += 1
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for q in self._queues.values():
            q.pullers.clear()
            q.idle.clear()


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
