"""The handle of a replica its backend starts and watches itself: a local process, a Ray actor.

``SupervisedReplica`` holds what both bundled runtimes track the same way: the life cycle
(starting -> active -> (draining -> stopped) | dead), the future that resolves the moment the
replica is known to be gone (every in-flight call races against it), the batches in flight, the
heartbeat bookkeeping and the fields of ``describe()``. A subclass adds its transport (gRPC
channel, actor handle) and where it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from inferline.core.protocols import ReplicaBase

__all__ = ["ACTIVE", "DEAD", "DRAINING", "STARTING", "STOPPED", "SupervisedReplica"]

log = logging.getLogger(__name__)

# Replica life cycle: starting -> active -> (draining -> stopped) | dead.
STARTING, ACTIVE, DRAINING, STOPPED, DEAD = "starting", "active", "draining", "stopped", "dead"

# the replica's own counters (from its last ``info()``) that ``describe()`` reports
_STAT_KEYS = (
    "batches",
    "items",
    "batch_errors",
    "service_mean_s",
    "service_p50_s",
    "service_p99_s",
    "service_max_s",
)


class SupervisedReplica(ReplicaBase):
    """Life cycle, death, in-flight count and heartbeat of a replica its backend supervises.

    Must be created inside the backend's event loop (``died`` is a future of that loop).
    """

    def __init__(self, model: str, rid: str, hardware: str) -> None:
        super().__init__(model, rid, hardware)
        self.state = STARTING
        self.pid = 0
        self.spawned_at = time.time()  # wall clock, for reports only
        self.activation_delay_s: float | None = None
        self.load_s: float | None = None
        self.death_reason = ""
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        # Resolved (with a reason) the moment the replica is known to be gone; every in-flight
        # call races against it, so a kill -9 or a lost node fails the batch at once.
        self.died: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.tasks: list[asyncio.Task[Any]] = []
        self.heartbeat_misses = 0
        self.last_heartbeat_mono: float | None = None
        # missed as many pings in a row as an idle replica may (it may still be inside a
        # long batch): /healthz does not count it as serving until it answers again
        self.unresponsive = False
        self.last_stats: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        return self.state in (ACTIVE, DRAINING) and not self.died.done()

    def mark_dead(self, reason: str) -> None:
        if not self.died.done():
            self.died.set_result(reason)
        if self.state != STOPPED:
            self.state = DEAD
        self.death_reason = self.death_reason or reason

    def answered_ping(self) -> None:
        self.heartbeat_misses, self.unresponsive = 0, False
        self.last_heartbeat_mono = time.monotonic()

    def missed_ping(self, misses: int, busy_misses: int) -> bool:
        """Count a missed ping; True once the replica should be given up on.

        A container inside a long native call may hold the GIL and starve the ping without
        being hung, so a replica with a batch in flight gets ``busy_misses`` instead."""
        self.heartbeat_misses += 1
        self.unresponsive = self.heartbeat_misses >= misses
        limit = busy_misses if self.inflight else misses
        log.warning(
            "replica %s missed heartbeat %d/%d%s",
            self._id,
            self.heartbeat_misses,
            limit,
            " (busy)" if self.inflight else "",
        )
        return self.heartbeat_misses >= limit

    def _where(self) -> dict[str, Any]:
        """Where the replica runs, for ``describe()`` (cores, node, ...)."""
        return {}

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self._id, "state": self.state}
        d |= self._where()
        d |= {
            "pid": self.pid,
            "hardware": self._hardware,
            "spawned_at": self.spawned_at,
            "activation_delay_s": self.activation_delay_s,
            "load_s": self.load_s,
            "inflight": self.inflight,
        }
        if self.last_heartbeat_mono is not None:
            d["heartbeat_age_s"] = time.monotonic() - self.last_heartbeat_mono
        for k in _STAT_KEYS:
            d[k] = self.last_stats.get(k)
        if self.death_reason:
            d["death_reason"] = self.death_reason
        return d
