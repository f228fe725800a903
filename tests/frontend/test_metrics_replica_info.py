"""``inferline_replica_info``: one series per active replica, labelled with its node.

A stand-in service (named as a fake) whose backend hands out replica handles with and without
a ``node`` attribute; the live check over ``ray://`` is ``integration/test_ray_serve.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferline.server import ServiceMetrics


@dataclass
class FakeHandle:
    id: str
    hardware: str = "cpu"


@dataclass
class FakeRayHandle:
    id: str
    node: str
    hardware: str = "cpu"


class FakeBackend:
    def __init__(self, handles: dict[str, list[Any]]) -> None:
        self.handles = handles

    def replicas(self, model: str) -> list[Any]:
        if model == "broken":
            raise RuntimeError("backend gone")
        return self.handles.get(model, [])


@dataclass
class FakeService:
    models: list[str]
    backend: Any
    dispatcher: Any = None
    cache: Any = None


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def test_each_replica_is_a_series_labelled_with_its_node_and_hardware() -> None:
    backend = FakeBackend(
        {
            "a": [FakeRayHandle("a-0", "n1"), FakeRayHandle("a-1", "n2", "gpu-v100")],
            "b": [FakeHandle("b-0")],
        }
    )
    svc = FakeService(["a", "b", "broken"], backend)
    text = ServiceMetrics(svc).render().decode()
    info = sorted(_samples(text, "inferline_replica_info"), key=lambda s: s[0]["replica"])
    assert info == [
        ({"model": "a", "replica": "a-0", "node": "n1", "server": "", "hardware": "cpu"}, 1.0),
        ({"model": "a", "replica": "a-1", "node": "n2", "server": "", "hardware": "gpu-v100"}, 1.0),
        ({"model": "b", "replica": "b-0", "node": "local", "server": "", "hardware": "cpu"}, 1.0),
    ]
    # the existing series are unchanged: replicas per model, 0 where the backend failed
    reps = dict((s[0]["model"], s[1]) for s in _samples(text, "inferline_replicas"))
    assert reps == {"a": 2.0, "b": 1.0, "broken": 0.0}


def test_a_replica_that_leaves_leaves_the_scrape() -> None:
    handles = [FakeRayHandle("a-0", "n1"), FakeRayHandle("a-1", "n2")]
    svc = FakeService(["a"], FakeBackend({"a": handles}))
    metrics = ServiceMetrics(svc)
    assert len(_samples(metrics.render().decode(), "inferline_replica_info")) == 2
    handles[1:] = [FakeRayHandle("a-2", "n3")]  # lost with its node, replaced elsewhere
    nodes = {s[0]["node"] for s in _samples(metrics.render().decode(), "inferline_replica_info")}
    assert nodes == {"n1", "n3"}
