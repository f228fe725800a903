"""``RayBackend`` (``ray://HOST:PORT``): the bundled containers as Ray actors across a cluster.

Each replica is one actor (``_actor.ReplicaActor``) asking Ray for ``num_cpus`` = the model's
threads, plus ``num_gpus=1`` and one unit of the kind's custom resource on a GPU kind
(``{"gpu-v100": 1}``), so it lands only on a node that declares that kind. The backend picks
the node itself (spread by default, packed with ``placement="pack"``) from Ray's node table and
what it already holds there, and pins the actor to it (``NodeAffinitySchedulingStrategy``, not
soft), so a request that does not fit is a ``CapacityError`` at once instead of an actor
pending forever.

Batches below ``object_store_min_bytes`` (768 KiB by default, the measured crossover) go
straight to the replica service's gRPC port inside the actor (``_direct``), past Ray's task
path; larger ones through the actor call and Ray's object store. Ray still places, starts,
pings and replaces the actors.

Ray's own retries are off (``max_restarts=0``, ``max_task_retries=0``): retries belong to the
dispatcher, which knows deadlines. A dead actor or a lost node fails the in-flight batch with
``ReplicaError`` (the dispatcher retries it on another replica); the backend drops the replica
from the active set, tells subscribers and starts a replacement on a surviving node. Where no
node has room the shortfall is recorded (``stats()["shortfall"]``), filled when capacity
returns (a node joins), and reported by the next ``scale()`` as a ``CapacityError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import ray

from inferline.adapters._subscribers import ReplicaSubscribers
from inferline.core import (
    DEFAULT_CATALOG,
    BackendError,
    CapacityError,
    HardwareCatalog,
    ModelConfig,
    ModelSpec,
    ValidationError,
)

from .._slots import check_source
from .._supervised import ACTIVE, DRAINING, STARTING, STOPPED
from ._actor import ReplicaActor
from ._address import parse_address
from ._cluster import connect, disconnect, read_nodes
from ._direct import close_soon, wait_closed
from ._handle import RayReplica
from ._healing import Healing, ModelRecord, Slot
from ._nodes import PLACEMENTS, NodeInfo
from ._table import NodeTable

__all__ = ["OBJECT_STORE_MIN_BYTES", "RayBackend"]

# Batches below this many bytes go to the actor's gRPC port, larger ones through Ray's object
# store: the crossover measured with `benchmarks/ray_scaleout.py --crossover` (README.md).
OBJECT_STORE_MIN_BYTES = 768 << 10

log = logging.getLogger(__name__)

_RemoteReplica = ray.remote(max_restarts=0, max_task_retries=0)(ReplicaActor)


class RayBackend(Healing):
    """Replicas as Ray actors. All methods must be called from one asyncio event loop.

    Args:
        url: ``ray://HOST:PORT`` (the GCS address) or ``ray://auto`` (``RAY_ADDRESS``).
        placement: ``"spread"`` (each new replica on the node with the fewest replicas of
            its model) or ``"pack"`` (fill one node before the next).
        namespace: the Ray namespace the driver joins when this backend connects.
        catalog: hardware catalog used to tell GPU kinds from others (default: the project's).
        kinds: extra custom resource names to treat as hardware kinds (``gpu-*`` and
            ``cpu-*`` names and the catalog's names always are).
        watch_interval_s: how often the node table is read (node loss, nodes joining,
            shortfalls to fill).
        heartbeat_interval_s, heartbeat_timeout_s, heartbeat_misses, busy_heartbeat_misses:
            the actor ping; that many misses in a row (more while a batch runs) and the
            replica is treated as lost (its actor is killed and replaced).
        start_timeout_s: how long an actor may take from creation to a loaded container.
        drain_timeout_s: how long scale-down waits for an in-flight batch.
        max_start_failures: consecutive failed replacements of a slot before giving up.
        max_concurrency: actor threads (one batch at a time, plus pings and stats).
        log_to_driver: forward the actors' stdout/stderr to this process (when it connects).
        object_store_min_bytes: a batch of fewer bytes than this (array data, strings; see
            ``_values.payload_bytes``) goes straight to the actor's gRPC port, a larger one
            through Ray's object store (``OBJECT_STORE_MIN_BYTES`` by default, the measured
            crossover). 0: every batch through Ray, and the actors serve no gRPC port.
        max_message_bytes: the gRPC message limit of that port (both directions); an answer
            past it is fetched again through Ray.
    """

    def __init__(
        self,
        url: str = "ray://auto",
        *,
        placement: str = "spread",
        namespace: str = "inferline",
        catalog: HardwareCatalog | None = None,
        kinds: Iterable[str] = (),
        watch_interval_s: float = 0.5,
        heartbeat_interval_s: float = 0.5,
        heartbeat_timeout_s: float = 2.0,
        heartbeat_misses: int = 4,
        busy_heartbeat_misses: int = 20,
        start_timeout_s: float = 60.0,
        drain_timeout_s: float = 60.0,
        max_start_failures: int = 5,
        max_concurrency: int = 4,
        log_to_driver: bool = False,
        object_store_min_bytes: int = OBJECT_STORE_MIN_BYTES,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        if placement not in PLACEMENTS:
            raise ValidationError("placement", f"one of {list(PLACEMENTS)}", placement)
        for name, v in (
            ("object_store_min_bytes", object_store_min_bytes),
            ("max_message_bytes", max_message_bytes),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValidationError(name, "an integer >= 0 (bytes)", v)
        self.object_store_min_bytes = object_store_min_bytes
        self.max_message_bytes = max_message_bytes
        # the secret every call to the actors' gRPC ports must carry (they listen on the
        # nodes' IPs, reachable from the cluster's network)
        self._token = secrets.token_urlsafe(24)
        self._url = url
        self._address = parse_address(url)
        self._table = NodeTable(
            catalog if catalog is not None else DEFAULT_CATALOG, kinds, placement
        )
        self.watch_interval_s = watch_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.heartbeat_misses = heartbeat_misses
        self.busy_heartbeat_misses = max(busy_heartbeat_misses, heartbeat_misses)
        self.start_timeout_s = start_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.max_start_failures = max_start_failures
        self.max_concurrency = max_concurrency
        self._models: dict[str, ModelRecord] = {}
        self._subscribers = ReplicaSubscribers()
        self._closed = False
        self._ids = itertools.count()
        self._lost: list[dict[str, Any]] = []
        self._watch_task: asyncio.Task[None] | None = None
        self._owns = connect(self._address, namespace, log_to_driver)
        try:
            self._apply_nodes(read_nodes())
        except BaseException:
            self._release_connection()
            raise

    # -- views ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def address(self) -> str:
        """The GCS address this backend's cluster answers on."""
        return str(ray.get_runtime_context().gcs_address)

    @property
    def placement(self) -> str:
        return self._table.placement

    def nodes(self) -> list[NodeInfo]:
        """Every node the cluster has had, alive first: capacity and what is free, by catalog
        name (the planner's per-node inventory)."""
        self._refresh_if_stale()
        return self._table.nodes()

    def inventory(self) -> dict[str, int]:
        """Totals over the alive nodes by catalog name (``{"cpu": 12, "gpu-v100": 2}``)."""
        self._refresh_if_stale()
        return self._table.totals("hardware")

    def free(self) -> dict[str, int]:
        """What this backend has not allocated on the alive nodes, by catalog name."""
        self._refresh_if_stale()
        return self._table.totals("free")

    # -- node table -------------------------------------------------------------------------

    # -- deploy / scale / remove ------------------------------------------------------------

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        """Start ``config.replicas`` actors of ``spec`` on ``config.hardware``; returns once
        every container has loaded."""
        self._check_open()
        if spec.name in self._models:
            raise ValidationError(
                "model", "a model that is not deployed yet (use scale() or remove())", spec.name
            )
        check_source(spec)
        await self._refresh_nodes()
        m = ModelRecord(spec, config)
        nodes = self._plan(m, config.replicas)
        self._models[spec.name] = m
        self._ensure_watch()
        try:
            await self._start_slots(m, nodes)
        except BaseException:
            self._models.pop(spec.name, None)
            await self._stop_all_slots(m)
            self._notify(spec.name)
            raise

    async def scale(self, model: str, replicas: int, *, node: str | None = None) -> None:
        """Grow or shrink ``model`` to ``replicas``. New actors join the active set when
        loaded; removed ones leave it at once and stop after their in-flight batch. Replicas
        lost earlier and not yet replaced count as missing: if they still do not fit, this
        raises ``CapacityError`` naming the shortfall.

        ``node`` (a node id): the new replicas all go to that node, whatever the placement
        (the profiler's contending replicas share the measured replica's machine); a
        ``CapacityError`` if they do not fit there."""
        self._check_open()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        if node is not None and (not isinstance(node, str) or not node):
            raise ValidationError("node", "a node id of the cluster (NodeInfo.node_id)", node)
        m = self._get(model)
        self._retry_given_up(m)
        m.config = ModelConfig(m.config.hardware, m.config.max_batch_size, replicas)
        if replicas < len(m.slots):

            def order(s: Slot) -> tuple[int, int]:
                # unplaced first, then not serving (starting, restarting), then the newest
                serving = s.replica is not None and s.replica.state == ACTIVE
                return (0 if s.unplaced else 1 if not serving else 2, -s.index)

            victims = sorted(m.slots, key=order)[: len(m.slots) - replicas]
            for s in victims:
                m.slots.remove(s)
            self._notify(model)
            await asyncio.gather(*(self._retire_slot(m, s) for s in victims))
        unplaced = [
            s for s in m.slots if s.unplaced and (s.restart_task is None or s.restart_task.done())
        ]
        need = len(unplaced) + replicas - len(m.slots)
        if need <= 0:
            return
        await self._refresh_nodes()
        try:
            nodes = self._plan(m, need, node)
        except CapacityError as e:
            if unplaced:
                raise CapacityError(
                    f"model {model!r} is short {len(unplaced)} replica(s) since "
                    f"{self._lost_summary()}; {e}",
                    e.free,
                ) from None
            raise
        for s in unplaced:
            m.slots.remove(s)
        try:
            await self._start_slots(m, nodes)
        except BaseException:
            m.slots.extend(unplaced)
            raise

    async def _start_slots(self, m: ModelRecord, nodes: list[str]) -> None:
        slots, reps = [], []
        for node in nodes:  # hold the resources now, before any await, so plans never overlap
            s = Slot(m.next_index)
            m.next_index += 1
            slots.append(s)
            reps.append(self._new_replica(m, s, node))
        m.slots.extend(slots)
        await self._start_all(
            m, slots, [self._launch(m, s, r) for s, r in zip(slots, reps, strict=True)]
        )

    async def _retire_slot(self, m: ModelRecord, s: Slot) -> None:
        await self._cancel_restart(s)
        if s.replica is not None:
            await self._drain_and_stop(m, s.replica)

    # -- actors -----------------------------------------------------------------------------

    def _new_replica(self, m: ModelRecord, s: Slot, node: str) -> RayReplica:
        name = m.spec.name
        r = RayReplica(
            self._url,
            name,
            f"{name}-{next(self._ids)}",
            m.config.hardware,
            node,
            self._table.demand(m.config.hardware, m.spec.threads),
            self._replica_failed,
            self._table.address_of(node),
        )
        r.object_store_min_bytes = self.object_store_min_bytes
        s.replica = r
        self._table.hold(node, r.demand)
        return r

    async def _launch(self, m: ModelRecord, s: Slot, r: RayReplica) -> RayReplica:
        """Start ``r``'s actor on its node, wait for its container, make it active."""
        name = m.spec.name
        cfg = {
            "model": name,
            "replica": r.id,
            "source": m.spec.source,
            "params": dict(m.spec.params),
            "threads": m.spec.threads,
            "gpu": r.demand.gpus > 0,
            "max_message_bytes": self.max_message_bytes,
        }
        if self.object_store_min_bytes > 0:  # some batches take the gRPC port
            cfg["token"] = self._token
        t0 = time.monotonic()
        try:
            await r.start(_RemoteReplica, cfg, self.max_concurrency, self.start_timeout_s)
        except BaseException:
            if r.state != STOPPED:
                r.state = STOPPED
            r.mark_dead(r.death_reason or "failed to start")
            self._stop_actor(r)
            raise
        r.activation_delay_s = time.monotonic() - t0
        r.last_heartbeat_mono = time.monotonic()
        if r.died.done() or self._closed or s not in m.slots or s.replica is not r:
            r.state = STOPPED
            self._stop_actor(r)
            raise BackendError(self._url, f"replica {r.id} of {name!r} was stopped while starting")
        r.state = ACTIVE
        log.info(
            "replica %s of %r ready on node %s (%s), pid %d, activation delay %.3f s (load %.3f s)",
            r.id,
            name,
            r.node[:8],
            r.address,
            r.pid,
            r.activation_delay_s,
            r.load_s,
        )
        r.tasks.append(asyncio.create_task(self._heartbeat(r), name=f"heartbeat-{r.id}"))
        self._notify(name)
        return r

    def _stop_actor(self, r: RayReplica) -> None:
        """Kill ``r``'s actor (if any) and give its resources back. Never raises."""
        for t in r.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        close_soon(r.direct)
        r.direct = None
        if r.actor is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.kill(r.actor, no_restart=True)
        if not r.released:
            r.released = True
            self._table.release(r.node, r.demand)

    async def _drain_and_stop(self, m: ModelRecord, r: RayReplica) -> None:
        if r.state == STARTING:
            r.state = STOPPED
            r.mark_dead("stopped while starting")
            self._stop_actor(r)
            return
        if r.state == ACTIVE:
            r.state = DRAINING
        if r.inflight:
            try:
                await asyncio.wait_for(r.idle.wait(), self.drain_timeout_s)
            except TimeoutError:
                log.warning(
                    "replica %s did not finish its batch in %s s", r.id, self.drain_timeout_s
                )
        if not r.died.done():
            await r.info()  # keep its final counters for stats()
            m.retired.append(r.describe() | {"state": STOPPED})
        r.state = STOPPED
        r.mark_dead("stopped")
        self._stop_actor(r)

    # -- stats / close ----------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """Per replica: node id and address, state, batches, items, service times measured in
        the actor, activation delay; per model: replicas per node, shortfall, restarts."""
        m, stats = await self._stats_head(model, self._url)
        active = [d["node"] for d in stats["replicas"] if d["state"] == ACTIVE]
        return stats | {
            "placement": self.placement,
            "shortfall": sum(1 for s in m.slots if s.unplaced or s.given_up),
            "nodes": dict(Counter(active)),
            "lost_nodes": list(self._lost[-20:]),
        }

    async def close(self) -> None:
        """Stop every actor (in-flight batches fail with ``ReplicaError``) and, if this backend
        connected the process to the cluster, disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks: list[asyncio.Task[Any]] = []
        if self._watch_task is not None:
            self._watch_task.cancel()
            tasks.append(self._watch_task)
        reps: list[RayReplica] = []
        for m in self._models.values():
            for s in m.slots:
                if s.restart_task is not None:
                    s.restart_task.cancel()
                    tasks.append(s.restart_task)
                if s.replica is not None:
                    reps.append(s.replica)
        for name in list(self._models):
            self._subscribers.notify(name, [])
        for r in reps:
            tasks.extend(r.tasks)
            r.state = STOPPED
            r.mark_dead("backend closed")
            self._stop_actor(r)
        self._models.clear()
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)
        await wait_closed()
        self._release_connection()

    def _release_connection(self) -> None:
        if self._owns:
            self._owns = False
            disconnect()
