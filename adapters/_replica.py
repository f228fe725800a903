"""What every bundled replica handle writes the same way: its identity, and for handles on a
remote server, the alive flag, the in-flight count and the wait for the last batch.

``ReplicaBase`` holds the ``ReplicaHandle`` properties (``id``, ``model``, ``hardware``) and the
``repr``; a subclass says when it is ``alive``. ``RemoteReplica`` adds what a handle on a
server the backend does not own (Triton, TF Serving) has: alive until the backend kills it or
closes, one counter of batches in flight and ``drained()`` for scale-down, with the protocol's
own round trip in ``_predict``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from inferline.core import BATCH_DEADLINE, DeadlineExceededError, ReplicaError
from inferline.core.protocols import ReplicaBase

__all__ = ["RemoteReplica", "ReplicaBase", "ReplicaOwner"]


class ReplicaOwner(Protocol):
    """What a ``RemoteReplica`` reads of its backend."""

    @property
    def url(self) -> str: ...

    @property
    def closed(self) -> bool: ...


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class RemoteReplica(ReplicaBase):
    """A handle on one unit of a remote server (a Triton instance, a TF Serving server).

    Alive until ``_kill()`` or until its backend closes; a dead handle refuses batches with
    ``ReplicaError``. Counts the batches in flight, so that scale-down can wait for the last
    one (``drained``) without polling. Subclasses implement ``_predict``.
    """

    _inactive = "replica is not active"  # the ReplicaError's reason for a dead handle

    def __init__(self, owner: ReplicaOwner, model: str, rid: str, hardware: str) -> None:
        super().__init__(model, rid, hardware)
        self._owner = owner
        self._alive = True
        self._in_flight = 0
        self._idle = asyncio.Event() if _has_loop() else None

    @property
    def alive(self) -> bool:
        return self._alive and not self._owner.closed

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self.alive:
            raise ReplicaError(self._owner.url, self._id, self._inactive)
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        try:
            return await self._predict(list(inputs))
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def _predict(self, inputs: list[Any]) -> list[Any]:
        raise NotImplementedError

    # what the server raises for a request it refuses because of the request itself
    _request_fault: type[Exception] = Exception

    async def _send(self, items: list[tuple[int, Any]], results: list[Any]) -> None:
        """Send ``items`` (``(index, encoded query)``) as one request; write each answer at
        its index in ``results``."""
        raise NotImplementedError

    def _refused(self, index: int, fault: Exception, results: list[Any]) -> None:
        """The server refused the query at ``index`` on its own: write its error."""
        raise NotImplementedError

    async def _bisect(self, items: list[tuple[int, Any]], results: list[Any]) -> None:
        """``_send`` ``items``; a request the server refuses (``_request_fault``) is split in
        halves until each refused query stands alone and gets its own error, so one bad
        query does not fail the others."""
        try:
            await self._send(items, results)
        except self._request_fault as e:
            if len(items) == 1:
                self._refused(items[0][0], e, results)
                return
            half = len(items) // 2
            await self._bisect(items[:half], results)
            await self._bisect(items[half:], results)

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no batch is in flight (True) or ``timeout_s`` passed (False)."""
        if self._in_flight == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def _late(self, m: Any, items: int, why: str) -> DeadlineExceededError:
        """A call cut at the batch's deadline (``core.BATCH_DEADLINE``): counted on ``m``
        (the model's ``ManagedModel``), and the error the batch's queries get (the queue's
        expiry answer, not retried: another replica could only be later)."""
        m.late_calls += 1
        m.late_items += items
        late = max(0.0, asyncio.get_running_loop().time() - BATCH_DEADLINE.get())
        return DeadlineExceededError(
            self._model, late, f"model {self._model!r}: replica {self._id} past the deadline: {why}"
        )

    def _kill(self) -> None:
        self._alive = False

    def _repr_fields(self) -> str:
        return f"alive={self.alive}, in_flight={self._in_flight}"
