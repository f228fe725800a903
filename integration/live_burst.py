"""Shared by the live tuner tests: short tuner horizons, a planned envelope for one Sleep model,
and a burst replayed against a running service while a watcher samples its state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from inferline.core import TunerConfig, TunerInputs, TunerModel, envelope_windows, gamma_trace
from inferline.core import trace_envelope as _trace_envelope

# Short horizons so a test takes seconds: stabilization 3 s, 2 s scale-down memory.
SHORT_TUNER = TunerConfig(
    stabilization_delay_s=3.0,
    down_horizon_s=2.0,
    down_window_s=0.5,
    keep_horizon_s=2.0,
    interval_s=0.05,
    up_rate="scaled",
)


def planned_inputs(batch_s: float, planned_qps: float, model: str = "m") -> TunerInputs:
    """The tuner inputs of a one-model plan: one query per ``batch_s`` batch, a 120 s CV 1
    sample at ``planned_qps`` (rho = planned_qps * batch_s)."""
    sample = gamma_trace(planned_qps, 1.0, 120.0, np.random.default_rng(0))
    mu = 1.0 / batch_s
    return TunerInputs(
        service_time_s=batch_s,
        envelope=_trace_envelope(sample, envelope_windows(batch_s)).points,
        mean_rate_qps=planned_qps,
        models={model: TunerModel(1.0, mu, planned_qps / mu)},
    )


def burst_offsets(
    planned_qps: float, burst_qps: float, burst_s: float, calm_s: float, *, start_s: float = 3.0
) -> np.ndarray:
    """Arrival offsets: ``start_s`` at the planned rate, the burst, then ``calm_s`` at a third
    of the planned rate (seeded)."""
    rng = np.random.default_rng(1)
    return np.concatenate(
        [
            gamma_trace(planned_qps, 1.0, start_s, rng),
            gamma_trace(burst_qps, 1.0, burst_s, rng, start_s=start_s),
            gamma_trace(planned_qps / 3, 1.0, calm_s, rng, start_s=start_s + burst_s),
        ]
    )


async def replay_and_watch(
    offsets: np.ndarray,
    send: Callable[[float], Awaitable[None]],
    sample: Callable[[float], Any],
    settled: Callable[[], bool],
    *,
    settle_s: float = 20.0,
) -> tuple[float, list[Any]]:
    """Send a query at each offset (``send(offset)``), sampling ``sample(t)`` every 50 ms;
    after the last answer wait up to ``settle_s`` for ``settled()``. Returns the start time
    (``time.perf_counter``) and the samples, the last one taken at the end."""
    t0 = time.perf_counter()
    seen: list[Any] = []

    async def watch() -> None:
        while True:
            seen.append(sample(time.perf_counter() - t0))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    tasks = []
    for at in offsets:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(float(at))))
    await asyncio.gather(*tasks)
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline and not settled():
        await asyncio.sleep(0.1)
    watcher.cancel()
    seen.append(sample(time.perf_counter() - t0))  # the watcher's last may predate the end
    return t0, seen
