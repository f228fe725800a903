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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from inferline.server.frontdoors._door import FrontDoor
from inferline.server.frontdoors._grpc_status import Admission, TokenCheck
from inferline.server.frontdoors._kserve_grpc import kserve_servicer
from inferline.server.frontdoors._tfserving_grpc import tfserving_servicers

__all__ = ["CORE_BACKLOG", "DEFAULT_MAX_INFLIGHT", "FrontDoorGrpc"]

log = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 1024
# calls grpc-core may hold before the event loop takes them (see the module docstring)
CORE_BACKLOG = 1 << 16


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
        self.gate = Admission(max_inflight, self._count_refused)

    def _count_refused(self, name: str) -> None:
        # an unserved name is not a label value: a flood of random names must not add series
        self.door.service.metrics.overloaded(name if name in self.door.names() else "")

    async def start(self) -> int:
        import grpc

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", 64 << 20),
                # past these grpc-core resets calls the loop has not taken yet (docstring)
                ("grpc.server.max_pending_requests", CORE_BACKLOG),
                ("grpc.server.max_pending_requests_hard_limit", CORE_BACKLOG),
            ]
        )
        if "kserve" in self.protocols:
            self._add_kserve(server)
        if "tfserving" in self.protocols:
            self._add_tfserving(server)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.port = server.add_insecure_port(f"{shown}:{self.port}")
        await server.start()
        self._server = server
        self.door.service.on_close(self.stop)
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
        self.services += ["tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"]

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0.5)
