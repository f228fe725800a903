"""The steer loop's pure decisions: counters to figures, a tick's arrivals, the tuner's
instance counts (``SteerController``), and an ensemble's steps as a pipeline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferline.core import Plan, ValidationError
from inferline.deploy import ModelFigures, SteerController, ensemble_pipeline
from inferline.deploy._steer_policy import counter_delta, spread_arrivals

STEPS = ("pre", "mlp")


def _plan(rate: float = 20.0, per: float = 25.0) -> Plan:
    windows = [0.25, 0.5, 1.0, 2.0, 4.0]
    b = {"kind": "triton", "max_batch_size": 4, "default_timeout_microseconds": 90000}
    return Plan.from_dict(
        {
            "format": "inferline.plan/1",
            "pipeline": "app",
            "slo_s": 0.1,
            "models": {m: {"hardware": "cpu", "max_batch_size": 4, "replicas": 1} for m in STEPS},
            "server_batchers": {m: b for m in STEPS},
            "tuner": {
                "service_time_s": 0.004,
                "envelope": [[w, math.ceil(rate * w)] for w in windows],
                "mean_rate_qps": rate,
                "models": {
                    m: {"scale_factor": 1.0, "throughput_qps": per, "max_provisioning_ratio": 1.0}
                    for m in STEPS
                },
            },
        }
    )


def test_counter_delta_counts_a_reset_from_zero() -> None:
    prev = {"m": {"request_success": 10.0, "exec_count": 5.0}}
    cur = {"m": {"request_success": 14.0, "exec_count": 2.0, "request_p99_us": 9.0}, "n": {}}
    assert counter_delta(prev, cur) == {
        "m": {"request_success": 4.0, "exec_count": 2.0},  # exec_count went back: reloaded
        "n": {},
    }


def test_model_figures() -> None:
    d = {
        "request_success": 18.0,
        "request_failure": 2.0,
        "inference_count": 20.0,
        "exec_count": 5.0,
        "compute_us": 36_000.0,  # each of the 18 served requests counts its 2 ms batch
        "queue_us": 4_000.0,
        "request_us": 36_000.0,
    }
    f = ModelFigures.of(d, 2.0)
    assert (f.requests, f.failures, f.rate_qps, f.mean_batch) == (20.0, 2.0, 10.0, 4.0)
    assert f.service_s == pytest.approx(0.002)  # per batch, not 36 ms / 5 batches
    assert f.queue_s == pytest.approx(0.0002) and f.latency_s == pytest.approx(0.002)
    assert ModelFigures.of({}, 1.0).mean_batch == 0.0


def test_spread_arrivals_are_sorted_within_the_tick_and_seeded() -> None:
    a = spread_arrivals(50, 3.0, 4.0, np.random.default_rng(7))
    assert a.size == 50 and np.all(np.diff(a) >= 0) and a.min() > 3.0 and a.max() <= 4.0
    assert np.array_equal(a, spread_arrivals(50, 3.0, 4.0, np.random.default_rng(7)))
    assert spread_arrivals(0, 3.0, 4.0, np.random.default_rng(7)).size == 0


def _run(ctl: SteerController, rates: list[float], t0: float, tick: float) -> list[object]:
    """Feed ``ctl`` the app's counter growing at each rate for one tick; the decisions."""
    rng = np.random.default_rng(0)
    n, t, out = 0.0, t0, []
    ctl.observe({"app": {"request_success": n}}, t, rng)
    for r in rates:
        n += r * tick
        t += tick
        out.append(ctl.observe({"app": {"request_success": n}}, t, rng).decision)
    return out


def test_controller_scales_up_on_a_burst_and_back_down_after_it() -> None:
    ctl = SteerController(_plan(), "app", start_s=0.0)
    assert _run(ctl, [8.0] * 10, 0.0, 0.5) == [None] * 10  # within the plan: no change
    up = [d for d in _run(ctl, [60.0] * 6, 5.0, 0.5) if d is not None]
    assert up and up[0].action == "up"
    # 60 q/s at 25 q/s an instance: 3, or 4 for a short window's burst above 75 q/s
    assert ctl.replicas["pre"] == ctl.replicas["mlp"] in (3, 4)
    down = [d for d in _run(ctl, [8.0] * 240, 8.0, 0.5) if d is not None]
    assert down and down[-1].action == "down"
    assert ctl.replicas == {"pre": 1, "mlp": 1}  # the plan's, once stable


def test_controller_reads_the_measured_p99_and_needs_tuner_inputs() -> None:
    ctl = SteerController(_plan(), "app")
    t = ctl.observe({"app": {"request_success": 0.0, "request_p99_us": 2500.0}}, 0.0, None)  # type: ignore[arg-type]
    assert t.measured_p99_s == pytest.approx(0.0025) and t.decision is None
    with pytest.raises(ValidationError, match="tuner"):
        SteerController(Plan("app", 0.1, _plan().models), "app")


ENSEMBLE = {
    "name": "e",
    "platform": "ensemble",
    "ensemble_scheduling": {
        "step": [
            {"model_name": "b", "input_map": {"x": "t1"}, "output_map": {"y": "out"}},
            {"model_name": "a", "input_map": {"image": "image"}, "output_map": {"f": "t1"}},
            {"model_name": "c", "input_map": {"x": "image"}, "output_map": {"y": "out2"}},
        ]
    },
}


def test_ensemble_steps_become_a_pipeline_in_data_flow_order() -> None:
    p = ensemble_pipeline("e", ENSEMBLE)
    assert p.name == "e" and p.models == ("a", "b", "c") and p.edges == (("a", "b"),)


def test_ensemble_refusals_name_the_field() -> None:
    with pytest.raises(ValidationError, match="step"):
        ensemble_pipeline("e", {"ensemble_scheduling": {"step": []}})
    twice = {"ensemble_scheduling": {"step": [{"model_name": "a"}, {"model_name": "a"}]}}
    with pytest.raises(ValidationError, match=r"step\[1\]"):
        ensemble_pipeline("e", twice)
    loop = {
        "ensemble_scheduling": {
            "step": [
                {"model_name": "a", "input_map": {"x": "u"}, "output_map": {"y": "v"}},
                {"model_name": "b", "input_map": {"x": "v"}, "output_map": {"y": "u"}},
            ]
        }
    }
    with pytest.raises(ValidationError, match="cycles"):
        ensemble_pipeline("e", loop)


class _StubLoop:
    """Stands in for a running SteerLoop: the admin app only reads its snapshot."""

    def snapshot(self) -> dict[str, object]:
        return {"enabled": True, "steer": True, "instances": {"pre": 2}}


def test_admin_app_wants_the_token_and_serves_drift_metrics_and_detach() -> None:
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry, Gauge

    from inferline.deploy._steer_admin import SteerRoutes, steer_app

    reg = CollectorRegistry()
    Gauge("inferline_estimated_p99_seconds", "e", ["app"], registry=reg).labels("a").set(0.05)
    detached: list[bool] = []

    async def detach() -> dict[str, object]:
        detached.append(True)
        return {"backend": "triton://x:1"}

    c = TestClient(steer_app(SteerRoutes(_StubLoop(), reg, detach), token="s3cret"))
    assert c.get("/health").status_code == 200  # probes need no token
    assert c.get("/admin/drift").status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert c.get("/admin/drift", headers=auth).json()["instances"] == {"pre": 2}
    assert (
        b'inferline_estimated_p99_seconds{app="a"} 0.05' in c.get("/metrics", headers=auth).content
    )
    assert c.post("/admin/detach").status_code == 401 and not detached
    assert c.post("/admin/detach", headers=auth).json() == {"backend": "triton://x:1"}
    assert detached == [True]
