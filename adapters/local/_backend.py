"""``LocalBackend`` (``local://``): the bundled Clipper-style container runtime.

Each replica is its own OS process (``python -m inferline.adapters.local.replica``) serving one
model container over gRPC on 127.0.0.1. The backend places replicas on CPU cores or GPUs from
its inventory, scales them up and down at run time (draining before stopping), watches them
(process exit plus a gRPC heartbeat) and restarts the ones that die.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from inferline.adapters._slots import ModelRecord, Slot, SlotKeeper, check_source
from inferline.adapters._subscribers import ReplicaSubscribers
from inferline.core import (
    BackendError,
    ModelConfig,
    ModelSpec,
    ValidationError,
)

from .._supervised import ACTIVE, DRAINING, STARTING, STOPPED
from . import _process
from . import replica_pb2_grpc as pbg
from ._handle import LocalReplica
from ._inventory import Inventory, Placement, detect_cores, detect_gpus
from ._process import REPLICA_MODULE, kill, reap, terminate

__all__ = ["REPLICA_MODULE", "LocalBackend"]

log = logging.getLogger(__name__)


@dataclass
class _Slot(Slot):
    """A slot that holds its placement (cores, GPU) across restarts."""

    placement: Placement = field(kw_only=True)


class LocalBackend(SlotKeeper):
    """The bundled runtime. All methods must be called from one asyncio event loop.

    Args:
        url: the backend's URL (``local://``; kept for messages and ``url``).
        cores: CPU core ids replicas may be pinned to (default: this process's affinity).
        gpus: GPU ids (strings or ints) for ``CUDA_VISIBLE_DEVICES`` (default: ``nvidia-smi -L``,
            or ``CUDA_VISIBLE_DEVICES`` if set; none when neither is available).
        gpu_kind: the hardware catalog name the GPUs are offered as.
        oversubscribe: share cores/GPUs round-robin instead of refusing with ``CapacityError``.
        heartbeat_interval_s, heartbeat_timeout_s, heartbeat_misses: the gRPC ping every
            interval; a replica missing ``heartbeat_misses`` pings in a row is killed and restarted.
        busy_heartbeat_misses: the same limit while a batch is in flight (a long native call
            can starve the ping without the replica being hung); default 20 (about 30 s with
            the default ping). From ``heartbeat_misses`` misses on, a busy replica is marked
            ``unresponsive`` (``/healthz`` does not count it) until it answers again.
        start_timeout_s: how long a replica may take from spawn to its first healthy ping.
        drain_timeout_s: how long scale-down waits for an in-flight batch before killing.
        predict_timeout_s: optional deadline for one batch RPC (None: rely on health checks).
        restart: restart replicas that die (default True).
        max_start_failures: consecutive failed restarts of a slot before giving up on it.
        python: the interpreter replicas run with (default: this one).
        env: extra environment variables for replica processes.
        max_message_bytes: gRPC message size limit both ways.
        replica_log_level: logging level inside the replica processes.
    """

    def __init__(
        self,
        url: str = "local://",
        *,
        cores: Sequence[int] | None = None,
        gpus: Sequence[int | str] | None = None,
        gpu_kind: str = "gpu-v100",
        oversubscribe: bool = False,
        heartbeat_interval_s: float = 0.5,
        heartbeat_timeout_s: float = 1.0,
        heartbeat_misses: int = 4,
        busy_heartbeat_misses: int = 20,
        start_timeout_s: float = 60.0,
        drain_timeout_s: float = 60.0,
        predict_timeout_s: float | None = None,
        restart: bool = True,
        max_start_failures: int = 5,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        max_message_bytes: int = 64 << 20,
        replica_log_level: str = "WARNING",
    ) -> None:
        all_cores = detect_cores()
        if cores is not None:
            unknown = sorted(set(cores) - set(all_cores))
            if unknown:
                raise ValidationError(
                    "cores", f"a subset of this process's cores {all_cores}", unknown
                )
        self._url = url
        self._inv = Inventory(
            list(cores) if cores is not None else all_cores,
            [str(g) for g in gpus] if gpus is not None else detect_gpus(),
            gpu_kind,
            oversubscribe,
        )
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.heartbeat_misses = heartbeat_misses
        # Replica ports are on 127.0.0.1, but any local user could call them and skip the
        # frontend's token and queue: each replica requires this backend's secret.
        self._replica_token = secrets.token_urlsafe(24)
        self.busy_heartbeat_misses = max(busy_heartbeat_misses, heartbeat_misses)
        self.start_timeout_s = start_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.predict_timeout_s = predict_timeout_s
        self.restart = restart
        self.max_start_failures = max_start_failures
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.max_message_bytes = max_message_bytes
        self.replica_log_level = replica_log_level
        self._models: dict[str, ModelRecord] = {}
        self._subscribers = ReplicaSubscribers()
        self._ids = itertools.count()
        self._closed = False
        self._pids: set[int] = set()
        self._finalizer = weakref.finalize(self, _process.kill_pids, self._pids)

    # -- views ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def gpu_kind(self) -> str:
        return self._inv.gpu_kind

    @property
    def oversubscribe(self) -> bool:
        return self._inv.oversubscribe

    def inventory(self) -> dict[str, int]:
        return self._inv.inventory()

    def core_sharing(self) -> dict[str, Any]:
        """How replicas share this backend's cores and GPUs, as ``EstimatorOptions``
        keywords: each is pinned to the least-used ones (``Inventory``), so the estimate
        places them the same way (``pinned_cores``)."""
        return {"pinned_cores": self._inv.inventory()}

    def free(self) -> dict[str, int]:
        return self._inv.free()

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        """Start ``config.replicas`` replicas of ``spec`` on ``config.hardware``; returns once
        all of them answer their first heartbeat."""
        self._check_open()
        if spec.name in self._models:
            raise ValidationError(
                "model", "a model that is not deployed yet (use scale() or remove())", spec.name
            )
        check_source(spec)
        placements = self._inv.allocate(spec.name, config.hardware, spec.threads, config.replicas)
        m = ModelRecord(spec, config)
        self._models[spec.name] = m
        try:
            await self._start_slots(m, placements)
        except BaseException:
            self._models.pop(spec.name, None)
            await self._stop_all_slots(m)
            self._notify(spec.name)
            raise

    async def scale(self, model: str, replicas: int) -> None:
        """Grow or shrink ``model`` to ``replicas`` replicas. New ones join the active set when
        ready; removed ones leave it at once and stop after their in-flight batch."""
        self._check_open()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        m = self._get(model)
        self._retry_given_up(m)
        cur = len(m.slots)
        m.config = ModelConfig(m.config.hardware, m.config.max_batch_size, replicas)
        if replicas > cur:
            placements = self._inv.allocate(
                model, m.config.hardware, m.spec.threads, replicas - cur
            )
            await self._start_slots(m, placements)
        elif replicas < cur:
            # Prefer giving up slots that are not serving (starting, restarting), then the newest.
            def order(s: _Slot) -> tuple[int, int]:
                serving = s.replica is not None and s.replica.state == ACTIVE
                return (1 if serving else 0, -s.index)

            victims = sorted(m.slots, key=order)[: cur - replicas]
            for s in victims:
                m.slots.remove(s)
            self._notify(model)
            await asyncio.gather(*(self._retire_slot(m, s) for s in victims))

    async def _start_slots(self, m: ModelRecord, placements: list[Placement]) -> None:
        slots = []
        for p in placements:
            slots.append(_Slot(m.next_index, placement=p))
            m.next_index += 1
        m.slots.extend(slots)
        await self._start_all(m, slots, [self._start_replica(m, s) for s in slots])

    async def _retire_slot(self, m: ModelRecord, s: _Slot) -> None:
        await self._cancel_restart(s)
        r = s.replica
        try:
            if r is not None:
                await self._drain_and_stop(m, r)
        finally:
            self._inv.release(s.placement)

    # -- replica processes ------------------------------------------------------------------

    async def _start_replica(self, m: ModelRecord, s: _Slot) -> LocalReplica:
        """Spawn a process for slot ``s``, wait for its first healthy ping, make it active."""
        name = m.spec.name
        rid = f"{name}-{next(self._ids)}"
        r = LocalReplica(self, name, rid, m.config.hardware, s.placement)
        s.replica = r
        cfg = self._replica_config(m, s, rid)
        t0 = time.monotonic()
        await self._spawn(m, s, r, cfg)
        await self._await_ready(m, r, t0)
        await self._activate(m, s, r, t0)
        return r

    def _replica_config(self, m: ModelRecord, s: _Slot, rid: str) -> dict[str, Any]:
        """The JSON document a replica process reads from its command line."""
        return {
            "model": m.spec.name,
            "replica": rid,
            "source": m.spec.source,
            "params": dict(m.spec.params),
            "threads": m.spec.threads,
            "cores": list(s.placement.cores),
            "gpu": s.placement.gpu,
            "parent_pid": os.getpid(),
            # The parent-death signal fires when the spawning *thread* exits, so only arm it
            # when that thread is the main one (a loop in a worker thread may end early).
            "pdeathsig": threading.current_thread() is threading.main_thread(),
            "max_message_bytes": self.max_message_bytes,
            "log_level": self.replica_log_level,
        }

    async def _spawn(self, m: ModelRecord, s: _Slot, r: LocalReplica, cfg: dict[str, Any]) -> None:
        """Start the replica's process, record its pid and watch for its exit."""
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            REPLICA_MODULE,
            json.dumps(cfg),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=_process.replica_env(self.env, self._replica_token, m.spec.threads, s.placement),
            start_new_session=True,  # a Ctrl-C at the terminal goes to the frontend only
        )
        r.proc, r.pid = proc, proc.pid
        _process.remember_pid(proc.pid)
        self._pids.add(proc.pid)
        r.tasks.append(asyncio.create_task(self._watch_exit(m, s, r), name=f"watch-{r.id}"))

    async def _await_ready(self, m: ModelRecord, r: LocalReplica, t0: float) -> None:
        """Read the replica's ready line, connect, wait for its first healthy ping, all within
        ``start_timeout_s`` of ``t0``; on any failure kill the process before raising."""
        try:
            ready = await asyncio.wait_for(_process.read_ready(r, self._url), self.start_timeout_s)
            r.port = int(ready["port"])
            r.load_s = float(ready.get("load_s", 0.0))
            self._connect(r)
            await asyncio.wait_for(
                self._first_ping(r), max(0.1, t0 + self.start_timeout_s - time.monotonic())
            )
        except BaseException as e:
            reason = e if isinstance(e, BackendError) else None
            kill(r)
            await reap(r)
            if isinstance(e, asyncio.TimeoutError):
                reason = BackendError(
                    self._url,
                    f"replica {r.id} of {m.spec.name!r} not ready within {self.start_timeout_s} s",
                )
            if reason is not None:
                raise reason from None
            raise

    def _connect(self, r: LocalReplica) -> None:
        """The gRPC channel, stub and credentials for the replica's port."""
        r.channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{r.port}",
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.enable_retries", 0),
            ],
        )
        r.stub = pbg.ReplicaStub(r.channel)
        r.metadata = (("authorization", f"Bearer {self._replica_token}"),)

    async def _activate(self, m: ModelRecord, s: _Slot, r: LocalReplica, t0: float) -> None:
        """Make a ready replica active (heartbeat on, subscribers told), unless it was stopped
        or replaced while it started."""
        name = m.spec.name
        r.activation_delay_s = time.monotonic() - t0
        r.last_heartbeat_mono = time.monotonic()
        if r.died.done() or self._closed or s not in m.slots or s.replica is not r:
            kill(r)
            await reap(r)
            raise BackendError(self._url, f"replica {r.id} of {name!r} was stopped while starting")
        r.state = ACTIVE
        log.info(
            "replica %s of %r ready: pid %d, port %d, cores %s%s, activation delay %.3f s "
            "(load %.3f s)",
            r.id,
            name,
            r.pid,
            r.port,
            list(s.placement.cores),
            f", gpu {s.placement.gpu}" if s.placement.gpu is not None else "",
            r.activation_delay_s,
            r.load_s,
        )
        r.tasks.append(asyncio.create_task(self._heartbeat(r), name=f"heartbeat-{r.id}"))
        self._notify(name)

    async def _first_ping(self, r: LocalReplica) -> None:
        while not await r.ping(self.heartbeat_timeout_s):
            if r.died.done():
                raise BackendError(
                    self._url, f"replica {r.id} died while starting: {r.died.result()}"
                )
            await asyncio.sleep(0.02)

    async def _heartbeat(self, r: LocalReplica) -> None:
        while r.state in (ACTIVE, DRAINING):
            await asyncio.sleep(self.heartbeat_interval_s)
            if r.state not in (ACTIVE, DRAINING) or r.died.done():
                return
            if await r.ping(self.heartbeat_timeout_s):
                r.answered_ping()
                continue
            if r.missed_ping(self.heartbeat_misses, self.busy_heartbeat_misses):
                # Alive but unresponsive (hung container, wedged server): kill it so the exit
                # watcher handles it like any other death and restarts it.
                r.death_reason = f"missed {r.heartbeat_misses} heartbeats"
                kill(r)
                return

    async def _watch_exit(self, m: ModelRecord, s: _Slot, r: LocalReplica) -> None:
        assert r.proc is not None
        rc = await r.proc.wait()
        r.exit_code = rc
        _process.forget_pid(r.pid)
        self._pids.discard(r.pid)
        expected = r.state in (STOPPED, DRAINING) or self._closed
        was_active = r.state == ACTIVE
        r.mark_dead(r.death_reason or f"process exited with code {rc}")
        if r.channel is not None:
            with contextlib.suppress(Exception):
                await r.channel.close()
        if expected or r.state == STOPPED:
            return
        log.warning("replica %s of %r died: %s", r.id, m.spec.name, r.death_reason)
        m.retired.append(r.describe())
        if was_active:
            self._notify(m.spec.name)
        if (
            self.restart
            and not self._closed
            and s in m.slots
            and s.replica is r
            and was_active  # a replica that dies while starting fails its start instead
        ):
            s.restart_task = asyncio.create_task(self._restart(m, s), name=f"restart-{r.id}")

    async def _restart(self, m: ModelRecord, s: _Slot) -> None:
        delay = 0.0
        while not self._closed and s in m.slots:
            if delay:
                await asyncio.sleep(delay)
            try:
                await self._start_replica(m, s)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                backoff = self._start_failed(m, s, e, "restart")
                if backoff is None:
                    return
                delay = backoff
                continue
            self._started(m, s)
            return

    async def _drain_and_stop(self, m: ModelRecord, r: LocalReplica) -> None:
        if r.state == ACTIVE:
            r.state = DRAINING
        elif r.state == STARTING:
            r.state = STOPPED
            kill(r)
            await reap(r)
            return
        if r.inflight:
            try:
                await asyncio.wait_for(r.idle.wait(), self.drain_timeout_s)
            except TimeoutError:
                log.warning(
                    "replica %s did not finish its batch in %s s; killing it",
                    r.id,
                    self.drain_timeout_s,
                )
        await r.info()  # keep its final counters for stats()
        r.state = STOPPED
        m.retired.append(r.describe())
        await terminate(r)

    # -- stats / close ----------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """What the replicas measured: per replica batches, items, service times (measured
        inside the replica), activation delay (spawn to first healthy ping), state."""
        _, stats = await self._stats_head(model, self._url)
        return stats

    async def close(self) -> None:
        """Stop every replica (in-flight batches fail with ``ReplicaError``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        reps: list[LocalReplica] = []
        for m in self._models.values():
            for s in m.slots:
                if s.restart_task is not None:
                    s.restart_task.cancel()
                if s.replica is not None:
                    reps.append(s.replica)
        for name in list(self._models):
            self._notify_empty(name)
        for r in reps:
            r.state = STOPPED
            r.mark_dead("backend closed")
        await asyncio.gather(*(terminate(r, grace_s=1.0) for r in reps), return_exceptions=True)
        for m in self._models.values():
            for s in m.slots:
                self._inv.release(s.placement)
            m.slots.clear()
        self._models.clear()
        _process.kill_pids(self._pids)  # anything left (a spawn racing close)

    def _notify_empty(self, model: str) -> None:
        self._subscribers.notify(model, [])

    def close_now(self) -> None:
        """Kill every replica process immediately, without an event loop (for finalizers)."""
        self._closed = True
        _process.kill_pids(self._pids)

    def pids(self) -> list[int]:
        """OS process ids of the replica processes running now (for tests and operators)."""
        return sorted(self._pids)
