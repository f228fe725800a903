"""``TritonBackend``: inferline's narrow waist over a running Triton Inference Server.

One replica handle per Triton model instance. The interposed queue runs one puller per handle
and keeps at most one batch in flight per handle, so Triton always has a free instance for the
next request and its own queue stays empty; inferline's EDF queue alone decides the order.
A preformed batch travels as one request (the batch dimension), and Triton's dynamic batcher
is off unless a deployment asks for it.

The server runs in explicit model-control mode. ``deploy`` and ``scale`` send the model's full
configuration (fetched from the server, changed, sent back; see ``_config``). Failures come
back as inferline's errors: a broken connection or a model the restarted server no longer
has raises ``ReplicaError`` for the batch and starts a recovery task that waits for the server,
reloads every managed model with its last configuration and publishes fresh handles to the
subscribers. Between queries, a watch (``watch_interval_s``) checks that the server still runs
each model as inferline loaded it (a restarted server comes back with its repository's
configuration, or none) and starts the same recovery when it does not. A batch the model
itself rejects is bisected so each query gets its own answer: an output, or a
``BackendError`` for the queries that fail on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from inferline.adapters._subscribers import ModelRegistry, ReplicaSubscribers
from inferline.core import (
    BackendError,
    CapacityError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ReplicaError,
    ValidationError,
)

from ._client import (
    TritonClient,
    TritonConnectionError,
    TritonFailure,
    TritonModelMissing,
    TritonServerError,
)
from ._config import BatcherSettings, TritonModelInfo, build_config, instance_count
from ._stats import ClientTiming, cumulative_figures, interval_figures
from ._tensors import ModelIO

__all__ = ["SCHEMES", "TritonBackend", "TritonReplica", "parse_triton_url"]

log = logging.getLogger(__name__)

# URL scheme -> protocol; the default ports are Triton's.
SCHEMES = {"triton": "http", "triton+http": "http", "triton+grpc": "grpc"}
_DEFAULT_PORT = {"http": 8000, "grpc": 8001}
_PARAM_KEYS = frozenset({"outputs", "dynamic_batching"})


def parse_triton_url(url: str) -> tuple[str, str, dict[str, str]]:
    """``triton://host:8000`` -> (protocol, "host:port", query options)."""
    if not isinstance(url, str) or "://" not in url:
        raise ValidationError("url", "'triton://host:port' or 'triton+grpc://host:port'", url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValidationError("url", f"a scheme among {sorted(SCHEMES)}", scheme)
    protocol = SCHEMES[scheme]
    host = parts.hostname
    if not host:
        raise ValidationError("url", "a host, e.g. 'triton://127.0.0.1:8000'", url)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range: urlsplit tells them apart, we need not
        port = 0
    if port == 0:  # ":0" read as no port took the default one silently
        raise ValidationError("url", "a port in [1, 65535]", url)
    port = port or _DEFAULT_PORT[protocol]
    host = f"[{host}]" if ":" in host else host
    return protocol, f"{host}:{port}", dict(parse_qsl(parts.query))


class TritonReplica:
    """One Triton model instance, as seen by the interposed queue."""

    def __init__(self, backend: TritonBackend, managed: _Managed, index: int) -> None:
        self._backend = backend
        self._m = managed
        self._index = index
        self._gen = managed.generation
        self._id = f"{managed.name}/{index}.{managed.generation}"
        self._alive = True
        self._in_flight = 0
        self._idle = asyncio.Event() if _has_loop() else None

    @property
    def id(self) -> str:
        return self._id

    @property
    def model(self) -> str:
        return self._m.name

    @property
    def hardware(self) -> str:
        return self._m.config.hardware

    @property
    def alive(self) -> bool:
        return self._alive and not self._backend.closed

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self.alive:
            raise ReplicaError(self._backend.url, self._id, "replica is no longer active")
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        try:
            return await self._backend._predict(self, self._m, list(inputs))
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no batch is in flight (True) or ``timeout_s`` passed (False)."""
        if self._in_flight == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _kill(self) -> None:
        self._alive = False

    def __repr__(self) -> str:
        return f"TritonReplica({self._id!r}, alive={self.alive}, in_flight={self._in_flight})"


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


_SLOW_PROBE_S = 5.0  # how often recovery probes a server that stayed away past its timeout


@dataclass
class _Managed:
    """A model inferline manages on the server, and its desired state."""

    name: str  # inferline's name
    server_name: str  # the model's name on Triton
    spec: ModelSpec
    config: ModelConfig
    triton_config: dict[str, Any]  # the last configuration inferline loaded
    io: ModelIO
    outputs: tuple[str, ...]
    batcher: BatcherSettings | None
    handles: list[TritonReplica] = field(default_factory=list)
    generation: int = 0
    next_index: int = 0
    restarts: int = 0
    state: str = "ready"  # ready | recovering | failed | unloaded
    # failed because the server stayed away past recovery_timeout_s (not a load error):
    # recovery keeps probing, slowly, and brings it back when the server returns
    unreachable: bool = False
    timing: ClientTiming = field(default_factory=ClientTiming)
    last_stats: dict[str, Any] | None = None
    last_stats_t: float | None = None


class TritonBackend(ModelRegistry):
    """A Triton Inference Server in explicit model-control mode, as an inferline backend.

    Args:
        url: ``triton://host:8000`` (HTTP) or ``triton+grpc://host:8001`` (gRPC). Query options
            (``?cpu_cores=4&gpus=0,1``) are read like the keyword arguments below.
        cpu_cores: CPU cores offered as catalog hardware ``cpu_kind`` (default: this machine's
            cores, right for a local server; pass it for a remote one).
        gpus: GPU device ids on the server offered as ``gpu_kind`` (default none).
        cpu_kind, gpu_kind: the hardware catalog names of the two kinds.
        oversubscribe: allow more replicas x threads than the inventory instead of raising
            ``CapacityError``.
        timeout_s: limit for one request (inference or model control).
        drain_timeout_s: how long scale-down waits for an instance's in-flight batch.
        recovery_timeout_s: how long recovery waits for a lost server to come back.
        watch_interval_s: how often the managed models' configuration is checked on the
            server while nothing fails (0: never). A server restarted, or a model reloaded by
            someone else, between queries comes back with its repository's configuration;
            without the check inferline went on counting the plan's instances until a query
            failed. A changed configuration is put back (inferline's plan is the desired
            state); a server that misses two health checks in a row is treated as lost.
        token: bearer token sent with every request (for a server behind an auth proxy).
        unload_on_close: unload the models inferline deployed when closing (default: leave the
            server's models running, as an attached deployment should be).
    """

    def __init__(
        self,
        url: str = "triton://127.0.0.1:8000",
        *,
        cpu_cores: int | None = None,
        gpus: Sequence[int] | None = None,
        cpu_kind: str = "cpu",
        gpu_kind: str = "gpu-v100",
        oversubscribe: bool = False,
        timeout_s: float = 60.0,
        drain_timeout_s: float = 30.0,
        recovery_timeout_s: float = 120.0,
        watch_interval_s: float = 5.0,
        token: str | None = None,
        unload_on_close: bool = False,
    ) -> None:
        protocol, address, query = parse_triton_url(url)
        opts = _query_options(url, query)
        cpu_cores = opts.get("cpu_cores", cpu_cores)
        gpus = opts.get("gpus", gpus)
        self._url = url
        self.protocol = protocol
        self.address = address
        self.cpu_kind = str(opts.get("cpu_kind", cpu_kind))
        self.gpu_kind = str(opts.get("gpu_kind", gpu_kind))
        self.oversubscribe = bool(opts.get("oversubscribe", oversubscribe))
        self.drain_timeout_s = float(opts.get("drain_timeout_s", drain_timeout_s))
        self.recovery_timeout_s = float(opts.get("recovery_timeout_s", recovery_timeout_s))
        self.unload_on_close = bool(opts.get("unload_on_close", unload_on_close))
        self.watch_interval_s = float(opts.get("watch_interval_s", watch_interval_s))
        if not self.watch_interval_s >= 0:
            raise ValidationError("watch_interval_s", "seconds >= 0", self.watch_interval_s)
        self.probe_timeout_s = 2.0  # health probes after a failure must not wait a full timeout
        if cpu_cores is None:
            cpu_cores = (
                len(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1
            )
        if isinstance(cpu_cores, bool) or not isinstance(cpu_cores, int) or cpu_cores < 0:
            raise ValidationError("cpu_cores", "an int >= 0", cpu_cores)
        self._cpu_cores = cpu_cores
        self._gpus = [int(g) for g in (gpus or [])]
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = TritonClient(
            address, protocol, timeout_s=float(opts.get("timeout_s", timeout_s)), headers=headers
        )
        self._models: dict[str, _Managed] = {}
        self._subscribers = ReplicaSubscribers()
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._outages = 0
        self._seen_configs: dict[str, dict[str, Any]] = {}  # server model -> last config
        self._closed = False

    # -- views ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def client(self) -> TritonClient:
        """The underlying protocol-neutral client (for discovery scripts and tests)."""
        return self._client

    def inventory(self) -> dict[str, int]:
        inv = {self.cpu_kind: self._cpu_cores}
        if self._gpus:
            inv[self.gpu_kind] = len(self._gpus)
        return inv

    def replica_units(self) -> dict[str, int]:
        """Per managed model, the CPU cores one CPU replica takes (its threads): what a planner
        needs to keep a plan within ``inventory()`` (a GPU replica takes one GPU)."""
        return {name: m.spec.threads for name, m in self._models.items()}

    def _used(self) -> dict[str, int]:
        used = dict.fromkeys(self.inventory(), 0)
        for m in self._models.values():
            per = m.spec.threads if m.config.hardware == self.cpu_kind else 1
            used[m.config.hardware] = used.get(m.config.hardware, 0) + m.config.replicas * per
        return used

    def free(self) -> dict[str, int]:
        used = self._used()
        return {k: max(0, v - used.get(k, 0)) for k, v in self.inventory().items()}

    def _control_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _error(self, e: TritonFailure) -> BackendError:
        return BackendError(self._url, str(e))

    # -- discovery --------------------------------------------------------------------------

    async def server_metadata(self) -> dict[str, Any]:
        """Name, version and extensions the server reports."""
        try:
            return await self._client.server_metadata()
        except TritonFailure as e:
            raise self._error(e) from None

    async def discover(self) -> dict[str, TritonModelInfo]:
        """Every model in the server's repository, with configuration for the loaded ones."""
        self._check_open()
        try:
            index = await self._client.repository_index()
        except TritonFailure as e:
            raise self._error(e) from None
        entries: dict[str, list[dict[str, Any]]] = {}
        for e in index:
            entries.setdefault(str(e["name"]), []).append(e)
        out: dict[str, TritonModelInfo] = {}
        for name, es in sorted(entries.items()):
            cfg = None
            if any(e.get("state") == "READY" for e in es):
                try:
                    cfg = await self._client.model_config(name)
                except TritonFailure as err:
                    log.warning("no configuration for %r: %s", name, err)
            out[name] = TritonModelInfo.from_server(name, es, cfg)
        return out

    async def model_metadata(self, model: str) -> dict[str, Any]:
        """Triton's metadata of a loaded model (inputs/outputs with the batch dimension)."""
        name = self._models[model].server_name if model in self._models else model
        try:
            return await self._client.model_metadata(name)
        except TritonModelMissing:
            raise NotFoundError("model", model, sorted(self._models)) from None
        except TritonFailure as e:
            raise self._error(e) from None

    async def adopt(
        self,
        server_name: str,
        *,
        name: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> ModelConfig:
        """Start managing a model the server already serves, without reloading it.

        Returns its configuration in inferline's terms (hardware kind, max batch size, replica
        count = instance count). ``scale`` keeps the batcher setting the operator chose.
        """
        self._check_open()
        name = name or server_name
        if name in self._models:
            raise ValidationError("model", "a model not managed yet", name)
        async with self._control_lock():
            try:
                if not await self._client.model_ready(server_name):
                    known = sorted(await self._loaded_names())
                    raise NotFoundError("loaded model", server_name, known)
                cfg = await self._client.model_config(server_name)
                self._seen_configs[server_name] = cfg
            except TritonFailure as e:
                raise self._error(e) from None
            io = ModelIO.from_config(cfg)
            gpu = any(g.get("kind") == "KIND_GPU" for g in cfg.get("instance_group", []))
            config = ModelConfig(
                self.gpu_kind if gpu else self.cpu_kind,
                max(1, io.max_batch_size),
                instance_count(cfg),
            )
            db = cfg.get("dynamic_batching")
            m = _Managed(
                name=name,
                server_name=server_name,
                spec=ModelSpec(name, source=server_name),
                config=config,
                triton_config=cfg,
                io=io,
                outputs=self._outputs(io, outputs, name),
                batcher=BatcherSettings.from_config(db) if isinstance(db, Mapping) else None,
            )
            self._models[name] = m
            self._add_handles(m, config.replicas)
        self._notify(name)
        self._start_watch()
        return config

    async def _loaded_names(self) -> list[str]:
        return [
            str(e["name"])
            for e in await self._client.repository_index()
            if e.get("state") == "READY"
        ]

    # -- deploy / scale / remove ----------------------------------------------------------

    def _hardware_gpus(self, hardware: str) -> list[int] | None:
        if hardware == self.cpu_kind:
            return None
        if hardware == self.gpu_kind and self._gpus:
            return list(self._gpus)
        raise NotFoundError("hardware", hardware, sorted(self.inventory()))

    def _check_capacity(self, hardware: str, need: int) -> None:
        if self.oversubscribe or need <= 0:
            return
        free = self.free().get(hardware, 0)
        if need > free:
            raise CapacityError(
                f"{need} more {hardware!r} units needed, {free} free on {self._url}", self.free()
            )

    @staticmethod
    def _outputs(io: ModelIO, outputs: Sequence[str] | None, name: str) -> tuple[str, ...]:
        if outputs is None:
            return tuple(t.name for t in io.outputs)
        if isinstance(outputs, str) or not outputs:
            raise ValidationError(
                f"{name}.params.outputs", "a non-empty list of output names", outputs
            )
        for o in outputs:
            io.output(o)
        return tuple(outputs)

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        """Load ``spec.source`` (default ``spec.name``) from the server's repository with
        ``config``: ``max_batch_size``, ``config.replicas`` instances of the hardware's kind.

        ``spec.params`` may hold ``outputs`` (the output names to return, default all) and
        ``dynamic_batching`` (``{"max_queue_delay_us", "preferred_batch_sizes"}``: turn Triton's
        own batcher on, e.g. to compare with inferline's queue; default off).
        """
        self._check_open()
        if spec.name in self._models:
            raise ValidationError(
                "model", "a model that is not deployed yet (use scale() or remove())", spec.name
            )
        extra = set(spec.params) - _PARAM_KEYS
        if extra:
            raise ValidationError(
                f"{spec.name}.params", f"keys among {sorted(_PARAM_KEYS)}", sorted(extra)
            )
        batcher = (
            BatcherSettings.from_dict(spec.params["dynamic_batching"])
            if spec.params.get("dynamic_batching") is not None
            else None
        )
        gpus = self._hardware_gpus(config.hardware)
        per = spec.threads if gpus is None else 1
        self._check_capacity(config.hardware, config.replicas * per)
        server_name = spec.source or spec.name
        async with self._control_lock():
            loaded_here = False
            try:
                known = {str(e["name"]) for e in await self._client.repository_index()}
                if server_name not in known:
                    raise NotFoundError(
                        "model in the Triton repository", server_name, sorted(known)
                    )
                was_ready = await self._client.model_ready(server_name)
                if was_ready:
                    current = await self._client.model_config(server_name)
                elif server_name in self._seen_configs:
                    # seen before (e.g. deployed, then removed): skip loading the repository's
                    # configuration only to read it; loading a Python model takes seconds
                    current = self._seen_configs[server_name]
                else:
                    await self._client.load(server_name)  # the repository's own configuration
                    loaded_here = True
                    current = await self._client.model_config(server_name)
                outputs = self._outputs(
                    ModelIO.from_config(current), spec.params.get("outputs"), spec.name
                )
                desired = build_config(
                    current,
                    max_batch_size=config.max_batch_size,
                    replicas=max(1, config.replicas),
                    gpus=gpus,
                    batcher=batcher,
                )
                if config.replicas == 0:
                    await self._client.unload(server_name)
                    loaded = desired
                else:
                    await self._client.load(server_name, desired)
                    loaded_here = not was_ready
                    loaded = await self._client.model_config(server_name)
                    self._seen_configs[server_name] = loaded
            except BaseException as e:
                if loaded_here:  # leave the server as it was
                    with contextlib.suppress(TritonFailure):
                        await self._client.unload(server_name)
                if isinstance(e, TritonFailure):
                    raise self._error(e) from None
                raise
            io = ModelIO.from_config(loaded)
            m = _Managed(
                name=spec.name,
                server_name=server_name,
                spec=spec,
                config=config,
                triton_config=loaded,
                io=io,
                outputs=outputs,
                batcher=batcher,
                state="ready" if config.replicas else "unloaded",
            )
            self._models[spec.name] = m
            self._add_handles(m, config.replicas)
        self._notify(spec.name)
        self._start_watch()

    def _add_handles(self, m: _Managed, n: int) -> None:
        for _ in range(n):
            m.handles.append(TritonReplica(self, m, m.next_index))
            m.next_index += 1

    async def scale(self, model: str, replicas: int) -> None:
        """Change the instance count in place. New instances join when the load returns;
        removed ones leave the active set at once and go after their in-flight batch."""
        self._check_open()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        m = self._get(model)
        async with self._control_lock():
            cur = m.config.replicas
            if replicas == cur and len([h for h in m.handles if h.alive]) == cur:
                return
            gpus = self._hardware_gpus(m.config.hardware)
            per = m.spec.threads if gpus is None else 1
            self._check_capacity(m.config.hardware, (replicas - cur) * per)
            if replicas < cur:
                victims = m.handles[replicas:]
                m.handles = m.handles[:replicas]
                for h in victims:
                    h._kill()
                self._notify(model)
                done = await asyncio.gather(*(h.drained(self.drain_timeout_s) for h in victims))
                if not all(done):
                    log.warning(
                        "scale-down of %r: an instance still busy after %ss",
                        model,
                        self.drain_timeout_s,
                    )
            new_config = ModelConfig(m.config.hardware, m.config.max_batch_size, replicas)
            try:
                if replicas == 0:
                    await self._client.unload(m.server_name)
                    m.state = "unloaded"
                else:
                    desired = build_config(
                        m.triton_config,
                        max_batch_size=m.config.max_batch_size,
                        replicas=replicas,
                        gpus=gpus,
                        batcher=m.batcher,
                    )
                    await self._client.load(m.server_name, desired)
                    m.triton_config = desired
                    m.state = "ready"
            except TritonFailure as e:
                raise self._error(e) from None
            m.config = new_config
            if replicas > len(m.handles):
                self._add_handles(m, replicas - len(m.handles))
        self._notify(model)

    async def reconfigure(self, model: str, config: ModelConfig) -> None:
        """Apply a new configuration to a deployed model (a new plan): max batch size,
        hardware kind and replica count, by loading its full model configuration. A change
        of the instance count only is done in place (``scale``); otherwise Triton reloads the
        model, serving in-flight requests with the old instances until the new ones are up."""
        self._check_open()
        m = self._get(model)
        if (
            config.hardware == m.config.hardware
            and config.max_batch_size == m.config.max_batch_size
        ):
            await self.scale(model, config.replicas)
            return
        gpus = self._hardware_gpus(config.hardware)
        per = m.spec.threads if gpus is None else 1
        if not self.oversubscribe:
            used = self._used()
            mine = m.config.replicas * (m.spec.threads if m.config.hardware == self.cpu_kind else 1)
            used[m.config.hardware] = used.get(m.config.hardware, 0) - mine
            free = self.inventory().get(config.hardware, 0) - used.get(config.hardware, 0)
            if config.replicas * per > free:
                raise CapacityError(
                    f"{config.replicas * per} {config.hardware!r} units needed, {free} free",
                    self.free(),
                )
        async with self._control_lock():
            if config.replicas < len(m.handles):
                victims = m.handles[config.replicas :]
                m.handles = m.handles[: config.replicas]
                for h in victims:
                    h._kill()
                self._notify(model)
                await asyncio.gather(*(h.drained(self.drain_timeout_s) for h in victims))
            try:
                if config.replicas == 0:
                    await self._client.unload(m.server_name)
                    loaded = build_config(
                        m.triton_config,
                        max_batch_size=config.max_batch_size,
                        replicas=1,
                        gpus=gpus,
                        batcher=m.batcher,
                    )
                    m.state = "unloaded"
                else:
                    desired = build_config(
                        m.triton_config,
                        max_batch_size=config.max_batch_size,
                        replicas=config.replicas,
                        gpus=gpus,
                        batcher=m.batcher,
                    )
                    await self._client.load(m.server_name, desired)
                    loaded = await self._client.model_config(m.server_name)
                    m.state = "ready"
            except TritonFailure as e:
                raise self._error(e) from None
            m.triton_config = loaded
            self._seen_configs[m.server_name] = loaded
            m.io = ModelIO.from_config(loaded)
            m.config = config
            if config.replicas > len(m.handles):
                self._add_handles(m, config.replicas - len(m.handles))
        self._notify(model)

    async def remove(self, model: str) -> None:
        """Stop serving ``model``: drain its instances, unload it from the server, forget it."""
        self._check_open()
        m = self._get(model)
        async with self._control_lock():
            victims, m.handles = m.handles, []
            for h in victims:
                h._kill()
            self._notify(model)
            await asyncio.gather(*(h.drained(self.drain_timeout_s) for h in victims))
            try:
                await self._client.unload(m.server_name)
            except TritonModelMissing:
                pass
            except TritonFailure as e:
                raise self._error(e) from None
            finally:
                self._models.pop(model, None)

    # -- inference --------------------------------------------------------------------------

    async def _predict(self, h: TritonReplica, m: _Managed, inputs: list[Any]) -> list[Any]:
        results: list[Any] = [None] * len(inputs)
        encoded: dict[int, dict[str, np.ndarray]] = {}
        for i, x in enumerate(inputs):
            try:
                encoded[i] = m.io.encode_item(x, f"{m.name}.inputs[{i}]")
            except ValidationError as e:
                results[i] = e
                m.timing.item_errors += 1
        groups: dict[Any, list[int]] = {}
        for i, enc in encoded.items():
            groups.setdefault(ModelIO.shape_key(enc), []).append(i)
        limit = m.io.max_batch_size
        for idxs in groups.values():
            if limit == 0:
                chunks = [[i] for i in idxs]
            else:
                chunks = [idxs[k : k + limit] for k in range(0, len(idxs), limit)]
            for chunk in chunks:
                await self._send(h, m, chunk, encoded, results)
        return results

    async def _send(
        self,
        h: TritonReplica,
        m: _Managed,
        idxs: list[int],
        encoded: Mapping[int, Mapping[str, np.ndarray]],
        results: list[Any],
    ) -> None:
        batched = m.io.max_batch_size > 0
        names = [t.name for t in m.io.inputs]
        if batched:
            arrays = ModelIO.stack([encoded[i] for i in idxs], names)
        else:
            arrays = dict(encoded[idxs[0]])
        dtypes = {t.name: t.datatype for t in m.io.inputs}
        t0 = time.perf_counter()
        try:
            out = await self._client.infer(
                m.server_name, {n: (arrays[n], dtypes[n]) for n in names}, m.outputs
            )
        except TritonConnectionError as e:
            m.timing.errors += 1
            await self._on_connection_error(m, str(e))
            raise ReplicaError(self._url, h.id, str(e)) from None
        except TritonModelMissing as e:
            m.timing.errors += 1
            self._start_recovery({m.name}, str(e))
            raise ReplicaError(self._url, h.id, str(e)) from None
        except TritonServerError as e:
            m.timing.errors += 1
            if len(idxs) == 1:
                results[idxs[0]] = BackendError(self._url, f"model {m.name!r}: {e}")
                m.timing.item_errors += 1
                return
            # Find the queries that fail on their own: bisect the batch.
            half = len(idxs) // 2
            await self._send(h, m, idxs[:half], encoded, results)
            await self._send(h, m, idxs[half:], encoded, results)
            return
        m.timing.record(len(idxs), time.perf_counter() - t0)
        try:
            values = m.io.decode(out, len(idxs), m.outputs, batched=batched)
        except ValidationError as e:
            for i in idxs:
                results[i] = BackendError(self._url, f"model {m.name!r}: bad response: {e}")
            return
        for i, v in zip(idxs, values, strict=True):
            results[i] = v

    # -- failure and recovery ---------------------------------------------------------------

    async def _on_connection_error(self, m: _Managed, reason: str) -> None:
        """A request broke: a slow request is not an outage, a server that is gone is."""
        t = self.probe_timeout_s
        try:
            if await self._client.ready(timeout_s=t) and await self._client.model_ready(
                m.server_name, timeout_s=t
            ):
                return
        except TritonFailure:
            pass  # gone between the two probes: an outage
        self._start_recovery(None, reason)

    def _start_recovery(self, models: set[str] | None, reason: str) -> None:
        if self._closed:
            return
        targets = set(self._models) if models is None else models & set(self._models)
        changed = []
        for name in targets:
            m = self._models[name]
            if m.state == "unloaded":
                continue
            m.state = "recovering"
            if m.handles:
                for h in m.handles:
                    h._kill()
                m.handles = []
                changed.append(name)
        for name in changed:
            self._notify(name)
        if self._recovery is not None and not self._recovery.done():
            return  # the running recovery re-checks every model that is recovering
        self._outages += 1
        log.warning("Triton at %s: %s; recovering %s", self._url, reason, sorted(targets))
        self._recovery = asyncio.get_running_loop().create_task(
            self._recover(), name=f"inferline-triton-recover-{self.address}"
        )

    async def reconnect(self) -> None:
        """Wait for the server and reload every model that needs it (what recovery does
        after a failure); also retries models whose recovery failed before."""
        self._check_open()
        for m in self._models.values():
            if m.state == "failed":
                m.state, m.unreachable = "recovering", False
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())
        await asyncio.shield(self._recovery)

    async def _recover(self) -> None:
        deadline = time.monotonic() + self.recovery_timeout_s
        delay = 0.05
        while not self._closed:
            pending = [
                m
                for m in self._models.values()
                if m.state == "recovering" or (m.state == "failed" and m.unreachable)
            ]
            if not pending:
                return
            if not await self._client.ready(timeout_s=self.probe_timeout_s):
                if time.monotonic() > deadline:
                    if any(m.state == "recovering" for m in pending):
                        log.error(
                            "Triton at %s did not come back within %ss: %s failed; "
                            "still probing every %ss",
                            self._url,
                            self.recovery_timeout_s,
                            sorted(m.name for m in pending),
                            _SLOW_PROBE_S,
                        )
                    for m in pending:
                        m.state, m.unreachable = "failed", True
                    # Before, recovery ended here and the models stayed failed for good,
                    # although the server came back minutes later.
                    await asyncio.sleep(_SLOW_PROBE_S)
                    continue
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            for m in pending:
                if m.unreachable:
                    m.state, m.unreachable = "recovering", False
            async with self._control_lock():
                for m in pending:
                    if m.state != "recovering" or self._closed:
                        continue
                    try:
                        await self._ensure_loaded(m)
                    except TritonConnectionError:
                        continue  # went away again: the outer loop waits for it
                    except TritonFailure as e:
                        log.error("could not reload %r on %s: %s", m.name, self._url, e)
                        m.state = "failed"
                        continue
                    m.generation += 1
                    m.restarts += 1
                    m.handles, m.next_index = [], 0  # same slots, new generation
                    self._add_handles(m, m.config.replicas)
                    m.state = "ready"
                    m.last_stats = None  # the counters restarted with the model
                    self._notify(m.name)
                    log.info("Triton model %r is back with %d instances", m.name, m.config.replicas)

    async def _ensure_loaded(self, m: _Managed) -> None:
        if await self._client.model_ready(m.server_name):
            cfg = await self._client.model_config(m.server_name)
            if _differs(cfg, m.triton_config) is None:
                return
        await self._client.load(m.server_name, m.triton_config)

    # -- watch: changes nobody's query noticed ------------------------------------------------

    def _start_watch(self) -> None:
        if self._closed or self.watch_interval_s <= 0:
            return
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"inferline-triton-watch-{self.address}"
            )

    async def _watch(self) -> None:
        misses = 0
        while not self._closed:
            await asyncio.sleep(self.watch_interval_s)
            if self._closed or (self._recovery is not None and not self._recovery.done()):
                misses = 0  # recovery is already on it
                continue
            if not any(m.state == "ready" for m in self._models.values()):
                continue
            if not await self._client.ready(timeout_s=self.probe_timeout_s):
                # one slow answer under load is not an outage; two in a row are (a stopped
                # or hung server accepts connections but answers nothing)
                misses += 1
                if misses >= 2:
                    misses = 0
                    self._start_recovery(None, "the server missed two health checks")
                continue
            misses = 0
            try:
                changed = await self._changed_models()
            except TritonFailure as e:
                log.debug("watch of %s: %s", self._url, e)
                continue
            if changed:
                self._start_recovery(
                    set(changed), "; ".join(f"{n}: {w}" for n, w in changed.items())
                )

    async def _changed_models(self) -> dict[str, str]:
        """Managed models the server no longer runs as inferline loaded them, and how."""
        changed: dict[str, str] = {}
        async with self._control_lock():  # scale() and reconfigure() change triton_config
            for m in list(self._models.values()):
                if m.state != "ready" or self._closed:
                    continue
                if not await self._client.model_ready(
                    m.server_name, timeout_s=self.probe_timeout_s
                ):
                    changed[m.name] = "no longer loaded on the server"
                    continue
                try:
                    cfg = await self._client.model_config(m.server_name)
                except TritonModelMissing:
                    changed[m.name] = "no longer loaded on the server"
                    continue
                diff = _differs(cfg, m.triton_config)
                if diff is not None:
                    changed[m.name] = f"the server runs it with {diff}"
        return changed

    # -- stats / close ----------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """Triton's statistics for ``model`` as cumulative counters and the figures of the
        interval since the previous call, plus the adapter's own client-side timing."""
        m = self._get(model)
        now = time.monotonic()
        server: dict[str, Any]
        try:
            raw = await self._client.statistics(m.server_name)
            interval_s = (
                now - m.last_stats_t if m.last_stats is not None and m.last_stats_t else None
            )
            server = {
                "cumulative": cumulative_figures(raw),
                "interval": interval_figures(m.last_stats, raw, interval_s),
            }
            m.last_stats, m.last_stats_t = raw, now
        except TritonFailure as e:
            server = {"error": str(e)}
        return {
            "model": model,
            "server_model": m.server_name,
            "backend": self._url,
            "hardware": m.config.hardware,
            "max_batch_size": m.config.max_batch_size,
            "target_replicas": m.config.replicas,
            "active_replicas": sum(1 for h in m.handles if h.alive),
            "in_flight": sum(h.in_flight for h in m.handles),
            "state": m.state,
            "restarts": m.restarts,
            "outages": self._outages,
            "triton_batcher": m.batcher.to_dict() if m.batcher else None,
            "server": server,
            "client": m.timing.summary(),
        }

    async def close(self) -> None:
        """Stop handing out replicas and close the connections. Idempotent. In-flight batches
        get up to ``drain_timeout_s`` (at most 5 s) to finish first."""
        if self._closed:
            return
        self._closed = True
        for task in (self._recovery, self._watch_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        handles = [h for m in self._models.values() for h in m.handles]
        for name in list(self._models):
            self._subscribers.notify(name, [])
        with contextlib.suppress(Exception):
            await asyncio.gather(*(h.drained(min(self.drain_timeout_s, 5.0)) for h in handles))
        for h in handles:
            h._kill()
        if self.unload_on_close:
            for m in self._models.values():
                with contextlib.suppress(TritonFailure):
                    await self._client.unload(m.server_name)
        await self._client.close()


def _differs(cfg: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    """What of inferline's configuration ``cfg`` (the server's) lacks, or None."""
    if instance_count(cfg) != instance_count(want):
        return f"{instance_count(cfg)} instances, not {instance_count(want)}"
    if cfg.get("max_batch_size", 0) != want.get("max_batch_size", 0):
        got, exp = cfg.get("max_batch_size", 0), want.get("max_batch_size", 0)
        return f"max batch size {got}, not {exp}"
    if (cfg.get("dynamic_batching") is None) != (want.get("dynamic_batching") is None):
        return "dynamic batching " + ("on" if cfg.get("dynamic_batching") is not None else "off")
    return None


_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _query_options(url: str, query: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    known = {"oversubscribe", "unload_on_close", "cpu_cores", "gpus", "timeout_s"}
    known |= {"drain_timeout_s", "recovery_timeout_s", "watch_interval_s", "cpu_kind", "gpu_kind"}
    for key, val in query.items():
        where = f"{url}: {key}"
        if key not in known:  # outside the try: ValidationError is a ValueError
            raise ValidationError(f"{url}: option", f"one of {sorted(known)}", key)
        try:
            if key in ("oversubscribe", "unload_on_close"):
                out[key] = _BOOL[val.lower()]
            elif key == "cpu_cores":
                out[key] = int(val)
            elif key == "gpus":
                out[key] = [int(g) for g in val.split(",") if g]
            elif key in ("timeout_s", "drain_timeout_s", "recovery_timeout_s", "watch_interval_s"):
                out[key] = float(val)
            else:  # cpu_kind, gpu_kind
                out[key] = val
        except (KeyError, ValueError):
            raise ValidationError(where, "a valid value", val) from None
    return out
