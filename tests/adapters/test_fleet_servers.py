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
from _fleet_fakes import FakeMember

from inferline.adapters.fleet import FleetBackend, cover
from inferline.core import (
    CapacityError,
    ModelConfig,
    ModelSpec,
    Pipeline,
    Profiles,
    gamma_trace,
)
from inferline.deploy import Attachment, plan_attachment, plugin_host

M = ModelSpec("m", source="x")
N = ModelSpec("n", source="y")


def test_the_fleet_follows_the_plans_placement_per_server() -> None:
    async def main() -> None:
        a, b = FakeMember("fake://a", 4), FakeMember("fake://b", 4)
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
        near, far = FakeMember("fake://a", 1), FakeMember("fake://b", 1, 0.02)
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
        a, b, c = (FakeMember(f"fake://{x}", 3) for x in "abc")
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
        b.back()  # both back: their replicas reloaded, the cover goes
        c.back()
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
