"""Slow-loris clients: a request's headers, then its body, must arrive within the read timeout
(408 and the connection closed); the time the app takes to answer is not limited."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
from _served_app import served
from fastapi import APIRouter, Request

from inferline.server import App, Service, create_app

TIMEOUT_S = 0.5


async def _slow_echo(x, slo):
    await asyncio.sleep(2 * TIMEOUT_S)  # slower than the read timeout: must still answer
    return x


def _body_router() -> APIRouter:
    r = APIRouter()

    @r.post("/echo-body")
    async def echo_body(request: Request) -> dict:
        return {"n": len(await request.body())}

    return r


@pytest.fixture()
def server():
    app = create_app(Service([App("slow", _slow_echo, 5.0)]), routers=[_body_router()])
    with served(app, read_timeout_s=TIMEOUT_S) as port:
        yield port


def _read_until_closed(s: socket.socket, limit_s: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    t0 = time.monotonic()
    s.settimeout(limit_s)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _assert_408(got: bytes, what: str) -> None:
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got
    assert b"connection: close" in head.lower()
    assert b'"error": "RequestTimeout"' in body and what.encode() in body


def test_a_connection_that_sends_nothing_is_closed_with_408(server):
    with _connect(server) as s:
        got, took = _read_until_closed(s)
    _assert_408(got, "headers")
    assert TIMEOUT_S * 0.8 < took < TIMEOUT_S + 2


def test_headers_sent_a_byte_at_a_time_are_cut_off(server):
    with _connect(server) as s:
        t0 = time.monotonic()
        req = b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-slow: " + b"a" * 1000
        sent = 0
        with pytest.raises(OSError):  # the server closes while the client still drips
            while time.monotonic() - t0 < TIMEOUT_S + 3:
                s.sendall(req[sent : sent + 1])
                sent += 1
                time.sleep(0.05)
        assert time.monotonic() - t0 < TIMEOUT_S + 2.5


@pytest.mark.parametrize("path", ["/apps/slow/predict", "/echo-body"])
def test_a_body_that_never_arrives_gets_408_and_no_traceback(server, path, caplog):
    caplog.set_level(logging.ERROR)
    with _connect(server) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f'content-length: 100\r\n\r\n{{"input"'.encode()
        )
        got, took = _read_until_closed(s)
    _assert_408(got, "body")
    assert took < TIMEOUT_S + 2
    time.sleep(0.1)  # let the app task see the disconnect
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_keep_alive_connections_next_request_has_its_own_deadline(server):
    with _connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        s.settimeout(5)
        first = b""
        while b"\r\n\r\n" not in first:  # the head and body may come in separate segments
            first += s.recv(65536)
        head, _, body = first.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(
            next(
                ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
            ).split(b":")[1]
        )
        while len(body) < length:
            body += s.recv(65536)
        time.sleep(TIMEOUT_S * 1.5)  # idle between requests is keep-alive's business (30 s)
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n")  # headers never finish
        got, took = _read_until_closed(s)
    _assert_408(got, "headers")
    assert took < TIMEOUT_S + 2


def test_slow_answers_are_not_cut_off_and_others_are_served_meanwhile(server):
    stalled = [_connect(server) for _ in range(20)]  # slow-loris connections, all at once
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=10) as c:
            r = c.post("/apps/slow/predict", json={"input": [1, 2]})  # takes 2x the timeout
            assert r.status_code == 200 and r.json()["output"] == [1, 2]
            r = c.post(
                "/echo-body", content=b"x" * 5000, headers={"content-type": "application/json"}
            )
            assert r.json() == {"n": 5000}
        for s in stalled:
            got, _ = _read_until_closed(s)
            _assert_408(got, "headers")
    finally:
        for s in stalled:
            s.close()
