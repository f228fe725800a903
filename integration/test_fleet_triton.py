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
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test models")

from triton_harness import Digits, SetupError, TritonServer, build_repository, ensure_installed

from inferline.core import InferlineError, ModelConfig, ModelSpec
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TritonServer, TritonServer, Digits]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root = tmp_path_factory.mktemp("triton-fleet")
    digits = build_repository(root / "a" / "models")
    shutil.copytree(root / "a" / "models", root / "b" / "models")
    servers = [
        TritonServer(install, root / x / "models", log_path=root / x / "triton.log")
        for x in ("a", "b")
    ]
    try:
        with ThreadPoolExecutor(2) as pool:  # the two starts overlap
            list(pool.map(lambda s: s.start(), servers))
        yield servers[0], servers[1], digits
    finally:
        for s in servers:
            s.kill()  # a graceful stop takes seconds; nothing is left to save


class _Load:
    """Open-loop queries (one every ``gap_s``) recording each outcome with its submit time."""

    def __init__(self, d: Dispatcher, images: np.ndarray, gap_s: float = 0.005) -> None:
        self.d, self.images, self.gap_s = d, images, gap_s
        self.out: list[tuple[str, int, Any, float]] = []  # kind, index, value, submitted
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()

    async def _one(self, i: int) -> None:
        t = time.monotonic()
        x = self.images[i % len(self.images)]
        try:
            self.out.append(("ok", i, await self.d.submit("pre", x, deadline=t + 5.0), t))
        except InferlineError as e:
            self.out.append(("error", i, e, t))
        except BaseException as e:  # anything else is a bug: recorded, then asserted on
            self.out.append(("other", i, e, t))

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            self.tasks.append(asyncio.create_task(self._one(i)))
            i += 1
            await asyncio.sleep(self.gap_s)


async def _until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


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
        d = Dispatcher()
        try:
            await body(b, d)
        finally:
            await d.close()
            await b.close()

    def on(b: Any) -> list[str]:
        return sorted(h.server for h in b.replicas("pre"))

    async def body(b: Any, d: Dispatcher) -> None:
        await b.deploy(ModelSpec("pre", source="digits_pre"), ModelConfig("cpu", 8, 4))
        assert on(b) == sorted([ua, ua, ub, ub])
        d.add_model("pre", batching=FixedBatching(8), max_retries=2)
        d.attach(b)
        load = _Load(d, images)
        loader = asyncio.create_task(load.run())
        await asyncio.sleep(1.0)

        sb.kill()  # a crash: SIGKILL to the server and its model processes
        t_kill = time.monotonic()
        await _until(lambda: on(b) == [ua, ua], 10, "the killed server's replicas to leave")
        t_gone = time.monotonic()
        # after the grace (1 s) the lost replicas are re-placed on the survivor
        await _until(lambda: on(b) == [ua] * 4, 10, "the lost replicas re-placed on a")
        t_covered = time.monotonic()
        st = await b.stats("pre")
        assert (st["shortfall"], st["unplaced"], st["servers"][0]["covering"]) == (0, 0, 2)
        await asyncio.sleep(0.5)
        served_alone = [o for o in load.out if o[0] == "ok" and o[3] > t_gone]
        assert len(served_alone) > 20  # the survivor carries the load
        await b.scale("pre", 5)  # while b is away, a scale-up goes to the survivor
        assert on(b) == [ua] * 5  # 3 of its own and the 2 that stand in for b's

        await asyncio.to_thread(sb.start)  # same ports
        five = sorted([ua, ua, ua, ub, ub])
        # b's own replicas back (reloaded there), then the survivor's cover goes
        await _until(lambda: on(b) == five, 90, "replicas back on b")
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
        load.stop.set()
        await loader
        await asyncio.wait_for(asyncio.gather(*load.tasks), 30)
        check(load, t_kill, t_gone, t_back, t_drain)
        print(
            f"fleet: lost replicas re-placed on the survivor {t_covered - t_kill:.2f} s after the kill"
        )

    def check(load: _Load, t_kill: float, t_gone: float, t_back: float, t_drain: float) -> None:
        out = load.out
        assert len(out) == len(load.tasks)  # every accepted query answered exactly once
        assert sorted(o[1] for o in out) == list(range(len(load.tasks)))
        assert not [o for o in out if o[0] == "other"]
        for kind, i, value, _ in out:
            if kind == "ok":
                want = (images[i % len(images)].reshape(64) - mean) / std
                np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)
        errors = [o for o in out if o[0] == "error"]
        # no failure before the kill, and none from the restart through drain and undrain
        assert not [o for o in errors if o[3] < t_kill or o[3] > t_back], errors[:3]
        print(
            f"fleet: {len(out)} queries, {len(errors)} explicit errors around the kill, "
            f"{sum(1 for o in out if o[3] > t_drain)} during drain/undrain, 0 unanswered; "
            f"replicas gone {t_gone - t_kill:.2f} s and back {t_back - t_kill:.1f} s after the kill"
        )

    asyncio.run(main())
