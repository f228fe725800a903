"""Steering Triton, the pure parts: its Prometheus page as counters per model
(``parse_triton_metrics``) and a planned batcher merged into the operator's config
(``steer_config``)."""

from __future__ import annotations

import copy

import pytest

from inferline.adapters.triton import metrics_url_for, parse_triton_metrics, steer_config
from inferline.core import ValidationError

# Captured from the harness's Triton 2.51 (``--metrics-config summary_latencies=true``), with
# a second version and a second model added by hand.
PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="digits_pre",version="1"} 20
nv_inference_request_success{model="digits_pre",version="2"} 5
nv_inference_request_success{model="digits",version="1"} 7
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="digits_pre",reason="OTHER",version="1"} 1
nv_inference_request_failure{model="digits_pre",reason="REJECTED",version="1"} 2
# TYPE nv_inference_count counter
nv_inference_count{model="digits_pre",version="1"} 20
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="digits_pre",version="1"} 4
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="digits_pre",version="1"} 22000
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="digits_pre",version="1"} 548
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="digits_pre",version="1"} 350
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="digits_pre",version="1"} 19778
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="digits_pre",version="1"} 1275
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="digits_pre",version="1"} 3
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="digits_pre",version="1"} 20
nv_inference_request_summary_us_sum{model="digits_pre",version="1"} 22000
nv_inference_request_summary_us{model="digits_pre",version="1",quantile="0.5"} 138
nv_inference_request_summary_us{model="digits_pre",version="1",quantile="0.99"} 208
nv_inference_request_summary_us{model="digits",version="1",quantile="0.99"} NaN
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.5
"""


def test_counters_per_model_summed_over_versions_and_reasons() -> None:
    got = parse_triton_metrics(PAGE)
    assert got["digits_pre"] == {
        "request_success": 25.0,
        "request_failure": 3.0,
        "inference_count": 20.0,
        "exec_count": 4.0,
        "request_us": 22000.0,
        "queue_us": 548.0,
        "compute_us": 350.0 + 19778.0 + 1275.0,  # input + infer + output: the batch's service
        "request_p99_us": 208.0,
    }
    assert got["digits"] == {"request_success": 7.0}  # a NaN quantile (empty window) is left out
    assert parse_triton_metrics(PAGE, ["digits", "absent"]) == {"digits": {"request_success": 7.0}}


def test_metrics_url_default_is_tritons_port_on_the_servers_host() -> None:
    assert metrics_url_for("10.0.0.5:8000", None) == "http://10.0.0.5:8002/metrics"
    assert metrics_url_for("[::1]:8000", None) == "http://[::1]:8002/metrics"
    assert metrics_url_for("h:1", "http://m:9/metrics") == "http://m:9/metrics"


OPERATOR = {
    "name": "digits_pre",
    "backend": "python",
    "max_batch_size": 64,
    "instance_group": [
        {"name": "main", "kind": "KIND_CPU", "count": 1, "rate_limiter": {"priority": 2}},
        {"name": "pinned", "kind": "KIND_CPU", "count": 1},
    ],
    "dynamic_batching": {
        "max_queue_delay_microseconds": 700,
        "preserve_ordering": True,
        "default_queue_policy": {"max_queue_size": 50, "timeout_action": "DELAY"},
    },
    "model_warmup": [{"name": "w", "batch_size": 1}],
    "parameters": {"k": {"string_value": "v"}},
}
BATCHER = {
    "kind": "triton",
    "max_batch_size": 8,
    "preferred_batch_size": [4],
    "max_queue_delay_microseconds": 2000,
    "default_timeout_microseconds": 90000,
}


def test_steer_config_sets_the_plan_and_keeps_the_operators_settings() -> None:
    before = copy.deepcopy(OPERATOR)
    cfg = steer_config(OPERATOR, BATCHER, 3)
    assert OPERATOR == before  # input untouched
    assert cfg["max_batch_size"] == 8
    assert [g["count"] for g in cfg["instance_group"]] == [2, 1]  # 3 in all, pinned kept
    assert cfg["instance_group"][0]["rate_limiter"] == {"priority": 2}
    assert cfg["dynamic_batching"] == {
        "max_queue_delay_microseconds": 2000,
        "preferred_batch_size": [4],
        "preserve_ordering": True,
        "default_queue_policy": {
            "max_queue_size": 50,
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 90000,
            "allow_timeout_override": True,
        },
    }
    for k in ("model_warmup", "parameters", "backend"):
        assert cfg[k] == OPERATOR[k]


def test_steer_config_edges() -> None:
    # fewer instances than the operator's other groups hold: the first group keeps one
    assert [g["count"] for g in steer_config(OPERATOR, BATCHER, 1)["instance_group"]] == [1, 1]
    # no timeout planned: the operator's queue policy stays; no preferred size: unset
    b = {**BATCHER, "default_timeout_microseconds": 0, "preferred_batch_size": []}
    db = steer_config(OPERATOR, b, 2)["dynamic_batching"]
    assert db["default_queue_policy"] == OPERATOR["dynamic_batching"]["default_queue_policy"]
    assert "preferred_batch_size" not in db
    # a model without a batch dimension keeps it, and gets no batcher
    flat = {**OPERATOR, "max_batch_size": 0, "dynamic_batching": None}
    flat.pop("dynamic_batching")
    out = steer_config(flat, BATCHER, 2)
    assert out["max_batch_size"] == 0 and "dynamic_batching" not in out
    with pytest.raises(ValidationError, match="kind"):
        steer_config(OPERATOR, {**BATCHER, "kind": "tfserving"}, 2)
