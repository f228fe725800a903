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
Each operator entry is sent back as the text it came as, so its version policy, labels and
every other field survive (``_config``); ``restore_operator_settings()`` puts the operator's
model sets back when attach stops, ``operator_snapshot()`` is the same as JSON for
``restore_snapshot(url, snapshot)`` after a crash (``_snapshot``).
Steering (``inferline attach --steer``): ``apply_server_batcher`` sets a model's TF Serving
batcher through a new version directory and two reloads, ``server_counters`` reads the
servers' Prometheus pages (``_steer``).

Failures come back as inferline's errors: a server that cannot be reached or no longer serves
the model fails the batch with ``ReplicaError`` (the queue retries elsewhere), its handle
leaves the active set, and a recovery task waits for the server, reloads its model set when
the model is missing (restarting a launched process that died) and publishes a fresh handle.
A batch the server rejects as ``INVALID_ARGUMENT`` is bisected so each bad query gets its own
``ValidationError`` and the good ones their outputs.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from inferline.core import CapacityError, ModelConfig, ModelSpec, NotFoundError, ValidationError

from .._remote import bearer_headers, settle_options, split_url
from ._client import TFServingClient, TFServingFailure, TFServingNotFound
from ._config import ServedModel
from ._metrics import METRICS_PATH
from ._replica import TFServingReplica, _Managed
from ._servers import (
    Endpoint,
    find_model_server,
    given_endpoints,
    known_models,
    launched_endpoints,
    stop_server,
)
from ._steer import TFServingSteer

__all__ = ["SCHEMES", "Endpoint", "TFServingBackend", "TFServingReplica", "find_model_server"]

log = logging.getLogger(__name__)

SCHEMES = {"tfserving": "rest", "tfserving+rest": "rest", "tfserving+grpc": "grpc"}
_PARAM_KEYS = frozenset(
    {"base_path", "platform", "versions", "signature_name", "outputs", "version"}
)


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _loose_flag(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


_URL_OPTIONS = {  # option -> how to read it from the query text
    "grpc_port": int,
    "rest_port": int,
    "launch": int,
    "default_max_batch_size": int,
    "timeout_s": float,
    "load_timeout_s": float,
    "recovery_timeout_s": float,
    "start_timeout_s": float,
    "unload_on_close": _loose_flag,
    "models": _names,
    "model_config_file": str,
    "hardware": str,
    "binary": str,
    "metrics_path": str,
}


class TFServingBackend(TFServingSteer):
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
        metrics_path: where the servers serve their Prometheus page on the REST port
            (``server_counters``; TF Serving's ``--monitoring_config_file`` sets it).
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
        metrics_path: str = METRICS_PATH,
        token: str | None = None,
    ) -> None:
        protocol, parts = split_url(url, SCHEMES, "'tfserving://host:port'")
        o = settle_options(
            url,
            parts.query,
            _URL_OPTIONS,
            {
                "grpc_port": grpc_port,
                "rest_port": rest_port,
                "model_config_file": model_config_file,
                "models": models,
                "launch": launch,
                "binary": binary,
                "hardware": hardware,
                "timeout_s": timeout_s,
                "load_timeout_s": load_timeout_s,
                "recovery_timeout_s": recovery_timeout_s,
                "start_timeout_s": start_timeout_s,
                "default_max_batch_size": default_max_batch_size,
                "unload_on_close": unload_on_close,
                "metrics_path": metrics_path,
            },
        )
        super().__init__(url, o)
        self.protocol = protocol
        self.hardware_kind = str(o["hardware"])
        self.load_timeout_s = float(o["load_timeout_s"])
        self.start_timeout_s = float(o["start_timeout_s"])
        self.default_max_batch_size = int(o["default_max_batch_size"])
        self.extra_models = tuple(o["models"])
        self.metrics_path = str(o["metrics_path"])
        headers = bearer_headers(token)
        known = known_models(o["model_config_file"])
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        launch = int(o["launch"])
        if launch:
            eps, self._tmp = launched_endpoints(launch, o["binary"], self.hardware_kind)
        else:
            eps = given_endpoints(
                parts,
                self.protocol,
                servers,
                grpc_port=o["grpc_port"],
                rest_port=o["rest_port"],
                hardware=self.hardware_kind,
                known=known,
            )
        if not eps:
            raise ValidationError("servers", "at least one TF Serving server", [])
        self._connect(eps, headers)
        self._init_servers(eps, started=not launch)

    def _connect(self, eps: list[Endpoint], headers: dict[str, str]) -> None:
        """Each server's client, and its gRPC client for model management."""
        for ep in eps:
            ep.client = TFServingClient(
                ep.rest, ep.grpc, self.protocol, timeout_s=self.timeout_s, headers=headers
            )
            if ep.grpc:
                ep.control = (
                    ep.client
                    if self.protocol == "grpc"
                    else TFServingClient(
                        None, ep.grpc, "grpc", timeout_s=self.timeout_s, headers=headers
                    )
                )

    # -- views ------------------------------------------------------------------------------

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
                st = await self._status(ep, server_name)
                if st is None:
                    continue
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
        self._check_new(spec, _PARAM_KEYS)
        entry = self._entry(spec)
        if entry is None:
            raise ValidationError(
                f"{spec.name}.params.base_path", "the model's directory on the servers", None
            )
        m = _Managed(
            name=spec.name,
            server_name=entry.name,
            spec=spec,
            config=config,
            entry=entry,
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

    async def scale(self, model: str, replicas: int) -> None:
        """Load the model on more servers, or unload it from some (after their in-flight batch)."""
        self._check_open()
        self._check_replicas(replicas)
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
            # the queue gives a removed handle no more batches: wait for the one it may hold
            await self._retire(model, victims, self.drain_timeout_s)
            for h in victims:
                await self._shrink_endpoint(m, h.endpoint)
        m.config = ModelConfig(m.config.hardware, m.config.max_batch_size, replicas)
        if replicas > cur:
            self._notify(model)

    async def remove(self, model: str) -> None:
        self._check_open()
        m = self._get(model)
        if m.adopted and m.entry is None:
            # Not ours to unload (no carried entry): only stop managing it.
            victims, m.handles = m.handles, []
            for h in victims:
                h._kill()
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
        self._check_adoptable(name)
        eps = []
        for ep in self._endpoints:
            st = await self._status(ep, server_name)
            if st is not None and any(s["state"] == "AVAILABLE" for s in st):
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
            name=name,
            server_name=server_name,
            spec=ModelSpec(name, source=server_name, params=params),
            config=config,
            entry=entry,
            signature=signature_name,
            adopted=True,
        )
        await self._load_signature(m, eps[0])
        m.handles = [TFServingReplica(self, m, ep, next(self._ids)) for ep in eps]
        self._models[name] = m
        self._notify(name)
        return config

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
                {"id": h.id, "server": h.endpoint.name, "alive": h.alive, "status": st}
                | h.figures()
            )
        return {
            **self._stats_head(m),
            "server_name": m.server_name,
            "target_replicas": len(m.handles),
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
        await self._stop_loops()
        await self._close_handles(0.0)  # launched servers stop: in-flight batches fail
        for ep in self._endpoints:
            for c in {id(ep.client): ep.client, id(ep.control): ep.control}.values():
                if c is not None:
                    await c.close()
            stop_server(ep)
        self._models.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
