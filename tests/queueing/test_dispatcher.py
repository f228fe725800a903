"""Dispatcher: EDF order, batch formation, one batch per replica, failures, close, overload."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from inferline.core.errors import (
    BackendError,
    DeadlineExceededError,
    NotFoundError,
    OverloadedError,
    ReplicaError,
    ValidationError,
)
from inferline.queueing import (
    BatchEvent,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    ModelStats,
    NoOpModel,
)


class Recorder:
    """A container that records the inputs of each batch it evaluated."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        self.batches.append(list(inputs))
        return [("out", x) for x in inputs]


async def _fire(d: Dispatcher, model: str, t: float, x: Any, deadline: float | None = None) -> Any:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(t - loop.time())
    return await d.submit(model, x, deadline=t + 10.0 if deadline is None else deadline, arrival=t)


def test_batches_follow_the_estimator_rule(vrun: Any) -> None:
    """One replica, max batch 4, 0.25 s per batch; hand-computed as the estimator would:
    t=0 q0 alone; t=0.25 takes q1..q4; t=0.5 takes q5 plus q6, q7 arriving at that instant."""
    arrivals = [0.0, 0.0625, 0.0625, 0.0625, 0.125, 0.125, 0.5, 0.5]

    async def scenario() -> tuple[list[float], Recorder]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(4))
        rec = Recorder()
        d.set_replicas("m", [InProcessReplica("m", rec, service_s=0.25)])

        async def one(i: int, t: float) -> float:
            out = await d.submit("m", i, deadline=t + 10.0, arrival=t)
            assert out == ("out", i)
            return loop.time() - t

        # launch in index order at each arrival time, so simultaneous arrivals keep their order
        tasks = []
        for i, t in enumerate(arrivals):
            if t > loop.time():
                await asyncio.sleep(t - loop.time())
            tasks.append(asyncio.ensure_future(one(i, t)))
        lat = await asyncio.gather(*tasks)
        await d.close()
        return lat, rec

    lat, rec = vrun(scenario)
    assert rec.batches == [[0], [1, 2, 3, 4], [5, 6, 7]]
    assert lat == [0.25, 0.4375, 0.4375, 0.4375, 0.375, 0.625, 0.25, 0.25]


def test_edf_order_and_tie_break_by_arrival(vrun: Any) -> None:
    async def scenario() -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1))
        rec = Recorder()
        d.set_replicas("m", [InProcessReplica("m", rec, service_s=1.0)])
        jobs = [
            _fire(d, "m", 0.0, "first", deadline=100.0),  # occupies the replica
            _fire(d, "m", 0.5, "late-deadline", deadline=9.0),
            _fire(d, "m", 0.5, "tie-b", deadline=5.0),
            _fire(d, "m", 0.25, "tie-a", deadline=5.0),  # same deadline, earlier arrival
            _fire(d, "m", 0.75, "urgent", deadline=2.0),
        ]
        await asyncio.gather(*jobs)
        await d.close()
        return rec.batches

    assert vrun(scenario) == [["first"], ["urgent"], ["tie-a"], ["tie-b"], ["late-deadline"]]


def test_burst_in_one_iteration_forms_one_batch_across_replicas(vrun: Any) -> None:
    async def scenario() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(8))
        reps = [InProcessReplica("m", NoOpModel(), service_s=0.1) for _ in range(3)]
        d.set_replicas("m", reps)
        await asyncio.sleep(0)
        await asyncio.gather(*(d.submit("m", i, deadline=1.0) for i in range(20)))
        await d.close()
        return [r.batch_sizes for r in reps]

    sizes = vrun(scenario)
    assert sorted(s for r in sizes for s in r) == [4, 8, 8]


def test_at_most_one_batch_in_flight_per_replica(vrun: Any) -> None:
    async def scenario() -> tuple[list[int], int, ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(3))
        reps = [InProcessReplica("m", NoOpModel(), service_s=0.01 * (i + 1)) for i in range(2)]
        d.set_replicas("m", reps)
        peak = 0

        def watch(ev: Any) -> None:
            nonlocal peak
            peak = max(peak, d.stats("m").in_flight_batches)

        d.add_listener(watch)
        await asyncio.gather(*(_fire(d, "m", 0.003 * i, i) for i in range(200)))
        st = d.stats("m")
        await d.close()
        return [r.max_in_flight for r in reps], peak, st

    per_replica, peak, st = vrun(scenario)
    assert per_replica == [1, 1]
    assert peak <= 2
    assert st.completed == 200 and st.failed == 0
    assert sum(b * c for b, c in st.batch_sizes.items()) == 200
    assert max(st.batch_sizes) <= 3


def test_replica_error_retries_on_another_replica(vrun: Any) -> None:
    async def scenario() -> tuple[list[Any], InProcessReplica, InProcessReplica, ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(4), max_retries=1)
        bad = InProcessReplica("m", NoOpModel(), service_s=0.1, replica_id="bad")
        good = InProcessReplica("m", NoOpModel(), service_s=0.1, replica_id="good")
        d.set_replicas("m", [bad, good])
        await asyncio.sleep(0)
        bad.kill()
        outs = await asyncio.gather(*(d.submit("m", i, deadline=1.0) for i in range(8)))
        st = d.stats("m")
        await d.close()
        return outs, bad, good, st

    outs, bad, good, st = vrun(scenario)
    assert outs == list(range(8))
    assert bad.batches == 0 and good.batches == 2
    assert st.retried == 4 and st.failed_batches == 1 and st.completed == 8


def test_a_batch_cancelled_under_the_handle_is_retried_not_lost(vrun: Any) -> None:
    # A handle's RPC can end in CancelledError without anyone cancelling the puller (a gRPC
    # channel closed under it): that is a replica failure, not the puller's end; before, the
    # puller died and the batch's queries were never answered.
    class CancelsOnce(InProcessReplica):
        calls = 0

        async def predict_batch(self, inputs: Any) -> list[Any]:
            self.calls += 1
            if self.calls == 1:
                raise asyncio.CancelledError()
            return await super().predict_batch(inputs)

    async def scenario() -> tuple[list[Any], ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(2), max_retries=1)
        d.set_replicas("m", [CancelsOnce("m", NoOpModel(), service_s=0.1, replica_id="r")])
        outs = await asyncio.wait_for(
            asyncio.gather(*(d.submit("m", i, deadline=5.0) for i in range(2))), 10.0
        )
        st = d.stats("m")
        await d.close()
        return outs, st

    outs, st = vrun(scenario)
    assert outs == [0, 1]
    assert st.failed_batches == 1 and st.retried == 2 and st.completed == 2


def test_replica_error_fails_after_max_retries(vrun: Any) -> None:
    async def scenario() -> tuple[list[Any], ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time, retry_cooldown_s=0.01)
        d.add_model("m", batching=FixedBatching(2), max_retries=2)

        class Flaky:
            def predict_batch(self, xs: list[Any]) -> list[Any]:
                raise RuntimeError("boom")

        d.set_replicas("m", [InProcessReplica("m", Flaky(), replica_id="r")])
        res = await asyncio.gather(
            *(d.submit("m", i, deadline=1.0) for i in range(2)), return_exceptions=True
        )
        st = d.stats("m")
        await d.close()
        return res, st

    res, st = vrun(scenario)
    assert all(isinstance(r, ReplicaError) and "boom" in str(r) for r in res)
    assert st.failed_batches == 3 and st.retried == 4 and st.failed == 2


def test_per_item_errors_fail_only_their_query(vrun: Any) -> None:
    class Picky:
        def predict_batch(self, xs: list[Any]) -> list[Any]:
            return [ValidationError("x", "an even int", x) if x % 2 else x * 10 for x in xs]

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(8))
        d.set_replicas("m", [InProcessReplica("m", Picky())])
        res = await d.submit_many("m", list(range(6)), deadline=1.0)
        await d.close()
        return res

    res = vrun(scenario)
    assert [r for r in res if not isinstance(r, Exception)] == [0, 20, 40]
    assert all(isinstance(r, ValidationError) for r in res[1::2])


def test_close_answers_queued_and_in_flight_queries(vrun: Any) -> None:
    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(2))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])
        tasks = [asyncio.ensure_future(d.submit("m", i, deadline=1.0)) for i in range(5)]
        await asyncio.sleep(0.5)  # first batch of 2 in flight, 3 queued
        await d.close()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(BackendError):
            await d.submit("m", 9, deadline=1.0)
        return res

    res = vrun(scenario)
    assert len(res) == 5 and all(isinstance(r, BackendError) for r in res)
    assert all("closed" in str(r) for r in res)


def test_overload_is_explicit_and_bounded(vrun: Any) -> None:
    async def scenario() -> tuple[int, int, ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(2), max_queue=5)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.1)])
        res = await asyncio.gather(
            *(d.submit("m", i, deadline=1.0) for i in range(12)), return_exceptions=True
        )
        ok = sum(1 for r in res if not isinstance(r, Exception))
        over = sum(1 for r in res if isinstance(r, OverloadedError))
        st = d.stats("m")
        await d.close()
        return ok, over, st

    ok, over, st = vrun(scenario)
    assert (ok, over) == (5, 7)
    assert st.rejected == 7 and st.completed == 5


def test_expire_late_answers_deadline_exceeded(vrun: Any) -> None:
    async def scenario() -> tuple[list[Any], ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1), expire_late=True)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])
        res = await asyncio.gather(
            _fire(d, "m", 0.0, "a", deadline=5.0),  # takes the replica until t=1
            _fire(d, "m", 0.25, "b", deadline=0.5),  # still queued at t=1: expired
            _fire(d, "m", 0.25, "c", deadline=6.0),
            return_exceptions=True,
        )
        st = d.stats("m")
        await d.close()
        return res, st

    res, st = vrun(scenario)
    assert res[0] == "a" and res[2] == "c"
    # answered by the expiry timer at deadline + the default grace (0.55), not at t=1
    assert isinstance(res[1], DeadlineExceededError)
    assert res[1].late_by_s == pytest.approx(0.05, abs=1e-12)
    assert st.expired == 1 and st.completed == 2 and st.batches == 2


def test_late_queries_served_by_default(vrun: Any) -> None:
    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])
        res = await asyncio.gather(*(_fire(d, "m", 0.0, i, deadline=0.1) for i in range(3)))
        await d.close()
        return res

    assert vrun(scenario) == [0, 1, 2]


def test_cancelled_queries_are_skipped(vrun: Any) -> None:
    async def scenario() -> tuple[list[list[Any]], ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(4))
        rec = Recorder()
        d.set_replicas("m", [InProcessReplica("m", rec, service_s=1.0)])
        first = asyncio.ensure_future(d.submit("m", "busy", deadline=1.0))
        await asyncio.sleep(0.1)
        tasks = [asyncio.ensure_future(d.submit("m", i, deadline=2.0)) for i in range(4)]
        await asyncio.sleep(0.1)
        tasks[1].cancel()
        tasks[2].cancel()
        await asyncio.gather(first, tasks[0], tasks[3])
        st = d.stats("m")
        await d.close()
        return rec.batches, st

    batches, st = vrun(scenario)
    assert batches == [["busy"], [0, 3]]
    assert st.cancelled == 2 and st.completed == 3


def test_cancelled_queries_do_not_fill_the_queue(vrun: Any) -> None:
    """Queries answered elsewhere while queued (a default at the SLO, a client gone) leave
    their entries until a puller reaches them; they neither count against max_queue (false
    503s) nor as queued in the stats."""

    async def scenario() -> tuple[int, int, ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1), max_queue=4)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=10.0)])
        busy = asyncio.ensure_future(d.submit("m", "busy", deadline=100.0))
        await asyncio.sleep(0.1)
        gone = [asyncio.ensure_future(d.submit("m", i, deadline=100.0)) for i in range(3)]
        await asyncio.sleep(0.1)
        for t in gone:
            t.cancel()
        await asyncio.sleep(0)
        queued_after_cancel = d.stats("m").queued
        fresh = [asyncio.ensure_future(d.submit("m", i, deadline=100.0)) for i in range(3)]
        await asyncio.sleep(0.1)
        with pytest.raises(OverloadedError):  # busy + 3 live: full now
            await d.submit("m", "one too many", deadline=100.0)
        await asyncio.gather(busy, *fresh)
        st = d.stats("m")
        await d.close()
        return queued_after_cancel, st.rejected, st

    queued, rejected, st = vrun(scenario)
    assert queued == 0 and rejected == 1
    assert st.cancelled == 3 and st.completed == 4


def test_unknown_model_and_bad_arguments(vrun: Any) -> None:
    d = Dispatcher()
    d.add_model("m")
    with pytest.raises(ValidationError):
        d.add_model("m")
    with pytest.raises(ValidationError):
        d.add_model("x", max_queue=0)
    with pytest.raises(NotFoundError):
        d.stats("nope")

    async def scenario() -> None:
        with pytest.raises(NotFoundError):
            await d.submit("nope", 1, deadline=1.0)
        with pytest.raises(ValidationError):
            await d.submit("m", 1, deadline=float("nan"))
        await d.close()

    vrun(scenario)


def test_batch_events_and_stats_roundtrip(vrun: Any) -> None:
    async def scenario() -> tuple[list[Any], ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(4))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.5, replica_id="r0")])
        events: list[Any] = []
        d.add_listener(events.append)
        await asyncio.gather(*(_fire(d, "m", t, i) for i, t in enumerate([0.0, 0.25, 0.25])))
        st = d.stats("m")
        await d.close()
        return events, st

    events, st = vrun(scenario)
    batches = [e for e in events if isinstance(e, BatchEvent)]
    assert [(b.size, b.start, b.service_s, b.queue_delays_s) for b in batches] == [
        (1, 0.0, 0.5, (0.0,)),
        (2, 0.5, 0.5, (0.25, 0.25)),
    ]
    assert [e.time for e in events if not isinstance(e, BatchEvent)] == [0.0, 0.25, 0.25]
    assert st.batch_sizes == {1: 1, 2: 1} and st.queue_delay_s_sum == 0.5
    assert ModelStats.from_dict(st.to_dict()) == st


def test_removed_replica_finishes_its_batch_then_takes_no_more(vrun: Any) -> None:
    async def scenario() -> tuple[list[Any], InProcessReplica, InProcessReplica, ModelStats]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(2))
        old = InProcessReplica("m", NoOpModel(), service_s=1.0, replica_id="old")
        new = InProcessReplica("m", NoOpModel(), service_s=0.25, replica_id="new")
        d.set_replicas("m", [old])
        tasks = [asyncio.ensure_future(d.submit("m", i, deadline=9.0)) for i in range(6)]
        await asyncio.sleep(0.5)  # "old" holds a batch of 2
        d.set_replicas("m", [new])
        outs = await asyncio.gather(*tasks)
        st = d.stats("m")
        await d.close()
        return outs, old, new, st

    outs, old, new, st = vrun(scenario)
    assert outs == list(range(6))
    assert old.batch_sizes == [2] and new.batch_sizes == [2, 2]
    assert st.replicas == 1 and st.failed == 0


def test_a_stage_routed_to_a_variant_is_served_from_its_queue(vrun: Any) -> None:
    """``route``: queries for a stage go to the variant's queue from then on (model variants);
    already-queued queries stay; ``None`` routes back; unknown targets are refused."""

    async def scenario() -> tuple[list[Any], list[list[Any]], list[list[Any]]]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("slow")
        d.add_model("fast")
        slow, fast = Recorder(), Recorder()
        d.set_replicas("slow", [InProcessReplica("slow", slow, service_s=0.5)])
        d.set_replicas("fast", [InProcessReplica("fast", fast, service_s=0.01)])
        with pytest.raises(NotFoundError, match="nope"):
            d.route("stage", "nope")
        d.route("stage", "slow")
        assert d.resolve("stage") == "slow" and d.routes == {"stage": "slow"}
        first = [asyncio.ensure_future(d.submit("stage", i, deadline=99.0)) for i in range(3)]
        await asyncio.sleep(0.1)
        d.route("stage", "fast")  # q1, q2 are still queued at slow: they finish there
        later = [asyncio.ensure_future(d.submit("stage", i, deadline=99.0)) for i in (3, 4)]
        outs = await asyncio.gather(*first, *later)
        d.route("stage", None)
        assert d.resolve("stage") == "stage" and d.routes == {}
        with pytest.raises(NotFoundError):
            await d.submit("stage", 5, deadline=99.0)
        await d.close()
        return outs, slow.batches, fast.batches

    outs, slow_batches, fast_batches = vrun(scenario)
    assert outs == [("out", i) for i in range(5)]
    assert sorted(x for b in slow_batches for x in b) == [0, 1, 2]
    assert sorted(x for b in fast_batches for x in b) == [3, 4]


def test_stats_give_the_recent_service_quantiles(vrun: Any) -> None:
    """Median and P99 of the last 1024 batches' service times, for comparison with a profile."""

    async def scenario() -> list[ModelStats]:
        d = Dispatcher(clock=asyncio.get_running_loop().time)
        d.add_model("m", batching=FixedBatching(1))
        snaps = [d.stats("m")]
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.1, replica_id="a")])
        for i in range(100):
            await d.submit("m", i, deadline=1e9)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.3, replica_id="b")])
        for i in range(2):
            await d.submit("m", i, deadline=1e9)
        snaps.append(d.stats("m"))
        for i in range(1024):
            await d.submit("m", i, deadline=1e9)
        snaps.append(d.stats("m"))
        await d.close()
        return snaps

    empty, mixed, later = vrun(scenario)
    assert empty.service_s_p50_recent == 0.0 and empty.service_s_p99_recent == 0.0
    want = np.percentile([0.1] * 100 + [0.3] * 2, [50, 99])
    assert mixed.service_s_p50_recent == pytest.approx(want[0])
    assert mixed.service_s_p99_recent == pytest.approx(want[1])
    # the window holds the last 1024 batches only: the 0.1 s ones have left it
    assert later.service_s_p50_recent == pytest.approx(0.3)
    assert later.service_s_p99_recent == pytest.approx(0.3)
    assert ModelStats.from_dict(later.to_dict()) == later
    assert empty.service_recent_by_batch == {}


def test_recent_service_quantiles_per_batch_size(vrun: Any) -> None:
    """Per batch size, the count, median and P99 of the last batches' service times (what
    `inferline calibrate` compares with the profile at that size)."""

    async def scenario() -> ModelStats:
        d = Dispatcher(clock=asyncio.get_running_loop().time)
        d.add_model("m", batching=FixedBatching(4))
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=lambda b: 0.1 * b)])
        for n in (8, 2, 1, 2):  # batches of 4, 4, 2, 1, 2
            futs = [asyncio.ensure_future(d.submit("m", i, deadline=1e9)) for i in range(n)]
            await asyncio.gather(*futs)
        s = d.stats("m")
        await d.close()
        return s

    s = vrun(scenario)
    by = s.service_recent_by_batch
    assert sum(r.batches for r in by.values()) == s.batches
    assert set(by) == set(s.batch_sizes)
    for b, r in by.items():
        assert r.batches == s.batch_sizes[b]
        assert r.p50_s == pytest.approx(0.1 * b) and r.p99_s == pytest.approx(0.1 * b)
    assert {b: r.batches for b, r in by.items()} == {4: 2, 2: 2, 1: 1}
    assert ModelStats.from_dict(s.to_dict()) == s
