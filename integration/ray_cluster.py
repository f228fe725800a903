"""A real Ray cluster on this machine, one per test module, put back in shape before each test.

Starting a cluster costs about 5 s, so a module shares one (BACKENDS.md). Its tests add and
remove nodes (node loss, a node joining mid-run, a node of another kind); each test used to
assume the shape the module started with, and in another order (``pytest --reverse``) saw
the nodes an earlier test had left: 5 CPUs where it expected 2, say. ``reset()`` brings the
cluster back to the module's plain workers (and removes the nodes tests added) before each
test, through the function-scoped fixture each module defines over its module-scoped one.

Loopback only: every Ray process binds to 127.0.0.1 with ``LOOPBACK`` set, here and in the
child processes (they inherit the environment).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import ray
from ray import cluster_utils
from ray._private import ray_constants

__all__ = ["LOOPBACK", "RayCluster", "ray_cluster"]

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass
class RayCluster:
    """``workers``: removable worker nodes, plain (1 CPU) or added by a test with other
    resources; ``plain``: how many plain workers each test starts from; ``gpu``: a worker
    declaring a GPU kind, kept for the whole module (None: none)."""

    cluster: Any
    workers: list[Any] = field(default_factory=list)
    plain: int = 0
    gpu: Any = None
    _custom: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"ray://{self.cluster.address}"

    @property
    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    def add_worker(self, **kw: Any) -> Any:
        """A worker of ``num_cpus`` (1) and the given resources; not plain if either is set."""
        num_cpus = kw.pop("num_cpus", 1)
        node = self.cluster.add_node(num_cpus=num_cpus, **kw)
        self.workers.append(node)
        if num_cpus != 1 or kw:
            self._custom.add(node.node_id)
        return node

    def remove(self, node_id: str) -> None:
        node = next(n for n in self.workers if n.node_id == node_id)
        self.workers.remove(node)
        self._custom.discard(node_id)
        self.cluster.remove_node(node)

    def reset(self) -> None:
        """Back to ``plain`` plain workers (the GPU worker stays): the nodes a test added go,
        the ones it removed come back as new nodes."""
        for n in [n for n in self.workers if n.node_id in self._custom]:
            self.remove(n.node_id)
        while len(self.workers) > self.plain:
            self.remove(self.workers[-1].node_id)
        changed = len(self.workers) < self.plain
        while len(self.workers) < self.plain:
            self.add_worker()
        if changed:
            self.cluster.wait_for_nodes()


@contextlib.contextmanager
def ray_cluster(head_cpus: int, plain: int, gpu: bool = False) -> Iterator[RayCluster]:
    """A cluster of a head with ``head_cpus`` CPUs, ``plain`` 1-CPU workers and, with ``gpu``,
    a worker with 1 CPU, ``num_gpus=1`` and ``{"gpu-v100": 1}``; shut down at the end."""
    with pytest.MonkeyPatch.context() as mp:
        # Ray reads this when it is imported (driver) and when its processes start (workers)
        for k, v in LOOPBACK.items():
            mp.setenv(k, v)
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        c = cluster_utils.Cluster(
            initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False}
        )
        try:
            rc = RayCluster(c, plain=plain)
            for _ in range(plain):
                rc.add_worker()
            if gpu:
                rc.gpu = c.add_node(num_cpus=1, num_gpus=1, resources={"gpu-v100": 1})
            c.wait_for_nodes()
            yield rc
        finally:
            if ray.is_initialized():
                ray.shutdown()
            c.shutdown()
