"""The attach contract of docs/writing-an-adapter.md for a third-party backend: ``discover()``
as ``{name: {"ready": bool, ...}}``, ``extra_models`` for servers that cannot list their models,
``adopt()``; and a backend option the backend does not take is a one-line error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.adapters import PluginHost, hookimpl
from inferline.core import ModelConfig, NotFoundError, ValidationError
from inferline.deploy._attach import attach


class MiniServer:
    """A backend of a server that lists only some models itself (the rest only by name)."""

    def __init__(self, url: str, *, listed: dict[str, Any] | None = None) -> None:
        self.url = url
        self.listed = {"a": {"ready": True, "state": "UP"}, "b": {"ready": False}}
        if listed is not None:
            self.listed = listed
        self.extra_models: tuple[str, ...] = ()
        self.adopted: list[str] = []
        self.closed = False

    async def discover(self) -> dict[str, Any]:
        found = dict(self.listed)
        for name in self.extra_models:  # asked about by name: this server has "c" too
            if name == "c":
                found[name] = {"ready": True, "max_batch_size": 8}
        return found

    async def adopt(self, name: str) -> ModelConfig:
        self.adopted.append(name)
        return ModelConfig("cpu", 1, 1)

    async def close(self) -> None:
        self.closed = True


class MiniPlugin:
    @hookimpl
    def inferline_backend_schemes(self) -> dict[str, Any]:
        return {"mini": lambda url, options: MiniServer(url, **options)}


@pytest.fixture
def host() -> PluginHost:
    h = PluginHost()
    h.register(MiniPlugin(), "mini")
    return h


def test_attach_adopts_the_ready_models_of_a_plain_discover(host: PluginHost) -> None:
    att = asyncio.run(attach("mini://h:1", host=host))
    assert list(att.models) == ["a"] and att.backend.adopted == ["a"]
    assert att.found["a"]["state"] == "UP" and att.found["b"]["state"] == "UNAVAILABLE"
    assert att.found["b"]["ready"] is False
    with pytest.raises(NotFoundError, match=r"ready model \['b'\].*known: \['a'\]"):
        asyncio.run(attach("mini://h:1", models=["b"], host=host))


def test_named_models_reach_a_server_that_cannot_list_them(host: PluginHost) -> None:
    att = asyncio.run(attach("mini://h:1", models=["c"], host=host))
    assert att.backend.extra_models == ("c",)
    assert list(att.models) == ["c"] and att.found["c"]["max_batch_size"] == 8


def test_a_malformed_discover_answer_and_an_unknown_option_are_named(host: PluginHost) -> None:
    with pytest.raises(
        ValidationError, match=r"discover\(\)\['a'\]\.ready: expected true or false"
    ):
        asyncio.run(attach("mini://h:1", host=host, listed={"a": {"ready": "yes"}}))
    with pytest.raises(ValidationError, match="backend option 'bogus': expected an option mini://"):
        host.backend_for("mini://h:1", bogus=1)


def test_attach_cli_refuses_bad_flags_in_one_line(tmp_path: Any, capsys: Any) -> None:
    from inferline.cli import main

    assert main(["attach", "triton://127.0.0.1:1", "--option", "models=m"]) == 2
    assert "--option models: expected --models M1,M2 instead" in capsys.readouterr().err
    bad = tmp_path / "inputs.json"
    bad.write_text("{not json")
    assert main(["attach", "triton://127.0.0.1:1", "--inputs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "inputs.json: expected valid JSON" in err and "Traceback" not in err
    assert main(["attach", "triton://127.0.0.1:1", "--option", "grpc_port=8001"]) == 2
    assert "backend option 'grpc_port'" in capsys.readouterr().err


def test_a_pipeline_whose_models_do_not_fit_together_is_refused() -> None:
    """One model's output must be able to be the next one's input: before, such a pipeline
    was served and every query failed with a 422."""
    from inferline.core import Pipeline, ValidationError
    from inferline.deploy._attach import check_pipeline_io
    from inferline.server.frontdoors import Signature, TensorInfo

    def sig(inp: tuple[str, tuple[int, ...]], out: tuple[str, tuple[int, ...]]) -> Signature:
        return Signature((TensorInfo("in", *inp),), (TensorInfo("out", *out),))

    pipe = Pipeline("p", ("pre", "cls"), (("pre", "cls"),))
    pre = sig(("float32", (8, 8)), ("float32", (64,)))
    check_pipeline_io(pipe, {"pre": pre, "cls": sig(("float32", (64,)), ("int64", (1,)))})
    check_pipeline_io(pipe, {"pre": pre, "cls": sig(("float32", (-1,)), ("int64", (1,)))})
    check_pipeline_io(pipe, {"pre": pre})  # a model without a signature: not checked
    with pytest.raises(ValidationError, match=r"pipeline\.edges\[0\] \(pre -> cls\)"):
        check_pipeline_io(pipe, {"pre": pre, "cls": sig(("float32", (32,)), ("int64", (1,)))})
    with pytest.raises(ValidationError, match="object"):
        check_pipeline_io(pipe, {"pre": pre, "cls": sig(("object", (1,)), ("int64", (1,)))})


def test_a_plan_for_an_attached_server_fits_its_inventory(host: PluginHost) -> None:
    """120 q/s of a 20 ms CPU model needs more than two replicas: on a server with two cores
    (one per replica here, two threads each in the second case) there is no plan, and the
    error names the inventory, instead of a plan that fails when applied."""
    import numpy as np

    from inferline.core import InfeasibleError, Pipeline, Profiles, gamma_trace
    from inferline.deploy._attach import plan_attachment

    att = asyncio.run(attach("mini://h:1", host=host))
    pipe = Pipeline.linear("p", ["a"])
    prof = Profiles.from_latencies({"a": {"cpu": {1: 0.02}}})
    trace = gamma_trace(120.0, 1.0, 10.0, np.random.default_rng(0))
    free = plan_attachment(att, pipe, prof, trace, 0.2)  # MiniServer has no inventory()
    need = free.models["a"].replicas
    assert need > 2
    att.backend.inventory = lambda: {"cpu": need, "tpu": 1}  # a kind the catalog lacks
    assert plan_attachment(att, pipe, prof, trace, 0.2).models == free.models
    att.backend.replica_units = lambda: {"a": 2}
    with pytest.raises(InfeasibleError, match=rf"inventory \(cpu: {need}\)"):
        plan_attachment(att, pipe, prof, trace, 0.2)
    att.backend.oversubscribe = True
    assert plan_attachment(att, pipe, prof, trace, 0.2).models == free.models
    # a backend that pins replicas to its cores (the bundled runtime): the estimate shares
    # them as placed, so 2.4 cores of work on two is no plan at all
    att.backend.core_sharing = lambda: {"pinned_cores": {"cpu": 2, "tpu": 1}}
    with pytest.raises(InfeasibleError, match="cpu: 2 shared cores"):
        plan_attachment(att, pipe, prof, trace, 0.2)


class Scaled(MiniServer):
    """A MiniServer a dispatcher can attach to and a plan can scale."""

    def subscribe(self, callback: Any) -> None:
        pass

    def replicas(self, name: str) -> list[Any]:
        return []

    async def stats(self, name: str) -> dict[str, Any]:
        return {"max_batch_size": 8}

    async def scale(self, name: str, replicas: int) -> None:
        self.scaled = (name, replicas)


def test_a_planned_batch_wait_reaches_an_attached_models_queue(host: PluginHost) -> None:
    """An attachment names no batching policy of its own, so the plan decides: its batch
    wait gives delayed batching, and a later plan without one puts fixed batching back."""
    from inferline.core import Plan
    from inferline.deploy._attach import apply_attachment_plan
    from inferline.queueing import DelayedBatching, Dispatcher, FixedBatching
    from inferline.server._service import Service

    async def run() -> tuple[Any, Any, dict[str, str], Any]:
        att = await attach("mini://h:1", host=host)
        att.backend = Scaled("mini://h:1")
        d = Dispatcher()
        d.add_model("a", batching=FixedBatching(1))
        svc = Service(dispatcher=d, backend=att.backend, models=["a"], plugins=host)
        waited = Plan("p", 0.2, {"a": ModelConfig("cpu", 4, 2, batch_wait_ms=12.0)})
        notes = await apply_attachment_plan(svc, att, waited)
        first = d.batching("a")
        assert svc.plan is not None and svc.plan.models["a"].batch_wait_ms == 12.0
        await apply_attachment_plan(svc, att, Plan("p", 0.2, {"a": ModelConfig("cpu", 4, 2)}))
        second = d.batching("a")
        await d.close()
        return first, second, notes, svc.plan

    first, second, notes, plan = asyncio.run(run())
    assert isinstance(first, DelayedBatching)
    assert first.to_dict() == {"policy": "delayed", "max_batch_size": 4, "batch_wait_s": 0.012}
    assert "batch wait 12 ms" in notes["a"]
    assert isinstance(second, FixedBatching) and second.to_dict()["max_batch_size"] == 4
    assert plan.models["a"].batch_wait_ms == 0


def test_the_row_cap_of_an_attachment_is_set_on_every_door_before_it_serves(
    host: PluginHost,
) -> None:
    from inferline.core import Pipeline
    from inferline.deploy._attach import start_attachment_service

    async def run(max_rows: Any) -> tuple[int, int]:
        att = await attach("mini://h:1", host=host)
        att.backend = Scaled("mini://h:1")
        svc, door = await start_attachment_service(
            att, pipeline=Pipeline("p", ("a",), ()), max_rows=max_rows
        )
        try:
            return door.max_rows, svc.apps["pipeline"].max_batch_inputs
        finally:
            await svc.close()

    assert asyncio.run(run(3)) == (3, 3)
    with pytest.raises(ValidationError, match="max_rows"):
        asyncio.run(run(0))
