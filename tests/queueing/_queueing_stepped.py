"""Virtual time on any event loop, uvloop included, for the queue tests (own module name, as
``_queueing_vtime``).

uvloop's timers cannot be made virtual, so ``SteppedTime`` keeps the time itself: replicas
(``GatedReplica``) end their batches when the driver opens their gate, and the driver moves
``now`` to the next arrival or batch end only once the loop has settled (every puller idle or
running a batch, no puller at the same-instant barrier, no query between two model calls, and
the dispatcher's activity counter unchanged for a few loop iterations). It then opens every
gate due at that instant and starts every query arriving at it in one step, so what the
dispatcher sees is one estimator instant, reached through uvloop's own scheduling. No wall
time is involved: settling counts loop iterations (``sleep(0)``), never timeouts.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.protocols import ReplicaBase
from inferline.queueing import Dispatcher

QUIET_ITERATIONS = 4  # iterations without dispatcher activity before time may move on
MAX_SETTLE_ITERATIONS = 100_000  # a harness bug, not a slow machine, if this is reached


class SteppedTime:
    """The clock of one run: ``clock()`` for the dispatcher, ``gate(s)`` for replicas."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    def gate(self, service_s: float) -> asyncio.Future[None]:
        """A future that the driver resolves at ``now + service_s``."""
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._due, (self.now + service_s, next(self._seq), fut))
        return fut

    async def settle(self, d: Dispatcher) -> None:
        inst = d._instant
        quiet, last = 0, inst.activity
        for _ in range(MAX_SETTLE_ITERATIONS):
            await asyncio.sleep(0)
            if inst.activity != last:
                quiet, last = 0, inst.activity
                continue
            pullers_parked = all(
                p in q.idle or p.batch is not None
                for q in d._queues.values()
                for p in q.pullers.values()
            )
            if pullers_parked and not inst._waiters and inst.in_transit == 0:
                quiet += 1
                if quiet >= QUIET_ITERATIONS:
                    return
            else:
                quiet = 0
        raise RuntimeError("stepped time: the loop never settled")

    async def drive(
        self, d: Dispatcher, arrivals: Sequence[float], start: Callable[[int, float], Any]
    ) -> None:
        """Call ``start(i, t)`` at each arrival ``t`` and open gates at their instants until
        nothing is due; ``start`` should schedule the query (e.g. ``ensure_future``)."""
        i, n = 0, len(arrivals)
        while True:
            await self.settle(d)
            nxt = [arrivals[i]] if i < n else []
            if self._due:
                nxt.append(self._due[0][0])
            if not nxt:
                return
            t = min(nxt)
            assert t >= self.now
            self.now = t
            while self._due and self._due[0][0] == t:
                _, _, fut = heapq.heappop(self._due)
                fut.set_result(None)
            while i < n and arrivals[i] == t:
                start(i, t)
                i += 1


class GatedReplica(ReplicaBase):
    """A replica whose batch of ``b`` ends ``service_s(b)`` of stepped time after it starts."""

    def __init__(
        self, model: str, time: SteppedTime, service_s: Callable[[int], float], rid: str
    ) -> None:
        super().__init__(model, rid, "cpu")
        self._time = time
        self._service = service_s
        self.batch_sizes: list[int] = []

    @property
    def alive(self) -> bool:
        return True

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        self.batch_sizes.append(len(inputs))
        await self._time.gate(self._service(len(inputs)))
        return list(inputs)
