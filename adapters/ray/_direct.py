"""The direct data path of a ``ray://`` replica: its actor's gRPC port, past Ray's task path.

Ray places, starts, watches and replaces the actor; the actor also serves its container over
the bundled runtime's replica service (``replica.proto``, the servicer a ``local://`` replica
process runs) on its node's IP, and ``ready()`` says where. A batch sent there costs one gRPC
round trip, as on ``local://``, instead of an actor task (which cost about 1 ms more at
batch 1, ``benchmarks/ray_scaleout.py``).

``DirectPath`` is the driver's side: one ``grpc.aio`` channel per replica, the backend's token
on every call, the values encoded as on ``local://`` (``to_pb_strict`` / ``from_pb``). It only
moves bytes and reports what gRPC said: ``RayReplica`` decides what a failure means (the
actor is asked through Ray, which knows whether it is alive).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from inferline.adapters.local import from_pb, replica_pb2, replica_pb2_grpc, to_pb_strict
from inferline.core import ValidationError

__all__ = [
    "REQUEST_FAULTS",
    "DirectPath",
    "DirectResult",
    "close_soon",
    "target_of",
    "wait_closed",
]

# the request itself is at fault (malformed, refused by the servicer): not the replica's
REQUEST_FAULTS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED})


def target_of(grpc_info: dict[str, Any]) -> str:
    """``host:port`` (``[v6]:port``) from the actor's ``ready()["grpc"]``; '' when it has none."""
    host, port = grpc_info.get("host"), grpc_info.get("port")
    if not host or not port:
        return ""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class DirectResult:
    """What one direct call gave: ``outputs`` (one value or ``InferlineError`` per input) or
    ``batch_error`` (the model's answer was unusable as a whole)."""

    __slots__ = ("batch_error", "outputs")

    def __init__(self, outputs: list[Any], batch_error: str = "") -> None:
        self.outputs = outputs
        self.batch_error = batch_error


class DirectPath:
    """A channel to one actor's replica service. Create inside the backend's event loop."""

    def __init__(self, target: str, token: str, max_message_bytes: int) -> None:
        self.target = target
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.enable_retries", 0),  # retries belong to the dispatcher
            ],
        )
        self._stub = replica_pb2_grpc.ReplicaStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    async def check(self, timeout_s: float) -> str:
        """'' when the replica answers a ``Ping`` here within ``timeout_s``, else why not."""
        try:
            await self._stub.Ping(
                replica_pb2.PingRequest(), timeout=timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as e:
            return f"{e.code().name}: {e.details()}"
        return ""

    def encode(self, inputs: Sequence[Any]) -> tuple[Any, dict[int, ValidationError]]:
        """The request for ``inputs`` and a ``ValidationError`` per input with no wire form."""
        req = replica_pb2.PredictRequest()
        bad: dict[int, ValidationError] = {}
        for i, x in enumerate(inputs):
            try:
                to_pb_strict(x, req.inputs.add())
            except ValidationError as e:
                del req.inputs[-1]
                bad[i] = ValidationError(f"inputs[{i}]", e.expected, e.got)
        return req, bad

    def call(self, req: Any, timeout: float | None) -> Any:
        """Start the ``PredictBatch`` call (a ``grpc.aio`` call: await it, or cancel it)."""
        return self._stub.PredictBatch(req, timeout=timeout, metadata=self._metadata)

    @staticmethod
    def decode(resp: Any, n: int, bad: dict[int, ValidationError], model: str) -> DirectResult:
        """Outputs in input order (the refused inputs' errors in their slots)."""
        if resp.HasField("batch_error"):  # the servicer's message names the model
            return DirectResult([], resp.batch_error.message)
        want = n - len(bad)
        if len(resp.outputs) != want:
            got = len(resp.outputs)
            return DirectResult([], f"model {model!r} returned {got} outputs for {want} inputs")
        outs: list[Any] = []
        for i, v in enumerate(resp.outputs):
            try:
                outs.append(from_pb(v, f"outputs[{i}]"))
            except ValidationError as e:
                outs.append(e)
        if bad:
            it = iter(outs)
            outs = [bad[i] if i in bad else next(it) for i in range(n)]
        return DirectResult(outs)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._channel.close(grace=None)


# channels being closed in the background: held here so that the tasks are not collected
_CLOSING: set[asyncio.Task[None]] = set()


def close_soon(path: DirectPath | None) -> None:
    """Close ``path``'s channel in the background (from sync code: ``_stop_actor``)."""
    if path is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    t = loop.create_task(path.close())
    _CLOSING.add(t)
    t.add_done_callback(_CLOSING.discard)


async def wait_closed() -> None:
    """Wait for the channels this loop is closing (the backend's ``close()``)."""
    loop = asyncio.get_running_loop()
    mine = [t for t in _CLOSING if t.get_loop() is loop]
    if mine:
        await asyncio.gather(*mine, return_exceptions=True)
