"""The ``ray://`` backend on a real Ray cluster (``ray.cluster_utils.Cluster``: a head and three
worker nodes on this machine, one CPU each, one of them declaring a ``gpu-v100``), no mocks.

* the backend conformance suite over ``ray://``;
* placement: per-node inventory (``nodes()``), spread over nodes, a GPU kind only where a node
  declares it, ``CapacityError`` when nothing fits;
* a node removed under load: in-flight batches fail with ``ReplicaError`` and are retried by a
  real ``Dispatcher``, every query is answered, the lost replica comes back on a surviving node;
* a lost replica with no room left is a recorded shortfall (``CapacityError`` on the next
  scale) that a node joining fills; a scale-up then uses the new node;
* the data path: small batches to the actor's gRPC port, large ones through Ray's object
  store, the batch deadline carried on both, a port that fails falling back to Ray.

One cluster for the module (starting one costs seconds); every Ray process binds 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'inferline[ray]')")

from ray_cluster import RayCluster, ray_cluster  # noqa: E402

from inferline.adapters import PluginHost  # noqa: E402
from inferline.adapters.checks import run_conformance  # noqa: E402
from inferline.adapters.ray import NodeInfo, RayBackend  # noqa: E402
from inferline.adapters.ray._direct import DirectPath  # noqa: E402
from inferline.core import (  # noqa: E402
    BATCH_DEADLINE,
    BackendError,
    CapacityError,
    DeadlineExceededError,
    ModelConfig,
    ModelSpec,
    ReplicaError,
)
from inferline.queueing import BatchEvent, Dispatcher, FixedBatching  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EX = "inferline.adapters.local.examples"


@pytest.fixture(scope="module")
def _cluster() -> Iterator[RayCluster]:
    # the head (1 CPU) hosts this driver; two plain workers; a worker with a GPU kind
    with ray_cluster(head_cpus=1, plain=2, gpu=True) as rc:
        yield rc


@pytest.fixture
def cluster(_cluster: RayCluster) -> RayCluster:
    """The module's cluster with its two plain workers, whatever earlier tests did to it."""
    _cluster.reset()
    return _cluster


def run(cluster: RayCluster, body: Callable[[RayBackend], Awaitable[Any]], **kw: Any) -> Any:
    """Run ``body(backend)`` on a fresh ``ray://`` backend that is always closed afterwards."""

    async def main() -> Any:
        b = PluginHost.default().backend_for(cluster.url, **kw)
        assert isinstance(b, RayBackend)
        try:
            return await body(b)
        finally:
            await b.close()

    return asyncio.run(main())


async def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_ray_backend_conforms(cluster: RayCluster) -> None:
    host = PluginHost.default()
    spec = ModelSpec("double", f"{EX}:scale", {"factor": 2.0})
    inputs = [np.arange(3, dtype=np.float32) + i for i in range(4)]

    def check(x: np.ndarray, y: np.ndarray) -> None:
        np.testing.assert_allclose(y, x * 2)
        assert y.flags.writeable  # as from local://, not a read-only object-store view

    done = asyncio.run(
        run_conformance(
            lambda: host.backend_for(cluster.url),
            spec,
            inputs,
            bad_input="not a number",
            check_output=check,
        )
    )
    assert done == [
        "protocol",
        "deploy",
        "predict_batch",
        "errors",
        "scale",
        "named errors",
        "stats and remove",
        "close",
    ]
    # the backend made this process's connection, so its close gave it back
    assert not ray.is_initialized()


def test_nodes_placement_and_hardware_kinds(cluster: RayCluster) -> None:
    async def body(b: RayBackend) -> None:
        nodes = b.nodes()
        assert all(isinstance(n, NodeInfo) for n in nodes)
        assert [NodeInfo.from_dict(n.to_dict()) for n in nodes] == nodes
        alive = [n for n in nodes if n.alive]
        assert len(alive) == 4 and all(n.cpus == 1 for n in alive)
        assert [n.node_id for n in alive if "gpu-v100" in n.hardware] == [cluster.gpu.node_id]
        assert b.inventory() == {"cpu": 4, "gpu-v100": 1} == b.free()

        # a GPU kind lands only where a node declares it, and sees exactly its device
        await b.deploy(ModelSpec("where", f"{EX}:probe"), ModelConfig("gpu-v100", 1, 1))
        [g] = b.replicas("where")
        assert g.node == cluster.gpu.node_id  # type: ignore[attr-defined]
        [info] = await g.predict_batch([0])
        assert info["cuda"] == "0" and info["omp"] == "1"
        with pytest.raises(CapacityError, match="gpu-v100"):
            await b.scale("where", 2)
        assert b.free() == {"cpu": 3, "gpu-v100": 0}

        # CPU replicas spread, one per node, keeping off the GPU node while others fit
        await b.deploy(ModelSpec("cpu", f"{EX}:probe"), ModelConfig("cpu", 1, 2))
        st = await b.stats("cpu")
        placed = [r["node"] for r in st["replicas"]]
        assert len(set(placed)) == 2 and cluster.gpu.node_id not in placed
        assert st["nodes"] == {n: 1 for n in placed} and st["placement"] == "spread"
        [out] = await b.replicas("cpu")[0].predict_batch(["x"])
        assert out["cuda"] == ""  # a CPU replica does not see GPUs
        await b.scale("cpu", 3)  # the last CPU-only node
        assert cluster.gpu.node_id not in (await b.stats("cpu"))["nodes"]
        with pytest.raises(CapacityError, match="do not fit"):
            await b.scale("cpu", 4)  # the one free CPU left is the GPU node's, held by "where"
        assert len(b.replicas("cpu")) == 3
        with pytest.raises(CapacityError, match="not in this backend's inventory"):
            await b.deploy(ModelSpec("nope", f"{EX}:noop"), ModelConfig("gpu-k80", 1, 1))
        await b.remove("where")
        await b.scale("cpu", 4)  # the GPU node's CPU is free again
        assert (await b.stats("cpu"))["nodes"].get(cluster.gpu.node_id) == 1
        assert b.free() == {"cpu": 0, "gpu-v100": 1}

    run(cluster, body)


def test_a_crashed_actor_is_replaced_and_a_bad_container_named(cluster: RayCluster) -> None:
    async def body(b: RayBackend) -> None:
        await b.deploy(ModelSpec("c", f"{EX}:crashing"), ModelConfig("cpu", 2, 1))
        [r] = b.replicas("c")
        with pytest.raises(ReplicaError, match="ActorDiedError"):
            await r.predict_batch(["crash"])  # the container exits its worker process
        assert not r.alive and b.replicas("c") == []
        await wait_for(lambda: len(b.replicas("c")) == 1, "the replacement")
        assert b.replicas("c")[0].id != r.id
        assert await b.replicas("c")[0].predict_batch(["ok"]) == ["ok"]
        assert (await b.stats("c"))["restarts"] == 1
        with pytest.raises(BackendError, match=r"failed to load its container.*refuses to load"):
            await b.deploy(
                ModelSpec("d", f"{EX}:crashing", {"at_load": True}), ModelConfig("cpu", 1, 1)
            )
        assert "d" not in b.models() and b.free()["cpu"] == b.inventory()["cpu"] - 1

    run(cluster, body)


def test_node_removed_under_load(cluster: RayCluster) -> None:
    """In-flight batches on the lost node fail with ReplicaError and are retried through a real
    Dispatcher: every query answered, the replica replaced on a surviving node."""

    async def body(b: RayBackend) -> None:
        await b.deploy(ModelSpec("m", f"{EX}:sleep", {"base_s": 0.02}), ModelConfig("cpu", 4, 2))
        st = await b.stats("m")
        victim = next(r for r in st["replicas"] if r["node"] != cluster.head_id)
        d = Dispatcher()
        d.add_model("m", batching=FixedBatching(4), max_retries=3)
        d.attach(b)
        failed: list[str] = []  # replicas whose batch failed (the dispatcher retried it)
        d.add_listener(
            lambda e: failed.append(e.replica) if isinstance(e, BatchEvent) and not e.ok else None
        )

        async def load() -> list[Any]:
            loop = asyncio.get_running_loop()
            futs = []
            t0 = loop.time()
            for i in range(240):  # 120 q/s for 2 s, about half the two replicas' capacity
                await asyncio.sleep(max(0.0, t0 + i / 120 - loop.time()))
                futs.append(asyncio.ensure_future(d.submit("m", i, deadline=loop.time() + 30)))
            return await asyncio.gather(*futs, return_exceptions=True)

        async def kill() -> None:
            await asyncio.sleep(0.7)
            await asyncio.to_thread(cluster.remove, victim["node"])

        try:
            outs, _ = await asyncio.gather(load(), kill())
        finally:
            await d.close()
        errors = [o for o in outs if isinstance(o, BaseException)]
        assert not errors, errors[:3]
        assert [o["x"] for o in outs] == list(range(240))
        ds = d.stats("m")
        assert ds.completed == 240 and ds.failed == 0
        assert ds.failed_batches == len(failed)
        assert set(failed) <= {victim["id"]}  # only the lost replica's batches failed
        # back to two replicas, none on the lost node, which is gone from the stats
        await wait_for(lambda: len(b.replicas("m")) == 2, "the replacement replica")
        st = await b.stats("m")
        nodes = {r["node"] for r in st["replicas"]}
        assert victim["node"] not in nodes and victim["node"] not in st["nodes"]
        assert len(nodes) == 2 and st["restarts"] == 1 and st["shortfall"] == 0
        assert any(victim["node"][:8] in r.get("death_reason", "") for r in st["retired"])
        assert st["lost_nodes"][-1]["node"] == victim["node"]
        assert victim["node"] not in {n.node_id for n in b.nodes() if n.alive}
        assert b.inventory()["cpu"] == 3
        assert victim["id"] in st["lost_nodes"][-1]["replicas"]
        print(f"node loss: {len(failed)} batch(es) failed and were retried: {ds}")

    run(cluster, body)


def test_shortfall_then_a_node_joins(cluster: RayCluster) -> None:
    """No room for a lost replica: shortfall recorded, CapacityError on the next scale; a node
    joining grows the inventory, fills the shortfall, and a scale-up uses the next one."""

    async def body(b: RayBackend) -> None:
        cpus = b.inventory()["cpu"]
        await b.deploy(ModelSpec("m", f"{EX}:noop"), ModelConfig("cpu", 1, cpus))
        st = await b.stats("m")
        victim = next(
            r for r in st["replicas"] if r["node"] in {w.node_id for w in cluster.workers}
        )
        await asyncio.to_thread(cluster.remove, victim["node"])
        await wait_for(lambda: len(b.replicas("m")) == cpus - 1, "the lost replica to leave")
        await wait_for(lambda: b.inventory()["cpu"] == cpus - 1, "the inventory to shrink")
        await asyncio.sleep(0.3)  # the replacement attempt finds no room
        st = await b.stats("m")
        assert st["shortfall"] == 1 and st["target_replicas"] == cpus
        with pytest.raises(CapacityError, match="short 1 replica"):
            await b.scale("m", cpus)

        joined = cluster.add_worker()  # in the loop's thread: Ray sets signal handlers
        await wait_for(lambda: b.inventory()["cpu"] == cpus, "the inventory to grow", 30)
        await wait_for(lambda: len(b.replicas("m")) == cpus, "the shortfall to be filled", 30)
        st = await b.stats("m")
        assert st["shortfall"] == 0 and st["nodes"].get(joined.node_id) == 1

        extra = cluster.add_worker()
        await wait_for(lambda: b.inventory()["cpu"] == cpus + 1, "the second node", 30)
        await b.scale("m", cpus + 1)
        st = await b.stats("m")
        assert st["nodes"].get(extra.node_id) == 1 and st["active_replicas"] == cpus + 1

    run(cluster, body)


def test_data_paths_deadlines_and_a_broken_port(cluster: RayCluster) -> None:
    """A small batch takes the actor's gRPC port, a large one Ray's object store; a call past
    the batch's deadline is cut on either path, counted, and answered DeadlineExceededError;
    a port that fails (here: the wrong token) sends the batch through Ray, and the replica
    keeps to Ray from then on."""

    async def body(b: RayBackend) -> None:
        await b.deploy(ModelSpec("s", f"{EX}:sleep", {"base_s": 0.0}), ModelConfig("cpu", 2, 1))
        await b.deploy(ModelSpec("slow", f"{EX}:sleep", {"base_s": 3.0}), ModelConfig("cpu", 1, 1))
        [r], [slow] = b.replicas("s"), b.replicas("slow")
        small = "x"
        big = np.zeros(b.object_store_min_bytes // 4 + 1, dtype=np.float32)
        assert [o["x"] for o in await r.predict_batch([small, small])] == ["x", "x"]
        assert (await r.predict_batch([big]))[0]["n"] == 1
        path = r.describe()["data_path"]
        assert path["grpc"] and (path["grpc_batches"], path["object_store_batches"]) == (1, 1)

        loop = asyncio.get_running_loop()
        for x in (small, big):  # the port, then the object store
            token = BATCH_DEADLINE.set(loop.time() + 0.1)
            try:
                t0 = loop.time()
                with pytest.raises(DeadlineExceededError, match="by its deadline"):
                    await slow.predict_batch([x])
                assert loop.time() - t0 < 2.0  # cut at the deadline, not the 3 s batch
            finally:
                BATCH_DEADLINE.reset(token)
        [rep] = (await b.stats("slow"))["replicas"]
        assert (rep["late_calls"], rep["late_items"]) == (2, 2)

        old = r.direct  # type: ignore[attr-defined]
        r.direct = DirectPath(old.target, "not the token", 1 << 20)  # type: ignore[attr-defined]
        await old.close()
        assert [o["x"] for o in await r.predict_batch([small])] == ["x"]
        path = r.describe()["data_path"]
        assert path["grpc"] is None and "UNAUTHENTICATED" in path["error"]
        assert path["object_store_batches"] == 2 and r.alive

    run(cluster, body)


def test_scaleout_benchmark_runs(cluster: RayCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks/ray_scaleout.py``'s measurements on this cluster, briefly, and its tables."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import ray_scaleout

    x = np.zeros(8, dtype=np.float32)
    hops = asyncio.run(ray_scaleout.hop_overhead(cluster.url, [("f32", x)], (1, 8), 1, (1024,)))
    assert [
        (r["batch"], r["local_ms"] > 0, r["ray_ms"] > 0, r["store_ms"] > 0) for r in hops[:2]
    ] == [
        (1, True, True, True),
        (8, True, True, True),
    ]
    assert hops[2]["payload"] == "crossover" and hops[2]["grpc_ms"] > 0 < hops[2]["store_ms"]
    scale = asyncio.run(ray_scaleout.scale_out(cluster.url, 2, 0.3))
    assert [(r["nodes"], r["replicas"]) for r in scale] == [(1, 1), (2, 2)]
    assert all(r["qps"] > 0 and r["p99_ms"] > 0 for r in scale) and scale[0]["vs_linear"] == 1.0
    ray_scaleout.print_tables(hops, scale, 0.3, ray.__version__)
    out = capsys.readouterr().out
    assert "target ray/local <= 1.5x" in out and "target >= 0.80 of linear" in out
    assert "object store" in out and "store/gRPC" in out
