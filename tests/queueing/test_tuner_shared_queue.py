"""The live tuner's variant switches on the stage's one queue (``variant_queue``,
``inferline/deploy/_tuning_queue.py``): at a switch the queries queued at the old variant go
to the new variant once its replicas serve, none is lost; ``per_variant`` keeps the old
behaviour; the option round-trips and is validated by name.

The switch test runs on virtual time (the dispatcher's clock and the tuner's are the loop's):
a real ``Service``, ``Dispatcher``, ``LiveTuner`` and its ``VariantTuner`` decision, with
in-process replicas started by a fake backend (a bundled-runtime process does not run on
virtual time)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

import numpy as np
import pytest

from inferline.core import (
    ModelConfig,
    Pipeline,
    PipelineVariants,
    Plan,
    Profiles,
    TunerConfig,
    TunerInputs,
    TunerModel,
    ValidationError,
    VariantPlan,
    envelope_windows,
    gamma_trace,
    plan_with_variants_section,
    trace_envelope,
)
from inferline.deploy import Loops, ServeSettings
from inferline.deploy._tuning import LiveTuner
from inferline.queueing import AdmissionConfig, Dispatcher, FixedBatching, InProcessReplica
from inferline.server import App, Service

SLOW_S, FAST_S, START_S = 0.05, 0.0125, 0.02  # a variant's batch of 1; a replica's start
PLANNED_QPS, BURST_QPS, SLO_S = 6.0, 24.0, 0.5
SERVICE = {"m-slow": SLOW_S, "m-fast": FAST_S}
PIPE = Pipeline("sleep", ("m",), ())
PROFILES = Profiles.from_latencies({m: {"cpu": {1: s}} for m, s in SERVICE.items()})
VARIANTS = PipelineVariants.from_dict(
    {
        "format": "inferline.variants/1",
        "pipeline": "sleep",
        "accuracy_floor": 0.85,
        "stages": {
            "m": {
                "variants": [
                    {"name": "m-slow", "accuracy": 0.95},
                    {"name": "m-fast", "accuracy": 0.9},
                ]
            }
        },
    }
)
TUNER = TunerConfig(
    stabilization_delay_s=3.0,
    down_horizon_s=2.0,
    down_window_s=0.5,
    keep_horizon_s=2.0,
    interval_s=0.05,
    up_rate="scaled",
)


def _plan() -> Plan:
    """Stage ``m`` on the accurate variant, planned for 6 q/s (one replica)."""
    sample = gamma_trace(PLANNED_QPS, 1.0, 120.0, np.random.default_rng(0))
    inputs = TunerInputs(
        SLOW_S,
        trace_envelope(sample, envelope_windows(SLOW_S)).points,
        PLANNED_QPS,
        {"m": TunerModel(1.0, 1.0 / SLOW_S, PLANNED_QPS * SLOW_S)},
    )
    plan = Plan("sleep", SLO_S, {"m": ModelConfig("cpu", 1, 1)}, tuner=inputs)
    return plan_with_variants_section(
        VariantPlan(plan, {"m": "m-slow"}, 0.95), PIPE, VARIANTS, PROFILES
    )


class Tag:
    """A model that answers which variant served each input."""

    def __init__(self, name: str) -> None:
        self.name = name

    def predict_batch(self, inputs: list[Any]) -> list[Any]:
        return [(self.name, x) for x in inputs]


class FakeInProcessBackend:
    """``scale()`` starts (after ``START_S``) or stops in-process replicas of the dispatcher;
    a fake because the bundled runtime's replica processes do not run on virtual time."""

    def __init__(self, d: Dispatcher, clock: Any) -> None:
        self.d = d
        self.clock = clock
        self.calls: list[tuple[float, str, int]] = []
        self.handles: dict[str, list[InProcessReplica]] = {m: [] for m in SERVICE}

    async def scale(self, model: str, n: int) -> None:
        self.calls.append((self.clock(), model, n))
        have = self.handles[model]
        if n > len(have):
            await asyncio.sleep(START_S)
            have += [
                InProcessReplica(model, Tag(model), service_s=SERVICE[model])
                for _ in range(n - len(have))
            ]
        del have[n:]
        self.d.set_replicas(model, list(have))


def _service(loop: asyncio.AbstractEventLoop, admission: bool = False) -> Any:
    d = Dispatcher(clock=loop.time)
    for m in SERVICE:
        d.add_model(
            m,
            batching=FixedBatching(1),
            admission=AdmissionConfig(mode="predicted") if admission and m == "m-slow" else None,
        )
    d.route("m", "m-slow")  # the plan's variant, as the server routes it

    async def pipeline(x: Any, ctx: Any) -> Any:
        return await ctx.predict("m", x)

    svc = Service([App.from_pipeline("app", pipeline, d, SLO_S)], dispatcher=d, models=SERVICE)
    return d, svc


def _switch_scenario(variant_queue: str) -> Any:
    async def scenario() -> Any:
        loop = asyncio.get_running_loop()
        d, svc = _service(loop)
        backend = FakeInProcessBackend(d, loop.time)
        await backend.scale("m-slow", 1)
        live = LiveTuner(
            backend, _plan(), TUNER, clock=loop.time, dispatcher=d, variant_queue=variant_queue
        )
        shared = dict(live.share_queues())  # what launch() does before the first query
        await asyncio.sleep(5.0 - loop.time())
        # six queries at 5 s: m-slow takes the first, five wait
        asks = [asyncio.ensure_future(svc.predict("app", i)) for i in range(6)]
        while d.stats("m-slow").in_flight == 0:
            await asyncio.sleep(0)
        # a 4x burst in the last second: the tuner switches m to the cheap variant
        for t in gamma_trace(BURST_QPS, 1.0, 1.0, np.random.default_rng(1), start_s=4.0):
            live.record(float(t))
        decision = live.tick()
        outs = [p.output for p in await asyncio.gather(*asks)]
        for _ in range(100):  # the old variant is stopped once its batch is done
            if live.applied:
                break
            await asyncio.sleep(0.01)
        switched = dict(live.variant_decisions[-1].switched) if decision else None
        await live.stop()
        await svc.close()
        await d.close()
        return shared, switched, outs, backend.calls, live.applied

    return scenario


def test_a_tuner_switch_sends_the_queued_queries_to_the_new_variant(vrun: Any) -> None:
    """At 5 s the busy ``m-slow`` replica holds q0 (5.0-5.05) and q1-q5 are queued; the tuner
    switches ``m`` to ``m-fast``, whose replica serves at 5.02. With the shared queue ``m-fast``
    serves q1-q5 and ``m-slow`` finishes q0 only, then is stopped (after 5.05); every query is
    answered. Fails without the shared queue: q1-q5 would finish on ``m-slow``."""
    shared, switched, outs, calls, applied = vrun(_switch_scenario("shared"))
    assert outs == [("m-slow", 0)] + [("m-fast", i) for i in range(1, 6)]
    assert shared == {"m": "shared"}
    assert switched == {"m": ("m-slow", "m-fast")}
    assert [(m, n) for _, m, n in calls[1:]] == [("m-fast", 1), ("m-slow", 0)]
    assert calls[2][0] >= 5.0 + SLOW_S  # stopped after its batch in flight
    assert len(applied) == 1 and applied[0].error is None


def test_per_variant_queues_keep_the_old_behaviour(vrun: Any) -> None:
    """``variant_queue: per_variant``: the queued queries finish on the old variant (which
    drains its own queue before it is stopped); none lost either."""
    shared, switched, outs, calls, applied = vrun(_switch_scenario("per_variant"))
    assert shared == {}
    assert switched == {"m": ("m-slow", "m-fast")}
    assert outs == [("m-slow", i) for i in range(6)]
    assert calls[2][1:] == ("m-slow", 0) and calls[2][0] >= 5.0 + 6 * SLOW_S
    assert len(applied) == 1 and applied[0].error is None


def _launched(variant_queue: str = "shared", *, admission: bool = False, variants: bool = True):
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        d, svc = _service(loop, admission)
        live = LiveTuner(
            FakeInProcessBackend(d, loop.time),
            _plan(),
            TUNER,
            clock=loop.time,
            dispatcher=d,
            variant_queue=variant_queue,
            variants=variants,
        )
        await live.launch(svc)
        out = d.shared, dict(live.queues)
        await live.stop()
        await d.close()
        return out

    return asyncio.run(main())


def test_launch_shares_the_variant_stage_queue_only_when_asked_and_able(caplog: Any) -> None:
    assert _launched() == ({"m": (("m-slow", "m-fast"), ("m-slow",))}, {"m": "shared"})
    assert _launched("per_variant") == ({}, {})
    assert _launched(variants=False) == ({}, {})  # --switching off: nothing switches
    # admission on a variant: one queue per variant, with a warning naming the field
    with caplog.at_level(logging.WARNING, logger="inferline.deploy._tuning_queue"):
        shared, queues = _launched(admission=True)
    assert shared == {} and queues["m"].startswith("admission:")
    assert "stage 'm' keeps one queue per variant" in caplog.text


def test_the_option_round_trips_and_is_validated_by_name() -> None:
    s = ServeSettings(variant_queue="per_variant")
    assert ServeSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert ServeSettings().variant_queue == "shared" and Loops().variant_queue == "shared"
    for bad in ("one", None, 1):
        with pytest.raises(ValidationError, match="variant_queue"):
            ServeSettings(variant_queue=bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="variant_queue"):
            ServeSettings.from_dict({"variant_queue": bad})
    with pytest.raises(ValidationError, match="variant_queue"):
        LiveTuner(None, _plan(), variant_queue="shard")
    from inferline.cli._server_args import add_server_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    assert p.parse_args([]).variant_queue == "shared"
    assert p.parse_args(["--variant-queue", "per_variant"]).variant_queue == "per_variant"
