"""Deadline expiry by timer (``expire_late``), on the virtual-time loop: exact answer times.

Each test names the injected bug it catches; every one was checked to fail with that bug.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from inferline.core.errors import DeadlineExceededError, ValidationError
from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica, NoOpModel
from inferline.queueing._expiry import _Expiry


@pytest.fixture
def fires(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock times at which any expiry timer fired (a poller would fire many times)."""
    times: list[float] = []
    real = _Expiry._fire

    def counting(self: _Expiry, q: Any) -> None:
        times.append(self.clock())
        real(self, q)

    monkeypatch.setattr(_Expiry, "_fire", counting)
    return times


def _busy_dispatcher(loop: asyncio.AbstractEventLoop, **kw: Any) -> Dispatcher:
    grace = kw.pop("grace", None)
    d = Dispatcher(clock=loop.time, **kw)
    d.add_model("m", batching=FixedBatching(8), expire_late=True, expire_grace_s=grace)
    d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])
    return d


async def _occupy(d: Dispatcher) -> asyncio.Future[tuple[float, Any]]:
    """Submit a query that takes the one replica until t=1 (it is cut into a batch at the
    end of this instant, before anything else queues; no time passes)."""
    busy = asyncio.ensure_future(_timed(d, "busy", 10.0))
    while d.stats("m").in_flight == 0:
        await asyncio.sleep(0)
    return busy


async def _timed(d: Dispatcher, x: Any, deadline: float) -> tuple[float, Any]:
    loop = asyncio.get_running_loop()
    try:
        out: Any = await d.submit("m", x, deadline=deadline)
    except DeadlineExceededError as e:
        out = e
    return loop.time(), out


async def _at(t: float, d: Dispatcher, x: Any, deadline: float) -> tuple[float, Any]:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(t - loop.time())
    return await _timed(d, x, deadline)


def test_nine_queries_behind_a_busy_replica_expire_at_deadline_plus_grace(
    vrun: Any, fires: list[float]
) -> None:
    """The issue's measurement: a replica busy for 1 s, nine queries queued behind it with a
    100 ms SLO. All nine are answered with ``DeadlineExceededError`` at 0.1 s + 50 ms grace,
    by one timer firing once. Catches: expiry only when a replica pulls (answers at 1.0 s),
    no default grace (0.1 s), polling instead of one timer (many fires)."""

    async def scenario() -> tuple[list[tuple[float, Any]], Any, Any]:
        loop = asyncio.get_running_loop()
        d = _busy_dispatcher(loop)
        busy = await _occupy(d)
        res = await asyncio.gather(*(_timed(d, i, 0.1) for i in range(9)))
        st = d.stats("m")
        await busy
        await d.close()
        return res, st, busy.result()

    res, st, busy = vrun(scenario)
    assert busy == (1.0, "busy")
    for t, out in res:
        assert isinstance(out, DeadlineExceededError)
        assert t == pytest.approx(0.15, abs=1e-12)
        assert out.late_by_s == pytest.approx(0.05, abs=1e-12)
    assert st.expired == 9 and st.queued == 0 and st.batches == 0
    assert fires == [pytest.approx(0.15, abs=1e-12)]


@pytest.mark.parametrize(
    ("dispatcher_grace", "model_grace", "at"), [(0.0, None, 0.1), (0.05, 0.02, 0.12)]
)
def test_grace_is_configurable_per_dispatcher_and_model(
    vrun: Any, dispatcher_grace: float, model_grace: float | None, at: float
) -> None:
    """Catches: ``expire_grace_s`` ignored (answers at 0.15 s), the model's grace not
    overriding the dispatcher's."""

    async def scenario() -> tuple[float, Any]:
        loop = asyncio.get_running_loop()
        d = _busy_dispatcher(loop, expire_grace_s=dispatcher_grace, grace=model_grace)
        busy = await _occupy(d)
        res = await _timed(d, "late", 0.1)
        await busy
        await d.close()
        return res

    t, out = vrun(scenario)
    assert isinstance(out, DeadlineExceededError) and t == pytest.approx(at, abs=1e-12)


def test_staggered_deadlines_each_expire_at_their_own_time(vrun: Any, fires: list[float]) -> None:
    """Nine arrivals 10 ms apart, SLO 100 ms: each is answered at its own deadline + grace,
    the timer re-armed for the next head after each firing. Catches: a timer that is not
    re-armed after it fires (the later eight wait for the replica), one that expires every
    queued query at once (answers too early), expiry only on pull."""

    async def scenario() -> list[tuple[float, Any]]:
        loop = asyncio.get_running_loop()
        d = _busy_dispatcher(loop)
        busy = await _occupy(d)
        res = await asyncio.gather(*(_at(0.01 * i, d, i, 0.01 * i + 0.1) for i in range(9)))
        await busy
        await d.close()
        return res

    res = vrun(scenario)
    for i, (t, out) in enumerate(res):
        assert isinstance(out, DeadlineExceededError), (i, out)
        assert t == pytest.approx(0.01 * i + 0.15, abs=1e-9), i
    assert len(fires) == 9


def test_an_earlier_deadline_arriving_later_rearms_the_timer(vrun: Any) -> None:
    """The timer is armed for a deadline of 0.5; a query with deadline 0.1 arrives after it
    and becomes the head: it expires at 0.15, the other at 0.55. Catches: arming only when
    the queue was empty (the 0.1 query waits until 0.55)."""

    async def scenario() -> list[tuple[float, Any]]:
        loop = asyncio.get_running_loop()
        d = _busy_dispatcher(loop)
        busy = await _occupy(d)
        res = await asyncio.gather(_at(0.0, d, "later", 0.5), _at(0.02, d, "sooner", 0.1))
        await busy
        await d.close()
        return res

    (t_later, later), (t_sooner, sooner) = vrun(scenario)
    assert isinstance(sooner, DeadlineExceededError) and t_sooner == pytest.approx(0.15)
    assert isinstance(later, DeadlineExceededError) and t_later == pytest.approx(0.55)


def test_cancelled_head_neither_expires_nor_holds_the_timer(vrun: Any, fires: list[float]) -> None:
    """The head (deadline 0.1) is cancelled by its caller at 0.05; the next query (deadline
    0.3) still expires exactly at 0.35 and the cancelled one is counted as cancelled, not
    expired. Catches: setting an exception on a cancelled future (InvalidStateError in the
    timer callback), a timer dropped when its head is gone (0.3 waits for the replica)."""

    async def scenario() -> tuple[Any, tuple[float, Any], Any, list[Any]]:
        loop = asyncio.get_running_loop()
        errors: list[Any] = []
        loop.set_exception_handler(lambda _l, ctx: errors.append(ctx))
        d = _busy_dispatcher(loop)
        busy = await _occupy(d)
        head = asyncio.ensure_future(d.submit("m", "head", deadline=0.1))
        nxt = asyncio.ensure_future(_timed(d, "next", 0.3))
        await asyncio.sleep(0.05)
        head.cancel()
        res = await nxt
        st = d.stats("m")
        await busy
        await d.close()
        return head, res, st, errors

    head, (t, out), st, errors = vrun(scenario)
    assert head.cancelled()
    assert isinstance(out, DeadlineExceededError) and t == pytest.approx(0.35, abs=1e-12)
    assert st.expired == 1 and st.cancelled == 1
    assert errors == []
    assert len(fires) <= 2  # the stale one (0.15) at most, then 0.35


def test_queries_served_before_their_deadline_leave_no_timer(vrun: Any, fires: list[float]) -> None:
    """Queries taken by a free replica before their deadline complete normally; once the
    queue is empty no timer is armed, and after a batch is cut the timer follows the new
    head. Catches: a timer left armed for queries already served (a stale firing per batch,
    or one that expires the next, later query early); not re-arming after a batch is cut."""

    async def scenario() -> tuple[list[tuple[float, Any]], list[Any], Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1), expire_late=True)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.04)])
        q = d._queues["m"]
        seen: list[Any] = []
        # three queries at t=0 with deadlines 0.1, 0.2, 0.3: served at 0.04, 0.08, 0.12
        tasks = [asyncio.ensure_future(_timed(d, i, 0.1 * (i + 1))) for i in range(3)]
        await asyncio.sleep(0.01)  # the first is in flight; the head is now deadline 0.2
        seen.append(q.expiry_deadline)
        res = await asyncio.gather(*tasks)
        seen.append((q.expiry_deadline, q.expiry_timer))
        st = d.stats("m")
        await d.close()
        return res, seen, st

    res, seen, st = vrun(scenario)
    assert res == [(0.04, 0), (pytest.approx(0.08), 1), (pytest.approx(0.12), 2)]
    assert seen == [pytest.approx(0.2), (math.inf, None)]
    assert st.expired == 0 and st.completed == 3
    assert fires == []


def test_close_disarms_and_answers_queued_queries(vrun: Any, fires: list[float]) -> None:
    """``close()`` answers the queued query with ``BackendError`` and cancels its timer.
    Catches: a timer left armed after close (fires on a closed dispatcher)."""

    async def scenario() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        d = _busy_dispatcher(loop)
        busy = await _occupy(d)
        queued = asyncio.ensure_future(d.submit("m", "q", deadline=0.1))
        await asyncio.sleep(0.01)
        await d.close()
        await asyncio.sleep(1.0)
        return await asyncio.gather(busy, queued, return_exceptions=True), d._queues["m"]

    res, q = vrun(scenario)
    assert all(type(r).__name__ == "BackendError" for r in res)
    assert q.expiry_timer is None and fires == []


@pytest.mark.parametrize("bad", [-0.01, math.nan, math.inf, "0.05", True])
def test_expire_grace_is_validated(bad: Any) -> None:
    """Catches: a negative, NaN, infinite or non-number grace accepted (a NaN timer)."""
    with pytest.raises(ValidationError, match="expire_grace_s"):
        Dispatcher(expire_grace_s=bad)
    d = Dispatcher()
    with pytest.raises(ValidationError, match="expire_grace_s"):
        d.add_model("m", expire_late=True, expire_grace_s=bad)
    assert d.models == []
