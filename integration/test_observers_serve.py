"""Observer plugins hear about a served deployment's configuration changes (deploy, plan applied)
through the plugin host, on the bundled runtime."""

from __future__ import annotations

import asyncio

import pytest

from inferline.adapters import PluginHost, hookimpl
from inferline.core import ModelConfig, Plan
from inferline.demo.simple import sleep_deployment
from inferline.deploy import Deployment, apply_plan, start_service

pytestmark = pytest.mark.integration


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, object, object, str]] = []

    @hookimpl
    def inferline_on_config_change(self, model, old, new, backend, reason) -> None:  # type: ignore[no-untyped-def]
        self.changes.append((model, old, new, reason))


def test_deploy_and_plan_changes_reach_observers() -> None:
    rec = Recorder()
    host = PluginHost.default()
    host.register(rec, "recorder")
    dep = Deployment.from_dict(sleep_deployment(base_s=0.001))

    async def main() -> None:
        svc = await start_service(dep, None, host=host)
        try:
            plan = Plan("sleep", 1.0, {"m": ModelConfig("cpu", 4, 2)})
            done = await apply_plan(svc, plan)
            assert done["m"] == "2 replicas, max batch 4"
        finally:
            await svc.close()

    asyncio.run(main())
    assert rec.changes[0] == ("m", None, ModelConfig("cpu", 1, 1), "deploy")
    assert rec.changes[1] == (
        "m",
        ModelConfig("cpu", 1, 1),
        ModelConfig("cpu", 4, 2),
        "plan applied",
    )
