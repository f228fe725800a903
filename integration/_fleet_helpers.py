"""What the fleet tests share (``tests/adapters/test_fleet*.py``, ``integration/test_fleet*.py``):
an open-loop load that records every query's outcome, a backend and dispatcher closed after a
test's body, a wait on a condition, and two harness Triton servers over copies of the digits
repository."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inferline.core import InferlineError
from inferline.queueing import Dispatcher

__all__ = ["OpenLoad", "Outcome", "serve_with", "two_triton_servers", "until"]


@dataclass(frozen=True)
class Outcome:
    """One query of an ``OpenLoad``: ``kind`` "ok" (``value`` the answer), "error" (an
    ``InferlineError``, the explicit failure) or "other" (anything else: a bug, asserted on)."""

    kind: str
    i: int
    value: Any
    submitted: float
    answered: float


class OpenLoad:
    """Open-loop queries to ``model``, one every ``gap_s`` from ``start()`` to ``finish()``:
    query ``i`` submits ``make_input(i)`` with a deadline ``deadline_s`` ahead; each outcome
    lands once in ``out``."""

    def __init__(
        self,
        d: Any,
        model: str,
        make_input: Callable[[int], Any] = lambda i: i,
        *,
        gap_s: float = 0.005,
        deadline_s: float = 10.0,
    ) -> None:
        self.d, self.model, self.make_input = d, model, make_input
        self.gap_s, self.deadline_s = gap_s, deadline_s
        self.out: list[Outcome] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self._loader: asyncio.Task[None] | None = None

    async def _one(self, i: int) -> None:
        t = time.monotonic()
        try:
            value = await self.d.submit(
                self.model, self.make_input(i), deadline=t + self.deadline_s
            )
            kind = "ok"
        except InferlineError as e:
            value, kind = e, "error"
        except BaseException as e:  # recorded, so that the test's check names it
            value, kind = e, "other"
        self.out.append(Outcome(kind, i, value, t, time.monotonic()))

    async def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            self.tasks.append(asyncio.create_task(self._one(i)))
            i += 1
            await asyncio.sleep(self.gap_s)

    def start(self) -> None:
        self._loader = asyncio.create_task(self._run())

    async def finish(self, timeout_s: float) -> None:
        """Stop submitting and wait (at most ``timeout_s``) for every query's outcome."""
        assert self._loader is not None, "finish() before start()"
        self.stop.set()
        await self._loader
        await asyncio.wait_for(asyncio.gather(*self.tasks), timeout_s)

    def failed(self) -> list[Outcome]:
        return [o for o in self.out if o.kind != "ok"]


async def serve_with(backend: Any, body: Callable[[Any, Dispatcher], Awaitable[None]]) -> None:
    """``body(backend, d)`` with a new ``Dispatcher`` ``d``; both closed after, whatever
    ``body`` raised."""
    d = Dispatcher()
    try:
        await body(backend, d)
    finally:
        await d.close()
        await backend.close()


async def until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def two_triton_servers(
    root: Path, make: Callable[..., Any] | None = None, **server_kw: Any
) -> Iterator[tuple[Any, Any, Any]]:
    """Two harness Triton servers (``root/a``, ``root/b``) over copies of the digits
    repository, started together; yields both and the held-out ``Digits``, kills both after
    (a graceful stop takes seconds; nothing is left to save). ``make(install, models, log_path,
    index)`` builds each server (default ``TritonServer(..., **server_kw)``). Skips the test
    where no Triton server can be had."""
    from triton_harness import SetupError, TritonServer, build_repository, ensure_installed

    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    digits = build_repository(root / "a" / "models")
    shutil.copytree(root / "a" / "models", root / "b" / "models")
    if make is None:
        make = lambda inst, models, log, _: TritonServer(inst, models, log_path=log, **server_kw)  # noqa: E731
    servers = [
        make(install, root / x / "models", root / x / "triton.log", k) for k, x in enumerate("ab")
    ]
    try:
        with ThreadPoolExecutor(2) as pool:  # the two starts overlap
            list(pool.map(lambda s: s.start(), servers))
        yield servers[0], servers[1], digits
    finally:
        for s in servers:
            s.kill()
