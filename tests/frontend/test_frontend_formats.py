"""Profile fitting, deployment descriptions and profiler options: pure functions, seeded data."""

from __future__ import annotations

import numpy as np
import pytest

from inferline.core import NotFoundError, Profiles, ValidationError
from inferline.demo.pipeline import deployment_dict
from inferline.demo.simple import sleep_deployment
from inferline.deploy import AppSpec, Deployment, QueueSpec, import_object
from inferline.measure import ProfilerOptions, batch_sizes_up_to
from inferline.measure._profile_fit import (
    BatchFit,
    batch_profile,
    fit_batch_latency,
    profiles_from_samples,
)
from inferline.server import InputSpec


def _samples(fn, sizes=(1, 2, 4, 8, 16, 32), n=200, noise=0.0005, seed=0):
    rng = np.random.default_rng(seed)
    return {b: list(fn(b) + rng.exponential(noise, n)) for b in sizes}


def test_fit_recovers_a_linear_profile():
    s = _samples(lambda b: 0.004 + 0.001 * b)
    f = fit_batch_latency("m", "cpu", s, 0.5)
    # median of exponential(0.5 ms) noise is ~0.35 ms: it lands in the intercept
    assert f.slope_s == pytest.approx(0.001, rel=0.05)
    assert f.intercept_s == pytest.approx(0.004 + 0.0005 * np.log(2), abs=3e-4)
    assert f.linear and f.pseudo_r2 > 0.9
    assert f.predict(10) == pytest.approx(f.intercept_s + 10 * f.slope_s)
    hi = fit_batch_latency("m", "cpu", s, 0.99)
    assert hi.intercept_s > f.intercept_s


def test_fit_flags_non_linear_batching():
    # flat, then a cliff at 32 (e.g. a cache or memory limit)
    s = _samples(lambda b: 0.005 if b < 32 else 0.05)
    f = fit_batch_latency("m", "cpu", s, 0.5)
    assert not f.linear
    assert f.max_rel_deviation > 0.2


def test_fit_flat_noisy_profile_is_linear():
    s = _samples(lambda b: 0.001, noise=0.0003)
    assert fit_batch_latency("m", "cpu", s, 0.5).linear


def test_fit_single_batch_and_errors():
    f = fit_batch_latency("m", "cpu", {4: [0.01, 0.02, 0.03]}, 0.5)
    assert f.slope_s == 0.0 and f.intercept_s == pytest.approx(0.02)
    with pytest.raises(ValidationError):
        fit_batch_latency("m", "cpu", {}, 0.5)
    with pytest.raises(ValidationError):
        fit_batch_latency("m", "cpu", {1: [0.1]}, 1.5)
    assert BatchFit.from_dict(f.to_dict()) == f


def test_profiles_from_samples_summaries_and_monotone():
    s = {"m": {"cpu": {1: [0.010, 0.012, 0.011], 2: [0.009, 0.009, 0.010], 4: [0.02] * 3}}}
    p = profiles_from_samples(s, "mean")
    bs = p.models["m"]["cpu"]
    assert bs[1].latency_s == pytest.approx(0.011)
    # batch 2 measured faster than batch 1: noise, so it is raised to batch 1's latency
    assert bs[2].latency_s == pytest.approx(0.011)
    assert bs[4].samples == 3 and bs[4].p99_s == pytest.approx(0.02)
    assert Profiles.from_dict(p.to_dict()) == p
    p99 = profiles_from_samples(s, "p99")
    assert p99.models["m"]["cpu"][1].latency_s == pytest.approx(
        np.percentile([0.01, 0.012, 0.011], 99)
    )
    with pytest.raises(ValidationError):
        batch_profile([0.1], "median")
    with pytest.raises(ValidationError):
        batch_profile([], "mean")


def test_batch_sizes_and_options_roundtrip():
    assert batch_sizes_up_to(16) == [1, 2, 4, 8, 16]
    assert batch_sizes_up_to(12) == [1, 2, 4, 8, 12]
    assert batch_sizes_up_to(1) == [1]
    o = ProfilerOptions(max_batch_size=8, contention=True, hardware=("cpu",))
    assert ProfilerOptions.from_dict(o.to_dict()) == o
    with pytest.raises(ValidationError):
        ProfilerOptions(statistic="max")
    with pytest.raises(ValidationError):
        ProfilerOptions.from_dict({"bogus": 1})


def test_deployment_roundtrip_demo_and_sleep():
    for d in (deployment_dict(), sleep_deployment(default_output=0)):
        dep = Deployment.from_dict(d)
        assert Deployment.from_dict(dep.to_dict()) == dep
        assert dep.to_dict()["format"] == "inferline.deployment/1"
    dep = Deployment.from_dict(deployment_dict(slo_ms=80))
    app = dep.apps[0]
    assert app.slo_s == pytest.approx(0.08)
    assert app.has_default and app.input == InputSpec("float32", (64,))
    assert callable(app.pipeline_fn())
    s = Deployment.from_dict(sleep_deployment())
    assert not s.apps[0].has_default
    assert callable(s.apps[0].pipeline_fn())  # a factory called with pipeline_params
    assert len(s.load_sample_inputs()) > 0


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"format": "inferline.plan/1"}, "format"),
        ({"models": []}, "models"),
        ({"models": [{"name": "a"}, {"name": "a"}]}, "models"),
        ({"apps": {"x": {"slo_ms": 10}}}, "apps.x.pipeline"),
        ({"apps": {"x": {"pipeline": "a:b", "slo_ms": -1}}}, "apps.x.slo_ms"),
        ({"queue": {"max_queue": 0}}, "queue.max_queue"),
        ({"extra": 1}, ""),
    ],
)
def test_deployment_validation_names_the_field(patch, field):
    d = {**sleep_deployment(), **patch}
    with pytest.raises(ValidationError) as ei:
        Deployment.from_dict(d)
    assert field in ei.value.field


def test_import_object_errors():
    assert import_object("inferline.demo.simple:passthrough") is not None
    with pytest.raises(ValidationError):
        import_object("no_colon")
    with pytest.raises(ValidationError):
        import_object("inferline.nope_module:x")
    with pytest.raises(NotFoundError):
        import_object("inferline.demo.simple:nope")


def test_appspec_and_queue_roundtrip():
    a = AppSpec("a", "m:f", 0.1, default_output=None, pipeline_params={"k": 1})
    assert AppSpec.from_dict("a", a.to_dict(), "apps.a") == a
    assert a.has_default  # an explicit null default is a default
    q = QueueSpec(5, True, 0, 10)
    assert QueueSpec.from_dict(q.to_dict()) == q


def test_mean_profile_ignores_a_stall():
    from inferline.measure._profile_fit import trimmed_mean

    xs = [0.001] * 99 + [1.3]  # one machine stall while profiling a 1 ms model
    assert trimmed_mean(np.asarray(xs)) == pytest.approx(0.001)
    assert batch_profile(xs, "mean").latency_s == pytest.approx(0.001)
    assert batch_profile(xs, "mean").p99_s > 0.01  # the tail is still reported
    assert trimmed_mean(np.asarray([0.002, 0.004])) == pytest.approx(0.003)
