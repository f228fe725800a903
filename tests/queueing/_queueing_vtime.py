"""An event loop on virtual time for the queue tests (own module name: several test folders have a conftest.py, so `from conftest import` is ambiguous).

``VirtualTimeLoop`` is a real asyncio selector loop whose clock jumps to the next timer when
nothing is runnable, so ``asyncio.sleep(0.25)`` takes no wall time and every timestamp is
exact. The dispatcher, the replicas and the pipelines run unchanged on it; only time is
virtual, which makes latencies comparable with the estimator to the last bit.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._real = real
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing runnable and no timer: only real I/O can help
            ready = self._real.select(0.2)
            if not ready:
                raise RuntimeError("virtual-time loop: nothing scheduled (deadlock)")
            return ready
        # jump exactly to the earliest timer (not now + timeout: keep times bit-exact)
        self._loop.advance_to(self._loop._scheduled[0]._when)  # type: ignore[attr-defined]
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._vt = 0.0
        self._clock_resolution = 1e-12
        self._selector = _VirtualSelector(self._selector, self)  # type: ignore[has-type]

    def time(self) -> float:
        return self._vt

    def advance_to(self, t: float) -> None:
        self._vt = max(self._vt, t)


def run_virtual(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``coro_fn()`` to completion on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro_fn())
