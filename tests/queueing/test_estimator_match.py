"""The live queue behaves like the estimator: identical per-query latencies in virtual time.

The same pipeline (fan-out, a conditional branch, a join), plan, profiles and trace go through
``inferline.core.simulate`` and through Dispatcher + PipelineRunner + in-process replicas on
a virtual-time loop. Times are dyadic fractions so every sum is exact and "the same instant"
means the same float in both.

The ``_on_uvloop`` tests run the same checks on uvloop, the loop ``inferline serve`` runs, with
time stepped by the test (``_queueing_stepped``): the queries of one instant reach the queue
through uvloop's own scheduling, in different numbers of task hops (a query that visits ``c``
goes through ``gather``), and must still form the estimator's batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _queueing_stepped import GatedReplica, SteppedTime

from inferline.core import ModelConfig, Pipeline, Profiles
from inferline.queueing import (
    DelayedBatching,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PipelineContext,
    PipelineRunner,
)

core = pytest.importorskip("inferline.core")
if not hasattr(core, "simulate"):
    pytest.skip("inferline.core.simulate (the estimator) is not available", allow_module_level=True)
simulate = core.simulate
draw_visits = core.draw_visits
EstimatorOptions = core.EstimatorOptions

SLO_S = 4.0
PIPE = Pipeline(
    "fanout",
    ("a", "b", "c", "d"),
    (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")),
    {"c": 0.5},
)
PROFILES = Profiles.from_latencies(
    {
        "a": {"cpu": {1: 0.03125, 2: 0.046875, 4: 0.0625, 8: 0.09375}},
        "b": {"cpu": {1: 0.0625, 2: 0.078125, 4: 0.109375, 8: 0.15625}},
        "c": {"cpu": {1: 0.125, 2: 0.1875, 4: 0.25}},
        "d": {"cpu": {1: 0.015625, 2: 0.015625, 4: 0.03125, 8: 0.046875}},
    }
)
CONFIGS = {
    "a": ModelConfig("cpu", max_batch_size=4, replicas=1),
    "b": ModelConfig("cpu", max_batch_size=8, replicas=2),
    "c": ModelConfig("cpu", max_batch_size=2, replicas=2),
    "d": ModelConfig("cpu", max_batch_size=8, replicas=1),
}


def _arrivals(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 4, size=n) / 64.0  # zero gaps: simultaneous arrivals
    return np.cumsum(gaps)


class _Waking:
    """A replica's service time with the wake-up extra: the batch latency plus
    ``wake.extra(time idle since its last batch ended)`` (never served: cold)."""

    def __init__(self, clock: Callable[[], float], m: str, hw: str, wake: Any) -> None:
        self.clock, self.m, self.hw, self.wake = clock, m, hw, wake
        self.end = -np.inf

    def __call__(self, b: int) -> float:
        now = self.clock()
        lat = PROFILES.latency(self.m, self.hw, b)
        if self.wake is not None:
            lat += self.wake.extra(now - self.end)
        self.end = now + lat
        return lat


async def _live(
    arrivals: np.ndarray, visits: np.ndarray, batch_wait_s: dict[str, float], wake: Any = None
) -> list[float]:
    loop = asyncio.get_running_loop()
    d = Dispatcher(clock=loop.time)
    for m, cfg in CONFIGS.items():
        wait = batch_wait_s.get(m, 0.0)
        policy: Any = (
            DelayedBatching(cfg.max_batch_size, wait) if wait else FixedBatching(cfg.max_batch_size)
        )
        d.add_model(m, batching=policy)

        d.set_replicas(
            m,
            [
                InProcessReplica(
                    m, NoOpModel(), service_s=_Waking(loop.time, m, cfg.hardware, wake)
                )
                for _ in range(cfg.replicas)
            ],
        )
    runner = PipelineRunner(d, _pipeline(visits), slo_s=SLO_S)

    async def one(i: int, t: float) -> float:
        await runner.run(i, arrival=t)
        return loop.time() - t

    tasks = []
    for i, t in enumerate(arrivals.tolist()):
        if t > loop.time():
            await asyncio.sleep(t - loop.time())
        tasks.append(asyncio.ensure_future(one(i, t)))
    lat = await asyncio.gather(*tasks)
    assert d._instant.in_transit == 0  # every hand-off of every query was closed
    await d.close()
    return lat


def _pipeline(visits: np.ndarray) -> Callable[[int, PipelineContext], Any]:
    visits_c = visits[:, PIPE.topological_order.index("c")]

    async def pipeline(i: int, ctx: PipelineContext) -> int:
        await ctx.predict("a", i)
        if visits_c[i]:
            await asyncio.gather(ctx.predict("b", i), ctx.predict("c", i))
        else:
            await ctx.predict("b", i)
        return await ctx.predict("d", i)

    return pipeline


async def _live_stepped(arrivals: np.ndarray, visits: np.ndarray, wake: Any = None) -> list[float]:
    """``_live`` on whatever loop runs it, with time stepped by the test (no delayed
    batching: its waits are loop timers)."""
    time = SteppedTime()
    d = Dispatcher(clock=time.clock)
    for m, cfg in CONFIGS.items():
        d.add_model(m, batching=FixedBatching(cfg.max_batch_size))
        waking = [_Waking(time.clock, m, cfg.hardware, wake) for _ in range(cfg.replicas)]
        d.set_replicas(m, [GatedReplica(m, time, w, f"{m}-{k}") for k, w in enumerate(waking)])
    runner = PipelineRunner(d, _pipeline(visits), slo_s=SLO_S)
    lat = [np.nan] * len(arrivals)
    tasks: list[asyncio.Future[None]] = []

    async def one(i: int, t: float) -> None:
        await runner.run(i, arrival=t)
        lat[i] = time.now - t

    def start(i: int, t: float) -> None:
        tasks.append(asyncio.ensure_future(one(i, t)))

    await time.drive(d, arrivals.tolist(), start)
    await asyncio.gather(*tasks)
    assert d._instant.in_transit == 0
    await d.close()
    return lat


def _on_uvloop(coro_fn: Callable[[], Any]) -> Any:
    uvloop = pytest.importorskip("uvloop")  # a dependency everywhere but Windows
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert type(runner.get_loop()).__module__.startswith("uvloop")
        return runner.run(coro_fn())


@pytest.mark.parametrize("seed", [1, 2])
def test_live_latencies_equal_the_estimator(vrun: Any, seed: int) -> None:
    arrivals = _arrivals(300, seed)
    opts = EstimatorOptions(seed=seed)
    sim = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=opts)
    visits = draw_visits(PIPE, len(arrivals), seed)
    assert 0.3 < visits[:, PIPE.topological_order.index("c")].mean() < 0.7
    live = vrun(lambda: _live(arrivals, visits, {}))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)
    # the load must actually queue and batch, or the comparison says little
    assert max(live) > 2 * min(live)


def test_delayed_batching_matches_the_estimator_option(vrun: Any) -> None:
    arrivals = _arrivals(200, 7)
    waits = {"a": 0.03125, "b": 0.046875}
    opts = EstimatorOptions(seed=7, batch_wait_s=waits)
    sim = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=opts)
    visits = draw_visits(PIPE, len(arrivals), 7)
    live = vrun(lambda: _live(arrivals, visits, waits))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)


@pytest.mark.parametrize("seed", [3, 4])
def test_wake_up_extras_match_the_estimator(vrun: Any, seed: int) -> None:
    """With wake-up extras, which idle replica takes a batch matters: the live queue wakes
    the most recently idle first, as the estimator's idle stack does."""
    wake = core.WakeProfile((0.0625, 0.25), (0.015625, 0.03125))
    prof = Profiles(PROFILES.models, {m: {"cpu": wake} for m in PIPE.models})
    # sparser arrivals than above, so replicas do go idle
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(0, 16, size=200) / 64.0)
    opts = EstimatorOptions(seed=seed)
    sim = simulate(PIPE, CONFIGS, prof, arrivals, options=opts)
    plain = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=opts)
    assert (sim.latencies_s > plain.latencies_s).mean() > 0.5  # the extras do show
    visits = draw_visits(PIPE, len(arrivals), seed)
    live = vrun(lambda: _live(arrivals, visits, {}, wake))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)


@pytest.mark.parametrize("seed", [1, 2])
def test_live_latencies_equal_the_estimator_on_uvloop(seed: int) -> None:
    """Catches a barrier that depends on the loop: with asyncio's ready queue unreadable,
    the dispatcher used to fall back to two plain yields, and a query that visits ``c``
    (one ``gather`` more) reached ``b`` after ``b``'s replica had cut its batch."""
    arrivals = _arrivals(300, seed)
    sim = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=EstimatorOptions(seed=seed))
    visits = draw_visits(PIPE, len(arrivals), seed)
    live = _on_uvloop(lambda: _live_stepped(arrivals, visits))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)
    assert max(live) > 2 * min(live)


@pytest.mark.parametrize("seed", [3, 4])
def test_wake_up_extras_match_the_estimator_on_uvloop(seed: int) -> None:
    """The warmest-first choice of a replica, on uvloop (see the virtual-time version)."""
    wake = core.WakeProfile((0.0625, 0.25), (0.015625, 0.03125))
    prof = Profiles(PROFILES.models, {m: {"cpu": wake} for m in PIPE.models})
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(0, 16, size=200) / 64.0)
    sim = simulate(PIPE, CONFIGS, prof, arrivals, options=EstimatorOptions(seed=seed))
    visits = draw_visits(PIPE, len(arrivals), seed)
    live = _on_uvloop(lambda: _live_stepped(arrivals, visits, wake))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)


def test_stepped_time_reproduces_the_virtual_time_loop(vrun: Any) -> None:
    """The uvloop harness itself: on the virtual-time loop it gives the estimator's
    latencies too, so a failure of the uvloop tests is the loop's, not the harness's."""
    arrivals = _arrivals(120, 5)
    sim = simulate(PIPE, CONFIGS, PROFILES, arrivals, options=EstimatorOptions(seed=5))
    visits = draw_visits(PIPE, len(arrivals), 5)
    live = vrun(lambda: _live_stepped(arrivals, visits))
    np.testing.assert_array_equal(np.asarray(live), sim.latencies_s)
