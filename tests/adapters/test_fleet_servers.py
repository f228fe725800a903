"""A fleet planned across its servers: each member's inventory as a planner node, the plan's
placement followed per member, the round trip to each server measured and added to the
profiles, lost replicas re-placed on the survivors within their room, and
``inferline nodes URL URL`` printing each member."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from inferline.adapters.fleet import FleetBackend, cover
from inferline.core import (
    CapacityError,
    InferlineError,
    ModelConfig,
    ModelSpec,
    Pipeline,
    Profiles,
    gamma_trace,
)
from inferline.deploy import Attachment, plan_attachment, plugin_host

M = ModelSpec("m", source="x")
N = ModelSpec("n", source="y")


class _FakeClient:
    """A FAKE server client: ``ready()`` answers after ``delay_s`` (a server that far)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def ready(self) -> bool:
        await asyncio.sleep(self.delay_s)
        return True


class FakeServerMember:
    """A FAKE member backend: a server of ``cores`` CPU cores (no real server: the placement
    and hop bookkeeping are checked on exact counts and delays). ``lose()`` takes its
    replicas away as a server loss does."""

    def __init__(self, url: str, cores: int, delay_s: float = 0.0) -> None:
        self.url, self.cores = url, cores
        self.client = _FakeClient(delay_s)
        self.held: dict[str, int] = {}
        self.away = False
        self.subs: list[Any] = []

    def inventory(self) -> dict[str, int]:
        return {"cpu": self.cores}

    def free(self) -> dict[str, int]:
        return {"cpu": max(0, self.cores - sum(self.held.values()))}

    def subscribe(self, cb: Any) -> None:
        self.subs.append(cb)

    def _set(self, model: str, n: int) -> None:
        if n - self.held.get(model, 0) > self.free()["cpu"]:
            raise CapacityError(f"{self.url}: no room for {n} of {model!r}", self.free())
        self.held[model] = n
        for cb in self.subs:
            cb(model, self.replicas(model))

    def replicas(self, model: str) -> list[Any]:
        if model not in self.held:
            raise InferlineError(f"{model!r} not here")
        return (
            [] if self.away else [_Handle(model, f"{model}-{k}") for k in range(self.held[model])]
        )

    def lose(self) -> None:
        self.away = True
        for m in self.held:
            for cb in self.subs:
                cb(m, [])

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        self._set(spec.name, config.replicas)

    async def scale(self, model: str, n: int) -> None:
        self._set(model, n)

    async def remove(self, model: str) -> None:
        self.held.pop(model, None)

    async def stats(self, model: str) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass


class _Handle:
    def __init__(self, model: str, rid: str) -> None:
        self.model, self.id, self.hardware, self.alive = model, rid, "cpu", True

    async def predict_batch(self, inputs: Any) -> list[Any]:
        return list(inputs)


def test_the_fleet_follows_the_plans_placement_per_server() -> None:
    async def main() -> None:
        a, b = FakeServerMember("fake://a", 4), FakeServerMember("fake://b", 4)
        fleet = FleetBackend([a, b])
        nodes = [n.to_dict() for n in fleet.nodes()]
        assert [(d["node_id"], d["hardware"], d["alive"]) for d in nodes] == [
            ("fake://a", {"cpu": 4}, True),
            ("fake://b", {"cpu": 4}, True),
        ]
        catalog = plugin_host().hardware_catalog()
        plan = {"m": ModelConfig("cpu", 4, 3), "n": ModelConfig("cpu", 4, 2)}
        # first-fit decreasing: m's 3 fill a to 3, n's first takes a's last core
        placed = fleet.place(plan, catalog)
        assert placed == {"m": {"fake://a": 3, "fake://b": 0}, "n": {"fake://a": 1, "fake://b": 1}}
        await fleet.deploy(M, plan["m"])
        await fleet.deploy(N, plan["n"])
        assert (a.held, b.held) == ({"m": 3, "n": 1}, {"n": 1})  # an even spread: m 2 + 1
        await fleet.scale("m", 1)  # a count the plan did not give: the even rules
        assert (a.held["m"], b.held.get("m", 0)) == (1, 0)
        fleet.place({"m": ModelConfig("cpu", 4, 2), "n": ModelConfig("cpu", 4, 2)}, catalog)
        await fleet.scale("m", 2)  # the new plan: m's 2 on a (with n's 1), n's other on b
        assert (a.held, b.held) == ({"m": 2, "n": 1}, {"n": 1})
        with pytest.raises(CapacityError):
            fleet.place({"m": ModelConfig("cpu", 4, 9)}, catalog)
        await fleet.close()

    asyncio.run(main())


def test_round_trips_are_measured_per_server_and_added_to_the_profiles() -> None:
    async def main() -> None:
        near, far = FakeServerMember("fake://a", 1), FakeServerMember("fake://b", 1, 0.02)
        fleet = FleetBackend([near, far])
        trips = await fleet.measure_round_trips(samples=3)
        assert trips["fake://b"] >= 0.02 and trips["fake://a"] < trips["fake://b"]
        await fleet.deploy(M, ModelConfig("cpu", 4, 2))
        assert (await fleet.stats("m"))["servers"][1]["round_trip_ms"] >= 20
        att = Attachment(fleet.url, fleet, plugin_host(), models={"m": ModelConfig("cpu", 4, 2)})
        prof = Profiles.from_latencies({"m": {"cpu": {1: 0.004, 2: 0.005, 4: 0.006}}})
        pipe = Pipeline.linear("p", ["m"])
        trace = gamma_trace(50.0, 1.0, 10.0, np.random.default_rng(0))
        plan = plan_attachment(att, pipe, prof, trace, 0.2)
        fleet.round_trips.clear()  # no measurement: the profile as it is
        plain = plan_attachment(att, pipe, prof, trace, 0.2)
        # profiled through a (the first replica's server): b's extra round trip is added
        extra = trips["fake://b"] - trips["fake://a"]
        assert plan.estimated_latency_s >= 0.004 + extra > plain.estimated_latency_s
        assert plan.models["m"].replicas <= 2  # within the two one-core servers
        await fleet.close()

    asyncio.run(main())


def test_cover_places_lost_replicas_within_the_survivors_room() -> None:
    assert cover(3, {}, {0: 1, 1: 2}, {0: None, 1: 5, 2: 9}, closed={2}) == {0: 2, 1: 1, 2: 0}
    assert cover(3, {}, {}, {0: 1, 1: 0}) == {0: 1, 1: 0}  # the rest is the shortfall
    assert cover(1, {0: 2, 1: 1}, {}, {0: None, 1: None}) == {0: 1, 1: 0}  # shrinks the most
    assert cover(2, {0: 2}, {}, {0: 1, 1: 3}) == {0: 1, 1: 1}  # cover beyond room moves


def test_a_lost_servers_replicas_go_to_the_survivors_and_come_back() -> None:
    async def main() -> None:
        a, b, c = (FakeServerMember(f"fake://{x}", 3) for x in "abc")
        fleet = FleetBackend([a, b, c], replace_grace_s=0.05)
        await fleet.deploy(M, ModelConfig("cpu", 4, 6))  # 2 on each
        c.lose()
        await asyncio.sleep(0.3)
        st = await fleet.stats("m")
        assert (a.held["m"], b.held["m"]) == (3, 3)  # one each: room for no more
        assert (st["shortfall"], st["unplaced"]) == (0, 0)
        assert [s["covering"] for s in st["servers"]] == [1, 1, 0]
        b.lose()  # a has no room for b's 2 (and b's cover): all short
        await asyncio.sleep(0.3)
        st = await fleet.stats("m")
        assert (a.held["m"], st["unplaced"], st["shortfall"]) == (3, 3, 3)
        b.away = c.away = False  # both back: their replicas reloaded, the cover goes
        b._set("m", b.held["m"])
        c._set("m", c.held["m"])
        await asyncio.sleep(0.3)
        st = await fleet.stats("m")
        assert (a.held["m"], b.held["m"], c.held["m"]) == (2, 2, 2)
        assert (st["shortfall"], st["unplaced"]) == (0, 0)
        await fleet.close()

    asyncio.run(main())


def test_cli_nodes_prints_each_fleet_member(tmp_path: Any, capsys: Any) -> None:
    from inferline.cli import main

    out = tmp_path / "nodes.json"
    urls = ["local://?cores=0", "local://?cores=1"]
    assert main(["nodes", *urls, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines()[1:3]]  # the table (test_fleet_nodes)
    assert [r[:3] for r in rows] == [[u, "alive", "cpu=1"] for u in urls]
    doc = json.loads(out.read_text())
    assert [n["name"] for n in doc["nodes"]] == urls
