"""Open-loop load generator: fires HTTP requests at a trace's arrival times.

It never waits for a response before sending the next request (a slow server does not slow
the offered load down, which is what makes tail latencies honest), keeps a pool of
keep-alive HTTP/1.1 connections (one request in flight per connection, a new connection when
none is idle), and records per query the send time, the answer time, the status and whether
the answer was the app's default output.

Speaks HTTP/1.1 over raw asyncio sockets (uvloop when installed) rather than through an HTTP
client library: the generator has to offer several thousand requests per second from one
core of a 2-core machine without becoming the bottleneck it is meant to measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from inferline.core import ValidationError

__all__ = [
    "ReplayResult",
    "closed_loop",
    "encode_bodies",
    "replay",
    "replay_sync",
]

# Status codes the generator uses for failures that never got an HTTP answer.
STATUS_CONNECT = 0  # could not connect or the connection dropped before the answer
STATUS_TIMEOUT = -1  # no answer before the end of the run


@dataclass(frozen=True)
class ReplayResult:
    """Per-query outcome of a replay. Times are seconds relative to the first scheduled send.

    ``latency_s`` is measured from the scheduled send time (so a client that fell behind
    shows up as latency rather than hiding it); ``send_lag_s`` says how far behind it was.
    """

    scheduled_s: np.ndarray
    sent_s: np.ndarray
    done_s: np.ndarray  # NaN when never answered
    status: np.ndarray  # HTTP status, or 0 (connection failed) / -1 (timed out)
    default: np.ndarray  # bool: answered with the app's default output
    slo_s: float | None = None
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.scheduled_s.size)

    @property
    def latency_s(self) -> np.ndarray:
        return self.done_s - self.scheduled_s

    @property
    def send_lag_s(self) -> np.ndarray:
        return self.sent_s - self.scheduled_s

    @property
    def ok(self) -> np.ndarray:
        """Answered with a real prediction (HTTP 200, not the default output)."""
        return (self.status == 200) & ~self.default

    def percentile(self, p: float, *, only_ok: bool = True) -> float:
        lat = self.latency_s[self.ok] if only_ok else self.latency_s[np.isfinite(self.done_s)]
        return float(np.percentile(lat, p)) if lat.size else float("nan")

    def miss_rate(self, slo_s: float | None = None) -> float:
        """Fraction of queries not answered with a prediction within the SLO (errors and
        default outputs count as misses)."""
        slo = self.slo_s if slo_s is None else slo_s
        if self.n == 0:
            return 0.0
        if slo is None:
            return float(np.mean(~self.ok))
        good = self.ok & (self.latency_s <= slo)
        return float(1.0 - np.mean(good))

    def status_counts(self) -> dict[str, int]:
        names = {STATUS_CONNECT: "connect-error", STATUS_TIMEOUT: "timeout"}
        c = Counter(int(s) for s in self.status)
        return {names.get(k, str(k)): v for k, v in sorted(c.items())}

    def throughput(self) -> float:
        """Answers (any status) per second over the span from first send to last answer."""
        done = self.done_s[np.isfinite(self.done_s)]
        if done.size < 2:
            return 0.0
        return float(done.size / max(done.max() - self.sent_s.min(), 1e-9))

    def summary(self) -> dict[str, Any]:
        lag = self.send_lag_s
        ok = self.ok
        span = float(self.scheduled_s[-1] - self.scheduled_s[0]) if self.n > 1 else 0.0
        return {
            "queries": self.n,
            "offered_qps": (self.n - 1) / span if span > 0 else float("nan"),
            "answered": int(np.isfinite(self.done_s).sum()),
            "ok": int(ok.sum()),
            "defaults": int(self.default.sum()),
            "errors": int((self.status != 200).sum()),
            "status": self.status_counts(),
            "p50_ms": self.percentile(50) * 1e3,
            "p99_ms": self.percentile(99) * 1e3,
            "max_ms": float(np.max(self.latency_s[ok])) * 1e3 if ok.any() else float("nan"),
            "slo_ms": None if self.slo_s is None else self.slo_s * 1e3,
            "slo_miss_rate": None if self.slo_s is None else self.miss_rate(),
            "throughput_qps": self.throughput(),
            "send_lag_p99_ms": float(np.percentile(lag, 99)) * 1e3 if self.n else 0.0,
            "error_kinds": dict(self.error_kinds),
        }


def encode_bodies(inputs: Sequence[Any], slo_ms: float | None = None) -> list[bytes]:
    """Request bodies ``{"input": x}`` for JSON-able inputs (numpy arrays become lists)."""
    out = []
    for x in inputs:
        if isinstance(x, np.ndarray):
            x = x.tolist()
        d: dict[str, Any] = {"input": x}
        if slo_ms is not None:
            d["latency_slo_ms"] = slo_ms
        out.append(json.dumps(d, separators=(",", ":")).encode())
    return out


def _parse_url(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValidationError("url", "an http://host:port URL", url)
    return u.hostname, u.port or 80, u.path.rstrip("/")


class _Conn(asyncio.Protocol):
    """One keep-alive connection: one request in flight, a tiny HTTP/1.1 response parser."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.current: int | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, i: int, data: bytes) -> None:
        self.current = i
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.current is not None:
            parsed = _parse_response(self.buf)
            if parsed is None:
                return
            status, body, used, close = parsed
            del self.buf[:used]
            i = self.current
            self.current = None
            self.pool.answered(self, i, status, body)
            if close:
                self._drop("server closed the connection")
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop(f"connection lost: {exc}" if exc else "connection closed")

    def _drop(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        i, self.current = self.current, None
        self.pool.lost(self, i, why)


def _parse_response(buf: bytearray) -> tuple[int, bytes, int, bool] | None:
    """``(status, body, bytes used, connection-close)`` once a whole response is buffered."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    try:
        status = int(head[9:12])
    except ValueError:
        status = 502
    close = b"\r\nconnection: close" in head
    start = end + 4
    k = head.find(b"\r\ncontent-length:")
    if k >= 0:
        e = head.find(b"\r\n", k + 2)
        n = int(head[k + 17 : e if e >= 0 else len(head)].strip())
        if len(buf) < start + n:
            return None
        return status, bytes(buf[start : start + n]), start + n, close
    if b"\r\ntransfer-encoding: chunked" in head:
        pos = start
        body = bytearray()
        while True:
            e = buf.find(b"\r\n", pos)
            if e < 0:
                return None
            size = int(bytes(buf[pos:e]).split(b";")[0], 16)
            if len(buf) < e + 2 + size + 2:
                return None
            body += buf[e + 2 : e + 2 + size]
            pos = e + 2 + size + 2
            if size == 0:
                return status, bytes(body), pos, close
    return status, b"", start, close  # no body (e.g. 204)


class _Pool:
    """Keep-alive connections, one request in flight on each.

    A query due when no connection is idle gets a new connection, up to ``max_connections``
    (file descriptors are finite); past that it waits for the first connection to free up,
    which shows as send lag and, since latency counts from the scheduled time, as latency.
    """

    def __init__(
        self,
        host: str,
        port: int,
        requests: list[bytes],
        n: int,
        on_answer: Any = None,
        max_connections: int = 512,
    ) -> None:
        self.host = host
        self.port = port
        self.requests = requests
        self.max_connections = max_connections
        self.idle: deque[_Conn] = deque()
        self.conns = 0  # open or being opened
        self.waiting: deque[int] = deque()  # due queries without a connection yet
        self.sent = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        self.status = np.full(n, STATUS_TIMEOUT, dtype=np.int32)
        self.default = np.zeros(n, dtype=bool)
        self.errors: Counter[str] = Counter()
        self.outstanding = 0
        self.all_done = asyncio.Event()
        self.finished_sending = False
        self.clock = time.perf_counter
        self.t0 = 0.0
        self.on_answer = on_answer
        self.loop = asyncio.get_running_loop()

    async def warm(self, k: int) -> None:
        k = min(k, self.max_connections)
        self.conns += k
        conns = await asyncio.gather(*(self._open() for _ in range(k)), return_exceptions=True)
        for c in conns:
            if isinstance(c, _Conn):
                self.idle.append(c)
            else:
                self.conns -= 1

    async def _open(self) -> _Conn:
        _, proto = await self.loop.create_connection(lambda: _Conn(self), self.host, self.port)
        return proto

    def _send(self, c: _Conn, i: int) -> None:
        self.sent[i] = self.clock() - self.t0
        c.send(i, self.requests[i % len(self.requests)])

    def fire(self, i: int) -> None:
        self.outstanding += 1
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                self._send(c, i)
                return
        self.waiting.append(i)
        if self.conns < self.max_connections:
            self.conns += 1
            self.loop.create_task(self._open_and_send())

    async def _open_and_send(self) -> None:
        try:
            c = await self._open()
        except OSError as e:
            self.conns -= 1
            self.errors[f"connect: {e.strerror or e}"] += 1
            if self.waiting:  # the query this connection was for fails, counted
                self._finish(self.waiting.popleft(), STATUS_CONNECT, b"")
            return
        if self.waiting:
            self._send(c, self.waiting.popleft())
        else:
            self.idle.append(c)

    def answered(self, c: _Conn, i: int, status: int, body: bytes) -> None:
        self._finish(i, status, body)
        if self.waiting:
            self._send(c, self.waiting.popleft())
        else:
            self.idle.append(c)

    def lost(self, c: _Conn, i: int | None, why: str) -> None:
        self.conns -= 1
        with contextlib.suppress(ValueError):
            self.idle.remove(c)
        if i is not None:
            self.errors[why] += 1
            self._finish(i, STATUS_CONNECT, b"")

    def _finish(self, i: int, status: int, body: bytes) -> None:
        if not np.isnan(self.done[i]):
            return
        self.done[i] = self.clock() - self.t0
        self.status[i] = status
        if status == 200:
            self.default[i] = b'"default":true' in body
        elif status >= 400:
            try:
                self.errors[str(json.loads(body).get("error", status))] += 1
            except (ValueError, AttributeError):
                self.errors[f"http {status}"] += 1
        if self.on_answer is not None:
            self.on_answer(i, status, body)
        self.outstanding -= 1
        if self.finished_sending and self.outstanding == 0:
            self.all_done.set()

    def close(self) -> None:
        for c in list(self.idle):
            if c.transport is not None:
                c.transport.close()
        self.idle.clear()


def _raise_fd_limit(want: int) -> None:
    """Lift the soft limit on open files toward ``want`` (best effort, up to the hard limit)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def _request_bytes(host: str, port: int, path: str, body: bytes, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{auth}\r\n"
    ).encode() + body


async def replay(
    arrivals_s: Sequence[float] | np.ndarray,
    url: str,
    app: str,
    bodies: Sequence[bytes],
    *,
    slo_s: float | None = None,
    token: str | None = None,
    connections: int = 64,
    max_connections: int = 512,
    drain_timeout_s: float = 30.0,
    on_answer: Callable[[int, int, bytes], None] | None = None,
) -> ReplayResult:
    """Send ``bodies[i % len(bodies)]`` to ``url/apps/app/predict`` at ``arrivals_s[i]``.

    ``connections`` are opened up front; more are opened when all are busy, up to
    ``max_connections``, after which due queries wait for a free one (and are late)."""
    times = np.asarray(arrivals_s, dtype=float)
    if times.ndim != 1 or times.size == 0:
        raise ValidationError("arrivals_s", "a non-empty list of times", times.shape)
    if not np.isfinite(times).all() or (times.size > 1 and (np.diff(times) < 0).any()):
        # a NaN time is never due: the send loop would spin on it forever
        raise ValidationError("arrivals_s", "finite, non-decreasing times", "NaN, inf or unsorted")
    if not bodies:
        raise ValidationError("bodies", "at least one request body", [])
    times = times - times[0]
    host, port, base = _parse_url(url)
    path = f"{base}/apps/{app}/predict"
    reqs = [_request_bytes(host, port, path, b, token) for b in bodies]
    _raise_fd_limit(max_connections + 64)
    pool = _Pool(host, port, reqs, times.size, on_answer, max_connections)
    await pool.warm(connections)
    if not pool.idle:
        raise ValidationError("url", f"a reachable server at {host}:{port}", "connection refused")
    pool.t0 = pool.clock() + 0.01
    clock = pool.clock
    t0 = pool.t0
    i = 0
    n = times.size
    while i < n:
        now = clock() - t0
        # Fire everything due; sleep only when the next arrival is in the future.
        while i < n and times[i] <= now:
            pool.fire(i)
            i += 1
        if i < n:
            delay = times[i] - (clock() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let responses in even when behind
    pool.finished_sending = True
    if pool.outstanding > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pool.all_done.wait(), drain_timeout_s)
    if pool.outstanding > 0:
        pool.errors["no answer before the drain timeout"] += pool.outstanding
    pool.close()
    # Sends that never happened (connection never opened) count as sent at the end.
    sent = np.where(np.isnan(pool.sent), pool.done, pool.sent)
    return ReplayResult(
        scheduled_s=times,
        sent_s=np.where(np.isnan(sent), times, sent),
        done_s=pool.done,
        status=pool.status,
        default=pool.default,
        slo_s=slo_s,
        error_kinds=dict(pool.errors),
    )


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)


def replay_sync(*args: Any, **kw: Any) -> ReplayResult:
    """``replay`` on a fresh event loop (uvloop when installed)."""
    return _run(replay(*args, **kw))  # type: ignore[no-any-return]


async def closed_loop(
    url: str,
    app: str,
    bodies: Sequence[bytes],
    *,
    concurrency: int = 32,
    duration_s: float = 3.0,
    token: str | None = None,
) -> dict[str, float]:
    """Maximum throughput: ``concurrency`` connections each sending as soon as answered."""
    host, port, base = _parse_url(url)
    path = f"{base}/apps/{app}/predict"
    reqs = [_request_bytes(host, port, path, b, token) for b in bodies]
    cap = 10_000_000
    pool = _Pool(host, port, reqs, cap)
    lat: list[float] = []
    statuses: Counter[int] = Counter()
    counter = 0
    stop_at = 0.0

    def on_answer(i: int, status: int, _body: bytes) -> None:
        nonlocal counter
        statuses[status] += 1
        lat.append(pool.done[i] - pool.sent[i])
        if pool.clock() - pool.t0 < stop_at and counter < cap:
            pool.loop.call_soon(_next)

    def _next() -> None:
        nonlocal counter
        pool.fire(counter)
        counter += 1

    pool.on_answer = on_answer
    await pool.warm(concurrency)
    if not pool.idle:
        raise ValidationError("url", f"a reachable server at {host}:{port}", "connection refused")
    pool.t0 = pool.clock()
    stop_at = duration_s
    for _ in range(concurrency):
        _next()
    await asyncio.sleep(duration_s)
    pool.finished_sending = True
    if pool.outstanding:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pool.all_done.wait(), 10.0)
    elapsed = pool.clock() - pool.t0
    pool.close()
    a = np.asarray(lat)
    return {
        "answered": float(a.size),
        "qps": a.size / elapsed,
        "ok_fraction": statuses.get(200, 0) / max(1, a.size),
        "p50_ms": float(np.percentile(a, 50)) * 1e3 if a.size else float("nan"),
        "p99_ms": float(np.percentile(a, 99)) * 1e3 if a.size else float("nan"),
    }
