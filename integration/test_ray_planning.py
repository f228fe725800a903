"""Planning over a real Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPUs for
replicas and two worker nodes of one CPU each): ``plan_attachment`` over a ``RayBackend`` plans
within ``backend.nodes()``, one inventory per node, so a replica never spans nodes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'inferline[ray]')")

from ray import cluster_utils  # noqa: E402
from ray._private import ray_constants  # noqa: E402

from inferline.adapters import PluginHost  # noqa: E402
from inferline.adapters.ray import RayBackend  # noqa: E402
from inferline.core import (  # noqa: E402
    InfeasibleError,
    ModelConfig,
    Pipeline,
    PlannerOptions,
    Profiles,
    gamma_trace,
    nodes_from_dicts,
    place_on_nodes,
    plan_inferline,
)
from inferline.deploy import Attachment, plan_attachment  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        c = cluster_utils.Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
        )
        try:
            workers = [c.add_node(num_cpus=1) for _ in range(2)]
            yield c, [w.node_id for w in workers]
        finally:
            if ray.is_initialized():
                ray.shutdown()
            c.shutdown()


def test_plan_attachment_over_ray_bins_replicas_into_its_nodes(cluster: Any) -> None:
    c, workers = cluster
    pipe = Pipeline.linear("p", ["m"])
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.05}}})  # 20 q/s per replica

    async def body() -> None:
        host = PluginHost.default()
        b = host.backend_for(f"ray://{c.address}")
        assert isinstance(b, RayBackend)
        try:
            nodes = b.nodes()
            cpus = {n.node_id: n.hardware["cpu"] for n in nodes if n.alive}
            assert sorted(k for k, v in cpus.items() if v) == sorted(workers)
            att = Attachment(f"ray://{c.address}", b, host, models={"m": ModelConfig("cpu", 1, 1)})
            catalog = host.hardware_catalog()
            paper = PlannerOptions(rate_margin=0.0)

            # 30 q/s: two 1-thread replicas, one on each worker
            busy = gamma_trace(30.0, 1.0, 10.0, np.random.default_rng(0))
            plan = plan_attachment(att, pipe, prof, busy, 0.5, options=paper)
            assert plan.models["m"].replicas == 2
            per_node = PlannerOptions(nodes=nodes_from_dicts([n.to_dict() for n in nodes]))
            placed = place_on_nodes(plan.models, catalog, per_node)
            assert {n: ms.get("m", 0) for n, ms in placed.items() if ms} == dict.fromkeys(
                workers, 1
            )

            # a 2-thread replica: the cluster has 2 CPUs, but no node has 2
            quiet = gamma_trace(8.0, 1.0, 10.0, np.random.default_rng(1))
            two = PlannerOptions(rate_margin=0.0, replica_units={"m": 2})
            flat = PlannerOptions(rate_margin=0.0, replica_units={"m": 2}, inventory=b.inventory())
            assert plan_inferline(pipe, prof, quiet, 1.0, options=flat).models["m"].replicas == 1
            with pytest.raises(InfeasibleError) as ei:
                plan_attachment(att, pipe, prof, quiet, 1.0, options=two)
            text = str(ei.value)
            assert all(f"node {w} (cpu=1)" in text for w in workers) and "cannot span" in text
        finally:
            await b.close()

    asyncio.run(body())


def test_inferline_nodes_writes_what_plan_inventory_nodes_reads(
    cluster: Any, tmp_path: Any, capsys: Any
) -> None:
    from inferline.cli import main
    from inferline.core import load_plan, save, save_trace

    c, workers = cluster
    out = tmp_path / "nodes.json"
    assert main(["nodes", f"ray://{c.address}", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(f"node {w}" in printed for w in workers)
    doc = json.loads(out.read_text())
    assert doc["format"] == "inferline.nodes/1"
    assert {n["name"]: n["hardware"]["cpu"] for n in doc["nodes"] if n["hardware"]["cpu"]} == (
        dict.fromkeys(workers, 1)
    )
    save(Pipeline.linear("p", ["m"]), tmp_path / "pipe.json")
    save(Profiles.from_latencies({"m": {"cpu": {1: 0.05}}}), tmp_path / "prof.json")
    save_trace(gamma_trace(30.0, 1.0, 10.0, np.random.default_rng(0)), tmp_path / "t.trace")
    args = [
        "plan",
        *("--pipeline", str(tmp_path / "pipe.json"), "--profiles", str(tmp_path / "prof.json")),
        *("--trace", str(tmp_path / "t.trace"), "--slo-s", "0.5", "--no-ladder"),
        *("--rate-margin", "0", "-o", str(tmp_path / "plan.json"), "--inventory-nodes", str(out)),
    ]
    assert main(args) == 0
    assert load_plan(tmp_path / "plan.json").models["m"].replicas == 2
    assert main([*args, "--cpu-threads", "m=2"]) == 2  # no node has 2 CPUs
    assert "cannot span nodes" in capsys.readouterr().err
