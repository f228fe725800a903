"""Model-Switching's table kept live, measured accuracy, and ``GET /admin/switching``.

``TableKeeper`` listens to the dispatcher: the batches of the stage's variants (service time
per batch size) and the queries routed to them (the arrival rate), both over the last
``window_s`` (the drift loop's window). Every tick it asks the pure ``TableRebuildPolicy``
whether the table is due; a due table is rebuilt off the event loop from the start-up profiles
scaled to the live timings, with the measured rate in its grid, and handed to the switcher's
controller. Each rebuild is logged (INFO, one line) and shown by ``GET /admin/switching``.

``score_held_out`` measures each variant's accuracy at start on a held-out set sent through the
dispatcher to the variant's replicas (what the app's queries take); ``load_held_out`` reads the
set (``.npz`` with arrays ``x`` and ``y``, never pickled, or JSON ``{"inputs", "labels"}``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferline.core import ValidationError
from inferline.deploy._switching import cancel_and_wait, tick_every
from inferline.queueing import ArrivalEvent, BatchEvent
from inferline.selection import (
    SwitchingController,
    SwitchingTable,
    TableInfo,
    TableRebuildPolicy,
    Variant,
    VariantTiming,
    build_switching_table,
    scaled_profiles,
    thread_hardware,
    timings_by_batch,
)

__all__ = [
    "TableKeeper",
    "load_held_out",
    "make_switching_router",
    "score_held_out",
    "switching_keeper",
]

log = logging.getLogger(__name__)

_KEEPERS: weakref.WeakKeyDictionary[Any, TableKeeper] = weakref.WeakKeyDictionary()


def switching_keeper(service: Any) -> TableKeeper | None:
    """The table keeper of ``service`` (None: Model-Switching is off)."""
    return _KEEPERS.get(service)


def load_held_out(path: str | Path) -> tuple[list[Any], list[Any]]:
    """``(inputs, labels)`` of a held-out file: ``.npz`` (arrays ``x``, ``y``) or JSON."""
    p = Path(path)
    try:
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                xs, ys = list(z["x"]), [y.item() for y in z["y"]]
        else:
            d = json.loads(p.read_text())
            xs, ys = [np.asarray(x) for x in d["inputs"]], list(d["labels"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValidationError(
            "switching.held_out", "an .npz with x and y, or JSON {inputs, labels}", f"{p}: {e}"
        ) from None
    if not xs or len(xs) != len(ys):
        raise ValidationError(
            "switching.held_out", "as many labels as inputs, at least one", (len(xs), len(ys))
        )
    return xs, ys


def _label(out: Any) -> Any:
    """One query's answer as a label: a scalar as is, a score vector by its argmax."""
    a = np.asarray(out)
    if a.size == 1:
        return a.item()
    return int(a.ravel().argmax()) if a.dtype.kind in "iuf" else a.ravel()[0].item()


async def score_held_out(
    dispatcher: Any,
    backend: Any,
    variants: Sequence[str],
    xs: Sequence[Any],
    ys: Sequence[Any],
    chunk: int = 64,
) -> dict[str, float]:
    """Each variant's share of right answers on ``xs``, sent through ``dispatcher`` to its
    replicas (a variant without replicas gets one first). Failed queries count as wrong."""
    acc = {}
    idle = [v for v in variants if not backend.replicas(v)]
    await asyncio.gather(*(backend.scale(v, 1) for v in idle))  # started side by side
    for v in variants:
        right = 0
        for i in range(0, len(xs), chunk):  # chunks: the queue's bound is not the set's size
            deadline = dispatcher.clock() + 600.0  # no deadline to speak of: score, not serve
            outs = await asyncio.gather(
                *(dispatcher.submit(v, x, deadline=deadline) for x in xs[i : i + chunk]),
                return_exceptions=True,
            )
            for o, y in zip(outs, ys[i : i + chunk], strict=True):
                right += not isinstance(o, BaseException) and _label(o) == y
        acc[v] = right / len(xs)
    return acc


class TableKeeper:
    """Rebuilds ``switcher``'s table when ``policy`` says so (see the module docstring)."""

    def __init__(
        self,
        switcher: Any,
        policy: TableRebuildPolicy,
        variants: Sequence[Variant],
        accuracy_source: Mapping[str, str],
        *,
        app: str,
        window_s: Callable[[], float],
        clock: Callable[[], float],
    ) -> None:
        self.switcher = switcher
        self.policy = policy
        self.variants = tuple(variants)
        self.app = app
        self._window_s = window_s
        self._clock = clock
        self._batches: deque[tuple[float, str, int, float]] = deque()
        self._arrivals: deque[float] = deque()
        self._names = {v.name for v in variants}
        self.info = TableInfo(clock(), "startup", {}, 0.0, "start-up profiles", accuracy_source)
        self.history: deque[TableInfo] = deque([self.info], maxlen=50)
        self._task: asyncio.Task[None] | None = None

    def on_event(self, ev: Any) -> None:
        if isinstance(ev, BatchEvent) and ev.ok and ev.model in self._names:
            self._batches.append((ev.start, ev.model, ev.size, ev.service_s))
        elif isinstance(ev, ArrivalEvent) and ev.accepted and ev.model in self._names:
            self._arrivals.append(ev.time)

    def _prune(self, now: float) -> float:
        w = self._window_s()
        while self._batches and self._batches[0][0] < now - w:
            self._batches.popleft()
        while self._arrivals and self._arrivals[0] < now - w:
            self._arrivals.popleft()
        return w

    def rate(self, now: float) -> float:
        """Arrivals per second over the window (its mean rate, not the controller's)."""
        w = self._prune(now)
        return sum(t >= now - w for t in self._arrivals) / w

    def timings(self, now: float) -> dict[str, dict[int, VariantTiming]]:
        """The window's batches per variant and batch size (events come in the order batches
        finish, not start: filtered here, not only pruned from the left)."""
        w = self._prune(now)
        return timings_by_batch((m, b, s) for t, m, b, s in self._batches if t >= now - w)

    async def tick(self) -> TableInfo | None:
        """Rebuild the table when due; the new info, or None when nothing was due."""
        now = self._clock()
        rate = self.rate(now)
        live = self.timings(now)
        sw = self.switcher
        hw = {v: thread_hardware(t) for v, t in sw._threads.items()}
        table: SwitchingTable = sw.table
        d = self.policy.decide(
            now, self.info.built_at_s, self.info.factors, live, hw, rate, table.rates_qps[-1]
        )
        if d is None:
            return None
        profiles = scaled_profiles(self.policy.base, d.factors)
        new = await asyncio.to_thread(
            build_switching_table,
            self.variants,
            profiles,
            sw.config,
            None,
            (d.rate_qps,) if d.rate_qps > 0 else (),
        )
        sw.table = new
        sw.controller = SwitchingController(new, sw.config)
        self.info = TableInfo(
            now,
            "live",
            d.factors,
            d.rate_qps,
            d.changes,
            self.info.accuracy_source,
            self.info.builds + 1,
        )
        self.history.append(self.info)
        log.info("switching table rebuilt from live timings: %s; rate %.1f q/s", d.changes, rate)
        return self.info

    def launch(self, service: Any, dispatcher: Any, interval_s: float) -> None:
        dispatcher.add_listener(self.on_event)
        _KEEPERS[service] = self
        if self.policy.config.every_s > 0:
            self._task = asyncio.create_task(self._loop(interval_s))
        service.on_close(self.close)

    async def _loop(self, interval_s: float) -> None:
        failed = "switching table rebuild failed; the previous table stays"
        await tick_every(interval_s, self.tick, log, failed)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def snapshot(self) -> dict[str, Any]:
        sw = self.switcher
        now = self._clock()
        table: SwitchingTable = sw.table
        return {
            "enabled": True,
            "app": self.app,
            "stage": sw.stage,
            "active": None if sw.active is None else sw.active.to_dict(),
            "built": {**self.info.to_dict(), "age_s": now - self.info.built_at_s},
            "accuracy": {
                v: {"value": table.accuracy[v], "source": self.info.accuracy_source.get(v)}
                for v in sorted(table.accuracy)
            },
            "window": {
                "window_s": self._window_s(),
                "rate_qps": self.rate(now),
                "timings": {
                    v: {str(b): t.to_dict() for b, t in sorted(by.items())}
                    for v, by in self.timings(now).items()
                },
            },
            "rebuilds": [i.to_dict() for i in self.history],
            "table": table.to_dict(),
            "time_unix": time.time(),
        }


class SwitchingRoutes:
    """``GET /admin/switching``: the table, when and from what it was built, the accuracies
    and their source (``enabled`` false when Model-Switching is off). Behind the guard."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def router(self) -> Any:
        from fastapi import APIRouter

        r = APIRouter(prefix="/admin", tags=["admin"])
        r.add_api_route("/switching", self.get, methods=["GET"], summary="Switching table")
        return r

    async def get(self) -> Any:
        from fastapi.responses import Response

        k = switching_keeper(self.service)
        body = k.snapshot() if k is not None else {"enabled": False}
        return Response(json.dumps(body, default=str).encode(), media_type="application/json")


def make_switching_router(service: Any) -> Any:
    """The ``/admin/switching`` router of ``service`` (a ``create_app`` router factory)."""
    return SwitchingRoutes(service).router()
