"""The dispatcher driving real replica processes of the bundled runtime (``local://``).

Two replica processes behind one EDF queue; then a scale-down while load runs (the removed
replica finishes its batch, its puller exits); then ``kill -9`` of a replica under load: every
accepted query gets a prediction or an explicit error, and the restarted replica serves again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from inferline.core import InferlineError, ModelConfig, ModelSpec
from inferline.queueing import Dispatcher, FixedBatching, PipelineContext, PipelineRunner

local = pytest.importorskip("inferline.adapters.local", reason="needs the bundled runtime")
LocalBackend = getattr(local, "LocalBackend", None)
if LocalBackend is None:
    pytest.skip("inferline.adapters.local.LocalBackend not available", allow_module_level=True)

EX = "inferline.adapters.local.examples"
pytestmark = [pytest.mark.timeout(90), pytest.mark.integration]


async def _wait(cond: Any, timeout_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_dispatcher_over_real_replica_processes() -> None:
    async def main() -> None:
        b = LocalBackend(oversubscribe=True, heartbeat_interval_s=0.2)
        d = Dispatcher()
        try:
            await b.deploy(
                ModelSpec("slow", f"{EX}:sleep", {"base_s": 0.02}), ModelConfig("cpu", 8, 2)
            )
            d.add_model("slow", batching=FixedBatching(8), max_retries=1)
            d.attach(b)
            assert d.stats("slow").replicas == 2

            async def pipe(x: int, ctx: PipelineContext) -> Any:
                return await ctx.predict("slow", x)

            runner = PipelineRunner(d, pipe, slo_s=5.0)
            outs = await asyncio.gather(*(runner.run(i) for i in range(64)))
            assert [o["x"] for o in outs] == list(range(64))
            assert len({o["pid"] for o in outs}) == 2  # both processes served
            st = d.stats("slow")
            assert st.completed == 64 and max(st.batch_sizes) == 8
            assert max(o["n"] for o in outs) == 8  # batches really reached the replica

            # scale down under load: nothing is lost, one puller is left
            load = [asyncio.ensure_future(runner.run(i)) for i in range(64)]
            await asyncio.sleep(0.03)
            await b.scale("slow", 1)
            res = await asyncio.gather(*load)
            assert [o["x"] for o in res] == list(range(64))
            await _wait(lambda: d.stats("slow").replicas == 1, 5.0, "one puller")

            # kill -9 the replica while a batch is in flight: answered, then it comes back
            victim = b.replicas("slow")[0]
            load = [asyncio.ensure_future(runner.run(i)) for i in range(48)]
            await asyncio.sleep(0.05)
            os.kill(victim.pid, signal.SIGKILL)
            res = await asyncio.wait_for(asyncio.gather(*load, return_exceptions=True), 30.0)
            ok = [r for r in res if not isinstance(r, BaseException)]
            errs = [r for r in res if isinstance(r, BaseException)]
            assert all(isinstance(e, InferlineError) for e in errs), errs
            assert len(ok) + len(errs) == 48
            await _wait(
                lambda: any(r.id != victim.id and r.alive for r in b.replicas("slow")),
                30.0,
                "the restarted replica",
            )
            await _wait(lambda: d.stats("slow").replicas == 1, 5.0, "a puller for it")
            again = await asyncio.wait_for(runner.run(7), 10.0)
            assert again["x"] == 7 and again["pid"] != victim.pid
            st = d.stats("slow")
            assert st.queued == 0 and st.in_flight == 0
        finally:
            await d.close()
            await b.close()

    asyncio.run(main())
