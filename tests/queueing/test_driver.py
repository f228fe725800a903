"""PipelineRunner: deadlines reach the queues, gather runs branches in parallel, contexts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.core.errors import OverloadedError, ValidationError
from inferline.queueing import (
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    PipelineRunner,
)


class AddOne:
    def predict_batch(self, xs: list[Any]) -> list[Any]:
        return [x + 1 for x in xs]


def _dispatcher(service: dict[str, float], max_batch: int = 4) -> Dispatcher:
    loop = asyncio.get_running_loop()
    d = Dispatcher(clock=loop.time)
    for m, s in service.items():
        d.add_model(m, batching=FixedBatching(max_batch))
        d.set_replicas(m, [InProcessReplica(m, AddOne(), service_s=s, replica_id=f"{m}-0")])
    return d


def test_linear_and_parallel_branches(vrun: Any) -> None:
    async def pipeline(x: int, ctx: PipelineContext) -> int:
        y = await ctx.predict("a", x)
        if y > 100:  # ordinary Python between calls
            return -1
        b, c = await asyncio.gather(ctx.predict("b", y), ctx.predict("c", y))
        return b + c

    async def scenario() -> tuple[Any, float, int]:
        loop = asyncio.get_running_loop()
        d = _dispatcher({"a": 0.25, "b": 0.5, "c": 0.125})
        r = PipelineRunner(d, pipeline, slo_s=2.0)
        res = await r.run_detailed(1)
        out_big = await r.run(500)
        assert out_big == -1
        await d.close()
        return res, loop.time(), out_big

    res, _, _ = vrun(scenario)
    assert res.output == (1 + 1 + 1) * 2
    # a (0.25) then b and c in parallel: max(0.5, 0.125)
    assert res.latency_s == 0.75 and res.calls == 3 and res.met_deadline
    assert res.deadline == res.arrival + 2.0


def test_deadlines_order_queues_by_pipeline_arrival(vrun: Any) -> None:
    """Two queries share a model queue; the one with the tighter per-request SLO goes first."""

    async def scenario() -> list[int]:
        d = _dispatcher({"m": 1.0}, max_batch=1)
        order: list[int] = []

        async def pipeline(x: int, ctx: PipelineContext) -> int:
            out = await ctx.predict("m", x)
            order.append(x)
            return out

        r = PipelineRunner(d, pipeline, slo_s=5.0)
        blocker = asyncio.ensure_future(r.run(0))
        await asyncio.sleep(0.1)
        loose = asyncio.ensure_future(r.run(1))
        tight = asyncio.ensure_future(r.run(2, slo_s=1.5))
        await asyncio.gather(blocker, loose, tight)
        await d.close()
        return order

    assert vrun(scenario) == [0, 2, 1]


def test_errors_propagate_and_arguments_are_checked(vrun: Any) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("m", batching=FixedBatching(1), max_queue=1)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=1.0)])

        async def pipeline(x: int, ctx: PipelineContext) -> Any:
            return await ctx.predict("m", x)

        r = PipelineRunner(d, pipeline, slo_s=1.0)
        first = asyncio.ensure_future(r.run(1))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError):
            await r.run(2)
        assert await first == 1
        with pytest.raises(ValidationError):
            PipelineRunner(d, pipeline, slo_s=0)
        with pytest.raises(ValidationError):
            await r.run(1, slo_s=-1.0)
        await d.close()

    vrun(scenario)


def test_cache_coalesces_identical_calls(vrun: Any) -> None:
    from inferline.queueing import PredictionCache

    async def scenario() -> tuple[list[int], Any, dict[str, int]]:
        d = _dispatcher({"m": 0.5}, max_batch=8)
        cache = PredictionCache(16)

        async def pipeline(x: int, ctx: PipelineContext) -> int:
            return await ctx.predict("m", x % 3)

        r = PipelineRunner(d, pipeline, slo_s=2.0, cache=cache)
        outs = await asyncio.gather(*(r.run(i) for i in range(9)))
        again = await r.run(4)
        st = d.stats("m")
        await d.close()
        return [*outs, again], st, cache.stats()

    outs, st, cs = vrun(scenario)
    assert outs == [1, 2, 3] * 3 + [2]
    assert st.submitted == 3  # 9 queries, 3 distinct inputs: one evaluation each
    assert cs["hits"] == 1 and cs["coalesced"] == 6
