"""Recovery and watch loops of a backend over remote servers (Triton, TF Serving).

A *failure domain* is what fails as a whole: Triton's one server (key ``None``), or one of TF
Serving's servers (its ``Endpoint``). When a request finds its server gone, the backend takes
the domain's handles out of the active set and starts one recovery task for the domain (a
second failure while it runs joins it). The task probes the server with growing pauses; once it
answers, the backend restores what it lost (reloads models, publishes fresh handles). Past
``recovery_timeout_s`` the backend either gives up or, with ``_keep_probing_s``, keeps probing
slowly and restores the domain when the server is back, however late.

The watch (``watch_interval_s > 0``) notices between queries what no request did: a server
that stopped answering (two missed probes in a row) or models it no longer runs as they were
loaded; either starts the same recovery.

A backend implements the hooks (``_recovery_pending``, ``_probe``, ``_restore``,
``_overdue``; for the watch ``_watch_wanted``, ``_changed_models``, ``_lose``) and keeps the
protocol out of the loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable

__all__ = ["RecoveryLoops"]

log = logging.getLogger(__name__)


class RecoveryLoops:
    """Recovery tasks by failure domain, and the watch. A mix-in of ``RemoteBackend``."""

    _url: str
    _closed: bool
    recovery_timeout_s: float
    watch_interval_s: float  # 0: no watch
    probe_timeout_s: float = 2.0
    # how recovery waits for a server: first pause, doubled up to the largest one; the pause
    # after a round that raised; past the deadline, the pause between slow probes (None: stop)
    _first_pause_s: float = 0.05
    _max_pause_s: float = 1.0
    _error_pause_s: float = 0.5
    _keep_probing_s: float | None = None
    _failure: type[Exception] = Exception  # what the protocol client raises

    def _init_recovery(self) -> None:
        self._recoveries: dict[Hashable, asyncio.Task[None]] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._outages = 0

    # -- hooks --------------------------------------------------------------------------------

    def _recovery_pending(self, key: Hashable) -> bool:
        """Whether the domain still has something to restore (False ends its recovery)."""
        return True

    async def _probe(self, key: Hashable) -> bool:
        """Whether the domain's server answers now."""
        raise NotImplementedError

    async def _restore(self, key: Hashable) -> bool:
        """The server answers: restore the domain. True when done, False to go round again."""
        raise NotImplementedError

    def _domain_name(self, key: Hashable) -> str:
        """How logs name a failure domain."""
        return "the server" if key is None else str(key)

    def _overdue(self, key: Hashable) -> None:
        """The server stayed away past ``recovery_timeout_s`` (called after each late probe)."""

    def _watch_wanted(self) -> bool:
        """Whether there is anything for the watch to check now."""
        return True

    async def _changed_models(self) -> dict[str, str]:
        """Models the server no longer runs as the backend loaded them, and how."""
        return {}

    def _lose(self, key: Hashable, models: set[str] | None, reason: str) -> None:
        """Take ``models`` (None: all of the domain's) out of service and recover them."""
        raise NotImplementedError

    # -- recovery -----------------------------------------------------------------------------

    def _recovering(self, key: Hashable = None) -> bool:
        task = self._recoveries.get(key)
        return task is not None and not task.done()

    def _begin_recovery(self, key: Hashable, name: str) -> bool:
        """Start the domain's recovery task unless one runs (then False: it will see the
        new failure). Counts an outage."""
        if self._closed or self._recovering(key):
            return False
        self._outages += 1
        self._recoveries[key] = asyncio.get_running_loop().create_task(
            self._recovery_loop(key), name=name
        )
        return True

    async def _join_recovery(self, key: Hashable = None) -> None:
        """Wait for the domain's recovery, starting one if none runs."""
        if not self._recovering(key):
            self._recoveries[key] = asyncio.get_running_loop().create_task(self._recovery_loop(key))
        await asyncio.shield(self._recoveries[key])

    async def _recovery_loop(self, key: Hashable) -> None:
        deadline = time.monotonic() + self.recovery_timeout_s
        pause = self._first_pause_s
        while not self._closed:
            if not self._recovery_pending(key):
                return
            ready = paused = False
            try:
                ready = await self._probe(key)
                if ready and await self._restore(key):
                    return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("recovering %s of %s: %s", self._domain_name(key), self._url, e)
                await asyncio.sleep(self._error_pause_s)
                paused = True
            if time.monotonic() > deadline:
                self._overdue(key)
                if self._keep_probing_s is None:
                    return
                await asyncio.sleep(self._keep_probing_s)
            elif not (ready or paused):
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._max_pause_s)

    # -- watch --------------------------------------------------------------------------------

    def _start_watch(self) -> None:
        if self._closed or self.watch_interval_s <= 0:
            return
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"inferline-watch-{self._url}"
            )

    async def _watch(self) -> None:
        misses = 0
        while not self._closed:
            await asyncio.sleep(self.watch_interval_s)
            if self._closed or self._recovering(None):
                misses = 0  # recovery is already on it
                continue
            if not self._watch_wanted():
                continue
            if not await self._probe(None):
                # one slow answer under load is not an outage; two in a row are (a stopped
                # or hung server accepts connections but answers nothing)
                misses += 1
                if misses >= 2:
                    misses = 0
                    self._lose(None, None, "the server missed two health checks")
                continue
            misses = 0
            try:
                changed = await self._changed_models()
            except self._failure as e:
                log.debug("watch of %s: %s", self._url, e)
                continue
            if changed:
                self._lose(None, set(changed), "; ".join(f"{n}: {w}" for n, w in changed.items()))

    # -- close --------------------------------------------------------------------------------

    async def _stop_loops(self) -> None:
        """Cancel the watch and every recovery, and wait for them."""
        for task in [self._watch_task, *self._recoveries.values()]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
