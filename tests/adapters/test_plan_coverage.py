"""A plan that leaves out a served model (``"models": {}`` included) no longer records a plan
that does not match what runs: the model keeps its configuration, the answer says so, and
``GET /admin/plan`` shows it as it runs. A plan naming a model that is not served is refused
before anything changes (an attachment skipped it silently)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from test_attach_contract import Scaled, attach, host  # noqa: F401 (fixture)

from inferline.core import ModelConfig, Plan, ValidationError
from inferline.demo.simple import noop_deployment
from inferline.deploy import Deployment, apply_attachment_plan, start_service
from inferline.server import create_app, make_admin_router


def test_an_empty_plan_keeps_the_running_model_and_says_so() -> None:
    """Real replica processes of the bundled runtime, through ``PUT /admin/plan``."""
    dep = Deployment.from_dict(noop_deployment())

    async def main() -> tuple[int, dict[str, Any], dict[str, Any], int]:
        svc = await start_service(dep, Plan("noop", 1.0, {"m": ModelConfig("cpu", 2, 2)}))
        try:
            app = create_app(svc, routers=[make_admin_router])
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                empty = Plan("noop", 1.0, {}).to_dict()
                r = await c.put("/admin/plan", json=empty)
                shown = (await c.get("/admin/plan")).json()
            return r.status_code, r.json(), shown, len(svc.backend.replicas("m"))
        finally:
            await svc.close()

    status, answer, shown, running = asyncio.run(main())
    assert status == 200, answer
    text = str(answer)
    assert "kept: not in the plan (2 replicas, max batch 2)" in text, answer
    models = shown.get("models", shown.get("plan", {}).get("models"))
    assert models["m"]["replicas"] == running == 2, shown
    assert models["m"]["max_batch_size"] == 2


def test_an_attachment_plan_names_only_attached_models_and_keeps_the_rest(host) -> None:  # noqa: F811
    from inferline.queueing import Dispatcher, FixedBatching
    from inferline.server import Service

    async def run() -> tuple[dict[str, str], Any, Any]:
        att = await attach("mini://h:1", host=host)
        att.backend = Scaled("mini://h:1")
        d = Dispatcher()
        d.add_model("a", batching=FixedBatching(1))
        svc = Service(dispatcher=d, backend=att.backend, models=["a"], plugins=host)
        try:
            with pytest.raises(ValidationError) as e:
                await apply_attachment_plan(
                    svc, att, Plan("p", 0.2, {"nope": ModelConfig("cpu", 4, 2)})
                )
            notes = await apply_attachment_plan(svc, att, Plan("p", 0.2, {}))
        finally:
            await d.close()
        return notes, svc.plan, e.value

    notes, plan, err = asyncio.run(run())
    assert err.field == "plan.models" and "nope" in str(err)
    assert notes["a"].startswith("kept: not in the plan"), notes
    assert plan is not None and "a" in plan.models
