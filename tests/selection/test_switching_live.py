"""Live model switching on the bundled runtime: a rate spike moves serving to the cheaper variant,
the idle variant stays warm at low CPU priority, and the calm after the spike brings the
accurate variant back (its warm replica promoted, not restarted)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for benchmarks._digits

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data
from inferline.adapters.local import LocalBackend
from inferline.core import ModelSpec, Profiles, ValidationError
from inferline.deploy._switching import LiveSwitcher, process_nice, set_nice
from inferline.queueing import Dispatcher
from inferline.selection import (
    SwitchingConfig,
    SwitchOption,
    Variant,
    build_switching_table,
)

# big: an RBF SVM plus 30 ms per batch (an expensive model); small: naive Bayes plus 2 ms
SPECS = {
    "big": ModelSpec("big", SRC, {"kind": "svc", "delay_s": 0.030}),
    "small": ModelSpec("small", SRC, {"kind": "nb", "delay_s": 0.002}),
}
# profiles of what the containers cost (sleep + model + RPC), batch sizes 1..8
PROFILES = Profiles.from_latencies(
    {
        "big": {"cpu": {1: 0.033, 2: 0.034, 4: 0.035, 8: 0.037}},
        "small": {"cpu": {1: 0.004, 2: 0.0045, 4: 0.005, 8: 0.006}},
    }
)
VARIANTS = [Variant("big", 0.99), Variant("small", 0.85)]
CFG = SwitchingConfig(
    deadline_s=0.15,
    core_budget=1,
    rate_window=24,
    rates_qps=(2, 5, 10, 20, 40, 80, 120, 200, 300),
    sim_queries=600,
    max_batch_size=1,
)


def test_set_nice_lowers_every_thread_of_a_child():
    async def main():
        proc = await asyncio.create_subprocess_exec("sleep", "5")
        try:
            assert set_nice([proc.pid], 10)
            assert process_nice(proc.pid) == 10
        finally:
            proc.kill()
            await proc.wait()

    asyncio.run(main())
    assert set_nice([2**22 + 12345], 5)  # a vanished process is ignored


def test_rate_spike_switches_to_the_cheaper_variant_and_back():
    table = build_switching_table(VARIANTS, PROFILES, CFG)
    _, _, xte, yte = digits_data()
    rng = np.random.default_rng(0)
    calm1 = np.cumsum(rng.exponential(1 / 5.0, 10))  # ~2 s at 5 q/s
    spike = calm1[-1] + np.cumsum(rng.exponential(1 / 150.0, 300))  # ~2 s at 150 q/s
    calm2 = spike[-1] + np.cumsum(rng.exponential(1 / 5.0, 10))  # ~2 s at 5 q/s
    offsets = np.concatenate([calm1, spike, calm2])

    async def main():
        backend = LocalBackend(oversubscribe=True)
        dispatcher = Dispatcher()
        sw = LiveSwitcher(backend, dispatcher, SPECS, table, CFG, interval_s=0.05, min_dwell_s=0.5)
        try:
            await sw.start()
            nice_start = {v: [process_nice(p) for p in sw._pids(v)] for v in SPECS}
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            served: list[tuple[float, str, bool]] = []
            nice_spike: dict[str, list[int]] = {}

            async def one(i: int, at: float) -> None:
                v, out = await sw.predict(xte[i % len(xte)])
                served.append((at, v, out == int(yte[i % len(yte)])))

            tasks = []
            for i, at in enumerate(offsets):
                await asyncio.sleep(max(0.0, t0 + at - loop.time()))
                tasks.append(asyncio.create_task(one(i, float(at))))
                if i == len(calm1) + len(spike) - 1:
                    nice_spike = {v: [process_nice(p) for p in sw._pids(v)] for v in SPECS}
            await asyncio.gather(*tasks)
            await asyncio.sleep(1.0)  # calm: the controller sees the rate fall
            nice_end = {v: [process_nice(p) for p in sw._pids(v)] for v in SPECS}
            return sw, served, nice_start, nice_spike, nice_end
        finally:
            await sw.close()
            await dispatcher.close()
            await backend.close()

    sw, served, nice_start, nice_spike, nice_end = asyncio.run(main())
    print(
        [(round(e.time_s, 2), e.old and e.old.variant, e.new.variant, e.reason) for e in sw.events]
    )
    # starts on the accurate variant, the cheap one warm at low priority
    assert sw.events[0].new.variant == "big"
    assert nice_start["big"] == [0] and nice_start["small"] == [19]
    # the spike moved serving to the cheap variant (its warm replica promoted to nice 0)
    to_small = [e for e in sw.events if e.new.variant == "small"]
    assert to_small and to_small[0].rate_qps > 15  # calm is 5 q/s; big saturates at ~30
    assert nice_spike["small"] == [0] and nice_spike["big"] == [19]
    spike_start = len(calm1)
    late_spike = [v for at, v, _ in sorted(served)[spike_start + 100 : spike_start + 300]]
    assert late_spike.count("small") > 0.9 * len(late_spike)
    # and the calm brought the accurate variant back, promoted from its warm replica
    assert sw.active.variant == "big" and nice_end["big"] == [0] and nice_end["small"] == [19]
    assert sum(ok for *_, ok in served) / len(served) > 0.8


def test_switcher_validates_its_inputs():
    table = build_switching_table(VARIANTS, PROFILES, CFG)
    with pytest.raises(ValidationError, match="specs"):
        LiveSwitcher(None, None, {"big": SPECS["big"]}, table, CFG)
    with pytest.raises(ValidationError, match="idle_nice"):
        LiveSwitcher(None, None, SPECS, table, CFG, idle_nice=40)
    assert SwitchOption("big", 1, 1).hardware == "cpu"
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the test process itself stays untouched
