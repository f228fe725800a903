"""``inferline_late_calls_total{model}`` / ``inferline_late_items_total{model}``: a backend
call cut at its batch's deadline shows in the scrape (issue 45). A real dispatcher and
ServiceMetrics; the model is a fake whose call always runs past the deadline it is given (the
real backends' cut calls: integration/test_deadline_carried.py)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferline.core.errors import DeadlineExceededError
from inferline.core.protocols import BATCH_DEADLINE
from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica
from inferline.server import ServiceMetrics


class FakeLateModel:
    """Answers like a backend whose call ran past its deadline: ``DeadlineExceededError``
    whenever the queue gave the call a deadline (``expire_late``), else the inputs."""

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        if BATCH_DEADLINE.get() != math.inf:
            raise DeadlineExceededError("m", 0.001, "the call ran past its deadline")
        return inputs


@dataclass
class FakeService:  # what the scrape reads of a Service
    models: list[str]
    dispatcher: Any
    backend: Any = None
    cache: Any = None


def _value(text: str, name: str) -> dict[str, float]:
    return {
        s.labels["model"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def test_a_late_call_shows_in_the_scrape() -> None:
    async def scenario() -> str:
        d = Dispatcher()
        d.add_model("m", batching=FixedBatching(4), expire_late=True)
        d.set_replicas("m", [InProcessReplica("m", FakeLateModel())])
        metrics = ServiceMetrics(FakeService(["m"], d))
        metrics.watch(d)
        now = d.clock()
        res = await asyncio.gather(
            *(d.submit("m", i, deadline=now + 10.0) for i in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, DeadlineExceededError) for r in res)
        await d.close()
        return metrics.render().decode()

    text = asyncio.run(scenario())
    calls = _value(text, "inferline_late_calls_total")
    items = _value(text, "inferline_late_items_total")
    assert calls == {"m": pytest.approx(1.0)}  # one batch of 3, cut once
    assert items == {"m": pytest.approx(3.0)}
