"""TF Serving steer pieces without a server: the batching parameters' text, the plan's
batcher with the instance count, the Prometheus page as counters, and the version
directories inferline adds and takes away."""

from __future__ import annotations

import pytest

from inferline.adapters.tfserving import (
    ServedModel,
    batching_text,
    parse_batching_text,
)
from inferline.adapters.tfserving._metrics import parse_tfserving_metrics
from inferline.adapters.tfserving._steer import steer_batcher
from inferline.adapters.tfserving._versions import (
    MARKER,
    added_versions,
    local_root,
    make_version,
    operator_versions,
    remove_added,
    staged_entry,
)
from inferline.core import TFServingBatcher, ValidationError


def test_batching_text_round_trips_and_validates() -> None:
    b = TFServingBatcher(32, 1500, 3, 7, (8, 16, 32))
    text = batching_text(b.to_dict(), "# head\n")
    assert text.startswith("# head\nmax_batch_size { value: 32 }\n")
    got = parse_batching_text(text)
    assert TFServingBatcher.from_dict({"kind": "tfserving", **got}) == b
    assert parse_batching_text("max_batch_size { value: 4 }") == {
        "max_batch_size": 4,
        "allowed_batch_sizes": [],
    }
    with pytest.raises(ValidationError, match="allowed_batch_sizes"):
        batching_text({"kind": "tfserving", "max_batch_size": 8, "allowed_batch_sizes": [4]})
    with pytest.raises(ValidationError, match=r"p\.max_batch_size"):
        parse_batching_text("max_batch_size: 4", "p")  # not the wrapped form


def test_instances_are_batch_threads_and_scale_the_queue_bound() -> None:
    doc = TFServingBatcher(8, 500, 2, 6, (4, 8)).to_dict()
    assert steer_batcher("m", doc, 2) == TFServingBatcher(8, 500, 2, 6, (4, 8))
    assert steer_batcher("m", doc, 5) == TFServingBatcher(8, 500, 5, 15, (4, 8))
    assert steer_batcher("m", doc, 1).max_enqueued_batches == 3
    with pytest.raises(ValidationError, match=r"server_batchers\.m\.kind"):
        steer_batcher("m", {"kind": "triton", "max_batch_size": 8}, 1)
    with pytest.raises(ValidationError, match=r"server_batchers\.m\.instances"):
        steer_batcher("m", doc, 0)
    with pytest.raises(ValidationError, match=r"server_batchers\.m\.batch_timeout_micros"):
        steer_batcher("m", {**doc, "batch_timeout_micros": -1}, 1)


PAGE = """# TYPE :tensorflow:serving:request_count counter
:tensorflow:serving:request_count{model_name="m",status="OK"} 12
:tensorflow:serving:request_count{model_name="m",status="UNAVAILABLE"} 2
:tensorflow:serving:request_count{model_name="other",status="OK"} 5
# TYPE :tensorflow:serving:batching_session:wrapped_run_count counter
:tensorflow:serving:batching_session:wrapped_run_count 4
# TYPE :tensorflow:serving:request_latency histogram
:tensorflow:serving:request_latency_bucket{model_name="m",API="predict",entrypoint="REST",le="+Inf"} 10
:tensorflow:serving:request_latency_sum{model_name="m",API="predict",entrypoint="REST"} 1000
:tensorflow:serving:request_latency_count{model_name="m",API="predict",entrypoint="REST"} 10
:tensorflow:serving:request_latency_sum{model_name="m",API="predict",entrypoint="GRPC"} 500
:tensorflow:serving:request_latency_count{model_name="m",API="predict",entrypoint="GRPC"} 4
# TYPE :tensorflow:serving:runtime_latency histogram
:tensorflow:serving:runtime_latency_sum{model_name="m",API="Predict",runtime="TF1"} 700
:tensorflow:serving:runtime_latency_count{model_name="m",API="Predict",runtime="TF1"} 12
# TYPE :tensorflow:serving:batching_session:queuing_latency histogram
:tensorflow:serving:batching_session:queuing_latency_sum{thread_pool_name="m"} 300
:tensorflow:serving:batching_session:queuing_latency_count{thread_pool_name="m"} 12
:tensorflow:serving:batching_session:queuing_latency_sum{thread_pool_name="other"} 90
:tensorflow:serving:batching_session:queuing_latency_count{thread_pool_name="other"} 5
"""


def test_prometheus_page_as_counters() -> None:
    got = parse_tfserving_metrics(PAGE, ["m"])
    assert got == {
        "m": {
            "request_success": 12.0,
            "request_failure": 2.0,
            "request_us": 1500.0,
            "compute_us": 700.0,
            "queue_us": 300.0,  # not the pool named after the other model
            "exec_count": 4.0,  # server-wide: only for a single model
        }
    }
    two = parse_tfserving_metrics(PAGE, ["m", "other"])
    assert "exec_count" not in two["m"] and two["other"] == {
        "request_success": 5.0,
        "queue_us": 90.0,
    }
    assert parse_tfserving_metrics(PAGE, ["nope"]) == {"nope": {}}


def _model(tmp_path):  # type: ignore[no-untyped-def]
    root = tmp_path / "m"
    for v in (1, 3):
        (root / str(v)).mkdir(parents=True)
        (root / str(v) / "model.npz").write_bytes(b"weights")
        (root / str(v) / "batching_params.pbtxt").write_text(f"operator's {v}\n")
    return root


def test_a_new_version_copies_the_served_one_and_leaves_it_untouched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = _model(tmp_path)
    new = make_version(root, 3, "max_batch_size { value: 4 }\n", "m")
    assert new == 4 and (root / "4" / "model.npz").read_bytes() == b"weights"
    assert (root / "4" / "batching_params.pbtxt").read_text() == "max_batch_size { value: 4 }\n"
    assert (root / "3" / "batching_params.pbtxt").read_text() == "operator's 3\n"  # not linked
    assert (root / "4" / MARKER).is_file() and not (root / "3" / MARKER).exists()
    assert make_version(root, 4, "x\n", "m") == 5 and not (root / "5" / "x").exists()
    assert added_versions(root) == [4, 5] and operator_versions(root) == [1, 3]
    assert sorted(p.name for p in root.iterdir()) == ["1", "3", "4", "5"]  # no temporary left
    assert remove_added(root, [4]) == [4] and remove_added(root) == [5]
    assert sorted(p.name for p in root.iterdir()) == ["1", "3"]
    assert remove_added(root) == []


def test_staged_entry_holds_the_operators_versions_and_the_served(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = _model(tmp_path)
    latest = ServedModel("m", str(root))
    assert staged_entry(latest, [3]) is None  # nothing of inferline's: nothing to stage
    make_version(root, 3, "x\n", "m")
    assert staged_entry(latest, [4]) == ServedModel("m", str(root), versions=(3, 4))
    two = ServedModel("m", str(root), latest=2)
    assert staged_entry(two, [4]).versions == (1, 3, 4)  # type: ignore[union-attr]
    spec = ServedModel("m", str(root), versions=(1,))
    assert staged_entry(spec, [4]).versions == (1, 4)  # type: ignore[union-attr]
    assert staged_entry(ServedModel("m", "gs://bucket/m"), [4]) is None
    with pytest.raises(ValidationError, match=r"m\.base_path"):
        local_root(ServedModel("m", "gs://bucket/m"), "m.base_path")
    with pytest.raises(ValidationError, match=r"m\.base_path"):
        local_root(ServedModel("m", str(tmp_path / "missing")), "m.base_path")
