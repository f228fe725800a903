"""The queued-query record and the dispatcher's non-awaiting submit path (``submit_nowait``,
``open_handoff``), which ``PipelineRunner`` uses instead of private members."""

from __future__ import annotations

import asyncio
import heapq
import random

from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica, NoOpModel
from inferline.queueing._mqueue import QueuedQuery


def _entry(deadline: float, arrival: float, rank: int, seq: int, retries: int = 0) -> QueuedQuery:
    return QueuedQuery(deadline, arrival, rank, seq, object(), None, 0.0, None, retries)  # type: ignore[arg-type]


def test_heap_orders_by_deadline_arrival_rank_then_seq() -> None:
    """The record keeps plain tuple order: the payload (unorderable here) is never compared."""
    rng = random.Random(7)
    entries = [
        _entry(rng.choice([1.0, 2.0]), rng.choice([0.0, 0.5]), rng.randrange(3), seq)
        for seq in range(200)
    ]
    heap: list[QueuedQuery] = []
    for e in entries:
        heapq.heappush(heap, e)
    popped = [heapq.heappop(heap) for _ in range(len(entries))]
    key = [(e.deadline, e.arrival, e.rank, e.seq) for e in popped]
    assert key == sorted(key)


def test_a_retried_query_keeps_its_place_and_counts_the_retry() -> None:
    e = _entry(1.0, 0.0, 3, 9)
    r = e.retried()
    assert type(r) is QueuedQuery
    assert r.retries == 1 and r[:-1] == e[:-1]  # same order key: same place in the heap


def test_submit_nowait_and_open_handoff() -> None:
    async def main() -> tuple[list[int], int, int]:
        d = Dispatcher()
        d.add_model("m", batching=FixedBatching(4))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.0)])
        h = d.open_handoff()
        in_transit_open = d._instant.in_transit
        futs = []
        for i in range(3):
            h.call()  # as PipelineContext.predict does before each model call
            futs.append(d.submit_nowait("m", i, deadline=d.clock() + 1.0, handoff=h))
        futs.append(d.submit_nowait("m", 3, d.clock() + 1.0))  # no hand-off: plain caller
        assert all(isinstance(f, asyncio.Future) for f in futs)
        outs = list(await asyncio.gather(*futs))
        for _ in range(3):
            h.answered()
        h.close()
        after = d._instant.in_transit
        await d.close()
        return outs, in_transit_open, after

    outs, in_transit_open, after = asyncio.run(main())
    assert outs == [0, 1, 2, 3]
    assert in_transit_open == 1  # an open query with no call out is in transit
    assert after == 0
