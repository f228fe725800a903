"""A third-party backend, installed through entry-point metadata, works end to end.

``echo_backend/`` is packaged like an outside project (its own ``pyproject.toml`` with an
``[project.entry-points.inferline]`` table). The test installs it into a temporary site folder
(the package plus a ``.dist-info`` whose ``entry_points.txt`` comes from that pyproject), puts
the folder on ``sys.path``, and then, through ``PluginHost.load_entrypoints()`` only: creates
the backend from its URL, profiles its models, plans with its hardware kind priced by the
plugin, serves a two-model pipeline through inferline's queue and HTTP frontend, and tells
its observer about a configuration change. Nothing in ``core/``, ``queueing/`` or the
built-in adapters knows the plugin.
"""

from __future__ import annotations

import ast
import asyncio
import shutil
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from inferline.adapters import DISABLED_ENV, PluginHost
from inferline.core import (
    ModelConfig,
    ModelSpec,
    Pipeline,
    gamma_trace,
    plan_inferline,
    value_from_json,
)

SRC = Path(__file__).with_name("echo_backend")


def install(site: Path) -> dict[str, str]:
    """Install the package into ``site`` as pip would: its modules plus a dist-info."""
    meta = tomllib.loads((SRC / "pyproject.toml").read_text())["project"]
    shutil.copytree(SRC / "inferline_echo", site / "inferline_echo")
    info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    lines = []
    for group, eps in meta["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return dict(meta["entry-points"]["inferline"])


@pytest.fixture
def echo_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    eps = install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield eps
    for name in [m for m in sys.modules if m.startswith("inferline_echo")]:
        del sys.modules[name]


def test_plugin_uses_only_the_public_api() -> None:
    allowed = {"inferline.core", "inferline.adapters"}
    for py in (SRC / "inferline_echo").glob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("inferline")
            ):
                assert node.module in allowed, f"{py.name} imports {node.module}"


# time (~12 s): the plugin found through entry points, then profiled, deployed, served over
# HTTP through a two-model pipeline (each step a real server start or a profiling run).
def test_third_party_backend_end_to_end(echo_installed: dict[str, str]) -> None:
    from inferline.deploy._format import AppSpec, Deployment
    from inferline.deploy._start import start_service
    from inferline.measure._profiler import ProfilerOptions, profile_models
    from inferline.server._http import create_app

    assert echo_installed == {"echo": "inferline_echo.plugin"}
    host = PluginHost()
    added = host.load_entrypoints()
    assert "echo" in added and "echo" in host.schemes()
    assert host.describe()["echo"]["origin"].startswith(
        "inferline_echo.plugin (inferline-echo 0.1.0)"
    )
    catalog = host.hardware_catalog()
    assert catalog["echo-accel"].cost_per_hour == 0.25

    specs = [
        ModelSpec("first", params={"base_s": 0.004, "per_item_s": 0.001, "scale": 1.0}),
        ModelSpec("second", params={"base_s": 0.002, "per_item_s": 0.0005, "scale": 2.0}),
    ]
    samples = [np.linspace(-1, 1, 8) * (i + 1) / 10 for i in range(16)]

    async def main() -> None:
        # profile on the plugin's backend, both hardware kinds
        b = host.backend_for("echo://?cores=2&accelerators=1")
        opts = ProfilerOptions(
            max_batch_size=4, warmup=1, min_samples=4, max_samples=8, max_seconds_per_point=0.5
        )
        res = await profile_models(b, specs, {s.name: samples for s in specs}, opts)
        await b.close()
        prof = res.profiles
        assert set(prof.models) == {"first", "second"}
        assert set(prof.hardware_for("first")) == {"cpu", "echo-accel"}
        assert (
            prof.models["first"]["echo-accel"][1].latency_s
            < prof.models["first"]["cpu"][1].latency_s
        )

        # plan with the plugin's hardware kind in the catalog
        pipe = Pipeline("chain", ("first", "second"), (("first", "second"),))
        trace = gamma_trace(40.0, 1.0, 10.0, np.random.default_rng(0))
        plan = plan_inferline(pipe, prof, trace, 0.15, catalog=catalog)
        assert set(plan.models) == {"first", "second"}

        # serve through inferline's queue, from a deployment naming the plugin's scheme
        dep = Deployment(
            "echo-chain",
            tuple(specs),
            (AppSpec("chain", "inferline_echo.pipelines:chain", 0.15),),
            backend="echo://?cores=2&accelerators=2",
        )
        svc = await start_service(dep, plan, backend=host.backend_for(dep.backend))
        try:
            preds = await asyncio.gather(*(svc.predict("chain", x) for x in samples))
            for x, p in zip(samples, preds, strict=True):
                np.testing.assert_allclose(p.output, np.tanh(2 * np.tanh(x)))
            import httpx

            from inferline.server._admin import make_admin_router

            app = create_app(svc, close_service_on_shutdown=False, routers=[make_admin_router])
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://t"
            ) as c:
                r = await c.post("/apps/chain/predict", json={"input": [0.5, -0.5]})
                assert r.status_code == 200, r.text
                got = value_from_json(r.json()["output"])
                assert got.tolist() == pytest.approx(np.tanh(2 * np.tanh([0.5, -0.5])).tolist())
                # more replicas than the backend's inventory: refused before anything moves,
                # naming the model (422)
                first = plan.models["first"]
                big = ModelConfig(first.hardware, first.max_batch_size, 50)
                r = await c.put(
                    "/admin/plan", json=plan.with_models({**plan.models, "first": big}).to_dict()
                )
                assert r.status_code == 422, r.text
                assert r.json()["field"] == "models.first.replicas"
                # a plan the backend refuses for one model when applied (room gone meanwhile):
                # not a 200, and the plan in force keeps that model's old configuration
                from inferline.core import CapacityError

                scale = svc.backend.scale

                async def refuse_first(model: str, n: int) -> None:
                    if model == "first":
                        raise CapacityError(f"no room for {n} replicas of {model!r}")
                    await scale(model, n)

                svc.backend.scale = refuse_first
                other = ModelConfig(first.hardware, first.max_batch_size * 2, first.replicas)
                r = await c.put(
                    "/admin/plan", json=plan.with_models({**plan.models, "first": other}).to_dict()
                )
                svc.backend.scale = scale
                assert r.status_code == 502, r.text
                assert r.json()["error"] == "PlanPartlyApplied"
                assert r.json()["applied"]["first"].startswith("failed: "), r.text
                in_force = (await c.get("/admin/plan")).json()["models"]
                assert in_force["first"] == first.to_dict()
                # no replica for a pipeline's model: refused, not a queue waiting for nothing
                none = ModelConfig(first.hardware, first.max_batch_size, 0)
                r = await c.put(
                    "/admin/plan", json=plan.with_models({**plan.models, "first": none}).to_dict()
                )
                assert r.status_code == 422, r.text
                assert "plan.models.first.replicas" in r.text
                assert len(svc.backend.replicas("first")) == first.replicas
            for name, cfg in plan.models.items():
                assert len(svc.backend.replicas(name)) == cfg.replicas
        finally:
            await svc.close()

    asyncio.run(main())

    # the plugin's observer hears about configuration changes through the host
    from inferline_echo.plugin import CONFIG_EVENTS

    host.notify_config(
        "first", None, ModelConfig("echo-accel", 4, 1), backend="echo://", reason="test"
    )
    assert CONFIG_EVENTS[-1][0] == "first" and CONFIG_EVENTS[-1][3] == "test"


def test_disabling_the_third_party_plugin(
    echo_installed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLED_ENV, "echo")
    host = PluginHost.default()
    assert "echo" not in host.schemes() and "local" in host.schemes()


def test_third_party_backend_passes_the_shipped_conformance_checks(
    echo_installed: dict[str, str],
) -> None:
    """As an adapter's author would: ``inferline.adapters.checks`` from the installed package,
    on a backend made from its URL through the plugin host."""
    from inferline.adapters.checks import CHECKS, run_conformance

    host = PluginHost()
    host.load_entrypoints()
    spec = ModelSpec("echo", params={"base_s": 0.001, "per_item_s": 0.0, "scale": 1.0})
    inputs = [np.linspace(-1, 1, 4) * (i + 1) for i in range(3)]

    def check(x: np.ndarray, y: np.ndarray) -> None:
        np.testing.assert_allclose(y, np.tanh(x))

    done = asyncio.run(
        run_conformance(
            lambda: host.backend_for("echo://?cores=2&accelerators=1"),
            spec,
            inputs,
            bad_input="not a number",
            check_output=check,
        )
    )
    assert done == list(CHECKS)
