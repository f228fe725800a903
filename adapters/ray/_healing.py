"""How the ``ray://`` backend heals: node table watch, lost replicas, replacements, shortfalls.

``Healing`` is a mixin of ``RayBackend`` (kept apart to keep each module to one concern): it
reads Ray's node table every ``watch_interval_s`` (a lost node fails its replicas, a joined
node grows the inventory and fills shortfalls), pings every replica (missed pings make it
lost), and replaces a lost replica on a node with room, or records it as the model's
shortfall when none has. ``Slot`` and ``ModelRecord`` are the backend's bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayError

from inferline.adapters._slots import ModelRecord, SlotKeeper
from inferline.adapters._slots import Slot as BaseSlot
from inferline.core import CapacityError

from .._supervised import ACTIVE, DRAINING, STARTING
from ._cluster import read_nodes
from ._handle import RayReplica, ray_reason
from ._table import NodeTable

__all__ = ["Healing", "ModelRecord", "Slot"]

log = logging.getLogger(__name__)


@dataclass
class Slot(BaseSlot):
    unplaced: bool = False  # lost and no node has room: the model's shortfall


class Healing(SlotKeeper):
    """The self-repair half of ``RayBackend`` (see the module docstring). The backend keeps
    the attributes below and implements ``_new_replica``, ``_launch`` and ``_stop_actor``."""

    _models: dict[str, ModelRecord]
    _table: NodeTable
    _lost: list[dict[str, Any]]
    _watch_task: asyncio.Task[None] | None
    watch_interval_s: float
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    heartbeat_misses: int
    busy_heartbeat_misses: int

    def _new_replica(self, m: ModelRecord, s: Slot, node: str) -> RayReplica:
        raise NotImplementedError

    async def _launch(self, m: ModelRecord, s: Slot, r: RayReplica) -> RayReplica:
        raise NotImplementedError

    def _stop_actor(self, r: RayReplica) -> None:
        raise NotImplementedError

    # -- node table -------------------------------------------------------------------------

    def _refresh_if_stale(self) -> None:
        watching = self._watch_task is not None and not self._watch_task.done()
        stale = time.monotonic() - self._table.read_at > self.watch_interval_s
        if stale and not watching and not self._closed:
            with contextlib.suppress(RayError, RuntimeError, ConnectionError):
                self._apply_nodes(read_nodes())

    async def _refresh_nodes(self) -> None:
        raw = await asyncio.to_thread(read_nodes)
        if not self._closed:
            self._apply_nodes(raw)

    def _apply_nodes(self, raw: list[dict[str, Any]]) -> None:
        joined, lost = self._table.apply(raw)
        for nid in joined:
            log.info("Ray node %s joined: inventory now %s", nid[:8], self._table.totals())
        for nid in lost:
            self._node_lost(nid)

    def _node_lost(self, nid: str) -> None:
        victims = [
            s.replica
            for m in self._models.values()
            for s in m.slots
            if s.replica is not None and s.replica.node == nid and not s.replica.died.done()
        ]
        reason = f"node {nid[:8]} lost"
        # replicas whose actor call failed first (a batch in flight notices before the table)
        recent = [
            d
            for m in self._models.values()
            for d in m.retired
            if d.get("node") == nid and d.get("state") == "dead" and "lost" not in d["death_reason"]
        ]
        for d in recent:
            d["death_reason"] = f"{reason} ({d['death_reason']})"
        ids = [r.id for r in victims] + [d["id"] for d in recent]
        self._lost.append({"node": nid, "at": time.time(), "replicas": ids})
        log.warning("Ray node %s lost with %d replica(s)", nid[:8], len(ids))
        for r in victims:
            self._replica_failed(r, reason)
        self._table.forget(nid)

    def _plan(self, m: ModelRecord, count: int, only: str | None = None) -> list[str]:
        """Node ids for ``count`` new replicas of ``m``, on node ``only`` alone when given
        (``CapacityError`` if they do not fit)."""
        existing = Counter(
            s.replica.node
            for s in m.slots
            if s.replica is not None and s.replica.state in (STARTING, ACTIVE)
        )
        return self._table.plan(
            m.spec.name, m.config.hardware, m.spec.threads, count, existing, only
        )

    def _lost_summary(self) -> str:
        if not self._lost:
            return "replicas failed and no node has room"
        last = self._lost[-1]
        return f"node {last['node'][:8]} was lost ({len(self._lost)} node(s) lost so far)"

    def _replica_failed(self, r: RayReplica, reason: str) -> None:
        """``r`` is gone (actor dead, node lost, unresponsive): out of the active set, its
        in-flight batch failed, subscribers told, a replacement started."""
        if r.died.done():
            return
        was_active = r.state == ACTIVE
        r.mark_dead(reason)
        self._stop_actor(r)
        m = self._models.get(r.model)
        if m is None or self._closed:
            return
        m.retired.append(r.describe())
        if not was_active:
            return  # starting: its launch fails; draining: it was leaving anyway
        log.warning("replica %s of %r on node %s lost: %s", r.id, r.model, r.node[:8], reason)
        self._notify(r.model)
        s = next((s for s in m.slots if s.replica is r), None)
        if s is not None and (s.restart_task is None or s.restart_task.done()):
            s.restart_task = asyncio.get_running_loop().create_task(
                self._restart(m, s), name=f"restart-{r.id}"
            )

    async def _restart(self, m: ModelRecord, s: Slot) -> None:
        """Replace slot ``s``'s replica on a node with room; record a shortfall if none has."""
        delay = 0.0
        while not self._closed and s in m.slots:
            if delay:
                await asyncio.sleep(delay)
            try:
                await self._refresh_nodes()
                [node] = self._plan(m, 1)
            except CapacityError as e:
                if not s.unplaced:
                    log.warning(
                        "model %r is short a replica: %s (filled when capacity returns; "
                        "scale() reports it)",
                        m.spec.name,
                        e,
                    )
                s.unplaced, s.replica = True, None
                return
            except (RayError, ConnectionError, RuntimeError) as e:
                s.failures += 1
                log.warning("cannot read the Ray node table: %s", e)
                delay = min(10.0, 0.2 * 2**s.failures)
                continue
            s.unplaced = False
            r = self._new_replica(m, s, node)
            try:
                await self._launch(m, s, r)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                backoff = self._start_failed(m, s, e, "replacement")
                if backoff is None:
                    return
                delay = backoff
                continue
            self._started(m, s)
            return

    # -- health -----------------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(), name="ray-node-watch"
            )

    async def _watch(self) -> None:
        """Read the node table every ``watch_interval_s``: lost nodes fail their replicas,
        joined nodes grow the inventory and fill shortfalls."""
        while not self._closed:
            await asyncio.sleep(self.watch_interval_s)
            try:
                await self._refresh_nodes()
            except (RayError, ConnectionError, RuntimeError) as e:
                log.warning("cannot read the Ray node table: %s", e)
                continue
            try:
                self._fill_shortfalls()
            except Exception:  # the watch must outlive a bug in one model's bookkeeping
                log.exception("filling shortfalls failed")

    def _fill_shortfalls(self) -> None:
        for m in list(self._models.values()):
            for s in m.slots:
                if not s.unplaced or (s.restart_task is not None and not s.restart_task.done()):
                    continue
                try:
                    self._plan(m, 1)
                except CapacityError:
                    break  # nothing fits this model yet
                s.restart_task = asyncio.get_running_loop().create_task(
                    self._restart(m, s), name=f"fill-{m.spec.name}-{s.index}"
                )
                break  # one per model per tick: the next tick sees the new holdings

    async def _heartbeat(self, r: RayReplica) -> None:
        while r.state in (ACTIVE, DRAINING) and not r.died.done():
            await asyncio.sleep(self.heartbeat_interval_s)
            if r.state not in (ACTIVE, DRAINING) or r.died.done():
                return
            try:
                ok = await r.ping(self.heartbeat_timeout_s)
            except RayError as e:
                self._replica_failed(r, f"heartbeat: {ray_reason(e)}")
                return
            if ok:
                r.answered_ping()
                continue
            if r.missed_ping(self.heartbeat_misses, self.busy_heartbeat_misses):
                self._replica_failed(r, f"missed {r.heartbeat_misses} heartbeats")
                return
