"""The wake-up extra: a batch that starts on an idle replica pays the profiled extra for that
idle time (``Profiles.wake_up``), hand-computed on small cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.core import (
    EstimatorOptions,
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    ValidationError,
    WakeProfile,
    pin_hardware,
    simulate,
    stage_profiles,
)

# +1 ms after 10 ms idle, +3 ms after 50 ms or more; linear in between and from 0 at no idle
WAKE = WakeProfile((0.010, 0.050), (0.001, 0.003))


def wake_prof(**lat: dict[int, float]) -> Profiles:
    base = Profiles.from_latencies({m: {"cpu": t} for m, t in lat.items()})
    return Profiles(base.models, {m: {"cpu": WAKE} for m in lat})


def close(a: np.ndarray, b: list[float]) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_extra_is_linear_from_zero_and_flat_after_the_last_point() -> None:
    assert WAKE.extra(0.0) == 0.0
    assert WAKE.extra(0.005) == pytest.approx(0.0005)
    assert WAKE.extra(0.030) == pytest.approx(0.002)
    assert WAKE.extra(0.050) == pytest.approx(0.003)
    assert WAKE.extra(10.0) == pytest.approx(0.003)


def test_a_batch_on_an_idle_replica_pays_the_extra_for_its_idle_time() -> None:
    p = Pipeline.linear("p", ["a"])
    arr = np.array([0.0, 0.005, 0.1, 0.13, 0.2])
    r = simulate(p, {"a": ModelConfig("cpu", 2, 1)}, wake_prof(a={1: 0.010, 2: 0.012}), arr)
    close(
        r.latencies_s,
        [
            0.013,  # a replica that never served is cold: the full extra
            0.018,  # queued behind q0; starts as q0 ends, so no idle time: 10 ms
            0.013,  # idle since 0.023 (77 ms): the full extra
            0.01135,  # idle since 0.113 (17 ms): 1 + 2 * 7/40 ms
            0.013,  # idle since 0.14135 (58.65 ms)
        ],
    )
    # the replica is busy for the extra too
    assert r.models["a"].utilization > 0
    busy = 0.013 + 0.010 + 0.013 + 0.01135 + 0.013
    assert r.models["a"].utilization == pytest.approx(busy / 0.213)


def test_wake_up_off_or_absent_gives_the_back_to_back_latencies() -> None:
    p = Pipeline.linear("p", ["a"])
    arr = np.array([0.0, 0.005, 0.1, 0.13, 0.2])
    c = {"a": ModelConfig("cpu", 2, 1)}
    off = simulate(
        p, c, wake_prof(a={1: 0.010, 2: 0.012}), arr, options=EstimatorOptions(wake_up=False)
    )
    plain = simulate(p, c, Profiles.from_latencies({"a": {"cpu": {1: 0.010, 2: 0.012}}}), arr)
    close(off.latencies_s, [0.010, 0.015, 0.010, 0.010, 0.010])
    close(plain.latencies_s, off.latencies_s.tolist())


def test_a_new_replica_is_idle_from_its_activation() -> None:
    p = Pipeline.linear("p", ["a"])
    arr = np.array([0.0, 0.05])
    r = simulate(
        p,
        {"a": ModelConfig("cpu", 1, 1)},
        wake_prof(a={1: 0.1}),
        arr,
        options=EstimatorOptions(activation_delay_s=0.02),
        schedule=[(0.01, "a", 2)],
    )
    # q0 on the first (cold) replica: 103 ms. The second is requested at 0.01 and serves
    # from 0.03; q1 at 0.05 finds it idle for 20 ms: +1.5 ms (not the 40 ms since its
    # request, nor "cold" as a replica that never served would be)
    close(r.latencies_s, [0.103, 0.1015])


def test_variants_and_pinned_profiles_keep_their_wake_up() -> None:
    base = Profiles.from_latencies({"a": {"cpu": {1: 0.01}}, "a_small": {"cpu": {1: 0.005}}})
    other = WakeProfile((0.02,), (0.004,))
    pr = Profiles(base.models, {"a": {"cpu": WAKE}, "a_small": {"cpu": other}})
    assert stage_profiles(pr, {"a": "a_small"}).wake("a", "cpu") == other
    plan = Plan("p", 0.1, {"a": ModelConfig("cpu", 1, 1)})
    assert pin_hardware(pr, plan).wake("a", "cpu") == WAKE


def test_profiles_round_trip_and_merge_with_wake_up() -> None:
    pr = wake_prof(a={1: 0.01})
    d = json.loads(json.dumps(pr.to_dict()))
    assert d["wake_up"] == {"a": {"cpu": {"idle_s": [0.01, 0.05], "extra_s": [0.001, 0.003]}}}
    assert Profiles.from_dict(d) == pr
    # re-profiling a pair without wake-up data drops the old extras; new ones replace
    fresh = Profiles.from_latencies({"a": {"cpu": {1: 0.02}}})
    assert pr.merged(fresh).wake("a", "cpu") is None
    assert fresh.merged(pr).wake("a", "cpu") == WAKE
    assert "wake_up" not in fresh.to_dict()


@pytest.mark.parametrize(
    ("wake", "field"),
    [
        ({"idle_s": [0.01], "extra_s": [0.001, 0.002]}, "wake_up.a.cpu.idle_s/extra_s"),
        ({"idle_s": [0.02, 0.01], "extra_s": [0.001, 0.002]}, "wake_up.a.cpu.idle_s"),
        ({"idle_s": [0.01, 0.02], "extra_s": [0.002, 0.001]}, "wake_up.a.cpu.extra_s"),
        ({"idle_s": [0.0], "extra_s": [0.001]}, "wake_up.a.cpu.idle_s"),
        ({"idle_s": [0.01], "extra_s": [-0.001]}, "wake_up.a.cpu.extra_s"),
        ({"idle_s": [0.01]}, "wake_up.a.cpu.extra_s"),
    ],
)
def test_bad_wake_up_names_the_field(wake: dict, field: str) -> None:
    d = wake_prof(a={1: 0.01}).to_dict()
    d["wake_up"]["a"]["cpu"] = wake
    with pytest.raises(ValidationError) as e:
        Profiles.from_dict(d)
    assert e.value.field == field


def test_wake_up_of_an_unprofiled_pair_is_refused() -> None:
    d = wake_prof(a={1: 0.01}).to_dict()
    d["wake_up"]["a"]["gpu-k80"] = d["wake_up"]["a"]["cpu"]
    with pytest.raises(ValidationError, match=r"wake_up\.a\.gpu-k80"):
        Profiles.from_dict(d)


def test_from_samples_floors_at_zero_and_never_decreases() -> None:
    w = WakeProfile.from_samples(0.001, {0.1: 0.003, 0.005: 0.0009, 0.02: 0.0025, 0.05: 0.002})
    assert w.idle_s == (0.005, 0.02, 0.05, 0.1)
    assert w.extra_s == pytest.approx((0.0, 0.0015, 0.0015, 0.002))


def test_estimator_options_round_trip_wake_up() -> None:
    o = EstimatorOptions(wake_up=False)
    assert EstimatorOptions.from_dict(o.to_dict()) == o
    assert EstimatorOptions.from_dict({}).wake_up is True
    with pytest.raises(ValidationError, match="wake_up"):
        EstimatorOptions.from_dict({"wake_up": "yes"})


def test_profiler_options_check_and_round_trip_the_idle_gaps() -> None:
    from inferline.measure import ProfilerOptions

    o = ProfilerOptions(wake_idle_s=(0.01, 0.05), wake_samples=5)
    assert ProfilerOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    assert ProfilerOptions(wake_idle_s=()).wake_idle_s == ()
    for bad in ((0.05, 0.01), (0.0,), (0.01, 0.01)):
        with pytest.raises(ValidationError, match="wake_idle_s"):
            ProfilerOptions(wake_idle_s=bad)
    with pytest.raises(ValidationError, match="wake_samples"):
        ProfilerOptions(wake_samples=2)
