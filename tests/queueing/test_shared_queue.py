"""One EDF queue per stage across its variants (``Dispatcher.share``, ``_shared``): the gate,
the variant chosen when a batch is cut, and the queue without sharing unchanged. Virtual time
(the injected clock is the loop's), so every time below is exact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.core.errors import DeadlineExceededError, NotFoundError, ValidationError
from inferline.queueing import AdmissionConfig, Dispatcher, FixedBatching, InProcessReplica
from inferline.queueing._mqueue import ModelQueue
from inferline.queueing._shared import SharedQueue


class Tag:
    """A model that answers which variant served each input."""

    def __init__(self, name: str) -> None:
        self.name = name

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return [(self.name, x) for x in inputs]


def _stage(loop: asyncio.AbstractEventLoop, *, share: bool, expire: bool = False) -> Dispatcher:
    """Stage ``big`` (its own variant: one replica, 1 s a batch of 1) and variant ``small``
    (one replica, 0.25 s a batch of up to 2)."""
    d = Dispatcher(clock=loop.time)
    d.add_model("big", batching=FixedBatching(1), expire_late=expire)
    d.add_model("small", batching=FixedBatching(2), expire_late=expire)
    d.set_replicas("big", [InProcessReplica("big", Tag("big"), service_s=1.0)])
    d.set_replicas("small", [InProcessReplica("small", Tag("small"), service_s=0.25)])
    if share:
        d.share("big", ["big", "small"])
    return d


async def _timed(d: Dispatcher, name: str, x: Any, deadline: float) -> tuple[float, Any]:
    loop = asyncio.get_running_loop()
    try:
        out: Any = await d.submit(name, x, deadline=deadline)
    except DeadlineExceededError as e:
        out = type(e).__name__
    return loop.time(), out


async def _switch_at(d: Dispatcher, t: float, variant: str) -> None:
    await asyncio.sleep(t - asyncio.get_running_loop().time())
    d.route("big", variant)


def _switch_scenario(share: bool) -> Any:
    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        d = _stage(loop, share=share)
        calls = [_timed(d, "big", i, 10.0 + i) for i in range(4)]
        res = await asyncio.gather(*calls, _switch_at(d, 0.5, "small"))
        queued = (d.queued("big"), d.queued("small"))
        await d.close()
        return res[:4], queued

    return scenario


def test_at_a_switch_the_queued_queries_go_to_the_new_variant(vrun: Any) -> None:
    """Four queries at t=0 on ``big``; at 0.5 the stage moves to ``small``. The busy ``big``
    replica finishes q0 (0-1) and takes nothing more; ``small`` cuts q1, q2 as one batch of
    its size 2 at 0.5 and q3 at 0.75. Catches: the old variant keeping its queue (q1 at 2 s),
    the new variant not woken at the switch (nothing at 0.5), the old variant's batch size."""
    res, _ = vrun(_switch_scenario(share=True))
    assert res == [
        (1.0, ("big", 0)),
        (0.75, ("small", 1)),
        (0.75, ("small", 2)),
        (1.0, ("small", 3)),
    ]


def test_without_sharing_queued_queries_finish_on_the_old_variant(vrun: Any) -> None:
    """The same switch without ``share``: today's per-variant queues, unchanged."""
    res, _ = vrun(_switch_scenario(share=False))
    assert res == [(t + 1.0, ("big", t)) for t in range(4)]


def test_one_deadline_order_across_the_variants(vrun: Any) -> None:
    """Queries submitted for either variant wait in one EDF order and are served by the active
    variant: with ``small`` active, its one replica takes the two earliest deadlines first,
    whichever name they were submitted for."""

    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        d = _stage(loop, share=True)
        d.route("big", "small")
        res = await asyncio.gather(
            _timed(d, "big", "late", 9.0),
            _timed(d, "small", "later", 9.5),
            _timed(d, "big", "early", 1.0),
            _timed(d, "small", "earlier", 0.5),
        )
        await d.close()
        return res

    assert vrun(scenario) == [
        (0.5, ("small", "late")),
        (0.5, ("small", "later")),
        (0.25, ("small", "early")),
        (0.25, ("small", "earlier")),
    ]


def test_two_active_variants_drain_together_and_queued_is_counted_once(vrun: Any) -> None:
    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        d = _stage(loop, share=True)
        d.set_active("big", ["small", "big"])
        futs = [asyncio.ensure_future(_timed(d, "big", i, 10.0 + i)) for i in range(5)]
        await asyncio.sleep(0)
        counts = (d.queued("small"), d.queued("big"))
        res = await asyncio.gather(*futs)
        shared = d.shared
        await d.close()
        return res, counts, shared

    res, counts, shared = vrun(scenario)
    # at t=0 small (warmest first? both idle: small then big) cuts q0, q1; big q2 at 0-1;
    # small q3, q4 at 0.25-0.5
    assert res == [
        (0.25, ("small", 0)),
        (0.25, ("small", 1)),
        (1.0, ("big", 2)),
        (0.5, ("small", 3)),
        (0.5, ("small", 4)),
    ]
    assert counts == (5, 0)  # reported on the first active variant only
    assert shared == {"big": (("big", "small"), ("small", "big"))}


def test_a_query_expires_once_in_the_shared_queue(vrun: Any) -> None:
    """Both members' expiry timers read the shared heap: a query behind a busy replica is
    answered once, at its deadline plus the grace."""

    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        d = _stage(loop, share=True, expire=True)
        busy = asyncio.ensure_future(_timed(d, "big", "busy", 5.0))
        while d.stats("big").in_flight == 0:
            await asyncio.sleep(0)
        res = [*await asyncio.gather(busy, _timed(d, "small", "x", 0.1))]
        st = (d.stats("big").expired + d.stats("small").expired, d.stats("small").batches)
        await d.close()
        return res, st

    res, (expired, small_batches) = vrun(scenario)
    assert res == [(1.0, ("big", "busy")), (pytest.approx(0.15), "DeadlineExceededError")]
    assert expired == 1 and small_batches == 0


def test_share_and_route_refuse_what_cannot_share(vrun: Any) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        d = Dispatcher(clock=loop.time)
        d.add_model("a")
        d.add_model("b", expire_late=True)
        d.add_model("c", admission=AdmissionConfig(mode="predicted"))
        d.add_model("e")
        with pytest.raises(ValidationError, match="expire_late"):
            d.share("a", ["a", "b"])
        with pytest.raises(ValidationError, match="admission"):
            d.share("a", ["a", "c"])
        with pytest.raises(NotFoundError):
            d.share("a", ["a", "zz"])
        d.share("a", ["a", "e"])
        with pytest.raises(ValidationError, match="shared queue"):
            d.share("e", ["e"])
        with pytest.raises(NotFoundError, match="variant"):
            d.route("a", "b")  # a model, but not a variant of the stage
        with pytest.raises(NotFoundError, match="shared queue"):
            d.set_active("b", ["b"])
        await d.close()

    vrun(scenario)


def test_the_gate_policy() -> None:
    """The pure gate: who may cut, and a clear error for a wrong active set."""
    members = [ModelQueue(n, FixedBatching(1), 10, False, 1) for n in ("x", "y")]
    g = SharedQueue("x", members, ["x"])
    assert g.may_cut("x") and not g.may_cut("y") and g.reporter() == "x"
    g.set_active(["y", "x", "y"])
    assert g.active == ("y", "x") and g.may_cut("y") and g.reporter() == "y"
    with pytest.raises(ValidationError, match="at least one"):
        g.set_active([])
    with pytest.raises(ValidationError, match="variants of stage"):
        g.set_active(["z"])
