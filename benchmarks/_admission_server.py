"""The server side of ``benchmarks/admission.py``: ``inferline serve``'s path in this process,
the load client in another (``_admission_client.py``), lateness on both clocks.

One mode (a deployment) is served as ``inferline serve`` serves it: the service, the HTTP
app (``create_app``, its predict fast path) on uvicorn and uvloop, and, once warm,
``gc.collect(); gc.freeze()`` as ``inferline serve`` does when it is ready. For each load
factor the client runs as a subprocess against the real socket and hands back JSON; meanwhile
this process records, on its own clock:

- each HTTP answer's time from the request reaching the app to its response starting
  (``srv late``: predictions answered past deadline + 5 ms by the server's clock);
- from the dispatcher's batch events, the queries whose queue delay plus batch run ended
  past deadline + 5 ms (``q late``) and of those the ones whose batch ran past admission's
  predicted completion (``overran``);
- how late this loop woke for a 5 ms timer (the server loop's lag, P99 and max) and the
  longest full garbage collection.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferline.core import DeadlineExceededError, OverloadedError, Plan
from inferline.deploy import Deployment, start_service
from inferline.queueing import BatchEvent
from inferline.server import bind_socket, create_app, serve_app

CLIENT = Path(__file__).with_name("_admission_client.py")


@dataclass
class Row:
    """One mode at one load factor; ``ok``, ``refused``, ``dropped`` hold times in seconds
    (latency of each prediction, time to answer each refusal at arrival / dispatch drop) as
    the client measured them, from each query's scheduled arrival."""

    mode: str
    factor: float
    offered_qps: float = 0.0
    seconds: float = 0.0
    ok: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    dropped: list[float] = field(default_factory=list)
    expired: int = 0
    errors: int = 0
    hi: dict[str, int] = field(default_factory=dict)  # the priority class's outcomes
    lag_p99_s: float = float("nan")  # how late the client sent (its own loop)
    lag_max_s: float = float("nan")
    srv_ok: list[float] = field(default_factory=list)  # server clock: each 200's time
    q_late: int = 0
    overran: int = 0
    srv_lag_p99_s: float = float("nan")
    srv_lag_max_s: float = float("nan")
    gc_max_s: float = 0.0
    srv_cpu_s: float = float("nan")  # this (the server's) process's CPU over the client's run
    cli_cpu_s: float = float("nan")  # the client process's, over its run
    slo_s: float = 0.1  # the deadline the priority class's on-time share counts against

    def late(self, slo_s: float, slack_s: float) -> int:
        return sum(x > slo_s + slack_s for x in self.ok)

    def srv_late(self, slo_s: float, slack_s: float) -> int:
        return sum(x > slo_s + slack_s for x in self.srv_ok)

    def goodput_qps(self, slo_s: float) -> float:
        return sum(x <= slo_s for x in self.ok) / self.seconds if self.seconds else 0.0


def timed(app: Any, record: Callable[[int, float], None]) -> Any:
    """``app`` (ASGI) calling ``record(status, seconds)`` as each HTTP response starts."""
    clock = time.perf_counter

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        t = clock()

        async def send_timed(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                record(msg["status"], clock() - t)
            await send(msg)

        await app(scope, receive, send_timed)

    return wrapped


class Probe:
    """Server-side figures for the row being measured (``row`` None: not recording)."""

    def __init__(self, slo_s: float, slack_s: float) -> None:
        self.row: Row | None = None
        self.limit = slo_s + slack_s
        self.lags: list[float] = []
        self._gc_t = 0.0

    def on_http(self, status: int, seconds: float) -> None:
        if self.row is not None and status == 200:
            self.row.srv_ok.append(seconds)

    def on_batch(self, ev: Any) -> None:
        if self.row is None or not isinstance(ev, BatchEvent) or not ev.ok:
            return
        n = sum(d + ev.service_s > self.limit for d in ev.queue_delays_s)
        self.row.q_late += n
        if n and ev.prediction_errors_s and min(ev.prediction_errors_s) < 0:
            self.row.overran += n

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_t = time.perf_counter()
        elif self.row is not None:
            self.row.gc_max_s = max(self.row.gc_max_s, time.perf_counter() - self._gc_t)

    async def loop_lag(self, period_s: float = 0.005) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(period_s)
            if self.row is not None:
                self.lags.append(time.perf_counter() - t - period_s)

    def finish(self) -> None:
        if self.row is not None and self.lags:
            self.row.srv_lag_p99_s = float(np.percentile(self.lags, 99))
            self.row.srv_lag_max_s = max(self.lags)
        self.row = None
        self.lags = []


async def _client(url: str, rate: float, seconds: float, hi: float, slo_s: float) -> Any:
    """The load client as a subprocess; its JSON summary."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENT),
        f"--url={url}",
        f"--rate={rate}",
        f"--seconds={seconds}",
        f"--hi-share={hi}",
        f"--slo-s={slo_s}",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the load client failed (exit {proc.returncode})")
    return json.loads(out)


def fill(row: Row, d: dict[str, Any]) -> None:
    """``row`` from the client's JSON summary."""
    row.seconds = d["seconds"]
    row.offered_qps = d["offered"] / d["seconds"]
    row.ok, row.refused, row.dropped = d["ok"], d["refused"], d["dropped"]
    row.expired, row.errors, row.hi = d["expired"], d["errors"], d["hi"]
    row.lag_p99_s, row.lag_max_s = d["lag_p99_s"], d["lag_max_s"]
    row.cli_cpu_s = d["cpu_s"]


async def warm(svc: Any) -> None:
    # the replica's first call is its slowest; batches of every size up to 8 follow, so the
    # live P99 knows them. A stall of the shared machine may have admission drop a few, or
    # cut a batch still running at deadline + grace (DeadlineExceededError, seen in a loaded
    # suite run): the warm-up's answers are not what the rows measure, so neither is an error.
    ok = (OverloadedError, DeadlineExceededError)
    first = await asyncio.gather(svc.predict("app", [1.0]), return_exceptions=True)
    for _ in range(30):
        xs = (svc.predict("app", [1.0]) for _ in range(12))
        for r in [*first, *await asyncio.gather(*xs, return_exceptions=True)]:
            if isinstance(r, BaseException) and not isinstance(r, ok):
                raise r
        first = []


# one factor's load: (the service, the server's URL or None, the row, the rate) -> filled row
Drive = Callable[[Any, "str | None", Row, float], Awaitable[None]]


async def run_rows(
    mode: str,
    dep: Deployment,
    plan: Plan,
    factors: list[float],
    capacity_qps: float,
    slack_s: float,
    drive: Drive,
    http: bool,
) -> list[Row]:
    """Serve ``dep`` here (over HTTP with ``http``), warm it, freeze start-up's objects out
    of the collector, then ``drive`` each factor's load while the probe records."""
    svc = await start_service(dep, plan)
    probe = Probe(plan.slo_s, slack_s)
    stop = asyncio.Event()
    server = None
    url = None
    if http:
        sock = bind_socket("127.0.0.1", 0)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        ready = asyncio.Event()
        app = timed(create_app(svc, close_service_on_shutdown=False), probe.on_http)
        server = asyncio.ensure_future(serve_app(app, sock, ready=ready.set, stop=stop))
        await ready.wait()
    lag = asyncio.ensure_future(probe.loop_lag())
    gc.callbacks.append(probe.on_gc)
    rows = []
    try:
        await warm(svc)
        svc.dispatcher.add_listener(probe.on_batch)
        gc.collect()
        gc.freeze()  # as `inferline serve` once ready (inferline/deploy/_serve.py)
        for f in factors:
            row = Row(mode, f, slo_s=plan.slo_s)
            probe.row = row
            cpu = time.process_time()
            await drive(svc, url, row, f * capacity_qps)
            row.srv_cpu_s = time.process_time() - cpu
            probe.finish()
            rows.append(row)
            await asyncio.sleep(0.3)  # let the backlog drain between rates
    finally:
        gc.callbacks.remove(probe.on_gc)
        gc.unfreeze()
        lag.cancel()
        stop.set()
        if server is not None:
            await server
        await svc.close()
    return rows


def http_drive(seconds: float, hi_share: float, slo_s: float) -> Drive:
    """The load from a client process over HTTP (``run_rows(..., http=True)``)."""

    async def drive(svc: Any, url: str | None, row: Row, rate: float) -> None:
        assert url is not None
        fill(row, await _client(url, rate, seconds, hi_share, slo_s))

    return drive
