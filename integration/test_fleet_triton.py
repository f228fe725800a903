"""A fleet of two real Triton servers (the harness) serving the same digits model as one model.

Replicas on both; one server killed (SIGKILL) under open-loop load: every query is answered
(a prediction or an explicit error, none without an answer), the survivor carries the load,
takes the lost replicas (re-placed after the grace) and a scale-up made while the other is
away, and the killed server's replicas come back once it restarts (the model reloaded there
by its member's recovery; the survivor's stand-ins then go). Then the other server is
drained and undrained under load with no failed query.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test models")

from _fleet_helpers import OpenLoad, serve_with, two_triton_servers, until
from triton_harness import Digits, TritonServer

from inferline.core import ModelConfig, ModelSpec
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TritonServer, TritonServer, Digits]]:
    with two_triton_servers(tmp_path_factory.mktemp("triton-fleet")) as pair:
        yield pair


def test_fleet_survives_a_killed_server_and_drains_without_failures(
    fleet: tuple[TritonServer, TritonServer, Digits],
) -> None:
    sa, sb, digits = fleet
    mdir = sa.repository / "digits_pre" / "1"
    mean, std = np.load(mdir / "mean.npy"), np.load(mdir / "std.npy")
    images = digits.test_images[:50]
    ua, ub = (f"{s.grpc_url}?oversubscribe=1&recovery_timeout_s=90" for s in (sa, sb))

    async def main() -> None:
        b = open_backend(plugin_host(), [ua, ub])
        await serve_with(b, body)

    def on(b: Any) -> list[str]:
        return sorted(h.server for h in b.replicas("pre"))

    async def body(b: Any, d: Dispatcher) -> None:
        await b.deploy(ModelSpec("pre", source="digits_pre"), ModelConfig("cpu", 8, 4))
        assert on(b) == sorted([ua, ua, ub, ub])
        d.add_model("pre", batching=FixedBatching(8), max_retries=2)
        d.attach(b)
        load = OpenLoad(d, "pre", lambda i: images[i % len(images)], deadline_s=5.0)
        load.start()
        await asyncio.sleep(1.0)

        sb.kill()  # a crash: SIGKILL to the server and its model processes
        t_kill = time.monotonic()
        await until(lambda: on(b) == [ua, ua], 10, "the killed server's replicas to leave")
        t_gone = time.monotonic()
        # after the grace (1 s) the lost replicas are re-placed on the survivor
        await until(lambda: on(b) == [ua] * 4, 10, "the lost replicas re-placed on a")
        t_covered = time.monotonic()
        st = await b.stats("pre")
        assert (st["shortfall"], st["unplaced"], st["servers"][0]["covering"]) == (0, 0, 2)
        await asyncio.sleep(0.5)
        served_alone = [o for o in load.out if o.kind == "ok" and o.submitted > t_gone]
        assert len(served_alone) > 20  # the survivor carries the load
        await b.scale("pre", 5)  # while b is away, a scale-up goes to the survivor
        assert on(b) == [ua] * 5  # 3 of its own and the 2 that stand in for b's

        await asyncio.to_thread(sb.start)  # same ports
        five = sorted([ua, ua, ua, ub, ub])
        # b's own replicas back (reloaded there), then the survivor's cover goes
        await until(lambda: on(b) == five, 90, "replicas back on b")
        t_back = time.monotonic()
        for _ in range(100):  # the cover's scale-down returns once its batches are done
            st = await b.stats("pre")
            if not any(s["covering"] for s in st["servers"]):
                break
            await asyncio.sleep(0.05)
        assert st["shortfall"] == 0 and st["target_replicas"] == 5
        assert [s["covering"] for s in st["servers"]] == [0, 0]
        assert st["servers"][1]["stats"]["restarts"] == 1  # reloaded where it was lost

        await asyncio.sleep(0.5)
        t_drain = time.monotonic()
        b.drain(ua)
        assert on(b) == [ub, ub]
        assert await b.wait_drained(ua, 10)
        await asyncio.sleep(0.5)
        b.undrain(ua)
        assert on(b) == five
        await asyncio.sleep(0.5)
        await load.finish(30)
        check(load, t_kill, t_gone, t_back, t_drain)
        print(
            f"fleet: lost replicas re-placed on the survivor {t_covered - t_kill:.2f} s after the kill"
        )

    def check(load: OpenLoad, t_kill: float, t_gone: float, t_back: float, t_drain: float) -> None:
        out = load.out
        assert len(out) == len(load.tasks)  # every accepted query answered exactly once
        assert sorted(o.i for o in out) == list(range(len(load.tasks)))
        assert not [o for o in out if o.kind == "other"]
        for o in out:
            if o.kind == "ok":
                want = (images[o.i % len(images)].reshape(64) - mean) / std
                np.testing.assert_allclose(o.value, want, rtol=1e-5, atol=1e-5)
        errors = [o for o in out if o.kind == "error"]
        # no failure before the kill, and none from the restart through drain and undrain
        assert not [o for o in errors if o.submitted < t_kill or o.submitted > t_back], errors[:3]
        print(
            f"fleet: {len(out)} queries, {len(errors)} explicit errors around the kill, "
            f"{sum(1 for o in out if o.submitted > t_drain)} during drain/undrain, 0 unanswered; "
            f"replicas gone {t_gone - t_kill:.2f} s and back {t_back - t_kill:.1f} s after the kill"
        )

    asyncio.run(main())
