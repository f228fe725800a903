"""A query admitted without a prediction is run, not dropped (issue 45): the one query the
queue admits at an idle replica with nothing queued (to measure the model again) used to be
dropped at its own cut by the same estimate that refused the others, so no batch ran, the
estimate never came down and every query was refused for good (the admission benchmark's
rows collapsing to a goodput of 0). The pure rules with numbers for times, and a dispatcher
on the virtual-time loop whose replica stalls once."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from inferline.core.errors import DeadlineExceededError
from inferline.queueing import (
    AdmissionConfig,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    NoOpModel,
    PredictedLate,
)
from inferline.queueing._admission import (
    doom_time,
    doomed,
    late_at_dispatch,
    probe,
    unpredicted,
)

ON = AdmissionConfig("predicted", buffer_s=0.002)


def test_unpredicted_queries_are_exempt_from_the_dispatch_and_doomed_rules() -> None:
    # a 200 ms batch cannot make a 100 ms deadline: dropped, unless admitted unpredicted
    assert late_at_dispatch(ON, 0.0, 0.100, 0.200)
    assert late_at_dispatch(ON, 0.0, 0.100, 0.200, 0.150)  # predicted (late): dropped
    assert not late_at_dispatch(ON, 0.0, 0.100, 0.200, math.inf)
    assert doomed(ON, 0.0, 0.100, [-math.inf], 0.200)
    assert doomed(ON, 0.0, 0.100, [-math.inf], 0.200, 0.050)
    assert not doomed(ON, 0.0, 0.100, [-math.inf], 0.200, math.inf)
    assert doom_time(ON, 0.100, 0.011, 0.050) == doom_time(ON, 0.100, 0.011)
    assert doom_time(ON, 0.100, 0.011, math.inf) == math.inf  # no timer for it
    assert unpredicted(math.inf) and not unpredicted(None) and not unpredicted(0.05)


def test_probe_only_when_the_typical_batch_makes_it() -> None:
    # deadline 100 ms, buffer 2: a typical 11 ms batch from now fits until now = 87 ms
    assert probe(ON, 0.0, 0.100, 0.011)
    assert probe(ON, 0.087, 0.100, 0.011)
    assert not probe(ON, 0.0871, 0.100, 0.011)
    assert not probe(ON, 0.0, 0.005, 0.011)  # a 5 ms SLO: even the typical batch misses
    assert probe(ON, 0.0, 0.005, None)  # no estimate: admitted, as admit does


def test_a_tail_held_high_by_a_stall_is_measured_down(vrun: Any) -> None:
    """Five batches of one at 11 ms, then one stalls for 300 ms: the pooled tail (a window
    of 20 batches) is then 289 ms, so every query is predicted late (11 + 289 > 98 ms). One
    at a time, 30 ms apart, each at an idle replica: only the tail refuses it (a typical
    11 ms batch fits), so each is admitted unpredicted, run and answered (before: dropped at
    its own cut by the same estimate, so no batch ran and the stall's tail stayed for good).
    Once 20 batches ran after the stall, its tail has left the window: two queries at once
    are both admitted on a prediction and answered."""
    stall = [0.300]
    runs = [0]

    def service(b: int) -> float:
        runs[0] += 1
        return stall.pop() if runs[0] == 6 else 0.010 + 0.001 * b

    async def scenario() -> tuple[list[Any], Any]:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        cfg = AdmissionConfig("predicted", buffer_s=0.002, window=20)
        d.add_model("m", batching=FixedBatching(1), admission=cfg, expire_grace_s=0.005)
        d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=service)])

        async def one(i: int) -> Any:
            try:
                return await d.submit("m", i, deadline=loop.time() + 0.100)
            except (PredictedLate, DeadlineExceededError) as e:
                return type(e).__name__

        out = []
        for i in range(27):
            out.append(await one(i))
            await asyncio.sleep(0.300 if i == 5 else 0.030)  # the stall: wait it out
        out += await asyncio.gather(one(27), one(28))
        st = d.stats("m")
        await d.close()
        return out, st

    out, st = vrun(scenario)
    assert out[5] == "DeadlineExceededError"  # the stalled batch, cut at deadline + grace
    assert out[:5] + out[6:] == [*range(5), *range(6, 29)]
    assert st.dropped_late == 0 and st.refused_late == 0
