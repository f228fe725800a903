"""``FleetBackend``: one logical model whose replicas live on several servers.

A fleet composes member backends that were each built the ordinary way (``local://``,
``triton+grpc://...``, ``tfserving+grpc://...``, mixed; ``inferline.deploy.open_backend``
builds them and this fleet from a list of URLs). It adds no protocol of its own:

- **Placement.** ``deploy``/``scale`` follow the plan's replicas per member when one was
  given (``place``: first-fit decreasing over the members' own inventories, as the planner
  judged it; ``_servers``), else spread a model's replicas over the open members within each
  member's ``free()`` (``_spread``); a member asked for 0 replicas is not touched.
- **One queue, replicas anywhere.** ``replicas(model)`` is the union of the members' active
  handles (wrapped as ``FleetReplica``: unique ids, the ``server`` they run on); every change
  a member reports is re-published to the fleet's subscribers (the dispatcher's pullers).
- **Server loss.** A member that loses its server takes its handles out of service and tells
  the fleet at once (Triton's and TF Serving's recovery, ``adapters/_recovery.py``); the
  queue retries the failed in-flight batches on the survivors (``max_retries``, within each
  query's deadline). The member's own recovery reloads the model when the server is back and
  publishes fresh handles, which the fleet passes on. Meanwhile the lost replicas are
  re-placed on the survivors where their room allows (``_relocate``); the shortfall (target
  minus active) is logged when it appears and shown by ``stats()``.
- **Drain.** ``drain(server)`` withdraws a member's handles from the published set (no new
  batches go there; those in flight finish) and reports when its last batch is done;
  ``undrain(server)`` publishes them again (``_drain``).
- **Membership.** A fleet named by a DNS name (``?resolve=dns``: ``_dns``) re-resolves it
  every ``refresh_s``: a new address becomes a member with its share of each model, a gone
  one is drained and removed, its share placed on the survivors (``_membership``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferline.core import (
    InferlineError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ReplicaHandle,
    ValidationError,
)

from .._subscribers import ModelRegistry, ReplicaSubscribers
from ._adopt import adopted_config, check_contracts, check_members, member_spec, merge_found
from ._dns import DnsSource, Resolver
from ._drain import Draining
from ._membership import Membership
from ._relocate import Relocation
from ._replica import FleetReplica
from ._servers import ServerPlanning
from ._spread import spread

__all__ = ["FleetBackend", "fleet_of"]

log = logging.getLogger(__name__)


@dataclass
class _FleetModel:
    """A model the fleet manages: what was asked for, and each member's share of it."""

    spec: ModelSpec
    config: ModelConfig
    shares: dict[int, int]
    deployed: set[int] = field(default_factory=set)  # members that hold the model
    short: int = 0  # the shortfall last logged (log a change once, not every publish)
    adopted: bool = False  # found on the servers (attach): never removed to reconfigure
    cover: dict[int, int] = field(default_factory=dict)  # stand-ins for a lost server's
    unplaced: int = 0  # lost replicas no survivor had room for


class FleetBackend(ServerPlanning, Relocation, Draining, Membership, ModelRegistry):
    """Member backends as one backend. ``members`` are open backends with distinct URLs; the
    fleet owns them from here on (``close()`` closes them). ``replace_lost``: re-place a
    lost server's replicas on the survivors after ``replace_grace_s`` (``_relocate``).
    ``source``: the DNS name the members came from (``_dns``), re-resolved every
    ``source.refresh_s`` by ``resolver``; ``addresses`` the members' addresses, ``urls``
    their URLs, ``open_member(url)`` builds a member for a new address (``_membership``)."""

    def __init__(
        self,
        members: Sequence[Any],
        *,
        replace_lost: bool = True,
        replace_grace_s: float = 1.0,
        source: DnsSource | None = None,
        addresses: Sequence[str] | None = None,
        urls: Sequence[str] | None = None,
        resolver: Resolver | None = None,
        open_member: Callable[[str], Any] | None = None,
        leave_wait_s: float = 10.0,
    ) -> None:
        members = list(members)
        if not members:
            raise ValidationError("backend", "a non-empty list of backend URLs", [])
        urls = [str(m.url) for m in members] if urls is None else [str(u) for u in urls]
        for i, u in enumerate(urls):
            if u in urls[:i]:
                raise ValidationError(f"backend[{i}]", "a URL not listed before", u)
        self._members = members
        self._urls = urls
        self._url = json.dumps(urls) if source is None else source.url
        self._models: dict[str, _FleetModel] = {}
        self._subscribers = ReplicaSubscribers()
        self._closed = False
        self._draining: set[int] = set()
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._flight = dict.fromkeys(range(len(members)), 0)
        self._idle = {i: asyncio.Event() for i in range(len(members))}
        self._wrapped: dict[int, dict[int, FleetReplica]] = {i: {} for i in range(len(members))}
        self._ready_on: dict[str, list[int]] | None = None  # discover(): model -> members
        self._found: list[Mapping[str, Any]] = []  # discover(): each member's own
        self._planned: dict[str, dict[int, int]] = {}  # place(): the plan's shares
        self.round_trips: dict[str, float | None] = {}  # measure_round_trips()
        self._profiled_on: dict[str, str] = {}  # model -> member of its first replica handed out
        self._unanswered: set[str] = set()
        self.replace_lost, self.replace_grace_s = bool(replace_lost), float(replace_grace_s)
        self._pending_cover: dict[str, asyncio.Task[None]] = {}
        self._init_membership(
            source,
            None if addresses is None else list(addresses),
            resolver,
            open_member,
            leave_wait_s,
        )
        for i, m in enumerate(members):
            m.subscribe(lambda model, _hs, i=i: self._member_changed(i, model))

    # -- views --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def servers(self) -> list[str]:
        """The members' URLs, in order (members that left: ``_membership``)."""
        return [u for i, u in enumerate(self._urls) if i not in self._gone]

    @property
    def members(self) -> list[Any]:
        return [m for i, m in enumerate(self._members) if i not in self._gone]

    @property
    def oversubscribe(self) -> bool:
        return all(getattr(m, "oversubscribe", False) for m in self.members)

    def inventory(self) -> dict[str, int]:
        return self._summed("inventory")

    def free(self) -> dict[str, int]:
        return self._summed("free")

    def _summed(self, what: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, m in enumerate(self._members):
            if (what == "free" and i in self._draining) or i in self._gone:
                continue  # a drained server takes no new replicas
            for k, v in getattr(m, what)().items():
                out[k] = out.get(k, 0) + int(v)
        return out

    def replica_units(self) -> dict[str, int]:
        return {name: fm.spec.threads for name, fm in self._models.items()}

    def server_index(self, server: str) -> int:
        """The member whose URL is ``server``."""
        if server in self._urls and self._urls.index(server) not in self._gone:
            return self._urls.index(server)
        raise NotFoundError("server", server, self.servers)

    # -- the published replica set ------------------------------------------------------------

    def _member_replicas(self, i: int, model: str) -> list[ReplicaHandle]:
        if i in self._gone:
            return []
        try:
            return list(self._members[i].replicas(model))
        except InferlineError:  # the member does not hold the model (share 0)
            return []

    def _wrap(self, i: int, handles: list[ReplicaHandle]) -> list[FleetReplica]:
        cache = self._wrapped[i]
        out = []
        for h in handles:
            w = cache.get(id(h))
            if w is None or w.inner is not h:
                w = cache[id(h)] = FleetReplica(h, i, self._urls[i], self._count_flight)
            out.append(w)
        return out

    def replicas(self, model: str) -> list[ReplicaHandle]:
        self._get(model)
        out: list[ReplicaHandle] = []
        for i in range(len(self._members)):
            if i not in self._draining:
                out += [w for w in self._wrap(i, self._member_replicas(i, model)) if w.alive]
        if out:  # a profiler times this one: its server's hop is in the profile (hop_profiles)
            self._profiled_on.setdefault(model, out[0].server)
        return out

    def _member_changed(self, i: int, model: str) -> None:
        fm = self._models.get(model)
        if fm is None or self._closed:
            return  # a deploy in progress: published once it is recorded
        live = {id(h) for h in self._member_replicas(i, model)}
        self._wrapped[i] = {k: w for k, w in self._wrapped[i].items() if k in live}
        self._report_shortfall(model, fm, i)
        self._notify(model)
        self._schedule_cover(model)

    def _report_shortfall(self, model: str, fm: _FleetModel, i: int) -> None:
        active = {j: len(self._member_replicas(j, model)) for j in range(len(self._members))}
        short = max(0, fm.config.replicas - sum(active.values()))
        if short != fm.short:
            if short > fm.short:
                log.warning(
                    "fleet: %s lost replicas of %r: %d of %d active (short %d)",
                    self._urls[i],
                    model,
                    sum(active.values()),
                    fm.config.replicas,
                    short,
                )
            else:
                log.info(
                    "fleet: %r has %d replica(s) back on %s", model, fm.short - short, self._urls[i]
                )
            fm.short = short

    def _count_flight(self, i: int, delta: int) -> None:
        self._flight[i] += delta
        if self._flight[i] == 0:
            self._idle[i].set()
        else:
            self._idle[i].clear()

    # -- deploy / scale / remove --------------------------------------------------------------

    def _room(
        self, hardware: str, per: int, movable: Mapping[int, int] | None = None
    ) -> dict[int, int | None]:
        """How many more replicas of ``per`` units each member can take on ``hardware``
        (plus its ``movable`` ones: cover replicas a new share may take the place of)."""
        room: dict[int, int | None] = {}
        for i, m in enumerate(self._members):
            if i in self._gone:
                room[i] = 0
            elif getattr(m, "oversubscribe", False):
                room[i] = None
            elif hardware in m.inventory():
                free = int(m.free().get(hardware, 0)) // max(per, 1)
                room[i] = free + (movable or {}).get(i, 0)
            else:
                room[i] = 0
        return room

    @staticmethod
    def _per(spec: ModelSpec, hardware: str) -> int:
        return spec.threads if hardware == "cpu" else 1

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        """Spread ``config.replicas`` over the open members and deploy each share; a member
        that fails undoes the others (the fleet is left as it was)."""
        self._check_open()
        if spec.name in self._models:
            raise ValidationError("model", "a model that is not deployed yet", spec.name)
        async with self._control():
            await self._deploy(spec, config)
        self._notify(spec.name)

    async def _deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        if "members" in spec.params:  # before any member deploys
            check_members(spec, self._urls)
        room = self._room(config.hardware, self._per(spec, config.hardware))
        shares = self._planned_shares(spec.name, config.replicas) or spread(
            config.replicas, dict.fromkeys(room, 0), room, self._draining
        )
        fm = _FleetModel(spec, config, shares)
        # 0 replicas: still deployed on one member, so that scale() has a model to grow
        opened = sorted(set(room) - self._draining) or [0]
        targets = [i for i, n in shares.items() if n > 0] or opened[:1]
        results = await asyncio.gather(
            *(
                self._members[i].deploy(self._spec(i, spec), self._share(config, shares[i]))
                for i in targets
            ),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        ok = [i for i, r in zip(targets, results, strict=True) if not isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(
                *(self._members[i].remove(spec.name) for i in ok), return_exceptions=True
            )
            raise failed[0]
        fm.deployed = set(ok)
        self._models[spec.name] = fm

    def _spec(self, i: int, spec: ModelSpec) -> ModelSpec:
        """``spec`` with member ``i``'s own params (``params.members``: docs/fleets.md)."""
        return member_spec(spec, self._urls[i], self._urls)

    @staticmethod
    def _share(config: ModelConfig, n: int) -> ModelConfig:
        return ModelConfig(config.hardware, config.max_batch_size, n)

    async def scale(self, model: str, replicas: int) -> None:
        """Change the model's replica count: the plan's shares when ``place`` gave some for
        this count; else grow on the open members with the fewest and room, shrink on
        draining members first, then on the members with the most. The cover for lost
        replicas is re-derived after."""
        self._check_open()
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)
        fm = self._get(model)
        async with self._control():
            per = self._per(fm.spec, fm.config.hardware)
            room = self._room(fm.config.hardware, per, fm.cover)
            shares = self._planned_shares(model, replicas) or spread(
                replicas, fm.shares, room, self._draining, self._down(model, fm)
            )
            try:
                await self._apply(model, fm, shares, self._cover_for(model, fm, shares))
            finally:  # what the members hold now, also after one of them failed
                fm.config = self._share(fm.config, sum(fm.shares.values()))
        self._notify(model)

    def _down(self, model: str, fm: _FleetModel) -> set[int]:
        """Members that should hold replicas of ``model`` and have none alive: their server
        is away (their own recovery brings the share back)."""
        return {
            i
            for i, n in fm.shares.items()
            if n > 0 and i not in self._draining and not self._member_replicas(i, model)
        }

    def _control(self) -> asyncio.Lock:
        """One change of the fleet's models at a time (members lock only themselves)."""
        loop = asyncio.get_running_loop()
        self._start_refresh()  # a DNS-sourced fleet refreshes its members from here on
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def _apply(
        self, model: str, fm: _FleetModel, shares: dict[int, int], cover: dict[int, int]
    ) -> None:
        """Each member to its share plus its cover (one call per member that changes)."""
        changed = [
            i
            for i in range(len(self._members))
            if (shares.get(i, 0), cover.get(i, 0)) != (fm.shares.get(i, 0), fm.cover.get(i, 0))
        ]
        calls = []
        for i in changed:
            n = shares.get(i, 0) + cover.get(i, 0)  # what the member holds: share and cover
            if i in fm.deployed:
                calls.append(self._members[i].scale(model, n))
            else:
                calls.append(
                    self._members[i].deploy(self._spec(i, fm.spec), self._share(fm.config, n))
                )
        results = await asyncio.gather(*calls, return_exceptions=True)
        failed = None
        for i, r in zip(changed, results, strict=True):
            if isinstance(r, BaseException):
                failed = failed or r
                continue
            fm.shares[i], fm.cover[i] = shares.get(i, 0), cover.get(i, 0)
            fm.deployed.add(i)
        if failed is not None:
            raise failed

    async def reconfigure(self, model: str, config: ModelConfig) -> None:
        """A new plan for ``model``: the same hardware and batch bound is a ``scale``; otherwise
        every member that holds it reconfigures its share (or redeploys it) first."""
        fm = self._get(model)
        same = (config.hardware, config.max_batch_size) == (
            fm.config.hardware,
            fm.config.max_batch_size,
        )
        if not same:
            async with self._control():
                for i in sorted(fm.deployed):
                    m, n = self._members[i], fm.shares.get(i, 0) + fm.cover.get(i, 0)
                    if callable(getattr(m, "reconfigure", None)):
                        await m.reconfigure(model, self._share(config, n))
                    elif fm.adopted:  # the operator's model stays loaded as it is (TF
                        # Serving takes any batch its own batching allows)
                        log.info("fleet: %r kept as it is on %s", model, self._urls[i])
                    else:
                        await m.remove(model)
                        await m.deploy(self._spec(i, fm.spec), self._share(config, n))
                fm.config = self._share(config, fm.config.replicas)
        await self.scale(model, config.replicas)

    async def remove(self, model: str) -> None:
        self._check_open()
        async with self._control():
            fm = self._get(model)
            self._models.pop(model)
            self._subscribers.notify(model, [])
            results = await asyncio.gather(
                *(self._members[i].remove(model) for i in sorted(fm.deployed)),
                return_exceptions=True,
            )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # -- attach: discover / adopt (inferline attach URL URL ...) --------------------------------

    @property
    def extra_models(self) -> tuple[str, ...]:
        """Models to ask about on members that cannot list theirs (TF Serving without a model
        config file); set on every such member."""
        names: list[str] = []
        for m in self._members:
            names += list(getattr(m, "extra_models", ()))
        return tuple(dict.fromkeys(names))

    @extra_models.setter
    def extra_models(self, names: Sequence[str]) -> None:
        for m in self._members:
            if hasattr(m, "extra_models"):
                m.extra_models = tuple(names)

    async def discover(self) -> dict[str, Any]:
        """Every member's models: per model, the entry of the first member where it is ready
        (its signature describes the model), and which members serve it (for ``adopt``)."""
        self._check_open()
        found = await asyncio.gather(*(self._discover_member(m) for m in self._members))
        merged, self._ready_on = merge_found(found)
        self._found = list(found)
        await self.measure_round_trips()  # the hop to each server, for planning
        return merged

    @staticmethod
    async def _discover_member(m: Any) -> Mapping[str, Any]:
        if not callable(getattr(m, "discover", None)):
            raise ValidationError("backend", "members with discover() and adopt()", str(m.url))
        return dict(await m.discover())

    async def adopt(self, server_name: str, *, name: str | None = None, **kw: Any) -> ModelConfig:
        """Adopt ``server_name`` on every member that serves it ready (all members when
        ``discover()`` was not called): one model whose replicas are theirs. A member that
        fails undoes nothing on the others' servers (adopting changes nothing there) but the
        fleet then manages none of them."""
        self._check_open()
        name = name or server_name
        if name in self._models:
            raise ValidationError("model", "a model not managed yet", name)
        on = list(range(len(self._members)))
        if self._ready_on is not None:
            on = self._ready_on.get(server_name, [])
        if not on:
            raise NotFoundError("served model", server_name, f"not ready on {self._urls}")
        if self._found:  # before any member adopts
            check_contracts(name, {self._urls[i]: self._found[i][server_name] for i in on})
        async with self._control():
            results = await asyncio.gather(
                *(self._members[i].adopt(server_name, name=name, **kw) for i in on),
                return_exceptions=True,
            )
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            configs: dict[int, ModelConfig] = dict(zip(on, results, strict=True))  # type: ignore[arg-type]
            config = adopted_config(name, configs)
            fm = _FleetModel(
                ModelSpec(name, source=server_name),
                config,
                {i: c.replicas for i, c in configs.items()},
            )
            fm.deployed, fm.adopted = set(on), True
            self._models[name] = fm
        self._notify(name)
        return config

    def operator_snapshot(self) -> dict[str, Any]:
        """Every member's snapshot (raises NotImplementedError when one cannot restore)."""
        for m in self.members:
            if not callable(getattr(m, "operator_snapshot", None)):
                raise NotImplementedError(f"{m.url}: operator_snapshot")
        return {
            "kind": "fleet",
            "url": self._url,
            "members": [m.operator_snapshot() for m in self.members],
        }

    async def restore_operator_settings(self) -> None:
        """Every member that can puts its server's settings back (all are tried; the first
        failure is raised once they were)."""
        results = await asyncio.gather(
            *(
                m.restore_operator_settings()
                for m in self.members
                if callable(getattr(m, "restore_operator_settings", None))
            ),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # -- stats / close ------------------------------------------------------------------------

    async def stats(self, model: str) -> Mapping[str, Any]:
        """The fleet's view (target, active, shortfall, each replica with its server) and
        each member's own ``stats`` under ``servers``."""
        fm = self._get(model)
        servers: list[dict[str, Any]] = []
        replicas: list[dict[str, Any]] = []
        for i, url in enumerate(self._urls):
            if i in self._gone:
                continue
            active = self._wrap(i, self._member_replicas(i, model))
            entry: dict[str, Any] = {
                "server": url,
                "target_replicas": fm.shares.get(i, 0),
                "active_replicas": len(active),
                "draining": i in self._draining,
                "in_flight": self._flight[i],
                "covering": fm.cover.get(i, 0),
                "round_trip_ms": _ms(self.round_trips.get(url)),
            }
            if i in fm.deployed:
                try:
                    entry["stats"] = dict(await self._members[i].stats(model))
                except InferlineError as e:
                    entry["stats"] = {"error": str(e)}
            servers.append(entry)
            replicas += [
                {"id": w.id, "server": url, "hardware": w.hardware, "draining": i in self._draining}
                for w in active
            ]
        target = fm.config.replicas
        return {
            "model": model,
            "backend": self._url,
            "hardware": fm.config.hardware,
            "max_batch_size": fm.config.max_batch_size,
            "target_replicas": target,
            "active_replicas": len(self.replicas(model)),
            "shortfall": max(0, target - len(replicas)),
            "unplaced": fm.unplaced,
            "replicas": replicas,
            "servers": servers,
            **self.membership_stats(),
        }

    async def close(self) -> None:
        """Close every member (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for t in [*self._pending_cover.values(), self._refresh_task]:
            if t is not None:
                t.cancel()
        for model in list(self._models):
            self._subscribers.notify(model, [])
        await asyncio.gather(*(m.close() for m in self.members), return_exceptions=True)


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 3)


def fleet_of(members: Sequence[Any], **dynamic: Any) -> FleetBackend:
    """The fleet of ``members`` (open backends with distinct URLs), for ``open_backend``: the
    members are built there, through the plugin host, and composed here. ``dynamic``: a
    DNS-sourced fleet's ``source``, ``addresses``, ``urls`` and ``open_member``."""
    return FleetBackend(members, **dynamic)
