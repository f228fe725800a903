"""How a fleet spreads one model's replicas over its members (pure: counts in, counts out).

Growing adds one replica at a time to the open member with the fewest, where it has room
(lowest index first on a tie), so replicas end up as even as the members' free capacity
allows. Shrinking takes from draining members first, then from the member with the most, so
a scale-down never leaves a drained server holding replicas it cannot use. A member whose
server is away (``down``) neither grows nor shrinks while others can: its share comes back
with the server, and a scale-up while it is away goes to the survivors.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from inferline.core import CapacityError

__all__ = ["spread"]


def spread(
    target: int,
    current: Mapping[int, int],
    room: Mapping[int, int | None],
    draining: Set[int] = frozenset(),
    down: Set[int] = frozenset(),
) -> dict[int, int]:
    """The replicas per member for ``target`` in all.

    ``current``: the shares now (every member a key); ``room``: how many more each member
    can take (None: no bound, a member that oversubscribes); ``draining``: members that take
    no new replicas; ``down``: members whose server is away (their share is left as it is,
    to be restored when it is back, unless only they can give replicas up). Raises
    ``CapacityError`` when the open members cannot hold ``target``.
    """
    new = {i: int(current.get(i, 0)) for i in room}
    added = dict.fromkeys(room, 0)
    total = sum(new.values())
    while total > target:
        busy = [i for i in new if new[i] > 0]
        victim = max(busy, key=lambda i: (i not in down, i in draining, new[i], i))
        new[victim] -= 1
        total -= 1
    closed = set(draining) | set(down)
    while total < target:
        open_ = [
            i for i in new if i not in closed and (room[i] is None or added[i] < (room[i] or 0))
        ]
        if not open_:
            free = {i: room[i] for i in room if i not in closed}
            raise CapacityError(
                f"{target} replicas do not fit the fleet: {total} placed, "
                f"room per open member {free}",
                free,
            )
        pick = min(open_, key=lambda i: (new[i], i))
        new[pick] += 1
        added[pick] += 1
        total += 1
    return new
