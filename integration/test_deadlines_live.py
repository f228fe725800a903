"""Deadline expiry live: a real replica process of the bundled runtime (``local://``), the
dispatcher with ``expire_late`` and the ``Service`` that answers HTTP queries.

A replica busy for 1 s (``examples:sleep`` with ``base_s=1.0``) and nine queries with a 100 ms
SLO queued behind it: each is answered at its deadline plus the 50 ms grace, by the expiry
timer, with the app's default output and an explanation (or, for an app without a default,
an explicit ``DeadlineExceededError``: a 504 over HTTP), not when the replica frees up.

Catches: expiry only when a replica pulls (the nine answered after ~0.9-1.0 s), a timer armed
against the wrong clock (answers far from 150 ms).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from inferline.core import DeadlineExceededError, ModelConfig, ModelSpec
from inferline.queueing import Dispatcher, FixedBatching, PipelineContext
from inferline.server import App, Service

local = pytest.importorskip("inferline.adapters.local", reason="needs the bundled runtime")
LocalBackend = getattr(local, "LocalBackend", None)
if LocalBackend is None:
    pytest.skip("inferline.adapters.local.LocalBackend not available", allow_module_level=True)

EX = "inferline.adapters.local.examples"
SLO_S, GRACE_S = 0.1, 0.05
# what the event loop and a loaded machine may add to deadline + grace
SLACK_S = 0.06
pytestmark = [pytest.mark.timeout(120), pytest.mark.integration]


async def _pipe(x: Any, ctx: PipelineContext) -> Any:
    return await ctx.predict("slow", x)


async def _serving() -> tuple[Any, Dispatcher, Service]:
    b = LocalBackend(oversubscribe=True, heartbeat_interval_s=0.2)
    d = Dispatcher(expire_grace_s=GRACE_S)
    await b.deploy(ModelSpec("slow", f"{EX}:sleep", {"base_s": 1.0}), ModelConfig("cpu", 1, 1))
    d.add_model("slow", batching=FixedBatching(1), expire_late=True)
    d.attach(b)
    svc = Service(dispatcher=d, backend=b, models=["slow"])
    svc.add_app(App.from_pipeline("app", _pipe, d, SLO_S, default_output={"label": "unknown"}))
    svc.add_app(App.from_pipeline("strict", _pipe, d, SLO_S))
    return b, d, svc


async def _occupy(svc: Service, d: Dispatcher) -> asyncio.Task[Any]:
    """A query with a 5 s SLO that holds the one replica for 1 s."""
    busy = asyncio.ensure_future(svc.predict("app", 0, slo_s=5.0))
    t0 = time.monotonic()
    while d.stats("slow").in_flight == 0:
        assert time.monotonic() - t0 < 20, "the replica never took the first query"
        await asyncio.sleep(0.005)
    return busy


def _run(coro: Any, loop: str) -> Any:
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(coro)
    return asyncio.run(coro)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvloop: what `inferline serve` runs
def test_nine_queries_behind_a_busy_replica_get_the_default_at_deadline_plus_grace(
    loop: str,
) -> None:
    async def main() -> tuple[list[Any], list[float], Any, Any]:
        b, d, svc = await _serving()
        try:
            # warm the replica process (its first batch may pay imports)
            await svc.predict("app", -1, slo_s=5.0)
            busy = await _occupy(svc, d)
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(svc.predict("app", i) for i in range(1, 10)))
            walls = [time.perf_counter() - t0]
            first = await busy
            st = d.stats("slow")
            return outs, walls, first, st
        finally:
            await d.close()
            await b.close()

    outs, walls, first, st = _run(main(), loop)
    assert first.default is False and first.output["x"] == 0  # the 1 s query: a prediction
    lat = sorted(p.latency_s for p in outs)
    print(f"{loop}: nine queries answered after {lat[0] * 1e3:.1f}..{lat[-1] * 1e3:.1f} ms")
    for p in outs:
        assert p.default is True and p.output == {"label": "unknown"}
        assert p.default_explanation and "deadline exceeded" in p.default_explanation
    # at deadline + grace: not before the deadline, well before the replica frees up (1 s)
    assert lat[0] >= SLO_S
    assert lat[-1] <= SLO_S + GRACE_S + SLACK_S, lat
    assert walls[0] <= SLO_S + GRACE_S + SLACK_S, walls
    assert st.expired == 9


def test_an_app_without_a_default_answers_deadline_exceeded_on_time() -> None:
    """The explicit-error branch (a 504 over HTTP), also at deadline + grace."""

    async def main() -> tuple[BaseException | None, float]:
        b, d, svc = await _serving()
        try:
            await svc.predict("app", -1, slo_s=5.0)
            busy = await _occupy(svc, d)
            t0 = time.perf_counter()
            err: BaseException | None = None
            try:
                await svc.predict("strict", 1)
            except DeadlineExceededError as e:
                err = e
            took = time.perf_counter() - t0
            await busy
            return err, took
        finally:
            await d.close()
            await b.close()

    err, took = asyncio.run(main())
    assert isinstance(err, DeadlineExceededError), err
    assert SLO_S <= took <= SLO_S + GRACE_S + SLACK_S, took
