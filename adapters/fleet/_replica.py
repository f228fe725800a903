"""``FleetReplica``: a member backend's replica handle as the fleet publishes it.

Two members may name their replicas alike (two ``local://`` runtimes both have ``mlp-0``,
two Triton servers both ``pre/0.1``), so the fleet gives each handle an id that carries its
member (``pre/0.1@1``) and the ``server`` it runs on. It counts its batches in flight per
member, so a drain knows when the member is empty without polling. One wrapper per member
handle, kept while the handle is published: the queue keys its pullers on handle identity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.protocols import ReplicaBase, ReplicaHandle

__all__ = ["FleetReplica"]


class FleetReplica(ReplicaBase):
    """``inner`` (a member's handle) on member ``index`` whose URL is ``server``.

    ``on_flight(index, +1 | -1)`` is called around every batch (the fleet's drain count).
    Attributes the fleet does not define (``pid``, ``node``, ``in_flight`` ...) are the
    member handle's.
    """

    def __init__(
        self,
        inner: ReplicaHandle,
        index: int,
        server: str,
        on_flight: Callable[[int, int], None],
    ) -> None:
        super().__init__(inner.model, f"{inner.id}@{index}", inner.hardware)
        self._inner = inner
        self._index = index
        self._on_flight = on_flight
        self.server = server

    @property
    def inner(self) -> ReplicaHandle:
        return self._inner

    @property
    def member(self) -> int:
        return self._index

    @property
    def hardware(self) -> str:
        return self._inner.hardware  # a member may move its model to other hardware

    @property
    def alive(self) -> bool:
        return self._inner.alive

    async def predict_batch(self, inputs: Sequence[Any]) -> list[Any]:
        self._on_flight(self._index, 1)
        try:
            return await self._inner.predict_batch(inputs)
        finally:
            self._on_flight(self._index, -1)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never reached for set attributes; avoids init recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _repr_fields(self) -> str:
        return f"server={self.server!r}, alive={self.alive}"
