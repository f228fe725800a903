"""Admission, the dispatch rule and priority classes in a running dispatcher, on the
virtual-time loop (exact times): refusals come at once, nothing admitted is answered late,
a higher class goes first, expiry still finds a late query behind a higher class."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.core.errors import DeadlineExceededError
from inferline.queueing import (
    AdmissionConfig,
    BatchEvent,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PredictedLate,
)

ON = AdmissionConfig("predicted", buffer_s=0.0)


def lat(b: int) -> float:
    return 0.010 + 0.001 * b


def _dispatcher(loop: asyncio.AbstractEventLoop, **kw: Any) -> Dispatcher:
    d = Dispatcher(clock=loop.time)
    d.add_model("m", batching=FixedBatching(8), **kw)
    d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=lat)])
    return d


async def _timed(d: Dispatcher, x: Any, deadline: float, priority: int = 0) -> tuple[float, Any]:
    loop = asyncio.get_running_loop()
    try:
        out: Any = await d.submit("m", x, deadline=deadline, priority=priority)
    except (PredictedLate, DeadlineExceededError) as e:
        out = e
    return loop.time(), out


def test_a_burst_past_what_fits_is_refused_at_once(vrun: Any) -> None:
    """40 queries at t=0 with a 50 ms SLO, one replica, batches of 8 (10 ms + 1 ms per item):
    two full batches end at 18 and 36 ms, and a third of 4 at exactly 50 ms. 20 admitted and
    answered in time; 20 refused at t=0 with a retry hint. Without admission all 40 would
    run, the last batch ending at 90 ms."""

    async def scenario() -> tuple[list[tuple[float, Any]], Any]:
        d = _dispatcher(asyncio.get_running_loop(), admission=ON, profile=lat)
        res = await asyncio.gather(*(_timed(d, i, 0.050) for i in range(40)))
        st = d.stats("m")
        await d.close()
        return res, st

    res, st = vrun(scenario)
    ok = [(t, x) for t, x in res if not isinstance(x, BaseException)]
    refused = [(t, x) for t, x in res if isinstance(x, PredictedLate)]
    assert len(ok) == 20 and len(refused) == 20
    assert max(t for t, _ in ok) == pytest.approx(0.050) and all(t <= 0.050 for t, _ in ok)
    assert all(t == 0.0 for t, _ in refused)  # answered at arrival
    assert all(e.stage == "admission" and e.retry_after_s > 0 for _, e in refused)
    assert st.refused_late == 20 and st.dropped_late == 0 and st.completed == 20


def test_admission_off_by_default_runs_everything_late(vrun: Any) -> None:
    async def scenario() -> list[tuple[float, Any]]:
        d = _dispatcher(asyncio.get_running_loop())
        res = await asyncio.gather(*(_timed(d, i, 0.050) for i in range(40)))
        await d.close()
        return res

    res = vrun(scenario)
    assert all(not isinstance(x, BaseException) for _, x in res)
    assert max(t for t, _ in res) == pytest.approx(0.018 * 5)


def test_without_an_estimate_it_admits_then_learns(vrun: Any) -> None:
    """No profile: the first queries are admitted (nothing to predict with); once enough
    batches of 8 ran (min_samples), the live P99 refuses what cannot fit."""

    async def scenario() -> tuple[int, int]:
        d = _dispatcher(asyncio.get_running_loop(), admission=AdmissionConfig("predicted", 0.0))
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(_timed(d, i, 10.0) for i in range(48)))  # 6 batches of 8
        now = loop.time()
        res = await asyncio.gather(*(_timed(d, i, now + 0.050) for i in range(40)))
        n_ref = sum(isinstance(x, PredictedLate) for _, x in res)
        late = sum(t > now + 0.050 for t, _ in res)
        await d.close()
        return n_ref, late

    n_ref, late = vrun(scenario)
    # only batches of 8 were measured: a smaller batch is read as 18 ms too (the smallest
    # measured size above it), so the third batch (4, 50 ms) is not admitted: 16 of 40
    assert n_ref == 24 and late == 0


def test_dispatch_rule_drops_a_query_that_became_late(vrun: Any) -> None:
    """A replica runs 4x slower than the profile says. Admission lets queries in on the
    profile's word; when a batch is cut, the live P99 (now learned) shows some cannot finish,
    and they are dropped with PredictedLate (stage dispatch) instead of run late."""

    async def scenario() -> tuple[list[tuple[float, Any]], Any, list[BatchEvent]]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        cfg = AdmissionConfig("predicted", buffer_s=0.0, min_samples=1)
        d.add_model("m", batching=FixedBatching(8), admission=cfg, profile=lat)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=lambda b: 4 * lat(b))])
        events: list[BatchEvent] = []
        d.add_listener(lambda e: events.append(e) if isinstance(e, BatchEvent) else None)
        res = await asyncio.gather(*(_timed(d, i, 0.100) for i in range(24)))
        st = d.stats("m")
        await d.close()
        return res, st, events

    res, st, events = vrun(scenario)
    dropped = [e for _, e in res if isinstance(e, PredictedLate)]
    assert dropped and all(e.stage == "dispatch" for e in dropped)
    assert st.dropped_late == len(dropped) and st.refused_late == 0
    # what ran finished in time: the first batch 72 ms; the second would end at 144 ms
    assert all(t <= 0.100 for t, x in res if not isinstance(x, BaseException))
    # the i-th query was predicted (the profile, the queue as it arrived: a batch of i + 1)
    # to end at 10 + i + 1 ms; the batch of 8 ended at 72 ms
    assert events[0].prediction_errors_s == pytest.approx(
        tuple(0.010 + 0.001 * (i + 1) - 0.072 for i in range(8))
    )


def test_a_higher_class_is_served_first_edf_within(vrun: Any) -> None:
    """Strict across classes, EDF within one: with the replica busy, 4 low queries with
    early deadlines and 4 high with later ones queue; batches of 2 take the high ones first,
    earliest deadline first."""

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(2))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.01)])
        order: list[Any] = []
        d.add_listener(lambda e: None)

        async def one(x: str, deadline: float, prio: int) -> None:
            await d.submit("m", x, deadline=deadline, priority=prio)
            order.append(x)

        busy = asyncio.ensure_future(one("busy", 9.0, 0))
        while d.stats("m").in_flight == 0:
            await asyncio.sleep(0)
        subs = [one(f"low{i}", 1.0 + i, 0) for i in range(4)]
        subs += [one(f"high{i}", 5.0 - i, 1) for i in range(4)]
        await asyncio.gather(busy, *subs)
        await d.close()
        return order

    order = vrun(scenario)
    assert order[0] == "busy"
    assert order[1:5] == ["high3", "high2", "high1", "high0"]
    assert order[5:] == ["low0", "low1", "low2", "low3"]


def test_expiry_finds_a_late_low_query_behind_a_higher_class(vrun: Any) -> None:
    """The head is a high-class query with a late deadline; a low-class one behind it has
    the earlier deadline. Expiry must still answer it at its deadline plus the grace."""

    async def scenario() -> list[tuple[float, Any]]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(8), expire_late=True, expire_grace_s=0.0)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])
        busy = asyncio.ensure_future(_timed(d, "busy", 10.0))
        while d.stats("m").in_flight == 0:
            await asyncio.sleep(0)
        hi = asyncio.ensure_future(_timed(d, "hi", 5.0, 3))
        lo = await _timed(d, "lo", 0.2)
        res = [lo, await hi, await busy]
        await d.close()
        return res

    (t_lo, lo), (t_hi, hi), _ = vrun(scenario)
    assert isinstance(lo, DeadlineExceededError) and t_lo == pytest.approx(0.2)
    assert hi == "hi" and t_hi == pytest.approx(2.0)
