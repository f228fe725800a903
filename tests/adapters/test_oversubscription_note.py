"""A plan that takes more cores than a sharing (``oversubscribe``) backend has is placed, but
its estimate gives every replica a core of its own: ``apply_plan`` says so (and logs it), and
the demo prints it; a plan that fits says nothing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from inferline.core import ModelConfig, Plan
from inferline.demo.simple import noop_deployment
from inferline.deploy._apply import apply_plan
from inferline.deploy._format import Deployment
from inferline.deploy._planned import oversubscription
from inferline.deploy._start import start_service


class _Inventory:
    """A stand-in (named as a fake) for a backend's inventory: two cores, one GPU."""

    def inventory(self) -> dict[str, int]:
        return {"cpu": 2, "gpu-k80": 1}


def test_the_note_counts_threads_on_cpus_and_one_unit_per_gpu_replica() -> None:
    d = noop_deployment()
    d["models"][0]["threads"] = 2
    dep = Deployment.from_dict(d)
    assert oversubscription(dep, _Inventory(), {"m": ModelConfig("cpu", 1, 1)}) is None
    note = oversubscription(dep, _Inventory(), {"m": ModelConfig("cpu", 1, 2)})
    assert note is not None and "cpu: 4 of 2" in note and "--inventory" in note
    assert "--pinned-cores cpu=2 " in note  # the estimate that shares them as placed
    assert oversubscription(dep, _Inventory(), {"m": ModelConfig("gpu-k80", 1, 1)}) is None
    assert "gpu-k80: 2 of 1" in (
        oversubscription(dep, _Inventory(), {"m": ModelConfig("gpu-k80", 1, 2)}) or ""
    )
    assert (
        oversubscription(dep, object(), {"m": ModelConfig("cpu", 1, 9)}) is None
    )  # no inventory()


def test_apply_plan_says_when_the_plan_oversubscribes_the_machine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real replica processes of the bundled runtime (oversubscribing, as the demo does)."""
    dep = Deployment.from_dict(noop_deployment())

    async def main() -> tuple[dict[str, str], dict[str, str], int]:
        svc = await start_service(dep, Plan("noop", 1.0, {"m": ModelConfig("cpu", 1, 1)}))
        try:
            cores = svc.backend.inventory()["cpu"]
            fits = await apply_plan(svc, Plan("noop", 1.0, {"m": ModelConfig("cpu", 1, cores)}))
            over = await apply_plan(svc, Plan("noop", 1.0, {"m": ModelConfig("cpu", 1, cores + 1)}))
            return fits, over, cores
        finally:
            await svc.close()

    with caplog.at_level(logging.WARNING, logger="inferline.deploy._format"):
        fits, over, cores = asyncio.run(main())
    assert "inventory" not in fits
    assert f"cpu: {cores + 1} of {cores}" in over["inventory"]
    assert over["m"].startswith(f"{cores + 1} replicas")
    assert any("estimate" in r.getMessage() for r in caplog.records)
