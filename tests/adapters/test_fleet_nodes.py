"""``inferline nodes URL [URL ...]`` for a fleet's members: each member's inventory (and where
it came from), the instances its server runs, and the hop to it (median and P99 round trip of
its readiness call over ``--tries`` calls), as a table or ``--json``; real ``local://``
members, and one real Triton server (skipped, naming Triton, where none can be set up)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from _fleet_fakes import FakeMember

from inferline.adapters.fleet import FleetBackend, Hop, hop_of, inventory_source, measure_hop
from inferline.cli import main
from inferline.core import ModelConfig, ModelSpec, Profiles, ValidationError

LOCALS = ["local://?cores=0", "local://?cores=1"]


def test_hop_of_is_the_median_and_the_nearest_rank_p99() -> None:
    trips = [0.001 * i for i in range(1, 101)]  # 1..100 ms
    hop = hop_of(list(reversed(trips)))
    assert hop == Hop(pytest.approx(0.0505), pytest.approx(0.099), 100)  # type: ignore[arg-type]
    few = hop_of([0.003, 0.001, 0.002])
    assert (few.median_s, few.p99_s, few.tries) == (0.002, 0.003, 3)  # P99 of 3: the slowest
    assert few.to_dict() == {"median_ms": 2.0, "p99_ms": 3.0, "tries": 3}
    with pytest.raises(ValidationError, match="trips"):
        hop_of([])


class _FakeReady:
    """A FAKE readiness call: answers ``ready`` after ``delay_s``, counting the calls."""

    def __init__(self, delay_s: float, ready: bool = True) -> None:
        self.delay_s, self.ready, self.calls = delay_s, ready, 0

    async def __call__(self) -> bool:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return self.ready


def test_measure_hop_times_each_try_after_one_untimed_call() -> None:
    ping = _FakeReady(0.002)
    hop = asyncio.run(measure_hop(ping, 4))
    assert ping.calls == 5 and hop.tries == 4
    assert 0.002 <= hop.median_s <= hop.p99_s  # a sleep is never shorter than asked
    with pytest.raises(ConnectionError):
        asyncio.run(measure_hop(_FakeReady(0.0, ready=False), 3))
    with pytest.raises(ValidationError, match="tries"):
        asyncio.run(measure_hop(ping, 0))


def test_inventory_source_names_where_the_capacity_came_from() -> None:
    class Triton:
        client = object()

    class TFServing:
        def endpoints(self) -> list[Any]:
            return []

    assert inventory_source("triton+grpc://h:8001?cpu_cores=4", Triton()) == "url"
    assert inventory_source("triton+grpc://h:8001?gpus=0,1", Triton()) == "url"
    assert inventory_source("triton+grpc://h:8001", Triton()) == "default"
    assert inventory_source("tfserving+grpc://h:8500", TFServing()) == "server"
    assert inventory_source("local://?cores=0,1", object()) == "url"


def test_cli_nodes_tables_local_members_and_writes_the_nodes_file(
    tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "nodes.json"
    assert main(["nodes", *LOCALS, "local://", "--tries", "3", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["server", "state", "hardware"]
    assert "hop p50 ms" in lines[0] and "hop p99 ms" in lines[0]
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == [*LOCALS, "local://"]
    # a local runtime has no server to reach: its hop is in any profile taken through it
    assert rows[0][1:] == ["alive", "cpu=1", "cpu=1", "url", "-", "in-process", "in-process", "-"]
    assert rows[2][4] == "default"  # local:// without ?cores=: this machine's cores
    doc = json.loads(out.read_text())
    assert [n["name"] for n in doc["nodes"]] == [*LOCALS, "local://"]
    assert doc["nodes"][0]["hardware"] == {"cpu": 1}


def test_cli_nodes_json_is_one_document(tmp_path: Path, capsys: Any) -> None:
    assert main(["nodes", *LOCALS, "--json", "-o", str(tmp_path / "n.json")]) == 0
    rows = json.loads(capsys.readouterr().out)["nodes"]
    assert [(r["node_id"], r["alive"], r["hardware"], r["hop"]) for r in rows] == [
        (u, True, {"cpu": 1}, None) for u in LOCALS
    ]
    assert {r["hop_kind"] for r in rows} == {"none"}
    with pytest.raises(SystemExit) as e:
        main(["nodes", *LOCALS, "--tries", "0"])
    assert e.value.code == 2
    assert "--tries: expected an int >= 1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("tritonclient.grpc", reason="Triton: tritonclient[grpc] not installed")
    # the harness lives beside the integration tests, not in the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
    from triton_harness import SetupError, TritonServer, ensure_installed
    from triton_harness import models as harness_models

    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"Triton: no Triton server available: {e}")
    repo = tmp_path_factory.mktemp("triton-nodes") / "models"
    vdir = repo / "digit_name" / "1"
    vdir.mkdir(parents=True)
    shutil.copy2(
        Path(harness_models.__file__).parent / "model_src" / "digit_name.py", vdir / "model.py"
    )
    (repo / "digit_name" / "config.pbtxt").write_text(
        'name: "digit_name"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [{ name: "label", data_type: TYPE_INT64, dims: [1] }]\n'
        'output [{ name: "name", data_type: TYPE_STRING, dims: [1] }]\n'
        "instance_group [{ count: 2, kind: KIND_CPU }]\n"
    )
    server = TritonServer(install, repo, load=["digit_name"])
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_cli_nodes_measures_a_real_triton_members_hop_and_instances(
    triton: Any, capsys: Any
) -> None:
    url = f"{triton.grpc_url}?cpu_cores=2"
    assert main(["nodes", url, LOCALS[0], "--json", "--tries", "5"]) == 0
    rows = {r["node_id"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    t = rows[url]
    assert t["alive"] and t["hardware"] == {"cpu": 2} and t["inventory_from"] == "url"
    assert t["served_instances"] == {"KIND_CPU": 2}  # the model config's instance group
    assert t["hop"]["tries"] == 5 and 0 < t["hop"]["median_ms"] <= t["hop"]["p99_ms"]
    assert rows[LOCALS[0]]["hop"] is None
    # one Triton URL alone is a one-member fleet: the same row, as a table
    assert main(["nodes", url, "--tries", "3"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:3] == [url, "alive", "cpu=2"] and "KIND_CPU=2" in row


def test_profiles_taken_through_a_fleet_get_the_farthest_members_hop() -> None:
    async def main() -> None:
        near, far = FakeMember("fake://near"), FakeMember("fake://far", delay_s=0.02)
        fleet = FleetBackend([near, far])
        # as profile_models does: one replica (the even spread puts it on the first
        # member), timed through the handle the fleet hands out, then removed
        await fleet.deploy(ModelSpec("m", source="x"), ModelConfig("cpu", 4, 1))
        assert [h.server for h in fleet.replicas("m")] == ["fake://near"]
        await fleet.remove("m")
        prof = Profiles.from_latencies(
            {"m": {"cpu": {1: 0.004, 4: 0.006}}, "n": {"cpu": {1: 0.001}}}
        )
        got = await fleet.hop_profiles(prof, tries=3)
        rt = fleet.round_trips
        assert rt["fake://far"] >= 0.02  # type: ignore[operator]
        extra = rt["fake://far"] - rt["fake://near"]  # type: ignore[operator]
        assert got.latency("m", "cpu", 1) == pytest.approx(0.004 + extra)
        assert got.latency("m", "cpu", 4) == pytest.approx(0.006 + extra)
        assert got.latency("n", "cpu", 1) == pytest.approx(0.001)  # never served here: as is
        await fleet.close()

    asyncio.run(main())
