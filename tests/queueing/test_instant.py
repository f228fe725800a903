"""The same-instant barrier on every loop (estimator rule 3) and its hand-off accounting.

A batch finishing upstream hands all its queries to an idle downstream replica at once, even
when the queries take different numbers of task hops between the two stages. These tests run
on asyncio's loop, on uvloop (the loop ``inferline serve`` runs) with real timers, and on the
virtual-time loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from _queueing_vtime import VirtualTimeLoop

from inferline.core.errors import ReplicaError
from inferline.queueing import (
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    PipelineRunner,
    PredictionCache,
)

try:
    import uvloop
except ImportError:  # pragma: no cover - a dependency everywhere but Windows
    uvloop = None

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "virtual": VirtualTimeLoop,
}
if uvloop is not None:
    LOOPS["uvloop"] = uvloop.new_event_loop
SERVICE_S = 0.0625  # per batch at both stages; exact in binary (the virtual loop)


def _run(loop: str, coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(coro_fn())


async def _hops(k: int) -> None:
    """``k`` task hops of different kinds: plain yields, a task awaited, a one-branch gather."""
    for j in range(k):
        if j % 3 == 0:
            await asyncio.sleep(0)
        elif j % 3 == 1:
            await asyncio.ensure_future(asyncio.sleep(0))
        else:
            await asyncio.gather(asyncio.sleep(0))


async def _two_stages(
    n: int, *, coalesce_rounds: int = 16, cached: bool = False
) -> tuple[list[int], list[int], list[float]]:
    """``n`` queries arrive together at ``a`` (one replica, batches up to ``n``), then take
    ``i % 6`` hops of :func:`_hops` before ``b`` (one replica). Returns the batch sizes at
    ``a`` and ``b`` and the latencies."""
    loop = asyncio.get_running_loop()
    d = Dispatcher(clock=loop.time, coalesce_rounds=coalesce_rounds)
    ra = InProcessReplica("a", NoOpModel(), service_s=SERVICE_S)
    rb = InProcessReplica("b", NoOpModel(), service_s=SERVICE_S)
    for r in (ra, rb):
        d.add_model(r.model, batching=FixedBatching(n))
        d.set_replicas(r.model, [r])

    async def pipeline(i: int, ctx: PipelineContext) -> Any:
        # with the cache, pairs of queries share one evaluation at ``a`` (the second waits
        # for the first's through the cache: more hops again)
        await ctx.predict("a", i // 2 if cached else i)
        await _hops(i % 6)
        return await ctx.predict("b", i)

    cache = PredictionCache(64) if cached else None
    runner = PipelineRunner(d, pipeline, slo_s=10.0, cache=cache)

    async def one(i: int) -> float:
        t = loop.time()
        await runner.run(i, arrival=t)
        return loop.time() - t

    lat = await asyncio.gather(*(one(i) for i in range(n)))
    assert d._instant.in_transit == 0
    await d.close()
    return ra.batch_sizes, rb.batch_sizes, list(lat)


@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cached"])
@pytest.mark.parametrize("loop", ["uvloop", "asyncio", "virtual"])
def test_uneven_hops_hand_the_whole_batch_downstream(loop: str, cached: bool) -> None:
    """Catches a barrier that relies on the loop's internals. It used to read asyncio's
    ready queue and, on uvloop (no such queue), fell back to two plain yields: there the 8
    queries finishing ``a`` together reached ``b`` in batches like [3, 5] or [4, 4] where
    the estimator (and asyncio's loop) give [8], so some of them waited a whole ``b``
    batch more."""
    if loop not in LOOPS:
        pytest.skip(f"{loop} is not installed")
    sizes_a, sizes_b, lat = _run(loop, lambda: _two_stages(8, cached=cached))
    assert sizes_a == ([4] if cached else [8])
    assert sizes_b == [8]
    # the estimator: every query leaves a at SERVICE_S and b at 2 * SERVICE_S
    if loop == "virtual":
        assert lat == [2 * SERVICE_S] * 8
    else:  # real timers: late by scheduling only, never by a second batch
        assert max(lat) < 3 * SERVICE_S


def test_without_the_barrier_the_hops_split_the_batch(vrun: Any) -> None:
    """The scenario above does depend on the barrier: ``coalesce_rounds=0`` (no barrier)
    lets ``b``'s replica take the queries that arrived first."""
    _, sizes_b, _ = vrun(lambda: _two_stages(8, coalesce_rounds=0))
    assert sizes_b[0] < 8 and sum(sizes_b) == 8


def test_a_query_held_between_stages_delays_batches_by_a_bounded_instant(vrun: Any) -> None:
    """A query that awaits something else between two stages keeps its hand-off open; the
    barrier still ends each instant after ``coalesce_rounds`` iterations, so the other
    queries' batches form at their own instants (no replica starves, no time passes)."""

    async def main() -> tuple[list[float], int, int]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time, coalesce_rounds=4)
        for m in ("a", "b"):
            d.add_model(m, batching=FixedBatching(4))
            d.set_replicas(m, [InProcessReplica(m, NoOpModel(), service_s=SERVICE_S)])
        held = asyncio.Event()

        async def pipeline(i: int, ctx: PipelineContext) -> Any:
            y = await ctx.predict("a", i)
            if i == 0:
                await held.wait()  # e.g. a remote lookup between the stages
            return await ctx.predict("b", y)

        runner = PipelineRunner(d, pipeline, slo_s=10.0)

        async def one(i: int, at: float) -> float:
            await asyncio.sleep(at)
            await runner.run(i, arrival=at)
            return loop.time() - at

        stuck = asyncio.ensure_future(one(0, 0.0))
        lat = await asyncio.gather(*(one(i, 1.0) for i in range(1, 5)))
        in_transit = d._instant.in_transit
        held.set()
        await stuck
        after = d._instant.in_transit
        await d.close()
        return list(lat), in_transit, after

    lat, in_transit, after = vrun(main)
    assert lat == [2 * SERVICE_S] * 4
    assert in_transit == 1 and after == 0


def test_hand_offs_balance_after_errors_cancellations_and_stragglers(vrun: Any) -> None:
    """Every way a query can end closes its hand-off: a model error caught by the pipeline,
    cancellation while a call is out, while between stages and while waiting for a shared cache
    evaluation, and a pipeline that returns with a call still out (a straggler)."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time, retry_cooldown_s=0.0)
        broken = InProcessReplica("bad", NoOpModel(), service_s=SERVICE_S)
        broken.kill()
        d.add_model("bad", max_retries=0)
        d.set_replicas("bad", [broken])
        for m, s in (("a", SERVICE_S), ("slow", 8 * SERVICE_S)):
            d.add_model(m, batching=FixedBatching(4))
            d.set_replicas(m, [InProcessReplica(m, NoOpModel(), service_s=s)])
        gate = asyncio.Event()
        seen: list[int] = []

        async def pipeline(kind: str, ctx: PipelineContext) -> Any:
            if kind == "error":
                try:
                    await ctx.predict("bad", 1)
                except ReplicaError:
                    return None
            if kind == "between":
                await ctx.predict("a", 1)
                await gate.wait()
            if kind in ("queued", "cached"):
                return await ctx.predict("slow", 7)
            if kind == "straggler":
                slow = asyncio.ensure_future(ctx.predict("slow", 2))
                done, _ = await asyncio.wait([slow], timeout=SERVICE_S)
                return None if not done else slow.result()
            return await ctx.predict("a", 3)

        cached = PipelineRunner(d, pipeline, slo_s=10.0, cache=PredictionCache(8))
        runner = PipelineRunner(d, pipeline, slo_s=10.0)
        fixed = [asyncio.ensure_future(runner.run(k)) for k in ("error", "straggler", "plain")]
        doomed = [
            asyncio.ensure_future(runner.run("between")),
            asyncio.ensure_future(runner.run("queued")),
            asyncio.ensure_future(cached.run("cached")),  # the shared evaluation's owner
            asyncio.ensure_future(cached.run("cached")),  # waits for it through the cache
        ]
        await asyncio.sleep(2 * SERVICE_S)
        seen.append(d._instant.in_transit)  # "between" sits between its stages
        for t in doomed[:3]:
            t.cancel()
        await asyncio.gather(*fixed, *doomed, return_exceptions=True)
        await asyncio.sleep(16 * SERVICE_S)  # the straggler's and the orphaned calls end
        seen.append(d._instant.in_transit)
        await d.close()
        return seen

    assert vrun(main) == [1, 0]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio", "virtual"])
def test_callers_without_a_runner_get_the_instant_while_they_keep_arriving(loop: str) -> None:
    """``Dispatcher.submit`` callers have no hand-off; the instant still lasts while every
    loop iteration brings an arrival (here one more ``sleep(0)`` per query between the two
    stages), so ``b`` gets one batch of 8. Catches a barrier that only counts hand-offs."""
    if loop not in LOOPS:
        pytest.skip(f"{loop} is not installed")

    async def main() -> list[int]:
        d = Dispatcher(clock=asyncio.get_running_loop().time)
        rb = InProcessReplica("b", NoOpModel(), service_s=SERVICE_S)
        for r in (InProcessReplica("a", NoOpModel(), service_s=SERVICE_S), rb):
            d.add_model(r.model, batching=FixedBatching(8))
            d.set_replicas(r.model, [r])

        async def client(i: int) -> Any:
            y = await d.submit("a", i, deadline=10.0)
            for _ in range(i % 4):
                await asyncio.sleep(0)
            return await d.submit("b", y, deadline=10.0)

        await asyncio.gather(*(client(i) for i in range(8)))
        await d.close()
        return rb.batch_sizes

    assert _run(loop, main) == [8]
