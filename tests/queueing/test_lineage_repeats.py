"""Repeated calls of one model per query: traced as visits, and the live queue serves them as
the estimator does (each call a queue entry of its own, the next one after the previous
answer), to the same batches and latencies in virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from inferline.core import EstimatorOptions, ModelConfig, Pipeline, Profiles, draw_visits, simulate
from inferline.queueing import (
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    PipelineRunner,
    trace_pipeline,
)


async def _echo(model: str, x: Any) -> Any:
    await asyncio.sleep(0.001)
    return x


def test_a_model_called_twice_per_query_is_traced_as_two_visits(vrun: Any) -> None:
    async def pipe(x: int, ctx: PipelineContext) -> Any:
        y = await ctx.predict("embed", x)
        for _ in range(2):  # e.g. a re-ranking pass run twice
            y = await ctx.predict("rank", y)
        if x % 4 == 0:  # a quarter of the queries: one or three calls
            for _ in range(1 if x % 8 else 3):
                await ctx.predict("explain", y)
        return y

    p = vrun(lambda: trace_pipeline(pipe, range(16), "twice", call=_echo))
    assert p.models == ("embed", "rank", "explain")
    assert p.edges == (("embed", "rank"), ("rank", "explain"))
    assert p.visits == {"rank": 2.0, "explain": 2.0}  # (1 + 3) / 2 per visiting query
    assert p.scale_factors == {"explain": 0.25}
    assert p.calls("rank") == 2.0 and p.calls("explain") == 0.5
    assert Pipeline.from_dict(p.to_dict()) == p


SLO_S = 4.0
PIPE = Pipeline("twice", ("a", "b", "c"), (("a", "b"), ("b", "c")), {"c": 0.5}, {"b": 2, "c": 1.5})
PROFILES = Profiles.from_latencies(
    {
        "a": {"cpu": {1: 0.03125, 2: 0.046875, 4: 0.0625}},
        "b": {"cpu": {1: 0.0625, 2: 0.078125, 4: 0.109375, 8: 0.15625}},
        "c": {"cpu": {1: 0.03125, 2: 0.046875, 4: 0.0625}},
    }
)
CONFIGS = {
    "a": ModelConfig("cpu", max_batch_size=4, replicas=1),
    "b": ModelConfig("cpu", max_batch_size=8, replicas=2),
    "c": ModelConfig("cpu", max_batch_size=4, replicas=1),
}


async def _live(arrivals: np.ndarray, vis: np.ndarray) -> tuple[list[float], dict[str, Any]]:
    loop = asyncio.get_running_loop()
    d = Dispatcher(clock=loop.time)
    for m, cfg in CONFIGS.items():
        d.add_model(m, batching=FixedBatching(cfg.max_batch_size))
        service = {
            b: PROFILES.latency(m, cfg.hardware, b) for b in range(1, cfg.max_batch_size + 1)
        }
        d.set_replicas(
            m,
            [
                InProcessReplica(m, NoOpModel(), service_s=service.__getitem__)
                for _ in range(cfg.replicas)
            ],
        )
    j = {m: k for k, m in enumerate(PIPE.topological_order)}

    async def pipeline(i: int, ctx: PipelineContext) -> int:
        await ctx.predict("a", i)
        for _ in range(vis[i, j["b"]]):  # sequential calls, each awaited
            await ctx.predict("b", i)
        for _ in range(vis[i, j["c"]]):
            await ctx.predict("c", i)
        return i

    runner = PipelineRunner(d, pipeline, slo_s=SLO_S)

    async def one(i: int, t: float) -> float:
        await runner.run(i, arrival=t)
        return loop.time() - t

    tasks = []
    for i, t in enumerate(arrivals.tolist()):
        if t > loop.time():
            await asyncio.sleep(t - loop.time())
        tasks.append(asyncio.ensure_future(one(i, t)))
    lat = await asyncio.gather(*tasks)
    stats = {m: d.stats(m) for m in CONFIGS}
    await d.close()
    return lat, stats


def test_live_queue_and_estimator_agree_on_a_two_visit_pipeline(vrun: Any) -> None:
    rng = np.random.default_rng(11)
    arrivals = np.cumsum(rng.integers(0, 4, size=300) / 64.0)  # zero gaps: same instants
    sim = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=EstimatorOptions(seed=11))
    vis = draw_visits(PIPE, len(arrivals), 11)
    assert set(np.unique(vis[:, 1])) == {2} and set(np.unique(vis[:, 2])) == {0, 1, 2}
    live, stats = vrun(lambda: _live(arrivals, vis))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)
    for m, st in stats.items():
        est = sim.models[m]
        assert st.completed == est.visits  # every call a queue entry
        assert st.batches == est.batches
        assert st.mean_batch_size == est.mean_batch_size
    assert sim.models["b"].visits == 600 and sim.models["b"].mean_batch_size > 1.5
    assert max(live) > 2 * min(live)  # it queues and batches
