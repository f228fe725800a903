"""gRPC front doors: KServe v2 and TF Serving on one port, behind the same bearer token.

Overload is refused, never reset. The inference RPCs (KServe ``ModelInfer``, TF Serving
``Predict``) of one port share a bound on calls in flight, ``max_inflight`` (default
:data:`DEFAULT_MAX_INFLIGHT`, 1,024; None: unbounded): past it a call is answered
``RESOURCE_EXHAUSTED`` ("retry later") right after the token check, before its inputs are
decoded, and counted in ``inferline_overloaded_total{model=<name it asked for>}`` (a name the
door does not serve: ``model=""``). Health, metadata and statistics RPCs are never refused.

Why the bound alone is not enough: ``grpc.aio`` takes arriving calls from grpc-core one at a
time on the event loop; the ones not taken yet wait in grpc-core's pending queue, and past
``grpc.server.max_pending_requests`` (1,000 by default, every call past a hard limit of
3,000) grpc-core kills them with a bare HTTP/2 RST_STREAM: the client sees ``CANCELLED``, and
nothing on the server ever sees the call to answer or count it. 2,000 concurrent calls on one
channel lost 10% that way. That queue is raised to :data:`CORE_BACKLOG` calls, so a burst
waits the few milliseconds the loop needs to reach each call and answer it, admitted or
refused; only a flood past that many calls waiting at once is still reset by grpc-core.

Door workers (``--door-workers N``, ``_grpc_worker``): once the
workers start, this door hands its port over (``hand_over``): its server stops, the port is
held bound but not listening (as the HTTP port), and every worker serves the port with its
own ``SO_REUSEPORT`` server. The RPC handlers registered here stay the answer to every RPC a
worker does not answer itself (``handlers``, run by ``_grpc_relay``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from inferline.server.frontdoors._door import FrontDoor
from inferline.server.frontdoors._grpc_status import Admission, TokenCheck
from inferline.server.frontdoors._kserve_grpc import kserve_servicer
from inferline.server.frontdoors._tfserving_grpc import tfserving_servicers

__all__ = [
    "CORE_BACKLOG",
    "DEFAULT_MAX_INFLIGHT",
    "FrontDoorGrpc",
    "grpc_door_of",
    "server_options",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 1024
# calls grpc-core may hold before the event loop takes them (see the module docstring)
CORE_BACKLOG = 1 << 16

# the gRPC door serving each service's port (door workers take it over: ``hand_over``)
_DOORS: weakref.WeakKeyDictionary[Any, FrontDoorGrpc] = weakref.WeakKeyDictionary()


def grpc_door_of(service: Any) -> FrontDoorGrpc | None:
    """The started gRPC door of ``service`` (None: it serves no gRPC port)."""
    return _DOORS.get(service)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """A gRPC door server's options (this process's, and every door worker's)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", 64 << 20),
        # past these grpc-core resets calls the loop has not taken yet (module docstring)
        ("grpc.server.max_pending_requests", CORE_BACKLOG),
        ("grpc.server.max_pending_requests_hard_limit", CORE_BACKLOG),
    ]


class _Recording:
    """The server the generated ``add_*_to_server`` functions see: registers on ``server``
    and keeps the generic handlers, which door workers relay to."""

    def __init__(self, server: Any, handlers: list[Any]) -> None:
        self.server = server
        self.handlers = handlers

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def __getattr__(self, name: str) -> Any:  # add_registered_method_handlers, ...
        return getattr(self.server, name)


def _methods(services: Sequence[str]) -> dict[str, str]:
    """Every RPC of ``services`` (full names, from the protobuf descriptors) and its kind:
    ``unary_unary``, ``stream_stream``, ..."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    out = {}
    for name in services:
        for m in pool.FindServiceByName(name).methods:
            kind = ("stream" if m.client_streaming else "unary") + "_"
            out[f"/{name}/{m.name}"] = kind + ("stream" if m.server_streaming else "unary")
    return out


class FrontDoorGrpc:
    """KServe v2 gRPC (tritonclient's definitions) and TF Serving gRPC on one port.

    ``await start()`` in the serving loop; ``await stop()`` (also registered with
    ``service.on_close``). Services whose generated modules are not installed are skipped;
    ``services`` lists the ones that run. ``protocols``: which of ``kserve`` and ``tfserving``
    to serve (both by default). ``max_inflight``: the most inference calls in flight on the
    port, past which a call is refused ``RESOURCE_EXHAUSTED`` and counted (None: no bound).
    """

    def __init__(
        self,
        door: FrontDoor,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_message_bytes: int = 1 << 20,
        protocols: Sequence[str] = ("kserve", "tfserving"),
        max_inflight: int | None = DEFAULT_MAX_INFLIGHT,
    ) -> None:
        if max_inflight is not None and (
            isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1
        ):
            raise ValueError(
                f"max_inflight must be a positive integer or None, not {max_inflight!r}"
            )
        self.door = door
        self.protocols = tuple(protocols)
        self.host = host
        self.port = port
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.services: list[str] = []
        self._server: Any = None
        self._auth = TokenCheck(token)
        self.max_inflight = max_inflight
        self.gate = Admission(max_inflight, self.count_refused)
        self.handlers: list[Any] = []  # the generic RPC handlers registered
        self._held: Any = None  # the port, held bound while door workers serve it

    def count_refused(self, name: str) -> None:
        """Count a call refused for overload (here, or in a door worker)."""
        # an unserved name is not a label value: a flood of random names must not add series
        self.door.service.metrics.overloaded(name if name in self.door.names() else "")

    async def start(self) -> int:
        import grpc

        server = grpc.aio.server(options=server_options(self.max_message_bytes))
        if "kserve" in self.protocols:
            self._add_kserve(_Recording(server, self.handlers))
        if "tfserving" in self.protocols:
            self._add_tfserving(_Recording(server, self.handlers))
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.port = server.add_insecure_port(f"{shown}:{self.port}")
        await server.start()
        self._server = server
        self.door.service.on_close(self.stop)
        with contextlib.suppress(TypeError):  # a service object without weak references
            _DOORS[self.door.service] = self
        log.info("gRPC front doors %s on %s:%d", self.services, self.host, self.port)
        return self.port

    def _add_kserve(self, server: Any) -> None:
        try:
            from tritonclient.grpc import service_pb2, service_pb2_grpc
        except ImportError as e:
            log.info("no KServe gRPC front door (tritonclient[grpc] missing: %s)", e)
            return
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            kserve_servicer(self.door, self._auth, service_pb2, service_pb2_grpc, self.gate),
            server,
        )
        self.services.append("inference.GRPCInferenceService")

    def _add_tfserving(self, server: Any) -> None:
        from inferline.adapters.tfserving import grpc_available, grpc_stubs

        if not grpc_available():
            log.info("no TF Serving gRPC front door (tensorflow-serving-api missing)")
            return
        st = grpc_stubs()
        pred, models = tfserving_servicers(
            self.door, self._auth, st, self.max_message_bytes, self.gate
        )
        st.prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(pred, server)
        st.model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, server)
        for m in ("prediction_service_pb2", "model_service_pb2"):  # their descriptors: _methods
            importlib.import_module("tensorflow_serving.apis." + m)
        self.services += ["tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"]

    async def hand_over(self) -> None:
        """Door workers serve the port from now on: stop serving it here, and hold it bound
        (``SO_REUSEPORT``, not listening: no connection comes here) until ``stop``."""
        import socket

        if self._server is None or self._held is not None:
            return
        server, self._server = self._server, None
        await server.stop(0)
        held = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind((self.host, self.port))
        self._held = held
        log.info("gRPC port %d handed over to the door workers", self.port)

    def worker_config(self, workers: int) -> dict[str, Any]:
        """What a door worker needs to serve this port (sent over the local channel)."""
        return {
            "host": self.host,
            "port": self.port,
            "max_message_bytes": self.max_message_bytes,
            # the bound holds per process: each worker has its own loop and grpc-core queue
            "max_inflight": self.max_inflight,
            "methods": _methods(self.services),
            "infer": "inference.GRPCInferenceService" in self.services,
            "workers": workers,
        }

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0.5)
        if self._held is not None:
            self._held.close()
            self._held = None
