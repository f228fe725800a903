"""What ``inferline nodes URL URL ...`` reports per fleet member, beyond its planner node:
the hop to its server (median and P99 of a minimal call over N tries), where its inventory
came from, and the instances its server already runs (docs/fleets.md, "Inventories").

- :class:`Hop` and :func:`hop_of`: the round-trip figures of one member, pure arithmetic
  over measured samples (nearest-rank P99: with 15 tries it is the slowest one; say so).
- :func:`inventory_source`: ``"url"`` when the member's URL gives its capacity
  (Triton's ``?cpu_cores=``/``?gpus=``, ``local://``'s ``?cores=``), ``"default"`` when the
  adapter assumed one (a Triton member without ``?cpu_cores=`` gets *this* machine's cores,
  wrong for a remote server), ``"server"`` for TF Serving (one unit per endpoint reached).
- :func:`served_instances`: per instance kind, the instances of the models the server has
  loaded (Triton's model configuration instance groups: ``KIND_CPU: 3``); None where the
  server cannot tell (TF Serving keeps no instance groups, ``local://`` has no server).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from inferline.core import ValidationError

__all__ = ["Hop", "hop_of", "inventory_source", "measure_hop", "served_instances"]

# the URL options that size a member's inventory, per adapter (see each adapter's URL docs)
_SIZING = ("cpu_cores", "gpus", "cores")


@dataclass(frozen=True)
class Hop:
    """A member's round trips: median and nearest-rank P99 over ``tries`` calls, seconds."""

    median_s: float
    p99_s: float
    tries: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_ms": round(self.median_s * 1e3, 3),
            "p99_ms": round(self.p99_s * 1e3, 3),
            "tries": self.tries,
        }


def hop_of(trips: Sequence[float]) -> Hop:
    """The :class:`Hop` of measured round trips (seconds; at least one)."""
    if not trips:
        raise ValidationError("trips", "at least one measured round trip", list(trips))
    ordered = sorted(float(t) for t in trips)
    rank = max(1, math.ceil(0.99 * len(ordered)))  # nearest rank: a sample, never a blend
    return Hop(statistics.median(ordered), ordered[rank - 1], len(ordered))


async def measure_hop(ping: Callable[[], Awaitable[Any]], tries: int) -> Hop:
    """``tries`` timed calls of ``ping`` (after one untimed call: it may open the
    connection); ``ConnectionError`` when the server answers not-ready."""
    if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
        raise ValidationError("tries", "an int >= 1", tries)
    await ping()
    trips = []
    for _ in range(tries):
        t = time.perf_counter()
        ok = await ping()
        trips.append(time.perf_counter() - t)
        if ok is False:
            raise ConnectionError("the server does not answer ready")
    return hop_of(trips)


def inventory_source(url: str, member: Any) -> str:
    """Where the member's ``inventory()`` comes from: ``url``, ``server`` or ``default``."""
    query = dict(parse_qsl(urlsplit(url).query))
    if any(k in query for k in _SIZING):
        return "url"
    if callable(getattr(member, "endpoints", None)):
        return "server"  # TF Serving: one unit per endpoint it reached
    return "default"


async def served_instances(member: Any) -> dict[str, int] | None:
    """Per Triton instance kind, the instances of the models the member's server has
    loaded (its instance groups); None when the member's server keeps none (no Triton
    model infos) or the server cannot be asked."""
    if getattr(member, "client", None) is None or not callable(getattr(member, "discover", None)):
        return None
    try:
        found = await member.discover()
    except Exception:  # a server that does not answer: the hop column says so
        return None
    out: dict[str, int] = {}
    told = False
    for info in found.values():
        n, kind = getattr(info, "instances", None), getattr(info, "instance_kind", None)
        if n is None or kind is None:
            continue
        told = True
        if n > 0:
            out[str(kind) or "KIND_AUTO"] = out.get(str(kind) or "KIND_AUTO", 0) + int(n)
    return out if told or not found else None
