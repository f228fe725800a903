"""The frontend side of one replica process: its ``ReplicaHandle`` and process bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from inferline.core import (
    BATCH_DEADLINE,
    BackendError,
    DeadlineExceededError,
    ReplicaError,
    ValidationError,
    batch_call_timeout,
)

from .._supervised import ACTIVE, SupervisedReplica
from . import _convert
from . import replica_pb2 as pb
from . import replica_pb2_grpc as pbg
from ._inventory import Placement

__all__ = ["LocalReplica"]

log = logging.getLogger(__name__)

_EXIT_GRACE_S = 0.25

_REQUEST_FAULTS = frozenset(
    {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class _Owner(Protocol):
    """What a ``LocalReplica`` reads of its ``LocalBackend``."""

    @property
    def url(self) -> str: ...

    predict_timeout_s: float | None
    max_message_bytes: int


class LocalReplica(SupervisedReplica):
    """One replica process of a model (a ``ReplicaHandle``).

    A restarted replica is a new ``LocalReplica`` with a new ``id``, so a queue that keys its
    pullers by id never confuses the dead incarnation with its successor.
    """

    def __init__(
        self, backend: _Owner, model: str, rid: str, hardware: str, placement: Placement
    ) -> None:
        super().__init__(model, rid, hardware)
        self._backend = backend
        self.placement = placement
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self._spawned_mono = time.monotonic()
        self.exit_code: int | None = None
        self.channel: grpc.aio.Channel | None = None
        self.stub: pbg.ReplicaStub | None = None
        # the backend's secret for its replicas' gRPC ports (see _server.TOKEN_ENV)
        self.metadata: tuple[tuple[str, str], ...] = ()
        # batch calls cut at the batch's deadline (core.BATCH_DEADLINE) and their queries
        self.late_calls = 0
        self.late_items = 0

    # -- ReplicaHandle (id, model, hardware, alive: SupervisedReplica) ---------------------

    def _repr_fields(self) -> str:
        return f"pid={self.pid}, state={self.state!r}"

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """One output (or ``InferlineError``) per input; ``ReplicaError`` if the batch failed."""
        url = self._backend.url
        if self.state != ACTIVE or self.died.done() or self.stub is None:
            raise ReplicaError(url, self._id, f"not accepting batches (state {self.state})")
        n = len(inputs)
        req = pb.PredictRequest()
        bad: dict[int, ValidationError] = {}
        for i, x in enumerate(inputs):
            try:
                _convert.to_pb_strict(x, req.inputs.add())
            except ValidationError as e:
                del req.inputs[-1]
                bad[i] = ValidationError(f"inputs[{i}]", e.expected, e.got)
        if bad and len(bad) == n:
            return [bad[i] for i in range(n)]
        self.inflight += 1
        self.idle.clear()
        timeout, bound = batch_call_timeout(self._backend.predict_timeout_s)
        call = self.stub.PredictBatch(req, timeout=timeout, metadata=self.metadata)
        fut = asyncio.ensure_future(self._await_call(call, n if bound else 0, timeout))
        try:
            done, _ = await asyncio.wait({fut, self.died}, return_when=asyncio.FIRST_COMPLETED)
            if fut not in done:
                call.cancel()
                fut.cancel()
                raise ReplicaError(
                    url, self._id, f"died during a batch of {n}: {self.died.result()}"
                )
            if fut.cancelled():
                # Not by us: closing the channel (the exit watcher does it for a dead
                # replica) cancels its RPCs, and both may be done before this task resumes.
                reason = self.died.result() if self.died.done() else "channel closed"
                raise ReplicaError(url, self._id, f"batch of {n} cancelled: {reason}")
            try:
                resp = fut.result()
            except ReplicaError:
                # The socket usually breaks a few ms before the exit watcher sees the process
                # go; wait for it briefly so that `alive` is already False when the caller
                # (the queue) decides whether to keep pulling for this replica.
                if not self.died.done():
                    await asyncio.wait({self.died}, timeout=_EXIT_GRACE_S)
                if self.died.done():
                    raise ReplicaError(
                        url, self._id, f"died during a batch of {n}: {self.died.result()}"
                    ) from None
                raise
        finally:
            if not fut.done():  # the caller was cancelled: do not leave the RPC running
                call.cancel()
                fut.cancel()
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()
        if resp.HasField("batch_error"):
            raise BackendError(url, resp.batch_error.message)
        want = n - len(bad)
        if len(resp.outputs) != want:
            raise BackendError(
                url, f"model {self._model!r} returned {len(resp.outputs)} outputs for {want} inputs"
            )
        outs: list[Any] = []
        for i, v in enumerate(resp.outputs):
            try:
                outs.append(_convert.from_pb(v, f"outputs[{i}]"))
            except ValidationError as e:
                outs.append(e)
        if bad:
            it = iter(outs)
            outs = [bad[i] if i in bad else next(it) for i in range(n)]
        return outs

    async def _await_call(
        self, call: Any, bound_items: int = 0, timeout: float | None = None
    ) -> pb.PredictResponse:
        """The call's answer; ``bound_items`` > 0: the batch's deadline bounds the call (in
        ``timeout``), and a call past it is counted and answered ``DeadlineExceededError``,
        not retried."""
        try:
            if not bound_items:
                return await call
            # the loop's timer as well as grpc's deadline: grpc's first one can lag ~0.2 s
            async with asyncio.timeout(timeout):
                return await call
        except TimeoutError:  # asyncio.timeout's (an RPC failure is an AioRpcError)
            raise self._late(bound_items) from None
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if bound_items and code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise self._late(bound_items) from None
            if code in _REQUEST_FAULTS:
                # The request itself is at fault (too large, malformed): another replica would
                # refuse it too, so this is not a replica failure the queue should retry.
                raise BackendError(
                    self._backend.url,
                    f"model {self._model!r} refused the batch: {code.name}: {e.details()} "
                    f"(message limit {self._backend.max_message_bytes} bytes)",
                ) from None
            # Otherwise the replica is unreachable or failed mid-call: say what RPC saw.
            reason = f"RPC failed: {code.name}: {e.details()}"
            raise ReplicaError(self._backend.url, self._id, reason) from None

    def _late(self, items: int) -> DeadlineExceededError:
        """A batch call cut at its deadline: counted, and the error its queries get."""
        self.late_calls += 1
        self.late_items += items
        return DeadlineExceededError(
            self._model,
            max(0.0, asyncio.get_running_loop().time() - BATCH_DEADLINE.get()),
            f"model {self._model!r}: replica {self._id} did not answer a batch of {items} "
            "by its deadline (the call was cancelled)",
        )

    # -- used by the backend ----------------------------------------------------------------

    async def ping(self, timeout_s: float) -> bool:
        if self.stub is None:
            return False
        try:
            await self.stub.Ping(pb.PingRequest(), timeout=timeout_s, metadata=self.metadata)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def info(self, timeout_s: float = 1.0) -> dict[str, Any]:
        if self.stub is None or self.died.done():
            return self.last_stats
        with contextlib.suppress(grpc.aio.AioRpcError, ValueError, asyncio.TimeoutError):
            resp = await self.stub.Info(pb.InfoRequest(), timeout=timeout_s, metadata=self.metadata)
            self.last_stats = json.loads(resp.stats_json)
        return self.last_stats

    def _where(self) -> dict[str, Any]:
        return {"cores": list(self.placement.cores), "gpu": self.placement.gpu}

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        if self.exit_code is not None:
            d["exit_code"] = self.exit_code
        d["late_calls"] = self.late_calls
        d["late_items"] = self.late_items
        return d
