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
configuration, or none) and starts the same recovery when it does not (``_recovery``, over the
loops shared with TF Serving in ``adapters/_recovery.py``). A batch the model itself rejects is
bisected so each query gets its own answer: an output, or a ``BackendError`` for the queries
that fail on their own (``_replica``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferline.core import (
    CapacityError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ValidationError,
)

from .._remote import bearer_headers, settle_options
from ._client import TritonClient, TritonFailure, TritonModelMissing
from ._config import KEEP_BATCHER, BatcherSettings, TritonModelInfo, build_config, instance_count
from ._metrics import metrics_url_for
from ._replica import TritonReplica, _Managed
from ._stats import cumulative_figures, interval_figures
from ._steering import TritonSteering
from ._tensors import ModelIO
from ._url import SCHEMES, URL_OPTIONS, parse_triton_url

__all__ = ["SCHEMES", "TritonBackend", "TritonReplica", "parse_triton_url"]

log = logging.getLogger(__name__)

_PARAM_KEYS = frozenset({"outputs", "dynamic_batching"})


class TritonBackend(TritonSteering):
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
        metrics_url: the server's Prometheus page (default ``http://<host>:8002/metrics``),
            read by ``server_counters`` (the steer loop).
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
        metrics_url: str | None = None,
    ) -> None:
        protocol, address, query = parse_triton_url(url)
        o = settle_options(
            url,
            query,
            URL_OPTIONS,
            {
                "cpu_cores": cpu_cores,
                "gpus": gpus,
                "cpu_kind": cpu_kind,
                "gpu_kind": gpu_kind,
                "oversubscribe": oversubscribe,
                "timeout_s": timeout_s,
                "drain_timeout_s": drain_timeout_s,
                "recovery_timeout_s": recovery_timeout_s,
                "watch_interval_s": watch_interval_s,
                "unload_on_close": unload_on_close,
            },
        )
        super().__init__(url, o)
        self._init_models()
        self.protocol = protocol
        self.address = address
        self.cpu_kind = str(o["cpu_kind"])
        self.gpu_kind = str(o["gpu_kind"])
        self.oversubscribe = bool(o["oversubscribe"])
        self.probe_timeout_s = 2.0  # health probes after a failure must not wait a full timeout
        cpu_cores, gpus = o["cpu_cores"], o["gpus"]
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
        self._client = TritonClient(
            address,
            protocol,
            timeout_s=self.timeout_s,
            headers=bearer_headers(token),
        )
        self._seen_configs: dict[str, dict[str, Any]] = {}  # server model -> last config
        self._headers = bearer_headers(token)
        self.metrics_url = metrics_url_for(address, metrics_url)
        self._init_operator_settings()

    # -- views ------------------------------------------------------------------------------

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
        self._check_adoptable(name)
        await self.check_model_control()
        async with self._control_lock():
            try:
                if not await self._client.model_ready(server_name):
                    known = sorted(await self._loaded_names())
                    raise NotFoundError("loaded model", server_name, known)
                cfg = await self._client.model_config(server_name)
                self._seen_configs[server_name] = cfg
            except TritonFailure as e:
                raise self._error(e) from None
            self._remember_operator(server_name, cfg)
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
                adopted=True,
            )
            self._models[name] = m
            self._add_handles(m, config.replicas)
        self._notify(name)
        self._start_watch()
        return config

    # -- deploy / scale / remove ----------------------------------------------------------

    def _hardware_gpus(self, hardware: str) -> list[int]:
        """Where ``hardware`` places a model: [] for CPU, the server's GPUs for GPU."""
        if hardware == self.cpu_kind:
            return []
        if hardware == self.gpu_kind and self._gpus:
            return list(self._gpus)
        raise NotFoundError("hardware", hardware, sorted(self.inventory()))

    def _placement(self, m: _Managed, hardware: str) -> list[int] | None:
        """``build_config``'s ``gpus`` for moving ``m`` to ``hardware``: None (keep the
        instance group's kind and GPUs) when the hardware does not change, so an adopted
        ``KIND_GPU`` or ``KIND_MODEL`` group scales without ``gpus=``."""
        return None if hardware == m.config.hardware else self._hardware_gpus(hardware)

    def _units(self, m: _Managed, hardware: str) -> int:
        """Inventory units one replica of ``m`` takes on ``hardware`` (0: not counted, a
        GPU the server places itself and this backend was not told of)."""
        if hardware == self.cpu_kind:
            return m.spec.threads
        return 1 if hardware in self.inventory() else 0

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
        self._check_new(spec, _PARAM_KEYS)
        batcher = (
            BatcherSettings.from_dict(spec.params["dynamic_batching"])
            if spec.params.get("dynamic_batching") is not None
            else None
        )
        gpus = self._hardware_gpus(config.hardware)
        per = spec.threads if not gpus else 1
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
                self._remember_operator(server_name, current if was_ready else None)
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

    async def scale(self, model: str, replicas: int) -> None:
        """Change the instance count in place. New instances join when the load returns;
        removed ones leave the active set at once and go after their in-flight batch."""
        self._check_open()
        self._check_replicas(replicas)
        m = self._get(model)
        async with self._control_lock():
            cur = m.config.replicas
            if replicas == cur and len([h for h in m.handles if h.alive]) == cur:
                return
            self._check_capacity(
                m.config.hardware, (replicas - cur) * self._units(m, m.config.hardware)
            )
            if replicas < cur:
                victims = m.handles[replicas:]
                m.handles = m.handles[:replicas]
                if not await self._retire(model, victims, self.drain_timeout_s):
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
                        batcher=KEEP_BATCHER if m.adopted else m.batcher,
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
        gpus = self._placement(m, config.hardware)
        per = self._units(m, config.hardware)
        if not self.oversubscribe and per:
            used = self._used()
            mine = m.config.replicas * self._units(m, m.config.hardware)
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
                await self._retire(model, victims, self.drain_timeout_s)
            try:
                if config.replicas == 0:
                    await self._client.unload(m.server_name)
                    loaded = build_config(
                        m.triton_config,
                        max_batch_size=config.max_batch_size,
                        replicas=1,
                        gpus=gpus,
                        batcher=KEEP_BATCHER if m.adopted else m.batcher,
                    )
                    m.state = "unloaded"
                else:
                    desired = build_config(
                        m.triton_config,
                        max_batch_size=config.max_batch_size,
                        replicas=config.replicas,
                        gpus=gpus,
                        batcher=KEEP_BATCHER if m.adopted else m.batcher,
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
            for h in m.handles:  # the instances kept now run on the new hardware
                h._hardware = config.hardware
            if config.replicas > len(m.handles):
                self._add_handles(m, config.replicas - len(m.handles))
        self._notify(model)

    async def remove(self, model: str) -> None:
        """Stop serving ``model``: drain its instances, unload it from the server, forget it."""
        self._check_open()
        m = self._get(model)
        async with self._control_lock():
            victims, m.handles = m.handles, []
            await self._retire(model, victims, self.drain_timeout_s)
            try:
                await self._client.unload(m.server_name)
            except TritonModelMissing:
                pass
            except TritonFailure as e:
                raise self._error(e) from None
            finally:
                self._models.pop(model, None)

    # -- stats / close ----------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """Triton's statistics for ``model`` as cumulative counters and the figures of the
        interval since the previous call, plus the adapter's own client-side timing."""
        m = self._get(model)
        now = time.monotonic()
        server: dict[str, Any]
        try:
            raw = await self._client.statistics(m.server_name)
            prev, interval_s = m.stats.advance(raw, now)
            server = {
                "cumulative": cumulative_figures(raw),
                "interval": interval_figures(prev, raw, interval_s),
            }
        except TritonFailure as e:
            server = {"error": str(e)}
        return {
            **self._stats_head(m),
            "server_model": m.server_name,
            "max_batch_size": m.config.max_batch_size,
            "target_replicas": m.config.replicas,
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
        await self._stop_loops()
        await self._close_handles(min(self.drain_timeout_s, 5.0))
        if self.unload_on_close:
            for m in self._models.values():
                with contextlib.suppress(TritonFailure):
                    await self._client.unload(m.server_name)
        await self._client.close()
