"""The profiler's contention on a backend of several machines (one with ``nodes()``): as many
contending replicas as fit on the measured replica's node, asked for on that node. A recording
stand-in backend (named as a fake); the real cluster is ``integration/test_ray_serve.py``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from inferline.adapters.ray import NodeInfo
from inferline.core import ModelConfig, ModelSpec
from inferline.measure._profiler import ProfilerOptions, _fit_on, profile_models


@dataclass
class FakeReplica:
    id: str
    node: str
    hardware: str = "cpu"

    async def predict_batch(self, inputs: list[Any]) -> list[Any]:
        await asyncio.sleep(0)
        return list(inputs)


@dataclass
class FakeClusterBackend:
    """Node "n1" (1 CPU), "n2" (3 CPUs, the measured replica's), "n3" (8 CPUs)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    reps: list[FakeReplica] = field(default_factory=list)
    pinned: bool = True

    def inventory(self) -> dict[str, int]:
        return {"cpu": 12}

    def free(self) -> dict[str, int]:
        return {"cpu": 12 - len(self.reps)}

    def nodes(self) -> list[NodeInfo]:
        cpus = {"n1": 1, "n2": 3, "n3": 8}
        used = {n: sum(r.node == n for r in self.reps) for n in cpus}
        return [
            NodeInfo(n, cpus=c, hardware={"cpu": c}, free={"cpu": c - used[n]})
            for n, c in cpus.items()
        ]

    def replicas(self, model: str) -> list[FakeReplica]:
        return list(self.reps)

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        self.calls.append(("deploy", config.hardware))
        self.reps = [FakeReplica("r0", "n2")]

    async def scale(self, model: str, n: int, *, node: str | None = None) -> None:
        self.calls.append(("scale", n, node))
        self.reps += [FakeReplica(f"r{i}", node or "n3") for i in range(len(self.reps), n)]

    async def remove(self, model: str) -> None:
        self.calls.append(("remove",))
        self.reps = []


def test_contention_is_sized_and_pinned_by_the_measured_replica_s_node() -> None:
    b = FakeClusterBackend()
    opts = ProfilerOptions(
        max_batch_size=1, warmup=1, min_samples=2, max_samples=2, contention=True, wake_idle_s=()
    )
    res = asyncio.run(profile_models(b, [ModelSpec("m", "x:y")], {"m": [1.0]}, opts))
    assert sorted(res.profiles.models["m"]) == ["cpu"]
    # n2 has 3 CPUs, one held by the measured replica: two contenders, on n2 (the
    # cluster-wide count would have asked for 11, spread over every node)
    assert b.calls == [("deploy", "cpu"), ("scale", 3, "n2"), ("remove",)]


def test_what_fits_on_a_node() -> None:
    assert _fit_on({"cpu": 7}, "cpu", 2) == 3
    assert _fit_on({"cpu": 7, "gpu-v100": 2}, "gpu-v100", 1) == 2
    assert _fit_on({"cpu": 1, "gpu-v100": 2}, "gpu-v100", 1) == 1  # CPUs bound a GPU kind too
    assert _fit_on({"cpu": 4}, "cpu-c7", 1) == 0  # the node lacks the kind
