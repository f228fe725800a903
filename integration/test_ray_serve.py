"""``inferline serve``, the live tuner and ``inferline profile`` over ``ray://`` on a real Ray
cluster (``ray.cluster_utils.Cluster``: a head without CPUs and three 1-CPU workers on this
machine; nodes join and leave during the tests), no mocks.

* node loss under open-loop load through a real ``inferline serve`` process: every query
  answered, the lost replica back on a surviving node (``GET /admin/models`` says where each
  replica runs, ``/metrics`` labels each with its node), the SLO recovers; prints a timeline;
* the live tuner under a burst with no room for its whole target keeps what fits, and its
  retry puts the rest on a node that joins;
* profiling on every hardware kind of the cluster, each on a node that has it, its contending
  replicas on the measured replica's node.

One cluster for the module; every Ray process binds 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'inferline[ray]')")

from live_burst import SHORT_TUNER, planned_inputs  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from ray_cluster import LOOPBACK, RayCluster, ray_cluster  # noqa: E402

from inferline.core import ModelConfig, Plan, save  # noqa: E402
from inferline.demo.simple import sleep_deployment  # noqa: E402
from inferline.measure import (  # noqa: E402
    ServerProcess,
    encode_bodies,
    replay,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def _cluster() -> Iterator[RayCluster]:
    # the head hosts Ray's GCS, which cannot be lost like a worker: no replicas there
    with ray_cluster(head_cpus=0, plain=3) as rc:
        yield rc


@pytest.fixture
def cluster(_cluster: RayCluster) -> RayCluster:
    """The module's cluster with its three plain workers, whatever earlier tests did to it."""
    _cluster.reset()
    return _cluster


# -- 1. node loss through inferline serve -----------------------------------------------------

SLO_S = 0.5  # headroom on a shared 2-core machine (whole-run P99s of 79-187 ms seen)
RATE_QPS = 40.0
RUN_S = 15.0
REMOVE_AT_S = 5.0
BODIES = encode_bodies([[1.0, 2.0, 3.0], [0.5], [4.0, 4.0]])


def _models(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/admin/models", timeout=10).json()["m"]["backend"])


def _rolling_p99(
    res: Any, window_s: float = 1.0, step_s: float = 0.25
) -> list[tuple[float, float]]:
    """(window end, P99 of the queries scheduled in the window) every ``step_s``; a query that
    got no prediction counts as infinitely late."""
    lat = np.where(res.ok, res.latency_s, np.inf)
    out = []
    for end in np.arange(window_s, float(res.scheduled_s[-1]) + step_s, step_s):
        sel = (res.scheduled_s > end - window_s) & (res.scheduled_s <= end)
        if sel.any():
            out.append((float(end), float(np.percentile(lat[sel], 99))))
    return out


# time (~18 s): 15 s at 40 q/s through `inferline serve` on the Ray cluster, a node removed
# at 5 s: the P99 must be seen recovering after the replica comes back.
def test_node_lost_under_load_through_inferline_serve(cluster: RayCluster, tmp_path) -> None:
    dep = sleep_deployment(base_s=0.02, slo_ms=SLO_S * 1e3, backend=cluster.url)
    (tmp_path / "d.json").write_text(json.dumps(dep))
    save(Plan("sleep", SLO_S, {"m": ModelConfig("cpu", 4, 2)}), tmp_path / "p.json")
    arrivals = np.arange(0.0, RUN_S, 1.0 / RATE_QPS)
    with ServerProcess(
        tmp_path / "d.json", tmp_path / "p.json", log_path=tmp_path / "server.log", env=LOOPBACK
    ) as srv:
        st = _models(srv.url)
        placed = [r["node"] for r in st["replicas"]]
        assert len(placed) == 2 and len(set(placed)) == 2, st["replicas"]  # spread
        assert all(r.get("node") for r in st["replicas"])
        workers = {w.node_id for w in cluster.workers}
        assert set(placed) <= workers
        victim = placed[0]
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        assert sorted(_info_nodes(metrics)) == sorted(placed)

        marks: dict[str, float] = {}
        t_start = time.perf_counter()

        def watch(stop: threading.Event) -> None:
            """Poll the admin API: when the model has two active replicas again, none on the
            lost node (a thread: the replay's event loop stays the replay's)."""
            while not stop.is_set():
                if "removed" in marks and "replicas_back" not in marks:
                    s = _models(srv.url)
                    nodes = [r["node"] for r in s["replicas"] if r["state"] == "active"]
                    if len(nodes) == 2 and victim not in nodes:
                        marks["replicas_back"] = time.perf_counter() - t_start
                stop.wait(0.1)

        async def scenario() -> Any:
            async def remove() -> None:
                await asyncio.sleep(REMOVE_AT_S)
                marks["remove_called"] = time.perf_counter() - t_start
                await asyncio.to_thread(cluster.remove, victim)
                marks["removed"] = time.perf_counter() - t_start

            k = asyncio.ensure_future(remove())
            res = await replay(arrivals, srv.url, "app", BODIES, slo_s=SLO_S, drain_timeout_s=30)
            await k
            return res

        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
        watcher.start()
        try:
            res = asyncio.run(scenario())
            deadline = time.monotonic() + 30
            while "replicas_back" not in marks and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            watcher.join(5)
        admin = httpx.get(f"{srv.url}/admin/models", timeout=10).json()["m"]
        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        log_tail = srv.log_tail()

    # every query answered: a prediction (or the default with its explanation), no errors,
    # no timeouts, nothing dropped
    summary = res.summary()
    assert summary["answered"] == res.n and (res.status == 200).all(), (summary, log_tail)
    # the replica count is back, on the remaining nodes only
    st, queue = admin["backend"], admin["queue"]
    assert "replicas_back" in marks, (marks, st["replicas"])
    active = [r for r in st["replicas"] if r["state"] == "active"]
    assert len(active) == 2 and st["active_replicas"] == 2 and st["shortfall"] == 0
    assert victim not in {r["node"] for r in active} and victim not in st["nodes"]
    assert all(r["node"] in {w.node_id for w in cluster.workers} for r in active)
    assert st["restarts"] == 1 and st["lost_nodes"][-1]["node"] == victim
    assert sorted(_info_nodes(metrics)) == sorted(r["node"] for r in active)
    # the SLO recovers: the last third of the run misses at most 1%
    last = res.scheduled_s >= RUN_S * 2 / 3
    tail_miss = float(np.mean(~(res.ok[last] & (res.latency_s[last] <= SLO_S))))
    assert tail_miss <= 0.01, (tail_miss, summary)

    # the timeline (times from the start of the replay, approximately: the replay's own zero
    # is a few ms later, once its connections are open)
    rolling = _rolling_p99(res)
    after = [(t, p) for t, p in rolling if t >= marks["remove_called"]]
    over = [t for t, p in after if p > SLO_S]
    under_again = next((t for t, p in after if t > over[-1]), None) if over else None
    before = [p for t, p in rolling if t < marks["remove_called"]]
    lat_ms = res.latency_s * 1e3
    around = (res.scheduled_s >= marks["remove_called"] - 0.5) & (
        res.scheduled_s < marks["remove_called"] + 3.0
    )
    print(
        "\nnode-loss timeline (ray://, 1-CPU workers, Sleep 20 ms, batch <= 4, 2 replicas, "
        f"{RATE_QPS:g} q/s open loop for {RUN_S:g} s, SLO {SLO_S * 1e3:g} ms):\n"
        f"  remove_node called      {marks['remove_called']:.2f} s "
        f"(returned at {marks['removed']:.2f} s)\n"
        f"  batches failed/retried  {queue['failed_batches']} batch(es), "
        f"{queue['retried']} query(ies) retried\n"
        f"  replicas back (2, none on the lost node) at {marks['replicas_back']:.2f} s "
        f"({marks['replicas_back'] - marks['remove_called']:.2f} s after the removal)\n"
        + (
            f"  rolling P99 (1 s windows) over the SLO from {over[0]:.2f} s, under it again "
            f"from {under_again if under_again is not None else float('nan'):.2f} s "
            f"(peak {max(p for _, p in after) * 1e3:.0f} ms)\n"
            if over
            else "  rolling P99 (1 s windows) never over the SLO "
            f"(peak {max(p for _, p in after) * 1e3:.0f} ms)\n"
        )
        + f"  rolling P99 before the loss: median {np.median(before) * 1e3:.0f} ms, "
        f"max {max(before) * 1e3:.0f} ms\n"
        + f"  max latency in the 3.5 s around the loss {np.nanmax(lat_ms[around]):.0f} ms\n"
        f"  whole run: {res.n} queries, {summary['ok']} ok, {summary['defaults']} defaults, "
        f"P99 {summary['p99_ms']:.1f} ms, SLO misses {summary['slo_miss_rate']:.2%}; "
        f"last third misses {tail_miss:.2%}"
    )


def _info_nodes(metrics: str) -> list[str]:
    return [
        s.labels["node"]
        for fam in text_string_to_metric_families(metrics)
        for s in fam.samples
        if s.name == "inferline_replica_info" and s.labels["model"] == "m"
    ]


# -- 2. the live tuner scales onto a node that joins ------------------------------------------

TUNER_BATCH_S = 0.05  # one query per batch: 20 q/s per replica
TUNER_PLANNED_QPS = 6.0
TUNER_BURST_QPS = 50.0  # wants 3+ replicas; the cluster has room for 2 until a node joins


# time (~15 s): 14 s of a 50 q/s burst; a Ray node joins mid-run (add_node takes ~1 s) and
# the tuner's retry must land a replica on it.
def test_tuner_scales_up_onto_a_node_added_mid_run(cluster: RayCluster) -> None:
    # two workers, so the burst outgrows them (the figures below are for this shape; the
    # test once ran on whatever the node-loss test had left: two workers in file order, more
    # in reverse order); the fixture puts the third back for the next test
    cluster.remove(cluster.workers[-1].node_id)
    from inferline.deploy import Deployment, start_service

    dep = Deployment.from_dict(
        sleep_deployment(base_s=TUNER_BATCH_S, slo_ms=500.0, backend=cluster.url)
    )
    plan = Plan(
        "sleep",
        0.5,
        {"m": ModelConfig("cpu", 1, 1)},
        tuner=planned_inputs(TUNER_BATCH_S, TUNER_PLANNED_QPS),
    )
    # no scale-down during the test
    cfg = replace(SHORT_TUNER, stabilization_delay_s=60.0)
    rng = np.random.default_rng(3)
    offsets = np.cumsum(rng.exponential(1.0 / TUNER_BURST_QPS, int(TUNER_BURST_QPS * 14)))

    async def main() -> dict[str, Any]:
        svc = await start_service(dep, plan, tuner=cfg)
        b = svc.backend
        live = svc.tuner
        live.retry_max_s = 1.0  # retries every second at most (default up to 8 s)
        out: dict[str, Any] = {"errors": 0}
        try:
            room = b.free()["cpu"] + 1  # the planned replica and what is free beside it
            t0 = time.perf_counter()

            async def one(at: float) -> None:
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                try:
                    await svc.predict("app", np.asarray([at], dtype=np.float32))
                except Exception:
                    out["errors"] += 1

            load = asyncio.gather(*(one(float(a)) for a in offsets))
            # the tuner asks for more than fits: it keeps what fits and retries the rest
            while not any(a.error and "fit" in a.error for a in live.applied):
                assert time.perf_counter() - t0 < 20, live.applied
                await asyncio.sleep(0.05)
            partial = next(a for a in live.applied if a.error)
            out["partial"] = (round(partial.finished_s - t0, 2), partial.error)
            out["target"] = live.replicas.get("m")
            out["before"] = len(b.replicas("m"))
            out["room"] = room
            out["join_called_at"] = round(time.perf_counter() - t0, 2)
            # in the loop's thread (Ray sets signal handlers): it blocks the loop meanwhile
            joined = cluster.add_worker()
            out["joined_at"] = round(time.perf_counter() - t0, 2)
            while b.replicas("m") and not any(
                getattr(r, "node", None) == joined.node_id for r in b.replicas("m")
            ):
                assert time.perf_counter() - t0 < 40, (live.applied[-3:], b.nodes())
                await asyncio.sleep(0.05)
            out["on_new_node_at"] = round(time.perf_counter() - t0, 2)
            out["after"] = len(b.replicas("m"))
            out["stats"] = await b.stats("m")
            out["joined"] = joined.node_id
            out["decisions"] = [
                (round(d.time_s - t0, 2), d.action, dict(d.replicas)) for d in live.decisions
            ]
            out["applied"] = [
                (round(a.started_s - t0, 2), round(a.finished_s - t0, 2), a.error)
                for a in live.applied
            ]
            await load
            return out
        finally:
            await svc.close()

    out = asyncio.run(main())
    print(
        f"\ntuner on ray:// ({TUNER_BURST_QPS:g} q/s from 0 s on 1 replica of 20 q/s, room for "
        f"{out['room']}):\n"
        f"  first decision {out['decisions'][0]}\n"
        f"  kept what fits  {out['partial']} -> {out['before']} replicas\n"
        f"  node joined     add_node called {out['join_called_at']} s, returned "
        f"{out['joined_at']} s\n"
        f"  retry landed    replica on the new node at {out['on_new_node_at']} s "
        f"({out['after']} replicas)\n"
        f"  decisions {out['decisions']}\n  applied {out['applied']}"
    )
    assert out["errors"] == 0
    assert out["room"] == 2 and out["before"] == 2  # what fitted before the node joined
    # the first refusal says it did not fit: "2 of 4 replicas fit" when the tuner's bisection
    # ran, or the backend's own "do not fit" when the room was already taken (timing)
    assert "fit" in out["partial"][1]
    assert out["after"] == 3 and out["stats"]["nodes"].get(out["joined"]) == 1
    assert out["stats"]["shortfall"] == 0


# -- 3. profiling every hardware kind of the cluster, each on a node that has it -------------


class RecordingBackend:
    """The real ``ray://`` backend, recording where each profiled replica and its contending
    replicas run (a pass-through wrapper, not a stand-in)."""

    def __init__(self, backend: Any) -> None:
        self._b = backend
        self.placed: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)

    async def deploy(self, spec: Any, config: Any) -> None:
        await self._b.deploy(spec, config)
        [target] = self._b.replicas(spec.name)
        self.placed.append({"hw": config.hardware, "target": target.node, "id": target.id})

    async def scale(self, model: str, replicas: int, **kw: Any) -> None:
        await self._b.scale(model, replicas, **kw)
        rec = self.placed[-1]
        rec["others"] = [r.node for r in self._b.replicas(model) if r.id != rec["id"]]
        rec["pinned"] = kw.get("node")


def test_profile_every_kind_on_a_node_that_has_it(cluster: RayCluster) -> None:
    from inferline.adapters import PluginHost
    from inferline.deploy import Deployment
    from inferline.measure import ProfilerOptions, profile_deployment

    # a second kind: a 2-CPU node declaring two units of a CPU-like kind "cpu-c7"
    c7 = cluster.add_worker(num_cpus=2, resources={"cpu-c7": 2})
    dep = Deployment.from_dict(sleep_deployment(base_s=0.004, spin=True, backend=cluster.url))
    opts = ProfilerOptions(
        max_batch_size=2,
        warmup=2,
        min_samples=5,
        max_samples=10,
        max_seconds_per_point=1.0,
        contention=True,
        wake_idle_s=(),
    )

    async def main() -> tuple[Any, RecordingBackend, dict[str, dict[str, int]]]:
        b = PluginHost.default().backend_for(cluster.url)
        try:
            deadline = time.perf_counter() + 30
            while b.inventory().get("cpu-c7", 0) < 2:  # the node table catches up
                assert time.perf_counter() < deadline, b.nodes()
                await asyncio.sleep(0.1)
            hardware = {n.node_id: dict(n.hardware) for n in b.nodes() if n.alive}
            rec = RecordingBackend(b)
            result, _ = await profile_deployment(dep, opts, backend=rec)
            return result, rec, hardware
        finally:
            await b.close()

    result, rec, hardware = asyncio.run(main())
    print("\nprofiled on ray://:", rec.placed)
    prof = result.profiles.models["m"]
    assert sorted(prof) == ["cpu", "cpu-c7"]  # every kind of the cluster
    assert all(sorted(prof[hw]) == [1, 2] for hw in prof)
    by_hw = {p["hw"]: p for p in rec.placed}
    assert sorted(by_hw) == ["cpu", "cpu-c7"]
    for hw, p in by_hw.items():
        assert hardware[p["target"]].get(hw, 0) > 0, (hw, p)  # measured where the kind is
        # contending replicas share the measured replica's node, as many as fit there
        assert all(n == p["target"] for n in p.get("others", [])), (hw, p)
    # "cpu": a 1-CPU node (the replica keeps off the kind's node), no room for contenders
    # there (the cluster-wide count would have put them on the other nodes)
    assert by_hw["cpu"]["target"] != c7.node_id and by_hw["cpu"].get("others", []) == []
    # "cpu-c7": on its node, with the one more that fits there contending
    assert by_hw["cpu-c7"]["target"] == c7.node_id
    assert by_hw["cpu-c7"]["others"] == [c7.node_id]
    assert by_hw["cpu-c7"]["pinned"] == c7.node_id
