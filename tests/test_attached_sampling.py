"""The attached profile's stopping rule (``inferline/measure/_attached.py``): a point ends
once its mean is known within 3% (the planner's ``latency_s``), not once its P99 is stable."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from inferline.measure import ProfilerOptions
from inferline.measure._attached import _sample_mean_point, mean_settled


def test_mean_settles_with_enough_low_variance_samples() -> None:
    rng = np.random.default_rng(0)
    steady = list(0.01 + rng.normal(0, 0.0005, 12))
    assert mean_settled(steady)
    assert not mean_settled(steady[:9])  # too few to say
    noisy = list(rng.exponential(0.01, 12))  # cv ~1: 12 samples give ~30% error
    assert not mean_settled(noisy)


class _SleepHandle:
    """A fake replica (a handle is all the sampler touches): sleeps ``s`` per batch."""

    model = "fake"

    def __init__(self, s: float) -> None:
        self.s = s
        self.calls = 0

    async def predict_batch(self, xs: list[Any]) -> list[Any]:
        self.calls += 1
        await asyncio.sleep(self.s)
        return list(xs)


def test_sampler_stops_when_the_mean_settles_and_at_its_time_cap() -> None:
    opts = ProfilerOptions(max_batch_size=4, max_samples=400, max_seconds_per_point=0.5)
    h = _SleepHandle(0.002)
    lat = asyncio.run(_sample_mean_point(h, [1, 2, 3], 4, opts))
    assert 10 <= len(lat) < 100  # steady sleeps: settled long before 400
    capped = ProfilerOptions(max_batch_size=4, max_seconds_per_point=0.05)
    t0 = time.perf_counter()
    slow = asyncio.run(_sample_mean_point(_SleepHandle(0.02), [1], 1, capped))
    assert len(slow) < 10 and time.perf_counter() - t0 < 0.5
