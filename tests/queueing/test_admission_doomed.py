"""Queued queries answered as soon as they are doomed (issue 45): the pure rule
(``doomed``, ``doom_time``, ``shortest_batch``) with numbers for times, and a running
dispatcher on the virtual-time loop (exact times) whose replica stalls."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from inferline.core.errors import DeadlineExceededError
from inferline.queueing import (
    AdmissionConfig,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PredictedLate,
)
from inferline.queueing._admission import doom_time, doomed, shortest_batch

ON = AdmissionConfig("predicted", buffer_s=0.002)


def lat(b: int) -> float:
    return 0.010 + 0.001 * b


def test_shortest_batch_skips_unknown_sizes() -> None:
    assert shortest_batch(lat, 8) == pytest.approx(0.011)
    assert shortest_batch(lambda b: None if b < 3 else 0.02 - 0.001 * b, 8) == pytest.approx(0.012)
    assert shortest_batch(lambda b: None, 8) is None


def test_doomed_from_the_earliest_start_plus_the_shortest_batch() -> None:
    # deadline 100 ms, buffer 2: the internal deadline 98 ms; shortest batch 11 ms
    assert not doomed(ON, 0.080, 0.100, [-math.inf], 0.011)  # 91 <= 98
    assert not doomed(ON, 0.087, 0.100, [-math.inf], 0.011)  # 98: just makes it
    assert doomed(ON, 0.0871, 0.100, [-math.inf], 0.011)
    # every replica busy until 90 ms: doomed already at 50 ms (90 + 11 > 98)
    assert doomed(ON, 0.050, 0.100, [0.090, 0.120], 0.011)
    assert not doomed(ON, 0.050, 0.100, [0.080, 0.120], 0.011)  # 80 + 11 <= 98
    # never without an estimate, a replica, a deadline, or with admission off
    assert not doomed(ON, 0.2, 0.100, [-math.inf], None)
    assert not doomed(ON, 0.2, 0.100, [], 0.011)
    assert not doomed(ON, 0.2, math.inf, [-math.inf], 0.011)
    assert not doomed(AdmissionConfig(), 0.2, 0.100, [-math.inf], 0.011)
    assert doom_time(ON, 0.100, 0.011) == pytest.approx(0.087)
    assert doom_time(ON, 0.100, None) == math.inf


def test_a_stalled_replica_s_queue_is_answered_when_doomed_not_at_the_next_cut(
    vrun: Any,
) -> None:
    """16 queries at t=0, 100 ms SLO: two batches of 8 fit on the profile (18 and 36 ms),
    so all are admitted. The first batch stalls for 300 ms. The 8 still queued cannot make
    it once 100 - 2 (buffer) - 11 (the shortest batch) = 87 ms have passed: they are
    answered PredictedLate then, not at 300 ms when the replica frees and cuts again. The
    stalled batch's own 8 are answered DeadlineExceeded at their deadline plus the grace
    (150 ms), not awaited; the replica stays busy until its call returns (a query sent at
    200 ms runs at 300 ms)."""
    stalls = [0.300]

    def service(b: int) -> float:
        return stalls.pop() if stalls else lat(b)

    async def scenario() -> tuple[list[tuple[float, Any]], Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        cfg = AdmissionConfig("predicted", buffer_s=0.002, min_samples=1000)  # the profile
        d.add_model("m", batching=FixedBatching(8), admission=cfg, profile=lat)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=service)])

        async def one(i: int, deadline: float = 0.100) -> tuple[float, Any]:
            try:
                out: Any = await d.submit("m", i, deadline=deadline)
            except (PredictedLate, DeadlineExceededError) as e:
                out = e
            return loop.time(), out

        first = asyncio.gather(*(one(i) for i in range(16)))
        await asyncio.sleep(0.200)
        later = await one(16, 1.0)
        res = [*await first, later]
        st = d.stats("m")
        await d.close()
        return res, st

    res, st = vrun(scenario)
    dropped = [(t, e) for t, e in res if isinstance(e, PredictedLate)]
    cut = [t for t, x in res if isinstance(x, DeadlineExceededError)]
    assert len(dropped) == 8 and len(cut) == 8 and st.refused_late == 0
    assert all(t == pytest.approx(0.087, abs=1e-5) for t, _ in dropped)
    assert all(e.stage == "dispatch" and e.reason == "dropped_late" for _, e in dropped)
    assert cut == [pytest.approx(0.150, abs=1e-5)] * 8
    assert res[-1][0] == pytest.approx(0.300 + lat(1)) and res[-1][1] == 16
    assert st.dropped_late == 8 and st.expired == 8 and st.completed == 1 and st.cancelled == 0


def test_nothing_admitted_in_time_is_dropped(vrun: Any) -> None:
    """The replica keeps to the profile: the doom timer never fires on a query that can
    make it (40 at t=0 with a 50 ms SLO: 20 admitted and all answered)."""

    async def scenario() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(8), admission=ON, profile=lat)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=lat)])
        res = await asyncio.gather(
            *(d.submit("m", i, deadline=0.050) for i in range(40)), return_exceptions=True
        )
        st = d.stats("m")
        await d.close()
        return sum(not isinstance(x, BaseException) for x in res), st.dropped_late, st.refused_late

    ok, dropped, refused = vrun(scenario)
    assert dropped == 0 and ok + refused == 40 and ok >= 16
