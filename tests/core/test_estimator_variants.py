"""A controller switching a stage to another model variant in the estimator (``StageSwitch``):
hand-computed event traces, billing, switching back, and the errors that name the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Profiles,
    StageSwitch,
    ValidationError,
    simulate,
)

CPU = DEFAULT_CATALOG.cost("cpu")
PIPE = Pipeline.linear("p", ["a"])
PROF = Profiles.from_latencies(
    {
        "a": {"cpu": {1: 1.0}},  # the stage's own profile: the slow variant
        "fast": {"cpu": {1: 0.25, 2: 0.3}},
        "gpu-only": {"gpu-k80": {1: 0.1}},
    }
)
OPT = EstimatorOptions(activation_delay_s=1.0)


class Script:
    """Returns the given decisions at the given times."""

    interval_s = 0.5

    def __init__(self, at: dict[float, dict[str, object]]) -> None:
        self.at = at

    def observe(self, now_s, new_arrivals, state):  # type: ignore[no-untyped-def]
        return self.at.get(now_s)


def cpu(b: int = 1, r: int = 1) -> ModelConfig:
    return ModelConfig("cpu", b, r)


def close(a: np.ndarray, b: list[float]) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_the_new_variant_takes_over_after_the_activation_delay() -> None:
    arr = np.array([0.0, 0.5, 1.2, 3.0, 3.0])
    ctl = Script({1.0: {"a": StageSwitch("fast", cpu(b=2))}})
    r = simulate(
        PIPE, {"a": cpu()}, PROF, arr, options=OPT, controller=ctl, variants={"a": ["fast"]}
    )
    # slow: q0 0-1, q1 1-2 (the old replica serves until the new one does, at 2.0);
    # fast from 2.0: q2 2.0-2.25, then q3 and q4 as one batch of 2, 3.0-3.3
    close(r.latencies_s, [1.0, 1.5, 1.05, 0.3, 0.3])
    assert r.variant_switches == ((1.0, "a", "fast"),)
    # one serving replica throughout: the old leaves when the new one serves
    assert r.replica_timeline == ((0.0, "a", 1), (2.0, "a", 1))
    # billed: the slow replica 0-2, the fast one from its request at 1.0 to the end (3.0)
    assert r.cost_per_hour == pytest.approx(CPU * (2.0 + 2.0) / 3.0)
    assert r.models["a"].batches == 4 and r.models["a"].visits == 5


def test_a_busy_old_replica_finishes_its_batch_and_queued_work_waits_for_the_new_one() -> None:
    # q1 starts on the slow replica at 1.9 and ends at 2.9, after the switch took effect at 2.0
    arr = np.array([0.0, 1.9, 2.1])
    ctl = Script({1.0: {"a": StageSwitch("fast", cpu())}})
    r = simulate(
        PIPE, {"a": cpu()}, PROF, arr, options=OPT, controller=ctl, variants={"a": ["fast"]}
    )
    close(r.latencies_s, [1.0, 1.0, 0.25])  # q2 on the fast replica at 2.1
    # the slow replica is billed until its batch ends at 2.9 (clipped to the span, 2.1)
    assert r.cost_per_hour == pytest.approx(CPU * (2.1 + 1.1) / 2.1)


def test_switching_back_before_the_old_replicas_left_keeps_them() -> None:
    arr = np.array([0.0, 0.5, 1.2, 3.0, 3.1])
    ctl = Script({1.0: {"a": StageSwitch("fast", cpu())}, 1.5: {"a": StageSwitch("a", cpu())}})
    r = simulate(
        PIPE, {"a": cpu()}, PROF, arr, options=OPT, controller=ctl, variants={"a": ["fast"]}
    )
    # the fast replica is cancelled before it serves; the slow one stays: 0-1, 1-2, 2-3, 3-4, 4-5
    close(r.latencies_s, [1.0, 1.5, 1.8, 1.0, 1.9])
    assert r.variant_switches == ((1.0, "a", "fast"), (1.5, "a", "a"))
    assert r.replica_timeline == ((0.0, "a", 1),)
    assert r.cost_per_hour == pytest.approx(CPU * (3.1 + 0.5) / 3.1)


def test_scaling_after_a_switch_scales_the_new_variant() -> None:
    arr = np.array([0.0, 3.0, 3.0, 3.0])
    ctl = Script({1.0: {"a": StageSwitch("fast", cpu())}, 2.0: {"a": cpu(r=3)}})
    r = simulate(
        PIPE, {"a": cpu()}, PROF, arr, options=OPT, controller=ctl, variants={"a": ["fast"]}
    )
    # three fast replicas by 3.0 (two more requested at 2.0, serving from 3.0)
    close(r.latencies_s, [1.0, 0.25, 0.25, 0.25])
    assert r.replica_timeline[-1] == (3.0, "a", 3)


@pytest.mark.parametrize(
    ("decision", "variants", "field"),
    [
        (StageSwitch("nope", cpu()), {"a": ["fast"]}, "controller.observe()['a'].variant"),
        (StageSwitch("fast", cpu(b=4)), {"a": ["fast"]}, "controller.observe()['a'].config"),
        (
            StageSwitch("fast", ModelConfig("gpu-k80", 1, 1)),
            {"a": ["fast"]},
            "controller.observe()['a'].config.hardware",
        ),
        (StageSwitch("fast", cpu()), {"a": ["gpu-only"]}, "variants.a"),
        (StageSwitch("fast", cpu()), {"zz": ["fast"]}, "variants"),
    ],
)
def test_bad_switches_name_the_field(decision, variants, field) -> None:  # type: ignore[no-untyped-def]
    ctl = Script({0.5: {"a": decision}})
    with pytest.raises(ValidationError) as e:
        simulate(
            PIPE,
            {"a": cpu()},
            PROF,
            np.array([0.0, 1.0]),
            options=OPT,
            controller=ctl,
            variants=variants,
        )
    assert e.value.field.startswith(field)


# -- properties ------------------------------------------------------------------------------
PIPE2 = Pipeline.linear("p2", ["a", "b"])
PROF2 = Profiles.from_latencies(
    {
        "a": {"cpu": {1: 0.20, 2: 0.25, 4: 0.30}},
        "a-v": {"cpu": {1: 0.05, 2: 0.06, 4: 0.08}},
        "b": {"cpu": {1: 0.10, 2: 0.15, 4: 0.20}},
        "b-v": {"cpu": {1: 0.30, 2: 0.35, 4: 0.40}},
    }
)


@st.composite
def scripts(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """Random switches and scalings at random ticks, each leaving the stage a replica (a
    stage starved of replicas ends the simulation unless the controller reacts at once: the
    driver's rule for a tuner that sees no arrivals)."""
    at: dict[float, dict[str, object]] = {}
    for _ in range(draw(st.integers(0, 8))):
        t = 0.25 * draw(st.integers(1, 40))
        stage = draw(st.sampled_from(["a", "b"]))
        n = draw(st.integers(1, 3))
        b = draw(st.sampled_from([1, 2, 4]))
        kind = draw(st.sampled_from(["own", "variant", "count"]))
        if kind == "count":
            at.setdefault(t, {})[stage] = cpu(b, n)
        else:
            at.setdefault(t, {})[stage] = StageSwitch(
                stage if kind == "own" else f"{stage}-v", cpu(b, n)
            )
    at[10.5] = {s: cpu(1, 1) for s in ("a", "b")}
    n = draw(st.integers(1, 80))
    arr = np.sort(np.array(draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))))
    delay = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return at, arr, delay


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scripts())
def test_every_query_finishes_no_faster_than_its_fastest_variants(script) -> None:  # type: ignore[no-untyped-def]
    """Nothing is lost or served impossibly fast however switches and scalings interleave
    (a switch back before the old replicas left, a count set mid-switch)."""
    at, arr, delay = script
    ctl = Script(at)
    ctl.interval_s = 0.25
    r = simulate(
        PIPE2,
        {"a": cpu(), "b": cpu()},
        PROF2,
        arr,
        options=EstimatorOptions(activation_delay_s=delay),
        controller=ctl,
        variants={"a": ["a-v"], "b": ["b-v"]},
    )
    assert np.all(np.isfinite(r.latencies_s))
    assert np.all(r.latencies_s >= 0.05 + 0.10 - 1e-12)
    assert r.cost_per_hour >= 0.0
    assert all(s.visits == arr.size for s in r.models.values())
