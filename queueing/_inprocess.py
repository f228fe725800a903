"""A replica that runs a model container inside this process.

``InProcessReplica`` implements ``ReplicaHandle`` by calling the container's
``predict_batch`` directly and then sleeping (asyncio) for the batch's service time, so the
dispatcher sees a replica that is busy for a known, profile-like duration without any RPC.
Tests, the queue benchmark and single-process setups use it; the bundled runtime in
``adapters.local`` runs containers in their own processes instead.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.errors import InferlineError, ReplicaError
from inferline.core.protocols import ReplicaBase

__all__ = ["InProcessReplica", "NoOpModel"]

_ids = itertools.count(1)


class NoOpModel:
    """A model container that returns its inputs (the data-path benchmark's model)."""

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return inputs


class InProcessReplica(ReplicaBase):
    """One in-process replica of ``model``.

    ``service_s`` is the time a batch keeps the replica busy: a number, or a function of the
    batch size (e.g. ``lambda b: profiles.latency(model, hw, b)``). Zero still yields to the
    event loop once, as an RPC would. ``kill()`` makes the current and later batches fail
    with ``ReplicaError`` (``alive`` turns False); ``revive()`` undoes it. ``max_in_flight``
    records the most batches that were ever inside at once.
    """

    def __init__(
        self,
        model: str,
        container: Any,
        *,
        service_s: float | Callable[[int], float] = 0.0,
        hardware: str = "cpu",
        replica_id: str | None = None,
    ) -> None:
        super().__init__(
            model, replica_id if replica_id is not None else f"{model}-{next(_ids)}", hardware
        )
        self._container = container
        self._service = service_s
        self._alive = True
        self.batches = 0
        self.batch_sizes: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def alive(self) -> bool:
        return self._alive

    def kill(self) -> None:
        self._alive = False

    def revive(self) -> None:
        self._alive = True

    def service_time(self, batch_size: int) -> float:
        s = self._service
        return float(s(batch_size)) if callable(s) else float(s)

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not self._alive:
            raise ReplicaError("inprocess", self._id, "replica is down")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            n = len(inputs)
            try:
                outs = list(self._container.predict_batch(list(inputs)))
            except InferlineError:
                raise
            except Exception as e:
                raise ReplicaError(
                    "inprocess", self._id, f"container raised {type(e).__name__}: {e}"
                ) from e
            await asyncio.sleep(self.service_time(n))
            if not self._alive:
                raise ReplicaError("inprocess", self._id, "replica died during the batch")
            self.batches += 1
            self.batch_sizes.append(n)
            return outs
        finally:
            self.in_flight -= 1
