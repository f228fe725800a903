"""A fleet's servers as the planner sees them: one inventory per member, the round trip to
each, and the plan's placement of replicas on them (docs/fleets.md, "Planning across
servers").

- ``nodes()``: each member as a node (``node_id`` its URL, its own ``inventory()`` and
  ``free()``: Triton's ``?cpu_cores=``/``?gpus=``, TF Serving's endpoints, a local
  runtime's cores), what ``inferline nodes URL URL ...`` prints and ``plan --inventory-nodes``
  reads; ``server_nodes(catalog)`` the same as planner inventories.
- ``measure_round_trips()``: the median time of the member's lightest call to its server
  (Triton's and TF Serving's readiness RPC) per member; ``hop_extras`` turns it into the
  time added to a model's profile (``core/planning/_servers.py``). ``measure_hops`` keeps
  the median and P99 (``_inventory.Hop``); ``inventory_report`` is what ``inferline nodes``
  prints per member.
- ``place(configs, catalog)``: the plan's replicas per member, first-fit decreasing over
  the members exactly as the planner judged the plan (``place_on_nodes``); ``deploy`` and
  ``scale`` then follow it while its count is the one asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferline.core import ModelConfig, PlannerOptions, Profiles
from inferline.core.planning import (
    add_hops,
    hop_extras,
    place_on_nodes,
    server_nodes,
    shares_by_model,
)

from ._inventory import Hop, inventory_source, measure_hop, served_instances

__all__ = ["MemberNode", "ServerPlanning", "pinger"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemberNode:
    """One member as a node: the form ``nodes_from_dicts`` reads (like a Ray ``NodeInfo``)."""

    node_id: str
    alive: bool
    hardware: Mapping[str, int] = field(default_factory=dict)
    free: Mapping[str, int] = field(default_factory=dict)
    round_trip_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "address": self.node_id,
            "alive": self.alive,
            "hardware": dict(self.hardware),
            "free": dict(self.free),
        }


def pinger(member: Any) -> Callable[[], Awaitable[Any]] | None:
    """The member's lightest call to its server: Triton's ``client.ready()``, a TF Serving
    endpoint's ``client.ready()``; None for a member with no server of its own to reach
    (``local://``: its hop is the runtime's, already in any profile taken through it)."""
    client = getattr(member, "client", None)
    if client is not None and callable(getattr(client, "ready", None)):
        return client.ready  # type: ignore[no-any-return]
    endpoints = getattr(member, "endpoints", None)
    if callable(endpoints):
        for ep in endpoints():
            c = getattr(ep, "client", None)
            if c is not None and callable(getattr(c, "ready", None)):
                return c.ready  # type: ignore[no-any-return]
    return None


class ServerPlanning:
    """The ``FleetBackend`` half that plans across its members (mixed in; it reads the
    fleet's ``_members``, ``_urls``, ``_draining``, ``_planned``, ``_unanswered`` and
    ``round_trips``)."""

    _members: list[Any]
    _urls: list[str]
    _draining: set[int]
    _planned: dict[str, dict[int, int]]
    _profiled_on: dict[str, str]
    round_trips: dict[str, float | None]

    _unanswered: set[str]
    _gone: set[int]

    def _alive(self, i: int) -> bool:
        """False when the member's server did not answer the last round trip measured."""
        return self._urls[i] not in self._unanswered

    def nodes(self) -> list[MemberNode]:
        """Each member as a node: its URL, its own inventory and what is free there."""
        return [
            MemberNode(
                u,
                self._alive(i),
                {k: int(v) for k, v in m.inventory().items()},
                {k: int(v) for k, v in m.free().items()},
                self.round_trips.get(u),
            )
            for i, (u, m) in enumerate(zip(self._urls, self._members, strict=True))
            if i not in self._gone
        ]

    def server_nodes(self, catalog: Any = None) -> tuple[Any, ...]:
        """The members' inventories as planner nodes, named by URL, in member order;
        drained members left out (they take no replicas), kinds not in ``catalog`` too."""
        kinds = None if catalog is None else list(catalog.names())
        return server_nodes(
            [
                (u, m.inventory())
                for i, (u, m) in enumerate(zip(self._urls, self._members, strict=True))
                if i not in self._draining and i not in self._gone
            ],
            kinds,
        )

    async def measure_round_trips(self, samples: int = 15) -> dict[str, float | None]:
        """Each member's round trip in seconds (median of ``samples`` readiness calls, the
        members side by side); None for a member without one or whose server does not
        answer (that one's node is then not ``alive``). Kept as ``round_trips`` for
        ``hop_extras`` and the stats."""
        await self.measure_hops(samples)
        return dict(self.round_trips)

    async def measure_hops(self, tries: int = 15) -> dict[str, Hop | None]:
        """Each member's :class:`Hop` (median and P99 of ``tries`` readiness calls, the
        members side by side); None for a member with no server to reach (``local://``)
        or whose server does not answer. Updates ``round_trips`` (the medians)."""
        live = [i for i in range(len(self._members)) if i not in self._gone]
        pings = [pinger(self._members[i]) for i in live]
        got = await asyncio.gather(
            *(measure_hop(p, tries) if p else _none() for p in pings),
            return_exceptions=True,
        )
        hops: dict[str, Hop | None] = {}
        for u, g in zip([self._urls[i] for i in live], got, strict=True):
            failed = isinstance(g, BaseException)
            hops[u] = None if failed or g is None else g
            self.round_trips[u] = None if hops[u] is None else hops[u].median_s  # type: ignore[union-attr]
            if failed:
                self._unanswered.add(u)
            else:
                self._unanswered.discard(u)
        log.info(
            "fleet: round trip per server %s",
            {u: None if t is None else round(t * 1e3, 2) for u, t in self.round_trips.items()},
        )
        return hops

    async def inventory_report(self, tries: int = 15) -> list[dict[str, Any]]:
        """What ``inferline nodes`` prints per member: its node (``to_dict()``), where its
        inventory came from, the instances its server runs (Triton's instance groups) and
        its :class:`Hop` (``None``: no server to reach, or not answering: see ``alive``)."""
        hops = await self.measure_hops(tries)
        live = [m for i, m in enumerate(self._members) if i not in self._gone]
        served = await asyncio.gather(*(served_instances(m) for m in live))
        rows = []
        for node, m, inst in zip(self.nodes(), live, served, strict=True):
            hop = hops.get(node.node_id)
            rows.append(
                {
                    **node.to_dict(),
                    "inventory_from": inventory_source(node.node_id, m),
                    "served_instances": inst,
                    "hop": None if hop is None else hop.to_dict(),
                    "hop_kind": "none" if pinger(m) is None else "ready",
                }
            )
        return rows

    def hop_extras(self, profiled_on: Mapping[str, str]) -> dict[str, float]:
        """Per model, what its farthest member's round trip adds over the member its profile
        was measured through (``profiled_on[model]``: a member URL); {} before
        ``measure_round_trips``."""
        if not self.round_trips:
            return {}
        return hop_extras(self.round_trips, profiled_on)

    async def hop_profiles(self, profiles: Profiles, tries: int = 15) -> Profiles:
        """``profiles`` (measured through this fleet: ``inferline profile`` of a deployment
        whose backend is a list) with each model's hop added: what its farthest member's
        round trip (median of ``tries``, measured now) adds over the member of the first
        replica the fleet handed out for it, the one the profiler timed."""
        await self.measure_hops(tries)
        on = {m: u for m, u in self._profiled_on.items() if m in profiles.models}
        return self.profiles_with_hops(profiles, on)

    def profiles_with_hops(self, profiles: Profiles, profiled_on: Mapping[str, str]) -> Profiles:
        """``profiles`` with each model's ``hop_extras`` added (``profiled_on[model]``: the
        member its profile was measured through), the hop logged when there is one; unchanged
        before ``measure_round_trips``."""
        extras = self.hop_extras(profiled_on)
        if any(extras.values()):
            log.info(
                "fleet: hop added to the profiles (ms): %s",
                {m: round(e * 1e3, 3) for m, e in extras.items()},
            )
        return add_hops(profiles, extras)

    def place(
        self,
        configs: Mapping[str, ModelConfig],
        catalog: Any,
        replica_units: Mapping[str, int] | None = None,
    ) -> dict[str, dict[str, int]]:
        """Record the plan's replicas per member for ``configs``: first-fit decreasing over
        ``server_nodes(catalog)`` (``CapacityError`` when they do not fit). Returns
        ``{model: {member URL: replicas}}``; ``deploy``/``scale`` follow it."""
        units = dict(replica_units or {})
        options = PlannerOptions(nodes=self.server_nodes(catalog), replica_units=units)
        by_model = shares_by_model(place_on_nodes(configs, catalog, options))
        for model, per in by_model.items():
            self._planned[model] = {self._urls.index(u): n for u, n in per.items()}
        log.info("fleet: the plan's placement %s", by_model)
        return by_model

    def _planned_shares(self, model: str, replicas: int) -> dict[int, int] | None:
        """The plan's shares of ``model`` when they sum to ``replicas`` and no member they
        use is drained (else the even spread decides)."""
        p = self._planned.get(model)
        if p is None or sum(p.values()) != replicas:
            return None
        if any(n > 0 and i in self._draining for i, n in p.items()):
            return None
        return {i: p.get(i, 0) for i in range(len(self._members))}


async def _none() -> None:
    return None
