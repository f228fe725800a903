"""gRPC front doors: KServe v2 and TF Serving on one port, behind the same bearer token."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from inferline.server.frontdoors._door import FrontDoor
from inferline.server.frontdoors._grpc_status import TokenCheck
from inferline.server.frontdoors._kserve_grpc import kserve_servicer
from inferline.server.frontdoors._tfserving_grpc import tfserving_servicers

__all__ = ["FrontDoorGrpc"]

log = logging.getLogger(__name__)


class FrontDoorGrpc:
    """KServe v2 gRPC (tritonclient's definitions) and TF Serving gRPC on one port.

    ``await start()`` in the serving loop; ``await stop()`` (also registered with
    ``service.on_close``). Services whose generated modules are not installed are skipped;
    ``services`` lists the ones that run. ``protocols``: which of ``kserve`` and ``tfserving``
    to serve (both by default).
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
    ) -> None:
        self.door = door
        self.protocols = tuple(protocols)
        self.host = host
        self.port = port
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.services: list[str] = []
        self._server: Any = None
        self._auth = TokenCheck(token)

    async def start(self) -> int:
        import grpc

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", 64 << 20),
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
            kserve_servicer(self.door, self._auth, service_pb2, service_pb2_grpc), server
        )
        self.services.append("inference.GRPCInferenceService")

    def _add_tfserving(self, server: Any) -> None:
        from inferline.adapters.tfserving import grpc_available, grpc_stubs

        if not grpc_available():
            log.info("no TF Serving gRPC front door (tensorflow-serving-api missing)")
            return
        st = grpc_stubs()
        pred, models = tfserving_servicers(self.door, self._auth, st, self.max_message_bytes)
        st.prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(pred, server)
        st.model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, server)
        self.services += ["tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"]

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0.5)
