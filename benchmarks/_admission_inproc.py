"""``benchmarks/admission.py --client inproc``: the queue's policy measured without the HTTP
door, the load sent through the service's own ``predict`` in this process (issue 45).

The HTTP rows (``_admission_server.py``) put a JSON parse and a response on the server's one
loop for every query, and a load client of its own beside it; on a loaded 2-core machine that
door, not the queue, decided the figures (docs/deadlines.md). Here the client is Poisson
arrivals on the server's loop, each query a task held only while in flight (a list of every
finished task kept ~100k objects alive for each full collection to scan), and the server's
objects are frozen out of the collector once warm, as ``inferline serve`` does. A prediction's
latency counts from its scheduled arrival (``late``) and from the predict call, the server's
arrival (``srv late``); a refusal's and a drop's time to answer from the predict call."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from _admission_client import arrivals
from _admission_server import Drive, Row

from inferline.core import DeadlineExceededError, OverloadedError


async def _one(svc: Any, row: Row, t_sched: float, x: list[float], prio: int) -> None:
    hi = row.hi
    t_call = time.perf_counter()  # the server's arrival: its deadline counts from here
    try:
        await svc.predict("app", x, None, prio)
    except OverloadedError as e:  # PredictedLate is one
        late_drop = getattr(e, "stage", "") == "dispatch"  # at a cut or once doomed
        (row.dropped if late_drop else row.refused).append(time.perf_counter() - t_call)
        if prio:
            hi["dropped" if late_drop else "refused"] += 1
        return
    except DeadlineExceededError:
        row.expired += 1
        hi["expired"] += prio
        return
    except Exception:
        row.errors += 1
        hi["errors"] += prio
        return
    t = time.perf_counter()
    lat = t - t_sched
    row.ok.append(lat)  # the client's clock: from the scheduled arrival, its lag included
    row.srv_ok.append(t - t_call)  # the server's: from the predict call
    if prio:
        hi["on_time" if lat <= row.slo_s else "late"] += 1


async def _drive(svc: Any, row: Row, rate: float, seconds: float, hi_share: float) -> None:
    """Poisson arrivals at ``rate`` for ``seconds``; only the tasks in flight are held."""
    times, prios = arrivals(rate, seconds, hi_share)
    row.hi = dict.fromkeys(("on_time", "late", "refused", "dropped", "expired", "errors"), 0)
    row.hi["total"] = int(prios.sum())
    live: set[asyncio.Task[None]] = set()
    lags: list[float] = []
    t0 = time.perf_counter()
    i = 0
    while i < len(times):
        now = time.perf_counter() - t0
        while i < len(times) and times[i] <= now:
            lags.append(now - times[i])
            task = asyncio.ensure_future(_one(svc, row, t0 + times[i], [float(i)], int(prios[i])))
            live.add(task)
            task.add_done_callback(live.discard)
            i += 1
        if i < len(times):
            await asyncio.sleep(max(0.0, times[i] - (time.perf_counter() - t0)))
    if live:
        await asyncio.gather(*live)
    row.offered_qps = len(times) / seconds
    row.seconds = seconds
    row.lag_p99_s = float(np.percentile(lags, 99)) if lags else 0.0
    row.lag_max_s = max(lags, default=0.0)


def inproc_drive(seconds: float, hi_share: float) -> Drive:
    """The load through the service's ``predict`` here (``run_rows(..., http=False)``)."""

    async def drive(svc: Any, url: str | None, row: Row, rate: float) -> None:
        await _drive(svc, row, rate, seconds, hi_share)
        row.cli_cpu_s = 0.0  # server and client: one process, its CPU in srv

    return drive
