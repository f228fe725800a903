"""Per-node inventories (``PlannerOptions.nodes``): a replica cannot span nodes, so a plan must
bin into the machines (first-fit decreasing), not only fit their totals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    DEFAULT_CATALOG,
    CapacityError,
    EstimatorOptions,
    InfeasibleError,
    ModelConfig,
    NodeInventory,
    Pipeline,
    PlannerOptions,
    Profiles,
    ValidationError,
    gamma_trace,
    nodes_from_dicts,
    place_on_nodes,
    plan_inferline,
)
from inferline.core.planning import (
    bin_replicas,
    nodes_document,
    nodes_from_document,
    over_inventory,
    total_inventory,
)

TWO_BY_3 = (NodeInventory("n1", {"cpu": 3}), NodeInventory("n2", {"cpu": 3}))


def _one_model(latency_s: float = 0.01):
    pipe = Pipeline.linear("p", ["m"])
    prof = Profiles.from_latencies({"m": {"cpu": {1: latency_s, 2: 2 * latency_s}}})
    trace = gamma_trace(50.0, 1.0, 5.0, np.random.default_rng(0))
    return pipe, prof, trace


def test_first_fit_decreasing_places_accelerators_then_the_largest_first():
    nodes = (NodeInventory("a", {"cpu": 4}), NodeInventory("b", {"cpu": 2, "gpu-v100": 1}))
    items = [("x", {"cpu": 1}), ("y", {"cpu": 3}), ("g", {"gpu-v100": 1, "cpu": 2})]
    # g first (the only node with its GPU), then y (3 cores) on a, then x on a
    assert bin_replicas(items, nodes) == ["a", "a", "b"]
    # the same units in total, but two cores short on b for the GPU replica's host side
    msg = bin_replicas([("g", {"gpu-v100": 1, "cpu": 3})], nodes)
    assert isinstance(msg, str) and "fits no node" in msg and "node b (cpu=2 of 2" in msg


def test_two_3_core_nodes_refuse_a_4_thread_replica():
    """6 cores free in total, but no node has 4: the flat inventory takes it, the nodes not."""
    pipe, prof, trace = _one_model()
    cfg = {"m": ModelConfig("cpu", 1, 1)}
    flat = PlannerOptions(inventory={"cpu": 6}, replica_units={"m": 4}, rate_margin=0.0)
    per_node = PlannerOptions(nodes=TWO_BY_3, replica_units={"m": 4}, rate_margin=0.0)
    assert over_inventory(cfg, DEFAULT_CATALOG, flat) is None
    over = over_inventory(cfg, DEFAULT_CATALOG, per_node)
    assert over is not None and "n1" in over and "n2" in over
    with pytest.raises(CapacityError, match=r"fits no node.*node n1 \(cpu=3 of 3\)"):
        place_on_nodes(cfg, DEFAULT_CATALOG, per_node)
    assert plan_inferline(pipe, prof, trace, 0.1, options=flat).models["m"].replicas == 1
    with pytest.raises(InfeasibleError) as ei:
        plan_inferline(pipe, prof, trace, 0.1, options=per_node)
    text = str(ei.value)
    assert "node n1 (cpu=3)" in text and "node n2 (cpu=3)" in text and "cannot span" in text


def test_the_planner_bins_replicas_and_counts_each_node():
    """2-thread replicas on two 3-core nodes: at most one per node (4 cores in all, not 3)."""
    pipe, prof, trace = _one_model(latency_s=0.05)  # 20 q/s per replica at 50 q/s
    per_node = PlannerOptions(nodes=TWO_BY_3, replica_units={"m": 2}, rate_margin=0.0)
    with pytest.raises(InfeasibleError, match="cannot span nodes"):
        plan_inferline(pipe, prof, trace, 0.2, options=per_node)
    # 1-thread replicas: 3 a node, and the plan says where they go
    one = PlannerOptions(nodes=TWO_BY_3, rate_margin=0.0)
    plan = plan_inferline(pipe, prof, trace, 0.2, options=one)
    assert 3 <= plan.models["m"].replicas <= 6
    placed = place_on_nodes(plan.models, DEFAULT_CATALOG, one)
    assert sum(ms.get("m", 0) for ms in placed.values()) == plan.models["m"].replicas
    assert all(ms.get("m", 0) <= 3 for ms in placed.values())


def test_a_kind_no_node_has_cannot_be_used():
    pipe = Pipeline.linear("p", ["m"])
    prof = Profiles.from_latencies({"m": {"gpu-v100": {1: 0.002}, "cpu": {1: 0.01}}})
    trace = gamma_trace(20.0, 1.0, 5.0, np.random.default_rng(1))
    options = PlannerOptions(nodes=(NodeInventory("c", {"cpu": 8}),), rate_margin=0.0)
    assert total_inventory(options, DEFAULT_CATALOG)["gpu-v100"] == 0
    plan = plan_inferline(pipe, prof, trace, 0.1, options=options)
    assert plan.models["m"].hardware == "cpu"


def test_node_options_round_trip_and_accept_a_backends_node_view():
    info = [  # the Ray backend's NodeInfo.to_dict(), a dead node left out
        {
            "node_id": "abc",
            "address": "10.0.0.1",
            "alive": True,
            "cpus": 4,
            "gpus": 1,
            "hardware": {"cpu": 4, "gpu-v100": 1},
            "free": {"cpu": 3, "gpu-v100": 1},
        },
        {"node_id": "dead", "alive": False, "hardware": {"cpu": 8}},
        {"name": "plain", "hardware": {"cpu": 2}},
    ]
    nodes = nodes_from_dicts(info)
    assert [n.name for n in nodes] == ["abc", "plain"]
    assert nodes[0].hardware == {"cpu": 4, "gpu-v100": 1}
    options = PlannerOptions(nodes=nodes, replica_units={"m": 2}, gpu_host_units={"m": 1})
    d = json.loads(json.dumps(options.to_dict()))
    assert PlannerOptions.from_dict(d) == options
    assert PlannerOptions.from_dict(d).to_dict() == d
    assert NodeInventory.from_dict(nodes[0].to_dict()) == nodes[0]
    doc = json.loads(json.dumps(nodes_document(nodes)))
    assert doc["format"] == "inferline.nodes/1" and nodes_from_document(doc) == nodes
    assert nodes_from_document(info) == nodes  # a bare list too


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"inventory": {"cpu": 6}}, "inventory"),
        ({"estimator": EstimatorOptions(shared_units={"cpu": 4})}, "shared_units"),
        ({"estimator": EstimatorOptions(pinned_cores={"cpu": 4})}, "pinned_cores"),
    ],
)
def test_nodes_refuse_a_flat_inventory_and_pooled_cores(kw, field):
    with pytest.raises(ValidationError, match=field):
        PlannerOptions(nodes=TWO_BY_3, **kw)


def test_bad_node_documents_name_the_field():
    with pytest.raises(ValidationError, match="distinct"):
        nodes_from_dicts([{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValidationError, match=r"nodes\[0\].hardware.cpu"):
        nodes_from_dicts([{"name": "a", "hardware": {"cpu": -1}}])
    with pytest.raises(ValidationError, match="at least one"):
        nodes_from_document({"format": "inferline.nodes/1", "nodes": []})
    with pytest.raises(ValidationError, match="format"):
        nodes_from_document({"format": "inferline.plan/1", "nodes": []})


def test_cli_plan_inventory_nodes(tmp_path, capsys):
    """``inferline plan --inventory-nodes FILE``: the plan bins into the nodes (and says where
    each replica goes); a 4-thread replica on two 3-core nodes is a one-line error naming both;
    a flat --inventory or pooled cores with it, or a malformed file, are usage errors."""
    from inferline.cli import main
    from inferline.core import load_plan, save, save_trace

    pipe, prof, trace = _one_model(latency_s=0.05)  # 20 q/s per replica at 50 q/s
    paths = {k: tmp_path / f"{k}.json" for k in ("pipe", "prof", "nodes", "plan")}
    save(pipe, paths["pipe"])
    save(prof, paths["prof"])
    save_trace(trace, tmp_path / "t.trace")
    paths["nodes"].write_text(json.dumps(nodes_document(TWO_BY_3)))
    args = [
        "plan",
        *("--pipeline", str(paths["pipe"]), "--profiles", str(paths["prof"])),
        *("--trace", str(tmp_path / "t.trace"), "--slo-s", "0.3", "--no-ladder"),
        *("--rate-margin", "0", "-o", str(paths["plan"])),
        *("--inventory-nodes", str(paths["nodes"])),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    plan = load_plan(paths["plan"])
    assert (
        3 <= plan.models["m"].replicas <= 6
        and "on the nodes (first-fit decreasing): n1: m x" in out
    )
    assert main([*args, "--cpu-threads", "m=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node n1 (cpu=3), node n2 (cpu=3)" in err[0], err
    for extra, named in (
        (["--inventory", "cpu=6"], "--inventory: not with --inventory-nodes"),
        (["--shared-cores", "cpu=6"], "--shared-cores: not with --inventory-nodes"),
    ):
        with pytest.raises(SystemExit) as ei:
            main([*args, *extra])
        assert ei.value.code == 2 and named in capsys.readouterr().err
    paths["nodes"].write_text(json.dumps({"format": "inferline.nodes/1", "nodes": [{"x": 1}]}))
    with pytest.raises(SystemExit) as ei:
        main(args)
    assert ei.value.code == 2 and "nodes[0]" in capsys.readouterr().err
