"""``TritonReplica``: one Triton model instance as the queue sees it, and the round trip of a
preformed batch (one request with the batch dimension; a batch the model rejects is bisected so
each query gets its own answer). What is left of the batch's deadline (``core.BATCH_DEADLINE``)
goes with the request as Triton's ``timeout`` and bounds the call; a request past it is
counted (``late_calls``) and its queries answered ``DeadlineExceededError``.

``_Managed`` is the backend's record of a model it manages on the server: its desired state
(the last configuration inferline loaded) and its handles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inferline.core import BackendError, ReplicaError, ValidationError, batch_call_timeout

from .._remote import ManagedModel, StatsInterval
from .._replica import RemoteReplica, ReplicaOwner
from ._client import (
    SERVER_LOST,
    TritonClient,
    TritonDeadline,
    TritonFailure,
    TritonServerError,
)
from ._config import BatcherSettings
from ._stats import ClientTiming
from ._tensors import ModelIO

__all__ = ["TritonReplica"]


@dataclass(kw_only=True)
class _Managed(ManagedModel):
    """A model inferline manages on the server, and its desired state."""

    triton_config: dict[str, Any]  # the last configuration inferline loaded
    io: ModelIO
    outputs: tuple[str, ...]
    batcher: BatcherSettings | None
    # adopted from the operator: its dynamic_batching stays as the operator set it
    adopted: bool = False
    generation: int = 0
    next_index: int = 0
    restarts: int = 0
    state: str = "ready"  # ready | recovering | failed | unloaded
    # failed because the server stayed away past recovery_timeout_s (not a load error):
    # recovery keeps probing, slowly, and brings it back when the server returns
    unreachable: bool = False
    timing: ClientTiming = field(default_factory=ClientTiming)
    stats: StatsInterval = field(default_factory=StatsInterval)


class _Owner(ReplicaOwner, Protocol):
    """What a ``TritonReplica`` needs of its backend."""

    @property
    def client(self) -> TritonClient: ...

    async def _lost(self, m: _Managed, failure: TritonFailure) -> None: ...


class TritonReplica(RemoteReplica):
    """One Triton model instance, as seen by the interposed queue."""

    _inactive = "replica is no longer active"
    _request_fault = TritonServerError

    def __init__(self, backend: _Owner, managed: _Managed, index: int) -> None:
        rid = f"{managed.name}/{index}.{managed.generation}"
        super().__init__(backend, managed.name, rid, managed.config.hardware)
        self._backend = backend
        self._m = managed
        self._index = index
        self._gen = managed.generation

    async def _predict(self, inputs: list[Any]) -> list[Any]:
        m = self._m
        results: list[Any] = [None] * len(inputs)
        groups: dict[Any, list[tuple[int, dict[str, np.ndarray]]]] = {}
        for i, x in enumerate(inputs):
            try:
                enc = m.io.encode_item(x, f"{m.name}.inputs[{i}]")
            except ValidationError as e:
                results[i] = e
                m.timing.item_errors += 1
                continue
            groups.setdefault(ModelIO.shape_key(enc), []).append((i, enc))
        limit = m.io.max_batch_size
        for items in groups.values():
            if limit == 0:
                chunks = [[item] for item in items]
            else:
                chunks = [items[k : k + limit] for k in range(0, len(items), limit)]
            for chunk in chunks:
                await self._bisect(chunk, results)
        return results

    async def _send(
        self, items: list[tuple[int, dict[str, np.ndarray]]], results: list[Any]
    ) -> None:
        m, url = self._m, self._backend.url
        batched = m.io.max_batch_size > 0
        names = [t.name for t in m.io.inputs]
        if batched:
            arrays = ModelIO.stack([enc for _, enc in items], names)
        else:
            arrays = dict(items[0][1])
        dtypes = {t.name: t.datatype for t in m.io.inputs}
        client = self._backend.client
        timeout, bound = batch_call_timeout(client.timeout_s)
        t0 = time.perf_counter()
        try:
            out = await client.infer(
                m.server_name,
                {n: (arrays[n], dtypes[n]) for n in names},
                m.outputs,
                timeout_s=timeout,
                carry_timeout=bound,
            )
        except TritonDeadline as e:
            raise self._late(m, len(items), str(e)) from None
        except SERVER_LOST as e:
            m.timing.errors += 1
            await self._backend._lost(m, e)
            raise ReplicaError(url, self._id, str(e)) from None
        except TritonServerError:
            m.timing.errors += 1
            raise  # the model refused the request: bisected (_bisect)
        m.timing.record(len(items), time.perf_counter() - t0)
        try:
            values = m.io.decode(out, len(items), m.outputs, batched=batched)
        except ValidationError as e:
            for i, _ in items:
                results[i] = BackendError(url, f"model {m.name!r}: bad response: {e}")
            return
        for (i, _), v in zip(items, values, strict=True):
            results[i] = v

    def _refused(self, index: int, fault: Exception, results: list[Any]) -> None:
        results[index] = BackendError(self._backend.url, f"model {self._m.name!r}: {fault}")
        self._m.timing.item_errors += 1
