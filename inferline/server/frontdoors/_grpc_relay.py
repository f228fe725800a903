"""The queue process's side of the gRPC front in door workers (``--door-workers N``).

A worker decodes ``ModelInfer`` itself and sends the tensors (``answer_infer``: the queue
runs them, the outputs go back); every other RPC it forwards whole (``answer_rpc``: the
serialized request, its metadata and deadline), answered here by the very handlers the
single-process door registers (``FrontDoorGrpc.handlers``), so health, metadata, model
config, statistics, TF Serving and the UNIMPLEMENTED ones answer as with ``--door-workers
0``. A refusal comes back as its gRPC status: the code, the message and the trailing
metadata (``retry-after-ms``) that ``grpc_fail`` gives it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from inferline.core import InferlineError
from inferline.server._frames import pack_tensors, unpack_tensors
from inferline.server.frontdoors._deadline import RequestLimits
from inferline.server.frontdoors._grpc import FrontDoorGrpc
from inferline.server.frontdoors._grpc_status import grpc_fail
from inferline.server.frontdoors._kserve_grpc import run_infer

__all__ = ["GrpcRelay", "RelayAbort", "RelayContext"]

log = logging.getLogger(__name__)

Reply = tuple[dict[str, Any], list[Any]]


class RelayAbort(Exception):
    """``RelayContext.abort``: raised as grpc.aio's ``abort`` raises, carrying the status."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class RelayContext:
    """The servicer context of a call a door worker relayed: the client's metadata and
    deadline, and the status the handler ends it with (not a fake: the worker sends that
    status to the client)."""

    def __init__(self, metadata: list[list[str]], remaining_s: float | None) -> None:
        self.metadata = tuple((k, v) for k, v in metadata)
        self.deadline = None if remaining_s is None else time.monotonic() + remaining_s
        self.trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def set_trailing_metadata(self, md: Any) -> None:
        self.trailing = tuple((str(k), str(v)) for k, v in md)

    async def abort(self, code: Any, details: str = "") -> None:
        raise RelayAbort(code, details)


@dataclass(frozen=True)
class _Details:
    """``grpc.HandlerCallDetails`` of a relayed call (what a generic handler reads)."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def _status(rid: int, a: RelayAbort, ctx: RelayContext) -> Reply:
    return {"id": rid, "code": a.code.name, "msg": a.details, "tm": list(ctx.trailing)}, []


def _internal(rid: int, what: str) -> Reply:
    import grpc

    log.exception("unexpected error serving %s for a door worker", what)
    return _status(rid, RelayAbort(grpc.StatusCode.INTERNAL, "internal error"), RelayContext([], 0))


class GrpcRelay:
    """Answers a door worker's gRPC frames with ``front``'s door and handlers."""

    def __init__(self, front: FrontDoorGrpc) -> None:
        self.front = front

    async def answer_infer(self, h: dict[str, Any], payload: memoryview) -> Reply:
        """A ``ModelInfer`` the worker decoded (its limits too): the outputs, or the status."""
        rid = h["id"]
        ctx = RelayContext([], None)
        try:
            tensors = unpack_tensors(h["t"], payload)
            limits = RequestLimits(h.get("to"), int(h.get("pr", 0)))
            outs = await run_infer(
                self.front.door, h["model"], tensors, limits, list(h.get("wanted") or [])
            )
            meta, bufs = pack_tensors(outs)
        except InferlineError as e:
            try:
                await grpc_fail(ctx, e)
            except RelayAbort as a:
                return _status(rid, a, ctx)
            raise  # grpc_fail always aborts
        except Exception:
            return _internal(rid, f"ModelInfer {h.get('model')!r}")
        return {"id": rid, "t": meta}, bufs

    async def answer_rpc(self, h: dict[str, Any], payload: memoryview) -> Reply:
        """A whole RPC: the handler registered for it here, run with the call's metadata
        and deadline; its serialized response, or its status."""
        import grpc

        rid, method = h["id"], h["m"]
        ctx = RelayContext(h.get("md") or [], h.get("tr"))
        handler = None
        for g in self.front.handlers:
            handler = g.service(_Details(method, ctx.metadata))
            if handler is not None:
                break
        try:
            if handler is None or handler.unary_unary is None:
                raise RelayAbort(grpc.StatusCode.UNIMPLEMENTED, f"no unary RPC {method}")
            request = handler.request_deserializer(bytes(payload))
            response = await handler.unary_unary(request, ctx)
            return {"id": rid}, [handler.response_serializer(response)]
        except RelayAbort as a:
            return _status(rid, a, ctx)
        except Exception:
            return _internal(rid, method)

    def overloaded(self, h: dict[str, Any]) -> None:
        """A worker refused a call for overload: counted here, where the metrics are."""
        self.front.count_refused(str(h.get("model", "")))
