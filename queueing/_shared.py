"""One EDF queue per stage across its model variants (Model-Switching as the paper runs it).

A stage served by variants (Zhang et al., HotCloud'20: one task queue, the model chosen when a
batch is formed) has ONE queue: the variants' model queues share one heap list, so a query
submitted for the stage (or for any variant) waits in the stage's deadline order, whichever
variant it was routed to. Each variant keeps its own ``ModelQueue`` (its replicas' pullers,
its batching policy, its counters), so the variant of a batch is the variant of the replica
that cuts it, and its batch size is that variant's policy's.

The *gate* says which variants may cut batches: the active ones (``Dispatcher.route`` makes
the routed variant the only active one; ``Dispatcher.set_active`` names several, e.g. to let
the old variant drain alongside the new). A replica of an inactive variant finishes the batch
it has in flight and takes no other; its puller waits until the gate opens for it again. At a
switch the queries already queued therefore go to the new variant's replicas, in deadline
order, instead of finishing on the old one.

What must agree across the members (``check_members``): the queue's expiry (``expire_late``
and its grace, since every member's timer reads the same heap) and no admission control
(its predictions are per replica set, not per stage). This module is the pure part: the gate
and the merge; the dispatcher wires it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from inferline.core.errors import ValidationError

from ._mqueue import ModelQueue, wake

__all__: list[str] = []  # private to the package


class SharedQueue:
    """The members of one stage's queue and its gate (``active``: the variants whose
    replicas may cut batches, in the order given)."""

    __slots__ = ("active", "members", "name")

    def __init__(self, name: str, members: Sequence[ModelQueue], active: Sequence[str]) -> None:
        self.name = name
        self.members: dict[str, ModelQueue] = {m.name: m for m in members}
        self.active: tuple[str, ...] = ()
        self.set_active(active)

    def may_cut(self, model: str) -> bool:
        """Whether ``model``'s replicas may take a batch from the shared heap now."""
        return model in self.active

    def set_active(self, models: Sequence[str]) -> None:
        """Open the gate for ``models`` only (at least one member) and wake their idle
        replicas when queries wait."""
        active = tuple(dict.fromkeys(models))
        if not active:
            raise ValidationError("active", "at least one variant of the stage", list(models))
        unknown = [m for m in active if m not in self.members]
        if unknown:
            raise ValidationError(
                "active", f"variants of stage {self.name!r} {sorted(self.members)}", unknown
            )
        self.active = active
        self.wake()

    def wake(self) -> None:
        """New work (or a newly open gate): wake the active variants' idle replicas."""
        for name in self.active:
            q = self.members[name]
            if q.idle and q.heap:
                wake(q)

    def reporter(self) -> str:
        """The member whose ``queued`` count reports the shared heap (the first active one),
        so that summing the members' counts counts each query once."""
        return self.active[0]


def check_members(name: str, members: Sequence[ModelQueue]) -> None:
    """Refuse members that cannot share one heap, naming the field."""
    if not members:
        raise ValidationError("models", f"at least one model for stage {name!r}", [])
    taken = [m.name for m in members if m.group is not None]
    if taken:
        raise ValidationError("models", "models not already in a shared queue", taken)
    with_admission = [m.name for m in members if m.admission is not None]
    if with_admission:
        raise ValidationError(
            "admission", "off for models that share a stage's queue", with_admission
        )
    first = members[0]
    for m in members[1:]:
        if (m.expire_late, m.expire_grace_s) != (first.expire_late, first.expire_grace_s):
            raise ValidationError(
                "expire_late",
                f"the same expiry as {first.name!r} "
                f"({first.expire_late}, grace {first.expire_grace_s} s)",
                f"{m.name}: ({m.expire_late}, grace {m.expire_grace_s} s)",
            )


def merge_heaps(members: Sequence[ModelQueue]) -> list:
    """Move every member's queued queries into the first member's heap list (in place: its
    pullers hold that list) and point every member at it; returns the shared list."""
    heap = members[0].heap
    for m in members[1:]:
        if m.heap is not heap:
            heap.extend(m.heap)
            m.heap.clear()  # in place: its pullers re-read ``q.heap`` once grouped
            m.heap = heap
    heapq.heapify(heap)
    if any(m.mixed for m in members):  # a priority class anywhere: every timer scans
        for m in members:
            m.mixed = True
    return heap
