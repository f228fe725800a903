"""Re-placing a lost server's replicas on the survivors (docs/fleets.md, "Server loss").

When a member's server stops answering, its share of a model has no live replica. After
``replace_grace_s`` (a reload that briefly has none is not a loss) the fleet starts as many
*cover* replicas on the open survivors as their room allows (``_spread.cover``: to the
member with the fewest first); what does not fit is the shortfall, logged and shown in
``stats()`` as ``unplaced``. The lost member keeps its share: when its server is back its
own recovery reloads the model there, and the fleet then takes the cover back from the
survivors (each change is a member ``scale``). Cover replicas are not the plan's: a
``scale`` of the model counts the shares only and re-derives the cover after it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from inferline.core import InferlineError

from ._spread import cover

__all__ = ["Relocation"]

log = logging.getLogger(__name__)


class Relocation:
    """The ``FleetBackend`` half that covers lost replicas (mixed in; reads the fleet's
    models, members, draining set and control lock)."""

    _members: list[Any]
    _urls: list[str]
    _models: dict[str, Any]
    _draining: set[int]
    _closed: bool
    replace_lost: bool
    replace_grace_s: float
    _pending_cover: dict[str, asyncio.Task[None]]

    def _schedule_cover(self, model: str) -> None:
        """Look at ``model``'s lost replicas after the grace (one pending look per model)."""
        if not self.replace_lost or self._closed or model in self._pending_cover:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # a change reported outside the loop (a test's direct call): no task
        self._pending_cover[model] = loop.create_task(self._cover_later(model))

    async def _cover_later(self, model: str) -> None:
        try:
            await asyncio.sleep(self.replace_grace_s)
        finally:
            self._pending_cover.pop(model, None)
        try:
            async with self._control():  # type: ignore[attr-defined]
                await self._recover(model)
        except InferlineError as e:  # a survivor refused: the shortfall stays, and is shown
            log.warning("fleet: could not re-place the lost replicas of %r: %s", model, e)

    async def _recover(self, model: str) -> None:
        """Bring ``model``'s cover to what its members that are away lost (call under the
        control lock)."""
        fm = self._models.get(model)
        if fm is None or self._closed:
            return
        await self._apply(model, fm, dict(fm.shares), self._cover_for(model, fm, fm.shares))  # type: ignore[attr-defined]

    def _cover_for(self, model: str, fm: Any, shares: dict[int, int]) -> dict[int, int]:
        """The cover each member should hold with ``shares``: the shares of members that are
        away, on the open survivors within what each can hold beyond its share (its free
        room plus its cover now: cover may move). Logs a change; sets ``fm.unplaced``."""
        if not self.replace_lost:
            return {}
        down = {
            i
            for i, n in shares.items()
            if n > 0 and i not in self._draining and not self._member_replicas(i, model)  # type: ignore[attr-defined]
        }
        lost = sum(shares[i] for i in down)
        per = self._per(fm.spec, fm.config.hardware)  # type: ignore[attr-defined]
        room = self._room(fm.config.hardware, per)  # type: ignore[attr-defined]
        can: dict[int, int | None] = {}
        for i, r in room.items():
            held = fm.shares.get(i, 0) + fm.cover.get(i, 0)  # what the member holds now
            can[i] = None if r is None else r + held - shares.get(i, 0)
        new = cover(lost, fm.cover, shares, can, self._draining | down)
        placed = sum(new.values())
        if placed != sum(fm.cover.values()) or lost - placed != fm.unplaced:
            log.warning(
                "fleet: %r has %d replica(s) on servers that are away (%s); %d re-placed on "
                "the survivors %s, %d could not be placed (no room)",
                model,
                lost,
                ", ".join(self._urls[i] for i in sorted(down)) or "none",
                placed,
                {self._urls[i]: n for i, n in new.items() if n},
                lost - placed,
            )
        fm.unplaced = lost - placed
        return {i: n for i, n in new.items() if n}
