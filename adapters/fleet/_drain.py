"""Draining a fleet member for an upgrade (docs/fleets.md, "Drain for upgrades"):
``drain(server)`` withdraws its handles from every model's published set (no new batches;
those in flight finish) and ``wait_drained`` says when the last one is done;
``undrain(server)`` publishes them again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["Draining"]

log = logging.getLogger(__name__)


class Draining:
    """The ``FleetBackend`` half that drains members (mixed in)."""

    _urls: list[str]
    _models: dict[str, Any]
    _draining: set[int]
    _gone: set[int]
    _flight: dict[int, int]
    _idle: dict[int, asyncio.Event]
    server_index: Callable[[str], int]
    _notify: Callable[[str], None]

    # -- drain --------------------------------------------------------------------------------

    def drain(self, server: str) -> dict[str, Any]:
        """Stop sending new batches to ``server``: its handles leave every model's published
        set at once; batches in flight there finish. Returns ``drain_status(server)``."""
        i = self.server_index(server)
        if i not in self._draining:
            self._draining.add(i)
            log.info("fleet: draining %s (%d batch(es) in flight)", server, self._flight[i])
            for model in list(self._models):
                self._notify(model)
        return self.drain_status(server)

    def undrain(self, server: str) -> dict[str, Any]:
        """Send batches to ``server`` again: its handles are published again."""
        i = self.server_index(server)
        if i in self._draining:
            self._draining.discard(i)
            log.info("fleet: %s takes batches again", server)
            for model in list(self._models):
                self._notify(model)
        return self.drain_status(server)

    def drain_status(self, server: str | None = None) -> dict[str, Any]:
        """Per server (or one): draining or not, batches in flight, and ``empty`` (draining
        and nothing in flight: safe to stop)."""
        if server is not None:
            i = self.server_index(server)
            return {
                "server": server,
                "draining": i in self._draining,
                "in_flight": self._flight[i],
                "empty": i in self._draining and self._flight[i] == 0,
            }
        return {
            "servers": [
                self.drain_status(u) for i, u in enumerate(self._urls) if i not in self._gone
            ]
        }

    async def wait_drained(self, server: str, timeout_s: float) -> bool:
        """Wait until ``server`` has no batch in flight (True) or ``timeout_s`` passed."""
        i = self.server_index(server)
        if self._flight[i] == 0:
            return True
        try:
            await asyncio.wait_for(self._idle[i].wait(), timeout_s)
            return True
        except TimeoutError:
            return False
