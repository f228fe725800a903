"""How a fleet spreads one model's replicas over its members (pure: counts in, counts out).

Growing adds one replica at a time to the open member with the fewest, where it has room
(lowest index first on a tie), so replicas end up as even as the members' free capacity
allows. Shrinking takes from draining members first, then from the member with the most, so
a scale-down never leaves a drained server holding replicas it cannot use. A member whose
server is away (``down``) neither grows nor shrinks while others can: its share comes back
with the server, and a scale-up while it is away goes to the survivors. ``cover`` places
stand-ins for a lost server's replicas on the survivors, within their room.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from inferline.core import CapacityError

__all__ = ["cover", "spread"]


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


def cover(
    lost: int,
    current: Mapping[int, int],
    held: Mapping[int, int],
    room: Mapping[int, int | None],
    closed: Set[int] = frozenset(),
) -> dict[int, int]:
    """Extra replicas per member standing in for ``lost`` replicas of members whose server
    is away: as many as the open members' ``room`` allows (the rest is the shortfall).

    ``current``: the cover each member holds now (kept where it still fits); ``held``: each
    member's own share (a new cover replica goes to the open member with the fewest in all,
    lowest index on a tie); ``room``: the most cover each member may hold (None: no bound);
    ``closed``: members that hold none (draining, or away themselves). Shrinking takes
    cover back from the member holding the most first."""

    def fits(i: int, n: int) -> int:
        r = room.get(i, 0)
        return n if r is None else min(n, max(r, 0))

    new = {i: 0 if i in closed else fits(i, int(current.get(i, 0))) for i in room}
    while sum(new.values()) > lost:
        victim = max((i for i in new if new[i] > 0), key=lambda i: (new[i], i))
        new[victim] -= 1
    while sum(new.values()) < lost:
        open_ = [i for i in new if i not in closed and fits(i, new[i] + 1) > new[i]]
        if not open_:
            break  # no room left: the rest stays short
        pick = min(open_, key=lambda i: (held.get(i, 0) + new[i], i))
        new[pick] += 1
    return new
