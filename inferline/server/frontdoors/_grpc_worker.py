"""The gRPC front in a door worker process (``--door-workers N``): the worker's own
``grpc.aio`` server on the gRPC port (``SO_REUSEPORT``: the kernel spreads connections over
the workers), with the single-process door's rules: the bearer token on every RPC, the
message size limit, the bound on inference calls in flight (RESOURCE_EXHAUSTED past it,
counted by the queue process), the same validation and status codes.

``ModelInfer`` is decoded here (``decode_infer``: the single-process door's decode and limits)
and its tensors go to the queue process over the local channel, as the HTTP path's do; the
outputs come back and are encoded here (``infer_response``). Every other RPC (health,
metadata, model config, statistics, TF Serving's) is forwarded whole and answered by the
queue process's own handlers (``_grpc_relay``): they are cheap, and their answers then
always match the queue's live state (readiness, statistics, traced outputs).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

from inferline.core import InferlineError
from inferline.server._frames import pack_tensors, unpack_tensors
from inferline.server.frontdoors._grpc import server_options
from inferline.server.frontdoors._grpc_status import Admission, TokenCheck, grpc_fail, unimplemented
from inferline.server.frontdoors._kserve_grpc import admit_infer, decode_infer, infer_response

__all__ = ["INFER_RPC", "WorkerGrpc", "start_worker_grpc"]

INFER_RPC = "/inference.GRPCInferenceService/ModelInfer"
QUEUE_GONE = "the server's queue process is gone (exiting or failed)"


class WorkerGrpc:
    """The worker's ``grpc.GenericRpcHandler``. ``link``: its end of the local channel
    (``request(header, payload)`` -> ``(reply, payload)``, ``ConnectionError`` once the queue
    process is gone); ``cfg``: ``FrontDoorGrpc.worker_config``'s."""

    def __init__(self, link: Any, cfg: dict[str, Any], token: str | None, max_rows: int) -> None:
        self.link = link
        self.auth = TokenCheck(token)
        self.gate = Admission(cfg["max_inflight"], self._refused)
        self.methods: dict[str, str] = dict(cfg["methods"])
        self.max_rows = max_rows
        self.pb: Any = None
        if cfg["infer"]:
            from tritonclient.grpc import service_pb2

            self.pb = service_pb2

    def _refused(self, name: str) -> None:
        with contextlib.suppress(ConnectionError):  # gone: nobody left to count it
            self.link.channel.send({"k": "overloaded", "model": name})

    def service(self, details: Any) -> Any:
        import grpc

        method = details.method
        if method == INFER_RPC and self.pb is not None:
            return grpc.unary_unary_rpc_method_handler(
                self.infer,
                request_deserializer=self.pb.ModelInferRequest.FromString,
                response_serializer=self.pb.ModelInferResponse.SerializeToString,
            )
        kind = self.methods.get(method)
        if kind is None:
            return None  # grpc answers UNIMPLEMENTED, as the single process does
        if kind == "unary_unary":  # raw bytes both ways: the queue process parses them
            return grpc.unary_unary_rpc_method_handler(functools.partial(self.forward, method))
        # a streaming RPC: the door serves none (UNIMPLEMENTED after the token check)
        refuse = functools.partial(unimplemented(self.auth, method.rsplit("/", 1)[1]), None)
        return getattr(grpc, f"{kind}_rpc_method_handler")(refuse)

    async def _ask(
        self, context: Any, head: dict[str, Any], payload: list[Any]
    ) -> tuple[dict[str, Any], memoryview]:
        """One request to the queue process; a refusal there ends the call with its status."""
        import grpc

        try:
            reply, data = await self.link.request(head, payload)
        except ConnectionError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, QUEUE_GONE)
        if "code" in reply:
            if reply.get("tm"):
                context.set_trailing_metadata(tuple((k, v) for k, v in reply["tm"]))
            await context.abort(grpc.StatusCode[reply["code"]], reply["msg"])
        return reply, data

    async def forward(self, method: str, request: bytes, context: Any) -> bytes:
        """Any unary RPC but ``ModelInfer``: answered by the queue process's handler."""
        await self.auth.require(context)
        md = [[k, v] for k, v in context.invocation_metadata() or () if isinstance(v, str)]
        left = context.time_remaining()
        head = {
            "k": "rpc",
            "m": method,
            "md": md,
            "tr": left if left is not None and math.isfinite(left) else None,
        }
        _, data = await self._ask(context, head, [request])
        return bytes(data)

    async def infer(self, request: Any, context: Any) -> Any:
        return await admit_infer(self.auth, self.gate, request, context, self._infer)

    async def _infer(self, request: Any, context: Any) -> Any:
        """``KServeHandlers._infer``'s steps: decode here, queue there, encode here."""
        try:
            tensors, limits = await decode_infer(request, context, self.max_rows)
            meta, bufs = pack_tensors(tensors)
        except InferlineError as e:
            await grpc_fail(context, e)
        head = {
            "k": "grpc_infer",
            "model": request.model_name,
            "to": limits.timeout_s,
            "pr": limits.priority,
            "wanted": [o.name for o in request.outputs],
            "t": meta,
        }
        reply, data = await self._ask(context, head, bufs)
        try:
            return infer_response(self.pb, request, unpack_tensors(reply["t"], data))
        except InferlineError as e:
            await grpc_fail(context, e)


async def start_worker_grpc(
    link: Any, cfg: dict[str, Any], token: str | None, max_rows: int
) -> Any:
    """The worker's gRPC server, started on ``cfg``'s host and port (``SO_REUSEPORT``)."""
    import grpc

    options = [*server_options(int(cfg["max_message_bytes"])), ("grpc.so_reuseport", 1)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((WorkerGrpc(link, cfg, token, max_rows),))
    host = str(cfg["host"])
    shown = f"[{host}]" if ":" in host else host
    port = server.add_insecure_port(f"{shown}:{int(cfg['port'])}")
    if port != int(cfg["port"]):
        raise RuntimeError(f"the gRPC port {shown}:{cfg['port']} could not be bound here")
    await server.start()
    return server
