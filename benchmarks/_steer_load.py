"""Load for ``benchmarks/steer_vs_analyzer.py``, straight at Triton's KServe v2 gRPC door: the
open-loop replay of an arrival trace and a closed-loop saturation run.

Why not perf_analyzer: it stops at the first failed request (exit 99), and a steered Triton
refuses, by its queue policy, a request that can no longer make the SLO; why not inferline's
replay client (``inferline.measure.replay``): it speaks only inferline's own
``/apps/{app}/predict`` route. So this is a small asyncio client over ``tritonclient``'s gRPC
(one channel): every request is sent at its arrival time whatever the earlier ones are doing
(open loop), its latency counts from the scheduled time (a client that fell behind shows as
latency), and a refused or failed request is recorded, not fatal.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Replay",
    "replay_trace",
    "saturate",
    "server_figures",
    "triton_counters",
    "warm_up",
]


@dataclass(frozen=True)
class Replay:
    """One open-loop replay: requests sent and answered, P99 of the answered, share over the
    SLO (a refused or failed request counts as over), answers per second over the run, the
    rate offered (the trace's), the P99 of how late sends went out, and errors by kind."""

    sent: int
    answered: int
    p99_ms: float
    p99_from_send_ms: float  # the same, counted from when the client actually sent
    over_slo: float
    served_qps: float
    offered_qps: float
    send_lag_p99_ms: float
    errors: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _inputs(model_input: str, images: np.ndarray) -> list[list[Any]]:
    """One prepared request input per image (read-only, shared by concurrent calls)."""
    from tritonclient.grpc import InferInput

    out = []
    for img in images:
        x = InferInput(model_input, [1, *img.shape], "FP32")
        x.set_data_from_numpy(img[None].astype(np.float32))
        out.append([x])
    return out


def _kind(e: BaseException) -> str:
    msg = str(e).split("\n")[0]
    return msg[:120] or type(e).__name__


async def _replay(
    grpc: str, model: str, arrivals_s: np.ndarray, inputs: list[list[Any]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter[str]]:
    from tritonclient.grpc.aio import InferenceServerClient

    n = arrivals_s.size
    sent = np.full(n, np.nan)
    done = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    errors: Counter[str] = Counter()
    client = InferenceServerClient(grpc)
    clock = time.perf_counter

    async def one(i: int, t0: float) -> None:
        sent[i] = clock() - t0
        try:
            await client.infer(model, inputs[i % len(inputs)])
            ok[i] = True
        except Exception as e:  # a refusal or failure is a result here, not an abort
            errors[_kind(e)] += 1
        done[i] = clock() - t0

    try:
        tasks = []
        t0 = clock() + 0.05
        for i, t in enumerate(arrivals_s):
            delay = t0 + t - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, t0)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return sent, done, ok, errors


def replay_trace(
    grpc: str, model: str, arrivals_s: np.ndarray, images: np.ndarray, *, slo_ms: float
) -> Replay:
    """Send ``model`` one request (an image of ``images``, in turn) per arrival."""
    t = np.asarray(arrivals_s, dtype=float) - float(arrivals_s[0])
    sent, done, ok, errors = asyncio.run(_replay(grpc, model, t, _inputs("image", images)))
    lat_ms = (done - t) * 1e3
    good = ok & (lat_ms <= slo_ms)
    served = ok.sum() / max(float(np.nanmax(done[ok])) if ok.any() else 1.0, 1e-9)
    return Replay(
        sent=int(t.size),
        answered=int(ok.sum()),
        p99_ms=float(np.percentile(lat_ms[ok], 99)) if ok.any() else float("nan"),
        p99_from_send_ms=float(np.percentile((done - sent)[ok], 99) * 1e3)
        if ok.any()
        else float("nan"),
        over_slo=float(1.0 - good.mean()),
        served_qps=float(served),
        offered_qps=float((t.size - 1) / max(float(t[-1]), 1e-9)),
        send_lag_p99_ms=float(np.percentile(sent - t, 99) * 1e3),
        errors=dict(errors),
    )


async def _closed(
    grpc: str, model: str, inputs: list[list[Any]], concurrency: int, requests: int
) -> tuple[int, int, float]:
    from tritonclient.grpc.aio import InferenceServerClient

    client = InferenceServerClient(grpc)
    left = requests
    answered = refused = 0

    async def worker(k: int) -> None:
        nonlocal left, answered, refused
        while left > 0:
            left -= 1
            try:
                await client.infer(model, inputs[(k + left) % len(inputs)])
                answered += 1
            except Exception:  # refused by the queue policy: counted, the loop goes on
                refused += 1

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed = time.perf_counter() - t0
    finally:
        await client.close()
    return answered, refused, elapsed


def saturate(
    grpc: str,
    model: str,
    images: np.ndarray,
    *,
    ladder: tuple[int, ...],
    requests: int,
) -> tuple[float, int, float]:
    """Closed loop at each concurrency of ``ladder`` (``requests`` each): the highest rate of
    answered requests, the concurrency it came at, and the share refused there."""
    inputs = _inputs("image", images)
    best = (0.0, ladder[0], 0.0)
    for c in ladder:
        answered, refused, elapsed = asyncio.run(_closed(grpc, model, inputs, c, requests))
        qps = answered / max(elapsed, 1e-9)
        if qps > best[0]:
            best = (qps, c, refused / max(answered + refused, 1))
    return best


def warm_up(grpc: str, model: str, images: np.ndarray, requests: int = 100) -> None:
    """A few batches through every instance first: a Python model's first calls are slow."""
    asyncio.run(_closed(grpc, model, _inputs("image", images), 8, requests))


_TRITON_LINE = re.compile(r'^nv_inference_(\w+)\{model="([^"]+)",version="[^"]*"\} ([0-9.eE+-]+)$')


def triton_counters(metrics_url: str) -> dict[tuple[str, str], float]:
    """Triton's cumulative per-model counters, ``(model, counter) -> value``."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = _TRITON_LINE.match(line)
        if m:
            out[(m.group(2), m.group(1))] = float(m.group(3))
    return out


def server_figures(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], models: list[str]
) -> dict[str, dict[str, float]]:
    """Per model over a run, from Triton's counters: mean batch (items per execution), and
    per request the mean ms queued, computing (input + infer + output) and in the model."""
    out: dict[str, dict[str, float]] = {}
    for m in models:

        def d(k: str, m: str = m) -> float:
            return after.get((m, k), 0.0) - before.get((m, k), 0.0)

        n = d("request_success")
        if n <= 0:
            continue
        compute = d("compute_input_duration_us") + d("compute_infer_duration_us")
        out[m] = {
            "mean_batch": d("count") / max(d("exec_count"), 1.0),
            "queue_ms": d("queue_duration_us") / n / 1e3,
            "compute_ms": (compute + d("compute_output_duration_us")) / n / 1e3,
            "request_ms": d("request_duration_us") / n / 1e3,
        }
    return out
