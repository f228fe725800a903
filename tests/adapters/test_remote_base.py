"""The shared half of the Triton and TF Serving backends, without a server: handles (in-flight
count, drain, bisection of a refused batch), the recovery loop and the watch over fake hooks,
stats intervals, URL options."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from inferline.adapters._remote import (
    ManagedModel,
    RemoteBackend,
    StatsInterval,
    flag,
    query_options,
    settle_options,
    split_url,
)
from inferline.adapters._replica import RemoteReplica
from inferline.core import ModelConfig, ModelSpec, ReplicaError, ValidationError

OPTIONS = {"timeout_s": 1, "recovery_timeout_s": 0.2, "unload_on_close": False}


class Refused(Exception):
    pass


class FakeReplica(RemoteReplica):
    _request_fault = Refused

    def __init__(self, backend: FakeBackend, m: ManagedModel, n: int) -> None:
        super().__init__(backend, m.name, f"{m.name}#{n}", m.config.hardware)
        self.requests: list[list[int]] = []
        self.gate: asyncio.Event | None = None

    async def _predict(self, inputs: list[Any]) -> list[Any]:
        results: list[Any] = [None] * len(inputs)
        await self._bisect(list(enumerate(inputs)), results)
        return results

    async def _send(self, items: list[tuple[int, Any]], results: list[Any]) -> None:
        self.requests.append([i for i, _ in items])
        if self.gate is not None:
            await self.gate.wait()
        if any(x == "bad" for _, x in items):
            raise Refused("a bad query")
        for i, x in items:
            results[i] = x * 2

    def _refused(self, index: int, fault: Exception, results: list[Any]) -> None:
        results[index] = ValidationError("input", "a good query", str(fault))


class FakeBackend(RemoteBackend):
    """Hooks scripted by the test: the server answers after ``down`` probes."""

    _first_pause_s = _max_pause_s = 0.001

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__("fake://h:1", {**OPTIONS, **(options or {})})
        self.down = 0
        self.probes = 0
        self.restored: list[Hashable] = []
        self.overdue = 0
        self.lost: list[tuple[set[str] | None, str]] = []
        self.changed: dict[str, str] = {}
        self.seen: list[tuple[str, int]] = []
        self.subscribe(lambda model, hs: self.seen.append((model, len(hs))))

    async def close_for_test(self) -> None:
        self._closed = True
        await self._stop_loops()
        await self._close_handles(0.0)

    def add(self, name: str, n: int) -> ManagedModel:
        m = ManagedModel(name, name, ModelSpec(name), ModelConfig("cpu", 4, n))
        m.handles = [FakeReplica(self, m, i) for i in range(n)]
        self._models[name] = m
        return m

    async def _probe(self, key: Hashable) -> bool:
        self.probes += 1
        return self.probes > self.down

    async def _restore(self, key: Hashable) -> bool:
        self.restored.append(key)
        for m in self._models.values():
            m.handles = [FakeReplica(self, m, i) for i in range(m.config.replicas)]
            self._notify(m.name)
        return True

    def _overdue(self, key: Hashable) -> None:
        self.overdue += 1

    async def _changed_models(self) -> dict[str, str]:
        return dict(self.changed)

    def _lose(self, key: Hashable, models: set[str] | None, reason: str) -> None:
        self.lost.append((models, reason))
        self._begin_recovery(key, "fake-recover")


def test_handle_counts_in_flight_drains_and_bisects_a_refused_batch() -> None:
    async def main() -> None:
        b = FakeBackend()
        m = b.add("m", 1)
        (h,) = m.handles
        assert h.alive and h.id == "m#0" and h.model == "m" and h.hardware == "cpu"
        out = await h.predict_batch([1, "bad", 3, 4])
        assert out[0] == 2 and out[2:] == [6, 8] and isinstance(out[1], ValidationError)
        # refused whole, then halves, then the bad query alone
        assert h.requests == [[0, 1, 2, 3], [0, 1], [0], [1], [2, 3]]
        h.gate = asyncio.Event()
        call = asyncio.ensure_future(h.predict_batch([5]))
        await asyncio.sleep(0)
        assert h.in_flight == 1 and m.in_flight() == 1
        assert not await h.drained(0.01)
        h.gate.set()
        assert await h.drained(1.0) and await call == [10] and h.in_flight == 0
        assert await b._retire("m", [h], 1.0)
        assert not h.alive and b.seen[-1] == ("m", 0) and "alive=False" in repr(h)
        with pytest.raises(ReplicaError, match="not active"):
            await h.predict_batch([1])

    asyncio.run(main())


def test_recovery_waits_for_the_server_then_restores_once() -> None:
    async def main() -> None:
        b = FakeBackend()
        m = b.add("m", 2)
        b.down = 3
        b._take_down(m.handles)
        assert b.replicas("m") == [] and b.seen == [("m", 0)]
        assert b._begin_recovery("srv", "r1")
        assert not b._begin_recovery("srv", "r2")  # joins the running one
        await b._join_recovery("srv")
        assert b.restored == ["srv"] and b.probes == 4 and b.overdue == 0
        assert len(b.replicas("m")) == 2 and b.seen[-1] == ("m", 2) and b._outages == 1
        await b.close_for_test()

    asyncio.run(main())


def test_recovery_past_the_deadline_gives_up_or_keeps_probing() -> None:
    async def main() -> None:
        b = FakeBackend({"recovery_timeout_s": 0.02})
        b.add("m", 1)
        b.down = 10**9
        b._begin_recovery(None, "r")
        await asyncio.wait_for(b._recoveries[None], 5)  # gives up: done
        assert b.overdue == 1 and b.restored == []

        slow = FakeBackend({"recovery_timeout_s": 0.02})
        slow._keep_probing_s = 0.01
        slow.add("m", 1)
        slow.down = 10**9
        slow._begin_recovery(None, "r")
        await asyncio.sleep(0.2)
        assert slow._recovering(None) and slow.overdue >= 2  # still probing, slowly
        slow.down = 0  # the server is back, late
        await asyncio.wait_for(slow._recoveries[None], 5)
        assert slow.restored == [None]
        await slow.close_for_test()

    asyncio.run(main())


def test_watch_counts_two_missed_probes_and_reports_changed_models() -> None:
    async def main() -> None:
        b = FakeBackend({"watch_interval_s": 0.005})
        b.add("m", 1)
        b.changed = {"m": "the server runs it with 2 instances, not 1"}
        b._start_watch()
        for _ in range(400):
            if b.lost:
                break
            await asyncio.sleep(0.005)
        assert b.lost[0] == ({"m"}, "m: the server runs it with 2 instances, not 1")
        await b._join_recovery(None)
        b.changed = {}
        b.lost.clear()
        b.down, b.probes = 10**9, 0
        for _ in range(400):
            if b.lost:
                break
            await asyncio.sleep(0.005)
        assert b.lost[0] == (None, "the server missed two health checks")
        await b.close_for_test()
        assert b._watch_task is not None and b._watch_task.done()

    asyncio.run(main())
    with pytest.raises(ValidationError, match="watch_interval_s"):
        FakeBackend({"watch_interval_s": -1})


def test_stats_interval_and_checks() -> None:
    s = StatsInterval()
    assert s.advance({"n": 1}, 10.0) == (None, None)
    assert s.advance({"n": 3}, 12.5) == ({"n": 1}, 2.5)
    s.reset()
    assert s.advance({"n": 0}, 13.0) == (None, None)
    b = FakeBackend()
    b.add("m", 1)
    with pytest.raises(ValidationError, match="not deployed yet"):
        b._check_new(ModelSpec("m"), ())
    with pytest.raises(ValidationError, match="keys among"):
        b._check_new(ModelSpec("n", params={"colour": 1}), ("outputs",))
    for bad in (-1, True, 1.5):
        with pytest.raises(ValidationError):
            b._check_replicas(bad)
    head = b._stats_head(b._get("m"))
    assert head == {
        "model": "m",
        "backend": "fake://h:1",
        "hardware": "cpu",
        "active_replicas": 1,
        "in_flight": 0,
        "late_calls": 0,
        "late_items": 0,
    }


def test_url_and_options() -> None:
    schemes = {"x": "http", "x+grpc": "grpc"}
    protocol, parts = split_url("X+gRPC://h:1?a=1", schemes, "'x://host:port'")
    assert protocol == "grpc" and parts.netloc == "h:1"
    for bad in ("h:1", "y://h", 7):
        with pytest.raises(ValidationError):
            split_url(bad, schemes, "'x://host:port'")
    readers = {"n": int, "on": flag, "t": float}
    assert query_options("x://h", "n=3&on=Yes", readers) == {"n": 3, "on": True}
    with pytest.raises(ValidationError, match="one of"):
        query_options("x://h", {"colour": "red"}, readers)
    with pytest.raises(ValidationError, match="a valid value"):
        query_options("x://h", {"on": "maybe"}, readers)
    # the URL's options win over the keyword arguments
    assert settle_options("x://h", "t=2.5", readers, {"n": 1, "t": 9.0}) == {"n": 1, "t": 2.5}
