"""Property: every accepted query resolves exactly once; the queue stays within max_queue.

Random schedules of submissions, per-request deadlines, cancellations, replica deaths and
revivals, replica-set changes, per-item model errors and a close at a random time, run on a
virtual-time loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from _queueing_vtime import run_virtual
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.core.errors import InferlineError, OverloadedError, ValidationError
from inferline.queueing import (
    AIMDBatching,
    DelayedBatching,
    Dispatcher,
    FixedBatching,
    InProcessReplica,
    RafikiGreedyBatching,
)


class OddFails:
    """Returns the input, or a per-item error for inputs divisible by 7."""

    def predict_batch(self, xs: list[int]) -> list[Any]:
        return [ValidationError("x", "not a multiple of 7", x) if x % 7 == 0 else x for x in xs]


policies = st.one_of(
    st.builds(FixedBatching, st.integers(1, 6)),
    st.builds(DelayedBatching, st.integers(1, 6), st.sampled_from([0.0, 0.01, 0.05])),
    st.builds(
        AIMDBatching,
        initial=st.integers(1, 4),
        slo_s=st.sampled_from([0.02, 0.1]),
    ),
    st.builds(
        RafikiGreedyBatching,
        candidate_sizes=st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple),
        latency_fn=st.just(lambda b: 0.005 * b),
    ),
)

ops = st.lists(
    st.tuples(
        st.sampled_from(["submit", "burst", "cancel", "kill", "revive", "rescale", "wait"]),
        st.integers(0, 1000),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    policy=policies,
    max_queue=st.integers(1, 12),
    replicas=st.integers(1, 3),
    max_retries=st.integers(0, 2),
    expire_late=st.booleans(),
    schedule=ops,
)
def test_every_query_resolves_once_and_queue_is_bounded(
    policy: Any,
    max_queue: int,
    replicas: int,
    max_retries: int,
    expire_late: bool,
    schedule: list[tuple[str, int]],
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop_errors: list[Any] = []
        loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
        d = Dispatcher(clock=loop.time, retry_cooldown_s=0.001)
        d.add_model(
            "m",
            batching=policy,
            max_queue=max_queue,
            expire_late=expire_late,
            max_retries=max_retries,
        )
        reps = [
            InProcessReplica("m", OddFails(), service_s=lambda b: 0.004 + 0.001 * b)
            for _ in range(replicas)
        ]
        d.set_replicas("m", reps)
        worst = 0

        def watch(_ev: Any) -> None:
            nonlocal worst
            s = d.stats("m")
            worst = max(worst, s.queued + s.in_flight)

        d.add_listener(watch)
        accepted: list[tuple[int, asyncio.Task[Any]]] = []
        x = 0

        entered: list[int] = []

        async def submit(x: int, slo: float) -> Any:
            entered.append(x)
            return await d.submit("m", x, deadline=loop.time() + slo)

        def offer(n: int, arg: int) -> None:
            nonlocal x
            for _ in range(n):
                x += 1
                t = asyncio.ensure_future(submit(x, 0.001 * (arg % 50)))
                accepted.append((x, t))

        for op, arg in schedule:
            if op == "submit":
                offer(1, arg)
            elif op == "burst":
                offer(1 + arg % 8, arg)
            elif op == "cancel" and accepted:
                accepted[arg % len(accepted)][1].cancel()
            elif op == "kill":
                reps[arg % len(reps)].kill()
            elif op == "revive":
                reps[arg % len(reps)].revive()
                d.set_replicas("m", reps)  # the backend reports the restarted replica
            elif op == "rescale":
                d.set_replicas("m", reps[: 1 + arg % len(reps)])
            await asyncio.sleep(0.001 * (arg % 13))
        # let work finish for a while, then close: everything still open gets an error
        await asyncio.sleep(0.05)
        await d.close()
        results = await asyncio.gather(*(t for _, t in accepted), return_exceptions=True)
        refused = sum(1 for r in results if isinstance(r, OverloadedError))
        for (xi, t), r in zip(accepted, results, strict=True):
            assert t.done()
            if t.cancelled():
                continue
            if isinstance(r, BaseException):
                assert isinstance(r, InferlineError), r
                if isinstance(r, ValidationError):
                    assert xi % 7 == 0
            else:
                assert r == xi and xi % 7 != 0
        s = d.stats("m")
        assert worst <= max_queue
        assert s.queued == 0 and s.in_flight == 0
        # each accepted query ended exactly once: as a result, an error, or skipped (cancelled)
        n_cancel_skipped = s.cancelled
        assert s.submitted == s.completed + s.failed + n_cancel_skipped
        assert s.rejected == refused
        # and the submissions that got in are exactly the ones counted as submitted
        assert s.submitted == len(entered) - refused
        assert not loop_errors, loop_errors

    run_virtual(scenario)
