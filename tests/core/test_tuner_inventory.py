"""A simulated tuner held to the deployment's inventory (``InventoryCap``), as the live one is
by a backend that refuses a scale-up it has no room for."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    InferLineController,
    InventoryCap,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    SystemState,
    TunerConfig,
    gamma_trace,
    plan_inferline,
    simulate,
)


@dataclass
class Scripted:
    """A controller that answers each call with the next entry of ``script``."""

    script: list[dict]
    interval_s: float = 1.0
    calls: int = field(default=0)

    def observe(self, now_s, new_arrivals, state):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.script.pop(0) if self.script else None


def state(**counts: int) -> SystemState:
    zero = {m: 0 for m in counts}
    return SystemState(0.0, zero, zero, dict(counts), zero, 0)


def at_most(total: int):  # type: ignore[no-untyped-def]
    return lambda counts: sum(counts.values()) <= total


def test_a_scale_up_is_cut_to_what_fits_and_the_rest_retried() -> None:
    cap = InventoryCap(Scripted([{"a": 5}, None, {"b": 1}, None]), at_most(4))
    none = np.zeros(0)
    assert cap.observe(1.0, none, state(a=1, b=2)) == {"a": 2}  # 1 + 2 fit beside b's 2
    assert cap.capped == 1
    # nothing new: the cut target is asked for again, and still does not fit
    assert cap.observe(2.0, none, state(a=2, b=2)) == {"a": 2}
    # b shrinks: its decision goes first, then a's retried target takes the room
    assert cap.observe(3.0, none, state(a=2, b=2)) == {"b": 1, "a": 3}
    assert cap.capped == 1  # a retry that is cut again is not a new cut decision
    assert cap.observe(4.0, none, state(a=3, b=1)) == {"a": 3}


def test_a_newer_decision_replaces_a_cut_one_and_scale_downs_pass() -> None:
    cap = InventoryCap(Scripted([{"a": 9}, {"a": 1}, None]), at_most(3))
    none = np.zeros(0)
    assert cap.observe(1.0, none, state(a=1, b=1)) == {"a": 2}
    assert cap.observe(2.0, none, state(a=2, b=1)) == {"a": 1}
    assert cap.observe(3.0, none, state(a=1, b=1)) is None  # nothing left to retry
    assert cap.interval_s == 1.0 and cap.calls == 3  # the wrapped controller's attributes


def test_ladder_configs_keep_their_batch_size_with_fewer_replicas() -> None:
    cap = InventoryCap(Scripted([{"a": ModelConfig("cpu", 8, 6)}]), at_most(3))
    assert cap.observe(1.0, np.zeros(0), state(a=1)) == {"a": ModelConfig("cpu", 8, 3)}


def test_simulated_tuner_never_holds_more_than_the_inventory() -> None:
    pipe = Pipeline.linear("p", ["a", "b"])
    prof = Profiles.from_latencies(
        {"a": {"cpu": {1: 0.02, 2: 0.03, 4: 0.05}}, "b": {"cpu": {1: 0.01, 2: 0.015, 4: 0.025}}}
    )
    rng = np.random.default_rng(3)
    sample = gamma_trace(60.0, 1.0, 60.0, rng)
    plan: Plan = plan_inferline(pipe, prof, sample, 0.2)
    burst = np.concatenate(
        [gamma_trace(60.0, 1.0, 20.0, rng), gamma_trace(300.0, 1.0, 20.0, rng, start_s=20.0)]
    )
    cfg = TunerConfig(interval_s=0.1)
    free = simulate(
        pipe, plan.models, prof, burst, controller=InferLineController(plan, cfg, start_s=0.0)
    )
    peak = _peak(free.replica_timeline)
    assert peak > 6  # the burst needs more than the inventory below
    options = PlannerOptions(inventory={"cpu": 6})
    ctl = InventoryCap.for_plan(
        InferLineController(plan, cfg, start_s=0.0), plan.models, DEFAULT_CATALOG, options
    )
    held = simulate(pipe, plan.models, prof, burst, controller=ctl)
    assert _peak(held.replica_timeline) <= 6 and ctl.capped >= 1
    assert held.percentile(99) > free.percentile(99)  # fewer replicas: a worse tail
    assert held.cost_per_hour < free.cost_per_hour


def _peak(timeline) -> int:  # type: ignore[no-untyped-def]
    counts: dict[str, int] = {}
    peak = 0
    for _, m, n in timeline:
        counts[m] = n
        peak = max(peak, sum(counts.values()))
    return peak
