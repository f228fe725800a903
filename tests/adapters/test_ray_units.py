"""The ``ray://`` backend's pure parts, without Ray: per-node inventory (``NodeInfo``),
placement (spread, pack, accelerator nodes kept for replicas that need them), URLs and
options, what crosses the hop, and that Ray stays optional. The backend itself runs on a real
cluster in ``integration/test_ray_backend.py``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from inferline.adapters import PluginHost
from inferline.adapters.ray import Demand, NodeInfo, choose_nodes, demand_for, node_from_ray
from inferline.adapters.ray._address import parse_address
from inferline.adapters.ray._table import NodeTable
from inferline.adapters.ray._values import pack_outputs, split_inputs, unpack_outputs
from inferline.adapters.ray.plugin import make_backend, query_options
from inferline.core import (
    DEFAULT_CATALOG,
    BackendError,
    CapacityError,
    InferlineError,
    ValidationError,
)


def raw(nid: str, alive: bool = True, **res: float) -> dict:
    return {"NodeID": nid, "Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": res}


def test_node_info_round_trips_and_names_bad_fields() -> None:
    n = NodeInfo("ab12", "10.0.0.2", True, 8, 2, {"cpu": 8, "gpu-v100": 2}, {"cpu": 6})
    d = n.to_dict()
    assert NodeInfo.from_dict(d) == n and d["hardware"] == {"cpu": 8, "gpu-v100": 2}
    with pytest.raises(ValidationError, match=r"node\.cpus"):
        NodeInfo.from_dict({**d, "cpus": -1})
    with pytest.raises(ValidationError, match=r"node\.alive"):
        NodeInfo.from_dict({**d, "alive": "yes"})
    with pytest.raises(ValidationError, match=r"node\.node_id"):
        NodeInfo.from_dict({"cpus": 1})
    with pytest.raises(ValidationError, match="bogus"):
        NodeInfo.from_dict({**d, "bogus": 1})


def test_node_from_ray_maps_resources_to_catalog_names() -> None:
    gpu = raw("g", CPU=8.0, GPU=2.0, **{"gpu-v100": 4.0, "memory": 1e9, "node:10.0.0.1": 1.0})
    n = node_from_ray(gpu, DEFAULT_CATALOG, used={"CPU": 3.0, "GPU": 1.0, "gpu-v100": 1.0})
    # a GPU kind counts only as far as the node has GPUs to hand out
    assert n.hardware == {"cpu": 8, "gpu-v100": 2} and n.free == {"cpu": 5, "gpu-v100": 1}
    assert (n.cpus, n.gpus, n.alive) == (8, 2, True)
    # gpu-*/cpu-* names are kinds even when the catalog does not price them (yet)
    odd = node_from_ray(
        raw("o", CPU=2.0, GPU=1.0, **{"gpu-a10": 1.0, "cpu-c7": 2.0}), DEFAULT_CATALOG
    )
    assert odd.hardware == {"cpu": 2, "cpu-c7": 2, "gpu-a10": 1}
    dead = node_from_ray(raw("d", alive=False, CPU=4.0), DEFAULT_CATALOG)
    assert not dead.alive and dead.free == {"cpu": 0}


def test_demand_per_hardware() -> None:
    assert demand_for("cpu", 2, DEFAULT_CATALOG).resources() == {"CPU": 2.0}
    assert demand_for("gpu-v100", 1, DEFAULT_CATALOG).resources() == {
        "CPU": 1.0,
        "GPU": 1.0,
        "gpu-v100": 1.0,
    }
    assert demand_for("cpu-c7", 4, DEFAULT_CATALOG) == Demand(4.0, 0.0, "cpu-c7")


def test_spread_and_pack() -> None:
    free = {n: {"CPU": 4.0} for n in ("a", "b", "c")}
    one = Demand(1.0)
    assert choose_nodes(free, one, 5) == ["a", "b", "c", "a", "b"]
    assert choose_nodes(free, one, 2, existing={"a": 1}) == ["b", "c"]
    assert choose_nodes(free, one, 5, placement="pack") == ["a", "a", "a", "a", "b"]
    # pack joins the node that already holds the model
    assert choose_nodes(free, one, 2, placement="pack", existing={"c": 1}) == ["c", "c"]
    with pytest.raises(ValidationError, match="placement"):
        choose_nodes(free, one, 1, placement="random")


def test_cpu_replicas_keep_off_accelerator_nodes_while_others_fit() -> None:
    free = {"gpu": {"CPU": 8.0, "GPU": 1.0, "gpu-v100": 1.0}, "cpu": {"CPU": 1.0}}
    assert choose_nodes(free, Demand(1.0), 2, special={"gpu"}) == ["cpu", "gpu"]
    gpu = Demand(1.0, 1.0, "gpu-v100")
    assert choose_nodes(free, gpu, 1, special={"gpu"}) == ["gpu"]
    with pytest.raises(CapacityError, match=r"do not fit; free: node gpu: CPU=8, GPU=1") as ei:
        choose_nodes(free, gpu, 2, special={"gpu"}, what="model 'm'")
    assert str(ei.value).startswith("model 'm': 2 replica(s)") and ei.value.free == free


def test_node_table_tracks_joins_losses_and_holdings() -> None:
    t = NodeTable(DEFAULT_CATALOG, (), "spread")
    assert t.apply([raw("a", CPU=1.0), raw("b", CPU=1.0)]) == ([], [])
    [node] = t.plan("m", "cpu", 1, 1, {})
    t.hold(node, t.demand("cpu", 1))
    assert t.totals("hardware") == {"cpu": 2} and t.totals("free") == {"cpu": 1}
    with pytest.raises(CapacityError, match="not in this backend's inventory"):
        t.plan("m", "gpu-v100", 1, 1, {})
    assert t.apply([raw("a", False, CPU=1.0), raw("b", CPU=1.0), raw("c", CPU=2.0)]) == (
        ["c"],
        ["a"],
    )
    assert [n.node_id for n in t.nodes()] == ["b", "c", "a"]  # alive first
    assert t.totals("hardware") == {"cpu": 3}


def test_plan_on_one_node_only() -> None:
    """``scale(..., node=)`` (the profiler's contending replicas on the measured replica's
    node): every new replica on that node whatever the placement, or a CapacityError."""
    t = NodeTable(DEFAULT_CATALOG, (), "spread")
    t.apply([raw("a", CPU=1.0), raw("b", CPU=3.0), raw("c", False, CPU=4.0)])
    assert t.plan("m", "cpu", 1, 3, {}, only="b") == ["b", "b", "b"]
    assert sorted(t.plan("m", "cpu", 1, 3, {})) == ["a", "b", "b"]  # spread, unpinned
    with pytest.raises(CapacityError, match="do not fit"):
        t.plan("m", "cpu", 1, 2, {}, only="a")
    with pytest.raises(CapacityError, match="not an alive node"):
        t.plan("m", "cpu", 1, 1, {}, only="c")


def test_addresses() -> None:
    assert parse_address("ray://10.0.0.5:6379") == "10.0.0.5:6379"
    assert parse_address("ray://head.example:6379?placement=pack") == "head.example:6379"
    with pytest.raises(ValidationError, match="GCS address"):
        parse_address("ray://10.0.0.5")


def test_auto_address_reads_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert parse_address("ray://auto") == "auto" == parse_address("ray://")
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert parse_address("ray://auto") == "10.1.2.3:6379"
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.1.2.3:10001")
    with pytest.raises(ValidationError, match=r"RAY_ADDRESS.*Ray Client"):
        parse_address("ray://auto")


def test_url_options() -> None:
    opts = query_options(
        "ray://h:1?placement=pack&kinds=gpu-a10,tpu-v4&start_timeout_s=5&heartbeat_misses=3"
    )
    assert opts == {
        "placement": "pack",
        "kinds": ("gpu-a10", "tpu-v4"),
        "start_timeout_s": 5.0,
        "heartbeat_misses": 3,
    }
    with pytest.raises(ValidationError, match="a RayBackend option"):
        query_options("ray://h:1?bogus=1")
    with pytest.raises(ValidationError, match="a valid value"):
        query_options("ray://h:1?placement=random")


def test_values_cross_as_local_does() -> None:
    x = np.arange(3, dtype=np.float32)
    good, bad = split_inputs([x, object(), "s", np.array([object()])])
    assert len(good) == 2 and good[0] is x and set(bad) == {1, 3}
    assert bad[1].field == "inputs[1]"
    values, errors = pack_outputs([x, ValueError("item"), object(), {"a": [1, 2]}])
    assert set(errors) == {1, 2} and errors[1]["type"] == "ValueError"
    ro = x.copy()
    ro.flags.writeable = False
    values[0] = ro  # what Ray hands back: a read-only view
    outs = unpack_outputs(values, errors)
    assert outs[0].flags.writeable and np.array_equal(outs[0], x)
    assert isinstance(outs[1], InferlineError) and isinstance(outs[2], ValidationError)
    assert outs[3] == {"a": [1, 2]}


def test_ray_stays_optional() -> None:
    """Importing inferline, its adapters and this plugin, and listing schemes, imports no Ray."""
    code = (
        "import sys\n"
        "import inferline, inferline.adapters.ray, inferline.adapters.ray.plugin\n"
        "from inferline.adapters import PluginHost\n"
        "assert 'ray' in PluginHost.default().schemes()\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_missing_ray_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(BackendError, match=r"pip install 'inferline\[ray\]'"):
        make_backend("ray://h:1", {})
    assert "ray" in PluginHost.default().schemes()
