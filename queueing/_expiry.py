"""Deadline expiry by timer, for models added with ``expire_late``.

A query still queued at its deadline plus the model's grace (``expire_grace_s``) is answered
then with ``DeadlineExceededError`` (the Service turns that into the app's default output with
its explanation, or a 504), not when a replica next frees up: behind a replica busy for 1 s
(or a hung one), a query with a 100 ms SLO is answered at 100 ms plus the grace.

The queue blocks on events, never polls (docs/design.md "Code conventions"): each model has at most
one loop timer, armed for the earliest deadline in its heap (the head) plus the grace, and
re-armed whenever the head changes: an arrival with an earlier deadline, a batch cut, a failed
batch put back, the timer itself. Invariant: while the heap holds a query, the timer is armed
for a deadline no later than any queued query's. Entries answered elsewhere (a caller that
left cancels its future) stay in the heap until a puller or the timer reaches them; a timer
armed for one fires once, drops it and re-arms for the next head.

With priority classes (``_priority``) the head is the first of the highest class, not always
the earliest deadline: once a queue has seen a class other than 0 (``mixed``), arming takes
the earliest deadline over the heap and a firing timer sweeps the whole heap (O(n); the
default, single-class queue keeps reading the head).

Pullers keep expiring, when they cut a batch, the queries whose deadline has already passed:
those could only be answered late, and a replica is better spent on the others.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any

from inferline.core.errors import DeadlineExceededError, ValidationError

from ._instant import _Instant
from ._mqueue import ModelQueue, QueuedQuery, deliver

__all__: list[str] = []  # private to the package

DEFAULT_EXPIRE_GRACE_S = 0.05


def _check_grace(value: Any) -> float:
    """``expire_grace_s`` as a float, or ``ValidationError`` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError("expire_grace_s", "a number of seconds >= 0", value)
    if not 0.0 <= value < math.inf:
        raise ValidationError("expire_grace_s", "a number of seconds >= 0", value)
    return float(value)


class _Expiry:
    """The expiry timers of one dispatcher's queues (see the module docstring).

    ``loop`` is the dispatcher's event loop, set when the dispatcher binds it; timers are
    loop timers of ``deadline + grace - clock()`` seconds (the dispatcher's clock advances at
    the loop's rate).
    """

    __slots__ = ("clock", "instant", "loop")

    def __init__(self, clock: Callable[[], float], instant: _Instant) -> None:
        self.clock = clock
        self.instant = instant
        self.loop: asyncio.AbstractEventLoop | None = None

    def expire(self, q: ModelQueue, item: QueuedQuery, now: float) -> None:
        """Answer ``item`` (already out of the heap) with ``DeadlineExceededError``."""
        q.expired += 1
        q.failed += 1
        item.fut.set_exception(DeadlineExceededError(q.name, now - item.deadline))
        deliver(item)
        self.instant.activity += 1

    def arm(self, q: ModelQueue) -> None:
        """Make ``q``'s timer due at its head's deadline plus the grace (no timer when the
        queue is empty). Cheap when the head did not change."""
        if not q.expire_late:
            return
        heap = q.heap
        while heap and heap[0].fut.done():  # answered elsewhere: must not hold the timer
            heapq.heappop(heap)
            q.cancelled += 1
        if not heap:
            deadline = math.inf
        elif q.mixed:
            deadline = min(e.deadline for e in heap if not e.fut.done())
        else:
            deadline = heap[0].deadline
        if deadline == q.expiry_deadline and (q.expiry_timer is not None or not heap):
            return
        self.disarm(q)
        loop = self.loop
        if deadline == math.inf or loop is None:
            return  # an infinite deadline never expires; no loop yet means nothing queued
        q.expiry_deadline = deadline
        delay = deadline + q.expire_grace_s - self.clock()
        q.expiry_timer = loop.call_at(loop.time() + max(0.0, delay), self._fire, q)

    @staticmethod
    def disarm(q: ModelQueue) -> None:
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None
        q.expiry_deadline = math.inf

    def _fire(self, q: ModelQueue) -> None:
        # The timer is due: the query it was armed for has expired even if the loop's timer
        # ran a hair early against ``clock`` (uvloop rounds timers to milliseconds).
        q.expiry_timer = None
        now = self.clock()
        limit = max(now - q.expire_grace_s, q.expiry_deadline)
        q.expiry_deadline = math.inf
        heap = q.heap
        if q.mixed:
            self._sweep(q, limit, now)
        while heap:
            head = heap[0]
            if head.fut.done():
                heapq.heappop(heap)
                q.cancelled += 1
            elif head.deadline <= limit:
                heapq.heappop(heap)
                self.expire(q, head, now)
            else:
                break
        self.arm(q)

    def _sweep(self, q: ModelQueue, limit: float, now: float) -> None:
        """Expire every queued query due by ``limit``, wherever it sits in the heap."""
        heap = q.heap
        keep = []
        for e in heap:
            if e.fut.done():
                q.cancelled += 1
            elif e.deadline <= limit:
                self.expire(q, e, now)
            else:
                keep.append(e)
        if len(keep) < len(heap):
            heapq.heapify(keep)
            heap[:] = keep  # in place: pullers hold this list
