"""trace_pipeline: DAG and scale factors derived from the pipeline function."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.core import Pipeline
from inferline.core.errors import ValidationError
from inferline.queueing import (
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    trace_pipeline,
)

# service times used by the tracing call: they make clock order differ from causal order
DELAY = {"pre": 0.02, "slow": 0.2, "fast": 0.01, "after_slow": 0.05, "join": 0.01}


async def model_call(model: str, x: Any) -> Any:
    await asyncio.sleep(DELAY.get(model, 0.0))
    return x


def test_linear(vrun: Any) -> None:
    async def pipe(x: int, ctx: PipelineContext) -> Any:
        y = await ctx.predict("pre", x)
        y = y + 1  # ordinary Python between calls
        z = await ctx.predict("cls", y)
        return await ctx.predict("post", z)

    p = vrun(lambda: trace_pipeline(pipe, range(5), "lin", call=model_call))
    assert p == Pipeline.linear("lin", ["pre", "cls", "post"])


def test_fan_out_join_is_causal_not_clock_order(vrun: Any) -> None:
    """``fast`` finishes long before ``after_slow`` starts, but runs in a parallel branch:
    no edge fast -> after_slow. ``join`` after the gather depends on both branches."""

    async def chain(y: Any, ctx: PipelineContext) -> Any:
        s = await ctx.predict("slow", y)
        return await ctx.predict("after_slow", s)

    async def pipe(x: int, ctx: PipelineContext) -> Any:
        y = await ctx.predict("pre", x)
        a, b = await asyncio.gather(chain(y, ctx), ctx.predict("fast", y))
        return await ctx.predict("join", (a, b))

    p = vrun(lambda: trace_pipeline(pipe, range(3), "fan", call=model_call))
    assert p.models == ("pre", "slow", "fast", "after_slow", "join")
    assert set(p.edges) == {
        ("pre", "slow"),
        ("pre", "fast"),
        ("slow", "after_slow"),
        ("after_slow", "join"),
        ("fast", "join"),
    }
    assert p.scale_factors == {}


def test_parallel_roots_before_any_call(vrun: Any) -> None:
    async def pipe(x: int, ctx: PipelineContext) -> Any:
        a, b = await asyncio.gather(ctx.predict("fast", x), ctx.predict("slow", x))
        return await ctx.predict("join", (a, b))

    p = vrun(lambda: trace_pipeline(pipe, range(2), "roots", call=model_call))
    assert p.roots == ("fast", "slow")
    assert set(p.edges) == {("fast", "join"), ("slow", "join")}


def test_conditional_stage_scale_factor_and_skip_edge(vrun: Any) -> None:
    """``rare`` runs for 3 of 10 inputs; ``post`` follows ``rare`` when it runs, else ``pre``
    directly, so the DAG keeps pre -> post as well."""

    async def pipe(x: int, ctx: PipelineContext) -> Any:
        y = await ctx.predict("pre", x)
        if x % 10 < 3:
            y = await ctx.predict("rare", y)
        return await ctx.predict("post", y)

    p = vrun(lambda: trace_pipeline(pipe, range(10), "cond", call=model_call))
    assert p.models == ("pre", "rare", "post")
    assert set(p.edges) == {("pre", "rare"), ("rare", "post"), ("pre", "post")}
    assert p.scale_factors == {"rare": pytest.approx(0.3)}


def test_trace_through_a_dispatcher(vrun: Any) -> None:
    async def scenario() -> Pipeline:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        for m in ("a", "b", "c"):
            d.add_model(m, batching=FixedBatching(4))
            d.set_replicas(m, [InProcessReplica(m, NoOpModel(), service_s=0.01)])

        async def pipe(x: int, ctx: PipelineContext) -> Any:
            y = await ctx.predict("a", x)
            if x % 2:
                return await ctx.predict("b", y)
            return await ctx.predict("c", y)

        p = await trace_pipeline(pipe, range(8), "disp", call=d)
        await d.close()
        return p

    p = vrun(scenario)
    assert set(p.edges) == {("a", "b"), ("a", "c")}
    assert p.scale_factors == {"b": 0.5, "c": 0.5}


def test_cycles_and_empty_traces_are_errors(vrun: Any) -> None:
    async def cyc(x: int, ctx: PipelineContext) -> Any:
        y = await ctx.predict("a", x)
        y = await ctx.predict("b", y)
        return await ctx.predict("a", y)

    async def nothing(x: int, ctx: PipelineContext) -> Any:
        return x

    with pytest.raises(ValidationError, match="cycle"):
        vrun(lambda: trace_pipeline(cyc, [1], "c", call=model_call))
    with pytest.raises(ValidationError):
        vrun(lambda: trace_pipeline(nothing, [1, 2], "n", call=model_call))
    with pytest.raises(ValidationError):
        vrun(lambda: trace_pipeline(nothing, [1], "n", call=42))  # type: ignore[arg-type]
