"""Members joining and leaving a running fleet (``resolve=dns``: ``_dns``; docs/fleets.md,
"Kubernetes").

Each refresh resolves the fleet's DNS name and asks ``MembershipPolicy`` what changed:

- **An address appears**: a member is built for it (``open_member``: the same construction
  as the fleet's first members, ``inferline.deploy.open_backend``), and each model the fleet
  deploys gets its share there: the open members' even share (``target // open members``,
  within its room), started on the new member first, then taken from the others the way a
  scale-down takes (``_spread.spread``: draining first, then the most).
- **An address is gone** (``drop_after`` answers in a row): the member is drained (no new
  batches; those in flight finish, up to ``leave_wait_s``), then removed: its share of each
  model is placed on the survivors within their room (``_spread.cover``), what does not fit
  is dropped from the model's count (logged), and the member is closed.

A removed member keeps its index (replica handles and in-flight counts refer to it) and
is left out of everything (``_gone``); an address that comes back reuses it. A change
clears the plan's placement (its nodes were the old members): ``spread`` decides until the
next plan. Each change is logged at INFO on one line and kept in ``membership_events``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from inferline.core import CapacityError, InferlineError, ValidationError

from ._dns import DnsSource, MembershipChange, MembershipPolicy, Resolver, resolve_dns
from ._spread import cover, spread

__all__ = ["Membership"]

log = logging.getLogger(__name__)


class Membership:
    """The ``FleetBackend`` half that adds and removes members while it runs (mixed in)."""

    _members: list[Any]
    _urls: list[str]
    _models: dict[str, Any]
    _draining: set[int]
    _closed: bool
    _flight: dict[int, int]
    _idle: dict[int, asyncio.Event]
    _wrapped: dict[int, dict[int, Any]]
    _planned: dict[str, dict[int, int]]
    _unanswered: set[str]
    round_trips: dict[str, float | None]

    def _init_membership(
        self,
        source: DnsSource | None,
        addresses: list[str] | None,
        resolver: Resolver | None,
        open_member: Callable[[str], Any] | None,
        leave_wait_s: float,
    ) -> None:
        if source is not None and (open_member is None or addresses is None):
            raise ValidationError("FleetBackend", "open_member and addresses with source", None)
        self._source = source
        self._resolver: Resolver = resolver or resolve_dns
        self._open_member = open_member
        self._policy = MembershipPolicy(source.drop_after if source else 2)
        self._gone: set[int] = set()
        self._addresses: dict[int, str] = dict(enumerate(addresses or []))
        self._refresh_task: asyncio.Task[None] | None = None
        self.leave_wait_s = float(leave_wait_s)
        self.membership_events: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)

    def _start_refresh(self) -> None:
        """Start the refresh loop on the running loop (once; a fleet with a DNS source)."""
        if self._source is None or self._refresh_task is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._refresh_task = loop.create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        assert self._source is not None
        while not self._closed:
            await asyncio.sleep(self._source.refresh_s)
            try:
                await self.refresh_members()
            except Exception:  # a background loop must outlive one bad refresh: logged,
                # and the next refresh tries again
                log.exception("fleet: membership refresh of %s failed", self._source.url)

    def member_addresses(self) -> list[str]:
        """The resolved addresses that are members now."""
        return sorted(a for i, a in self._addresses.items() if i not in self._gone)

    async def refresh_members(self) -> MembershipChange:
        """Resolve the fleet's name once and apply what changed (joins first, so that a
        leaving member's share has somewhere to go)."""
        src = self._source
        if src is None:
            raise ValidationError("backend", "a fleet with ?resolve=dns", getattr(self, "url", ""))
        try:
            answer: list[str] | None = list(await self._resolver(src.host, src.port))
        except OSError as e:
            log.warning("fleet: %s did not resolve (%s); members unchanged", src.host, e)
            answer = None
        change = self._policy.step(self.member_addresses(), answer)
        for a in change.added:
            await self._join(a)
        for a in change.removed:
            await self._leave(a)
        return change

    def _event(self, change: str, url: str, replicas: dict[str, Any]) -> None:
        self.membership_events.append(
            {"at": round(time.time(), 3), "change": change, "server": url, "replicas": replicas}
        )

    def membership_stats(self) -> dict[str, Any]:
        """The source, the members' addresses and the last changes (``stats()``)."""
        if self._source is None:
            return {}
        return {
            "membership": {
                "source": self._source.url,
                "refresh_s": self._source.refresh_s,
                "addresses": self.member_addresses(),
                "events": list(self.membership_events),
            }
        }

    # -- join ---------------------------------------------------------------------------------

    async def _join(self, address: str) -> None:
        assert self._source is not None and self._open_member is not None
        url = self._source.member_url(address)
        try:
            member = self._open_member(url)
        except (InferlineError, OSError) as e:
            log.warning("fleet: could not open new member %s: %s", url, e)
            return
        if url in self._urls:  # an address that left and came back: its old slot
            i = self._urls.index(url)
            self._members[i] = member
            self._gone.discard(i)
            self._draining.discard(i)
        else:
            i = len(self._members)
            self._members.append(member)
            self._urls.append(url)
            self._flight[i], self._idle[i], self._wrapped[i] = 0, asyncio.Event(), {}
            self._idle[i].set()
        self._addresses[i] = address
        member.subscribe(lambda model, _hs, i=i: self._member_changed(i, model))  # type: ignore[attr-defined]
        self._planned.clear()  # the plan's nodes were the old members
        placed: dict[str, int] = {}
        async with self._control():  # type: ignore[attr-defined]
            for model, fm in list(self._models.items()):
                placed[model] = await self._rebalance(model, fm, i)
        log.info("fleet: member joined %s (from %s): replicas %s", url, self._source.host, placed)
        self._event("joined", url, placed)

    async def _rebalance(self, model: str, fm: Any, i: int) -> int:
        """Give the new member ``i`` its even share of ``model``: started there first, then
        taken from the others. Returns the replicas it got."""
        open_ = [j for j in range(len(self._members)) if j not in self._draining]
        k = fm.config.replicas // max(len(open_), 1)
        room = self._room(fm.config.hardware, self._per(fm.spec, fm.config.hardware))  # type: ignore[attr-defined]
        k = k if room.get(i) is None else min(k, room[i] or 0)
        if k <= 0 or fm.adopted:  # an adopted model is the operator's: not loaded elsewhere
            return 0
        rest = {j: n for j, n in fm.shares.items() if j != i}
        down = self._down(model, fm)  # type: ignore[attr-defined]
        try:
            others = spread(
                fm.config.replicas - k, rest, dict.fromkeys(rest, 0), self._draining, down
            )
            await self._apply(model, fm, {**fm.shares, i: k}, dict(fm.cover))  # type: ignore[attr-defined]
            shares = {**others, i: k}
            await self._apply(model, fm, shares, self._cover_for(model, fm, shares))  # type: ignore[attr-defined]
        except InferlineError as e:  # CapacityError too: what was applied stays
            log.warning("fleet: %r not moved to %s: %s", model, self._urls[i], e)
            return fm.shares.get(i, 0)  # type: ignore[no-any-return]
        return k

    # -- leave --------------------------------------------------------------------------------

    async def _leave(self, address: str) -> None:
        i = next(j for j, a in self._addresses.items() if a == address and j not in self._gone)
        url = self._urls[i]
        self._draining.add(i)  # no new batches; those in flight finish
        for model in list(self._models):
            self._notify(model)  # type: ignore[attr-defined]
        empty = await self.wait_drained(url, self.leave_wait_s)  # type: ignore[attr-defined]
        moved: dict[str, Any] = {}
        async with self._control():  # type: ignore[attr-defined]
            self._gone.add(i)
            self._planned.clear()
            for model, fm in list(self._models.items()):
                moved[model] = await self._take_over(model, fm, i)
        self._wrapped[i] = {}
        self.round_trips.pop(url, None)
        self._unanswered.discard(url)
        try:
            await asyncio.wait_for(self._members[i].close(), self.leave_wait_s)
        except (InferlineError, OSError, TimeoutError) as e:
            log.warning("fleet: closing %s: %s", url, e)
        log.info(
            "fleet: member left %s (%s no longer resolves it; %s): replicas moved %s",
            url,
            self._source.host if self._source else "?",
            "drained" if empty else f"{self._flight[i]} batch(es) still in flight",
            moved,
        )
        self._event("left", url, moved)

    async def _take_over(self, model: str, fm: Any, i: int) -> dict[str, int]:
        """Place member ``i``'s share of ``model`` on the survivors within their room (the
        rest is dropped from the model's count). Returns the replicas each survivor got."""
        lost = fm.shares.pop(i, 0)
        fm.cover.pop(i, None)
        fm.deployed.discard(i)
        if lost == 0:
            return {}
        per = self._per(fm.spec, fm.config.hardware)  # type: ignore[attr-defined]
        room = self._room(fm.config.hardware, per, fm.cover)  # type: ignore[attr-defined]
        closed = self._draining | self._down(model, fm)  # type: ignore[attr-defined]
        extra = cover(lost, {}, fm.shares, room, closed)
        shares = {j: fm.shares.get(j, 0) + extra.get(j, 0) for j in set(fm.shares) | set(extra)}
        dropped = lost - sum(extra.values())
        if dropped:
            log.warning(
                "fleet: %r: %d replica(s) of %s had no room left", model, dropped, self._urls[i]
            )
        try:
            await self._apply(model, fm, shares, self._cover_for(model, fm, shares))  # type: ignore[attr-defined]
        except (InferlineError, CapacityError) as e:
            log.warning("fleet: %r not re-placed after %s left: %s", model, self._urls[i], e)
        fm.config = self._share(fm.config, sum(fm.shares.values()))  # type: ignore[attr-defined]
        return {self._urls[j]: n for j, n in extra.items() if n}
