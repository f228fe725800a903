"""``TFServingBackend``: inferline's narrow waist over TensorFlow Serving servers.

A replica is a TF Serving server endpoint serving the model: the backend holds a list of
servers (given, or processes it launches from a ``tensorflow_model_server`` binary), and a
model with ``replicas = n`` is loaded on ``n`` of them (at most one replica per server; models
may share servers, as TF Serving is built to). The interposed queue keeps one batch in flight
per replica handle and sends each preformed batch as one request (the batch on axis 0), so
the batch size is inferline's and the server's own batching (if configured) sees full batches.

Deploying and scaling use ``ModelService/HandleReloadConfigRequest``, which replaces a server's
whole model set: the backend keeps every server's set (from ``model_config_file``, or the empty
set of a server it launched) and always sends all of it, so models it does not change stay
loaded. A server whose set is unknown is served read-only (predict, status, metadata,
adoption) and a reload on it is refused with ``ValidationError``.

Failures come back as inferline's errors: a server that cannot be reached or no longer serves
the model fails the batch with ``ReplicaError`` (the queue retries elsewhere), its handle
leaves the active set, and a recovery task waits for the server, reloads its model set when
the model is missing (restarting a launched process that died) and publishes a fresh handle.
A batch the server rejects as ``INVALID_ARGUMENT`` is bisected so each bad query gets its own
``ValidationError`` and the good ones their outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    TFServingClient,
    TFServingConnectionError,
    TFServingFailure,
    TFServingInvalidArgument,
    TFServingNotFound,
)
from ._config import ServedModel, format_text, parse_text
from ._protos import np_dtype

__all__ = ["SCHEMES", "Endpoint", "TFServingBackend", "TFServingReplica", "find_model_server"]

log = logging.getLogger(__name__)

SCHEMES = {"tfserving": "rest", "tfserving+rest": "rest", "tfserving+grpc": "grpc"}
BINARY_ENV = "TENSORFLOW_MODEL_SERVER"
_PARAM_KEYS = frozenset(
    {"base_path", "platform", "versions", "signature_name", "outputs", "version"}
)


def find_model_server(binary: str | Sequence[str] | None = None) -> list[str] | None:
    """The command that starts a TF Serving server: ``binary``, ``$TENSORFLOW_MODEL_SERVER``
    (split like a shell word list) or ``tensorflow_model_server`` on PATH; None if none."""
    if binary:
        return shlex.split(binary) if isinstance(binary, str) else list(binary)
    env = os.environ.get(BINARY_ENV)
    if env:
        return shlex.split(env)
    found = shutil.which("tensorflow_model_server")
    return [found] if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
class Endpoint:
    """One TF Serving server: its REST and gRPC addresses and hardware kind."""

    rest: str | None
    grpc: str | None
    hardware: str = "cpu"
    models: dict[str, ServedModel] | None = None  # its whole model set, when known
    command: list[str] | None = None  # set when the backend launches it
    config_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    client: TFServingClient | None = None
    control: TFServingClient | None = None
    lock: asyncio.Lock | None = None
    recovering: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.rest or self.grpc or "?"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rest": self.rest,
            "grpc": self.grpc,
            "hardware": self.hardware,
            "launched": self.command is not None,
            "models": None if self.models is None else sorted(self.models),
        }


class TFServingReplica:
    """A model served by one TF Serving server."""

    def __init__(self, backend: TFServingBackend, managed: _Managed, ep: Endpoint, n: int) -> None:
        self._backend = backend
        self._m = managed
        self.endpoint = ep
        self._id = f"{managed.name}@{ep.name}#{n}"
        self._alive = True
        self.batches = 0
        self.items = 0
        self.busy_s = 0.0
        self.by_size: dict[int, list[float]] = {}
        self.inflight = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def model(self) -> str:
        return self._m.name

    @property
    def hardware(self) -> str:
        return self.endpoint.hardware

    @property
    def alive(self) -> bool:
        return self._alive and not self._backend.closed

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self.alive:
            raise ReplicaError(self._backend.url, self._id, "replica is not active")
        t0 = time.perf_counter()
        out = await self._backend._predict(self, self._m, list(inputs))
        dt = time.perf_counter() - t0
        self.batches += 1
        self.items += len(inputs)
        self.busy_s += dt
        self.by_size.setdefault(len(inputs), []).append(dt)
        return out

    def __repr__(self) -> str:
        return f"TFServingReplica({self._id!r}, alive={self.alive})"


@dataclass
class _Managed:
    name: str
    server_name: str
    spec: ModelSpec
    config: ModelConfig
    entry: ServedModel | None
    signature: str = "serving_default"
    version: int | None = None
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    output_dtypes: dict[str, str] = field(default_factory=dict)
    handles: list[TFServingReplica] = field(default_factory=list)
    adopted: bool = False


class TFServingBackend(ModelRegistry):
    """TF Serving servers as an inferline backend.

    Args:
        url: ``tfserving://host:8501`` (REST) or ``tfserving+grpc://host:8500``; several
            servers as ``tfserving://h1:8501,h2:8501``. Query options are read like the
            keyword arguments below (``?grpc_port=8500&model_config_file=/etc/models.conf``).
        servers: the servers as ``[{"rest": "h:8501", "grpc": "h:8500", "hardware": "cpu"}]``
            (instead of the URL's hosts).
        grpc_port / rest_port: the other API's port on the URL's hosts (model management is
            gRPC only; default: TF Serving's pairing, gRPC 8500 with REST 8501).
        model_config_file: the ``--model_config_file`` the servers were started with: their
            current model set, which every reload carries.
        models: names of models the servers serve (for discovery when no config file is given).
        launch: start this many servers (``tensorflow_model_server``, or ``binary``) on free
            loopback ports, each with an empty model set; stopped on ``close()``.
        binary: the server command (a path, or an argument list; default
            ``$TENSORFLOW_MODEL_SERVER`` or ``tensorflow_model_server`` on PATH).
        hardware: the hardware kind of the servers (default ``cpu``).
        timeout_s, load_timeout_s, recovery_timeout_s, start_timeout_s: limits for one
            request, for a model to become AVAILABLE, for a lost server to come back, and for
            a launched server to answer.
        default_max_batch_size: the max batch size reported for adopted models (TF Serving
            does not publish one).
        unload_on_close: unload the models inferline deployed when closing (default: leave
            them running, as an attached deployment should be).
        token: bearer token sent with every request (a server behind an auth proxy).
    """

    def __init__(
        self,
        url: str = "tfserving://127.0.0.1:8501",
        *,
        servers: Sequence[Mapping[str, Any]] | None = None,
        grpc_port: int | None = None,
        rest_port: int | None = None,
        model_config_file: str | None = None,
        models: Sequence[str] = (),
        launch: int = 0,
        binary: str | Sequence[str] | None = None,
        hardware: str = "cpu",
        timeout_s: float = 60.0,
        load_timeout_s: float = 120.0,
        recovery_timeout_s: float = 120.0,
        start_timeout_s: float = 60.0,
        default_max_batch_size: int = 1,
        unload_on_close: bool = False,
        token: str | None = None,
    ) -> None:
        if not isinstance(url, str) or "://" not in url:
            raise ValidationError("url", "'tfserving://host:port'", url)
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise ValidationError("url", f"a scheme among {sorted(SCHEMES)}", scheme)
        q = _query_options(url, dict(parse_qsl(parts.query)))
        self._url = url
        self.protocol = SCHEMES[scheme]
        grpc_port = q.get("grpc_port", grpc_port)
        rest_port = q.get("rest_port", rest_port)
        model_config_file = q.get("model_config_file", model_config_file)
        launch = int(q.get("launch", launch))
        self.hardware_kind = str(q.get("hardware", hardware))
        self.timeout_s = float(q.get("timeout_s", timeout_s))
        self.load_timeout_s = float(q.get("load_timeout_s", load_timeout_s))
        self.recovery_timeout_s = float(q.get("recovery_timeout_s", recovery_timeout_s))
        self.start_timeout_s = float(q.get("start_timeout_s", start_timeout_s))
        self.default_max_batch_size = int(q.get("default_max_batch_size", default_max_batch_size))
        self.unload_on_close = bool(q.get("unload_on_close", unload_on_close))
        self.extra_models = tuple(q.get("models", models))
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        known: dict[str, ServedModel] | None = None
        if model_config_file:
            try:
                text = Path(model_config_file).read_text()
            except OSError as e:
                raise ValidationError(
                    "model_config_file", "a readable file", f"{model_config_file}: {e}"
                ) from None
            known = {m.name: m for m in parse_text(text)}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        eps: list[Endpoint] = []
        if launch:
            cmd = find_model_server(q.get("binary", binary))
            if cmd is None:
                raise ValidationError(
                    "launch", f"a tensorflow_model_server binary (on PATH or ${BINARY_ENV})", None
                )
            self._tmp = tempfile.TemporaryDirectory(prefix="inferline-tfserving-")
            for i in range(launch):
                ep = Endpoint(
                    f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}", self.hardware_kind, {}
                )
                ep.command = cmd
                ep.config_path = Path(self._tmp.name) / f"server{i}.conf"
                eps.append(ep)
        elif servers:
            for i, s in enumerate(servers):
                s = dict(s)
                extra = set(s) - {"rest", "grpc", "hardware"}
                if extra or not (s.get("rest") or s.get("grpc")):
                    raise ValidationError(
                        f"servers[{i}]", "{rest, grpc, hardware} with an address", s
                    )
                eps.append(
                    Endpoint(
                        s.get("rest"),
                        s.get("grpc"),
                        str(s.get("hardware", self.hardware_kind)),
                        None if known is None else dict(known),
                    )
                )
        else:
            for host_port in parts.netloc.split(","):
                host, _, port_s = host_port.rpartition(":")
                if not host or not port_s.isdigit():
                    raise ValidationError(
                        "url", "hosts as 'host:port' (comma-separated)", host_port
                    )
                port = int(port_s)
                if self.protocol == "rest":
                    g = grpc_port if grpc_port is not None else (8500 if port == 8501 else None)
                    eps.append(
                        Endpoint(
                            f"{host}:{port}",
                            f"{host}:{g}" if g else None,
                            self.hardware_kind,
                            None if known is None else dict(known),
                        )
                    )
                else:
                    r = rest_port
                    eps.append(
                        Endpoint(
                            f"{host}:{r}" if r else None,
                            f"{host}:{port}",
                            self.hardware_kind,
                            None if known is None else dict(known),
                        )
                    )
        if not eps:
            raise ValidationError("servers", "at least one TF Serving server", [])
        for ep in eps:
            ep.client = TFServingClient(
                ep.rest, ep.grpc, self.protocol, timeout_s=self.timeout_s, headers=self._headers
            )
            if ep.grpc:
                ep.control = (
                    ep.client
                    if self.protocol == "grpc"
                    else TFServingClient(
                        None, ep.grpc, "grpc", timeout_s=self.timeout_s, headers=self._headers
                    )
                )
        self._endpoints = eps
        self._started = not launch
        self._models: dict[str, _Managed] = {}
        self._subscribers = ReplicaSubscribers()
        self._ids = itertools.count()
        self._closed = False

    # -- views ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def inventory(self) -> dict[str, int]:
        inv: dict[str, int] = {}
        for ep in self._endpoints:
            inv[ep.hardware] = inv.get(ep.hardware, 0) + 1
        return inv

    def free(self) -> dict[str, int]:
        """Servers that host no replica inferline manages, by hardware kind."""
        busy = {h.endpoint for m in self._models.values() for h in m.handles}
        out = dict.fromkeys(self.inventory(), 0)
        for ep in self._endpoints:
            if ep not in busy:
                out[ep.hardware] += 1
        return out

    def _lock(self, ep: Endpoint) -> asyncio.Lock:
        if ep.lock is None:
            ep.lock = asyncio.Lock()
        return ep.lock

    def _error(self, e: TFServingFailure) -> BackendError:
        return BackendError(self._url, str(e))

    # -- launched servers -------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        self._check_open()
        if self._started:
            return
        self._started = True
        try:
            await asyncio.gather(*(self._start_server(ep) for ep in self._endpoints if ep.command))
        except BaseException:
            self._started = False
            for ep in self._endpoints:
                self._stop_server(ep)
            raise

    async def _start_server(self, ep: Endpoint) -> None:
        assert ep.command is not None and ep.config_path is not None and ep.rest and ep.grpc
        ep.config_path.write_text(format_text(list((ep.models or {}).values())))
        args = [
            *ep.command,
            f"--port={ep.grpc.rpartition(':')[2]}",
            f"--rest_api_port={ep.rest.rpartition(':')[2]}",
            f"--model_config_file={ep.config_path}",
        ]
        # tensorflow_model_server has no flag for its gRPC bind address: it listens on
        # 0.0.0.0 with no credentials (model_servers/server.cc), model reloads included.
        log.warning(
            "launching tensorflow_model_server: its gRPC port %s listens on all interfaces "
            "with no credentials; keep it behind a firewall or in its own network namespace",
            ep.grpc.rpartition(":")[2],
        )
        logf = open(ep.config_path.with_suffix(".log"), "ab")
        try:
            ep.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            logf.close()
        log.info(
            "started TF Serving server pid %d (REST %s, gRPC %s)", ep.proc.pid, ep.rest, ep.grpc
        )
        assert ep.client is not None
        deadline = time.monotonic() + self.start_timeout_s
        while not await ep.client.ready(timeout_s=1.0):
            if ep.proc.poll() is not None:
                tail = (
                    ep.config_path.with_suffix(".log")
                    .read_bytes()[-500:]
                    .decode("utf-8", "replace")
                )
                raise BackendError(
                    self._url, f"server {ep.name} exited with {ep.proc.returncode}: {tail}"
                )
            if time.monotonic() > deadline:
                raise BackendError(
                    self._url, f"server {ep.name} not ready within {self.start_timeout_s} s"
                )
            await asyncio.sleep(0.05)

    def _stop_server(self, ep: Endpoint) -> None:
        p = ep.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(5.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5.0)

    def server_pids(self) -> list[int]:
        """Process ids of the servers this backend launched and that still run."""
        return [
            ep.proc.pid for ep in self._endpoints if ep.proc is not None and ep.proc.poll() is None
        ]

    # -- model sets -------------------------------------------------------------------------

    async def _set_models(
        self, ep: Endpoint, models: dict[str, ServedModel], wait_for: Sequence[str]
    ) -> None:
        """Reload ``ep`` with exactly ``models`` and wait until ``wait_for`` are AVAILABLE."""
        if ep.models is None:
            raise ValidationError(
                f"model set of server {ep.name}",
                "known, so that a reload can carry it (pass model_config_file=, or let the backend launch the server)",
                None,
            )
        if ep.control is None:
            raise ValidationError(
                f"gRPC address of server {ep.name}",
                "host:port (model management is gRPC only)",
                None,
            )
        try:
            await ep.control.reload(list(models.values()), timeout_s=self.load_timeout_s)
        except TFServingFailure as e:
            raise self._error(e) from None
        ep.models = dict(models)
        if ep.config_path is not None:  # a launched server restarts with the same set
            ep.config_path.write_text(format_text(list(models.values())))
        for name in wait_for:
            await self._wait_available(ep, name)

    async def _wait_available(self, ep: Endpoint, name: str) -> None:
        assert ep.client is not None
        deadline = time.monotonic() + self.load_timeout_s
        last: Any = None
        while True:
            try:
                st = await ep.client.status(name)
                last = st
                if any(s["state"] == "AVAILABLE" for s in st):
                    return
                bad = [s for s in st if s["state"] == "END" and s["error_code"] != "OK"]
                if bad:
                    raise BackendError(
                        self._url,
                        f"{name!r} failed to load on {ep.name}: {bad[0]['error_message']}",
                    )
            except TFServingNotFound as e:
                last = str(e)
            except TFServingFailure as e:
                raise self._error(e) from None
            if time.monotonic() > deadline:
                raise BackendError(
                    self._url,
                    f"{name!r} not AVAILABLE on {ep.name} within {self.load_timeout_s} s: {last}",
                )
            await asyncio.sleep(0.05)

    # -- discovery --------------------------------------------------------------------------

    async def discover(self) -> dict[str, dict[str, Any]]:
        """What the servers serve: per model, its status on each server and its signatures.

        Model names come from the servers' known model sets, the models inferline manages and
        ``models=`` (TF Serving has no call that lists models).
        """
        await self._ensure_started()
        out: dict[str, dict[str, Any]] = {}
        for ep in self._endpoints:
            assert ep.client is not None
            names = set(ep.models or {}) | set(self._models) | set(self.extra_models)
            for name in sorted(names):
                server_name = self._models[name].server_name if name in self._models else name
                try:
                    st = await ep.client.status(server_name)
                except TFServingNotFound:
                    continue
                except TFServingFailure as e:
                    raise self._error(e) from None
                info = out.setdefault(
                    name, {"name": name, "servers": {}, "signatures": None, "base_path": None}
                )
                info["servers"][ep.name] = st
                if ep.models and name in ep.models:
                    info["base_path"] = ep.models[name].base_path
                if info["signatures"] is None and any(s["state"] == "AVAILABLE" for s in st):
                    try:
                        info["signatures"] = (await ep.client.metadata(server_name))["signatures"]
                    except TFServingFailure as e:
                        log.warning("no metadata for %r on %s: %s", name, ep.name, e)
        return out

    async def model_metadata(self, model: str) -> dict[str, Any]:
        """The model's metadata (signatures) from the first server that serves it."""
        await self._ensure_started()
        name = self._models[model].server_name if model in self._models else model
        last: Exception | None = None
        for ep in self._endpoints:
            assert ep.client is not None
            try:
                return await ep.client.metadata(name)
            except TFServingNotFound as e:
                last = e
            except TFServingFailure as e:
                raise self._error(e) from None
        raise NotFoundError(
            "model", model, f"not served by {[e.name for e in self._endpoints]} ({last})"
        )

    async def _load_signature(self, m: _Managed, ep: Endpoint) -> None:
        assert ep.client is not None
        try:
            meta = await ep.client.metadata(m.server_name)
        except TFServingFailure as e:
            raise self._error(e) from None
        sigs = meta["signatures"]
        if m.signature not in sigs:
            raise ValidationError(
                f"{m.name}.params.signature_name", f"one of {sorted(sigs)}", m.signature
            )
        sig = sigs[m.signature]
        m.inputs = sig["inputs"]
        outs = m.spec.params.get("outputs")
        if outs is None:
            m.outputs = tuple(sorted(sig["outputs"]))
        else:
            if isinstance(outs, str) or not outs or not set(outs) <= set(sig["outputs"]):
                raise ValidationError(
                    f"{m.name}.params.outputs", f"a list among {sorted(sig['outputs'])}", outs
                )
            m.outputs = tuple(outs)
        m.output_dtypes = {k: v["dtype"] for k, v in sig["outputs"].items()}

    # -- deploy / scale / remove ------------------------------------------------------------

    def _pick(self, m: _Managed, hardware: str, n: int) -> list[Endpoint]:
        hosting = {h.endpoint for h in m.handles}
        cands = [ep for ep in self._endpoints if ep.hardware == hardware and ep not in hosting]
        if hardware not in self.inventory():
            raise NotFoundError("hardware", hardware, sorted(self.inventory()))
        if len(cands) < n:
            raise CapacityError(
                f"{m.name!r} needs {n} more {hardware!r} servers without it; {len(cands)} left on {self._url} "
                "(a TF Serving replica is a server: at most one per server)",
                self.free(),
            )
        load = {ep: 0 for ep in self._endpoints}
        for mm in self._models.values():
            for h in mm.handles:
                load[h.endpoint] += 1
        return sorted(cands, key=lambda ep: (load[ep], self._endpoints.index(ep)))[:n]

    def _entry(self, spec: ModelSpec) -> ServedModel | None:
        p = spec.params
        server_name = spec.source or spec.name
        if p.get("base_path"):
            v = p.get("versions")
            return ServedModel(
                server_name,
                str(p["base_path"]),
                str(p.get("platform", "tensorflow")),
                None if v is None else tuple(int(x) for x in v),
            )
        for ep in self._endpoints:
            if ep.models and server_name in ep.models:
                return ep.models[server_name]
        return None

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        """Load ``spec`` on ``config.replicas`` servers of ``config.hardware``.

        ``spec.source`` is the model's name on the servers (default ``spec.name``);
        ``spec.params``: ``base_path`` (the SavedModel directory, needed unless a server's
        model set already has the model), ``platform``, ``versions``, ``signature_name``
        (default ``serving_default``), ``outputs`` (output names to return, default all),
        ``version`` (pin predictions to one version).
        """
        await self._ensure_started()
        if spec.name in self._models:
            raise ValidationError(
                "model", "a model that is not deployed yet (use scale() or remove())", spec.name
            )
        extra = set(spec.params) - _PARAM_KEYS
        if extra:
            raise ValidationError(
                f"{spec.name}.params", f"keys among {sorted(_PARAM_KEYS)}", sorted(extra)
            )
        entry = self._entry(spec)
        if entry is None:
            raise ValidationError(
                f"{spec.name}.params.base_path", "the model's directory on the servers", None
            )
        m = _Managed(
            spec.name,
            entry.name,
            spec,
            config,
            entry,
            signature=str(spec.params.get("signature_name", "serving_default")),
            version=None if spec.params.get("version") is None else int(spec.params["version"]),
        )
        eps = self._pick(m, config.hardware, config.replicas)
        self._models[spec.name] = m
        try:
            await self._grow(m, eps)
        except BaseException:
            self._models.pop(spec.name, None)
            raise
        self._notify(spec.name)

    async def _grow(self, m: _Managed, eps: Sequence[Endpoint]) -> None:
        assert m.entry is not None
        done: list[Endpoint] = []
        try:
            for ep in eps:
                async with self._lock(ep):
                    models = dict(ep.models or {})
                    models[m.server_name] = m.entry
                    await self._set_models(ep, models, [m.server_name])
                done.append(ep)
            if not m.inputs and eps:
                await self._load_signature(m, eps[0])
        except BaseException:
            for ep in done:  # all or nothing
                with contextlib.suppress(Exception):
                    await self._shrink_endpoint(m, ep)
            raise
        for ep in eps:
            m.handles.append(TFServingReplica(self, m, ep, next(self._ids)))

    async def _shrink_endpoint(self, m: _Managed, ep: Endpoint) -> None:
        async with self._lock(ep):
            if ep.models is not None and m.server_name in ep.models:
                models = {k: v for k, v in ep.models.items() if k != m.server_name}
                await self._set_models(ep, models, [])

    async def scale(self, model: str, replicas: int) -> None:
        """Load the model on more servers, or unload it from some (after their in-flight batch)."""
        self._check_open()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        m = self._get(model)
        cur = len(m.handles)
        if replicas > cur:
            if m.entry is None:
                raise ValidationError(
                    f"{model}.base_path",
                    "known (the model was adopted without a config file)",
                    None,
                )
            eps = self._pick(m, m.config.hardware, replicas - cur)
            await self._grow(m, eps)
        elif replicas < cur:
            victims = m.handles[replicas:]
            m.handles = m.handles[:replicas]
            for h in victims:
                h._alive = False
            self._notify(model)
            for h in victims:
                await self._drain(h)
                await self._shrink_endpoint(m, h.endpoint)
        m.config = ModelConfig(m.config.hardware, m.config.max_batch_size, replicas)
        if replicas > cur:
            self._notify(model)

    async def _drain(self, h: TFServingReplica, timeout_s: float = 30.0) -> None:
        # The queue stops giving a removed handle batches; wait for the one it may hold.
        deadline = time.monotonic() + timeout_s
        while h.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def remove(self, model: str) -> None:
        self._check_open()
        m = self._get(model)
        if m.adopted and m.entry is None:
            # Not ours to unload (no carried entry): only stop managing it.
            for h in m.handles:
                h._alive = False
            m.handles.clear()
            self._notify(model)
            self._models.pop(model, None)
            return
        await self.scale(model, 0)
        self._models.pop(model, None)

    async def adopt(
        self,
        server_name: str,
        *,
        name: str | None = None,
        outputs: Sequence[str] | None = None,
        signature_name: str = "serving_default",
    ) -> ModelConfig:
        """Start managing a model the servers already serve, without reloading anything.
        Returns its configuration in inferline's terms (one replica per serving server)."""
        await self._ensure_started()
        name = name or server_name
        if name in self._models:
            raise ValidationError("model", "a model not managed yet", name)
        eps = []
        for ep in self._endpoints:
            assert ep.client is not None
            try:
                st = await ep.client.status(server_name)
            except TFServingNotFound:
                continue
            except TFServingFailure as e:
                raise self._error(e) from None
            if any(s["state"] == "AVAILABLE" for s in st):
                eps.append(ep)
        if not eps:
            raise NotFoundError(
                "served model", server_name, f"not AVAILABLE on {[e.name for e in self._endpoints]}"
            )
        params: dict[str, Any] = {"signature_name": signature_name}
        if outputs is not None:
            params["outputs"] = list(outputs)
        entry = next(
            (ep.models[server_name] for ep in eps if ep.models and server_name in ep.models), None
        )
        config = ModelConfig(eps[0].hardware, max(1, self.default_max_batch_size), len(eps))
        m = _Managed(
            name,
            server_name,
            ModelSpec(name, source=server_name, params=params),
            config,
            entry,
            signature=signature_name,
            adopted=True,
        )
        await self._load_signature(m, eps[0])
        m.handles = [TFServingReplica(self, m, ep, next(self._ids)) for ep in eps]
        self._models[name] = m
        self._notify(name)
        return config

    # -- predict ------------------------------------------------------------------------------

    def _encode(self, m: _Managed, item: Any, where: str) -> dict[str, np.ndarray]:
        names = sorted(m.inputs)
        if isinstance(item, Mapping):
            if set(item) != set(names):
                raise ValidationError(where, f"named inputs {names}", sorted(map(str, item)))
            raw = dict(item)
        elif len(names) == 1:
            raw = {names[0]: item}
        else:
            raise ValidationError(
                where, f"a mapping of the named inputs {names}", type(item).__name__
            )
        out = {}
        for k in names:
            info = m.inputs[k]
            dt = info["dtype"]
            try:
                a = np.asarray(
                    raw[k], dtype=object if dt == "DT_STRING" else np_dtype(dt, f"{where}.{k}")
                )
            except (TypeError, ValueError) as e:
                raise ValidationError(f"{where}.{k}", f"an array of {dt}", str(e)) from None
            shape = info.get("shape")
            if shape is not None and len(shape) >= 1:
                want = shape[1:]
                if a.ndim != len(want) or any(
                    w >= 0 and w != g for w, g in zip(want, a.shape, strict=False)
                ):
                    dims = ", ".join("*" if w < 0 else str(w) for w in want)
                    raise ValidationError(f"{where}.{k}", f"shape ({dims})", tuple(a.shape))
            out[k] = a
        return out

    async def _predict(self, h: TFServingReplica, m: _Managed, inputs: list[Any]) -> list[Any]:
        results: list[Any] = [None] * len(inputs)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for i, x in enumerate(inputs):
            try:
                enc = self._encode(m, x, f"{m.name} input")
            except ValidationError as e:
                results[i] = e
                continue
            key = tuple((k, v.shape) for k, v in sorted(enc.items()))
            groups.setdefault(key, []).append((i, enc))
        h.inflight += 1
        try:
            for items in groups.values():
                await self._send(h, m, items, results)
        finally:
            h.inflight -= 1
        return results

    async def _send(
        self,
        h: TFServingReplica,
        m: _Managed,
        items: list[tuple[int, dict[str, np.ndarray]]],
        results: list[Any],
    ) -> None:
        ep = h.endpoint
        assert ep.client is not None
        batch = {k: np.stack([enc[k] for _, enc in items]) for k in items[0][1]}
        try:
            outs = await ep.client.predict(
                m.server_name,
                batch,
                signature=m.signature,
                version=m.version,
                output_dtypes=m.output_dtypes,
                output_filter=m.outputs
                if len(m.outputs) == 1 or m.spec.params.get("outputs")
                else (),
            )
        except TFServingInvalidArgument as e:
            if len(items) == 1:
                results[items[0][0]] = ValidationError(
                    f"{m.name} input", f"an input {m.name!r} accepts", e.message
                )
                return
            half = len(items) // 2
            await self._send(h, m, items[:half], results)
            await self._send(h, m, items[half:], results)
            return
        except (TFServingConnectionError, TFServingNotFound) as e:
            self._lost(h, m, str(e))
            raise ReplicaError(self._url, h.id, str(e)) from None
        except TFServingFailure as e:
            raise ReplicaError(self._url, h.id, str(e)) from None
        names = [n for n in m.outputs if n in outs] or list(outs)
        n = len(items)
        for k in names:
            if outs[k].ndim == 0 or outs[k].shape[0] != n:
                raise ReplicaError(
                    self._url, h.id, f"output {k!r} has shape {outs[k].shape}, not a batch of {n}"
                )
        for j, (i, _) in enumerate(items):
            results[i] = outs[names[0]][j] if len(names) == 1 else {k: outs[k][j] for k in names}

    # -- recovery -----------------------------------------------------------------------------

    def _lost(self, h: TFServingReplica, m: _Managed, reason: str) -> None:
        ep = h.endpoint
        changed = [
            mm.name
            for mm in self._models.values()
            for hh in mm.handles
            if hh.endpoint is ep and hh._alive
        ]
        for mm in self._models.values():
            for hh in mm.handles:
                if hh.endpoint is ep:
                    hh._alive = False
        log.warning("TF Serving server %s lost (%s); recovering", ep.name, reason)
        for name in changed:
            self._notify(name)
        if ep.recovering is None or ep.recovering.done():
            ep.recovering = asyncio.get_running_loop().create_task(
                self._recover(ep), name=f"tfserving-recover-{ep.name}"
            )

    async def _recover(self, ep: Endpoint) -> None:
        assert ep.client is not None
        deadline = time.monotonic() + self.recovery_timeout_s
        while not self._closed and time.monotonic() < deadline:
            try:
                if ep.proc is not None and ep.proc.poll() is not None:
                    log.warning(
                        "launched server %s exited with %s; restarting it",
                        ep.name,
                        ep.proc.returncode,
                    )
                    await self._start_server(ep)
                if not await ep.client.ready(timeout_s=1.0):
                    await asyncio.sleep(0.2)
                    continue
                mine = [
                    mm
                    for mm in self._models.values()
                    if any(hh.endpoint is ep for hh in mm.handles)
                ]
                missing = []
                for mm in mine:
                    try:
                        st = await ep.client.status(mm.server_name)
                        if not any(s["state"] == "AVAILABLE" for s in st):
                            missing.append(mm.server_name)
                    except TFServingNotFound:
                        missing.append(mm.server_name)
                if missing and ep.models is not None:
                    async with self._lock(ep):
                        await self._set_models(ep, dict(ep.models), missing)
                elif missing:
                    await asyncio.sleep(0.5)  # not ours to reload: wait for its operator
                    continue
                for mm in mine:
                    for i, hh in enumerate(mm.handles):
                        if hh.endpoint is ep:
                            mm.handles[i] = TFServingReplica(self, mm, ep, next(self._ids))
                    self._notify(mm.name)
                log.info("TF Serving server %s recovered", ep.name)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("recovering %s: %s", ep.name, e)
                await asyncio.sleep(0.5)
        log.error(
            "TF Serving server %s did not come back within %s s", ep.name, self.recovery_timeout_s
        )

    # -- stats / close --------------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """Client-side timing per replica (batches, items, mean latency per batch size) and
        the model's state on each of its servers."""
        m = self._get(model)
        reps = []
        for h in m.handles:
            st: Any
            try:
                assert h.endpoint.client is not None
                st = await h.endpoint.client.status(m.server_name)
            except TFServingFailure as e:
                st = str(e)
            reps.append(
                {
                    "id": h.id,
                    "server": h.endpoint.name,
                    "alive": h.alive,
                    "status": st,
                    "batches": h.batches,
                    "items": h.items,
                    "busy_s": h.busy_s,
                    "mean_latency_s_by_batch": {
                        b: float(np.mean(v)) for b, v in sorted(h.by_size.items())
                    },
                }
            )
        return {
            "model": model,
            "backend": self._url,
            "server_name": m.server_name,
            "hardware": m.config.hardware,
            "target_replicas": len(m.handles),
            "active_replicas": sum(1 for h in m.handles if h.alive),
            "batches": sum(h.batches for h in m.handles),
            "items": sum(h.items for h in m.handles),
            "replicas": reps,
        }

    async def close(self) -> None:
        """Stop recovery, close clients and stop launched servers. Idempotent."""
        if self._closed:
            return
        if self.unload_on_close:
            for m in list(self._models.values()):
                if m.entry is not None and not m.adopted:
                    with contextlib.suppress(Exception):
                        await self.scale(m.name, 0)
        self._closed = True
        for name in list(self._models):
            self._subscribers.notify(name, [])
        for ep in self._endpoints:
            if ep.recovering is not None:
                ep.recovering.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ep.recovering
            for c in {id(ep.client): ep.client, id(ep.control): ep.control}.values():
                if c is not None:
                    await c.close()
            self._stop_server(ep)
        self._models.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _query_options(url: str, query: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in query.items():
        where = f"{url}: {k}"
        try:
            if k in ("grpc_port", "rest_port", "launch", "default_max_batch_size"):
                out[k] = int(v)
            elif k in ("timeout_s", "load_timeout_s", "recovery_timeout_s", "start_timeout_s"):
                out[k] = float(v)
            elif k == "unload_on_close":
                out[k] = v.lower() in ("1", "true", "yes")
            elif k == "models":
                out[k] = [x for x in v.split(",") if x]
            elif k in ("model_config_file", "hardware", "binary"):
                out[k] = v
            else:
                raise ValidationError(where, "a TFServingBackend option", k)
        except ValueError:
            raise ValidationError(where, "a valid value", v) from None
    return out
