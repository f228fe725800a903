"""Unit tests of the Triton adapter's pure parts (no server): tensor mapping, configuration
building, statistics intervals, error classification, URLs. The adapter against a real
Triton server is tested in ``integration/test_triton*.py``."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferline.adapters.triton import (
    BatcherSettings,
    ClientTiming,
    ModelIO,
    TensorSpec,
    TritonBackend,
    TritonModelInfo,
    build_config,
    cumulative_figures,
    instance_count,
    interval_figures,
    parse_triton_url,
    triton_datatype,
)
from inferline.adapters.triton._client import (
    TritonConnectionError,
    TritonModelMissing,
    TritonServerError,
    _ints,
    classify,
)
from inferline.core import BackendError, ModelConfig, ModelSpec, NotFoundError, ValidationError

CONFIG = {
    "name": "clf",
    "backend": "python",
    "max_batch_size": 16,
    "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [64]}],
    "output": [
        {"name": "probs", "data_type": "TYPE_FP32", "dims": [10]},
        {"name": "label", "data_type": "TYPE_INT64", "dims": [1]},
        {"name": "name", "data_type": "TYPE_STRING", "dims": [1]},
    ],
    "instance_group": [{"name": "clf_0", "kind": "KIND_CPU", "count": 1, "gpus": []}],
    "dynamic_batching": {"max_queue_delay_microseconds": 100},
}


# -- tensors ---------------------------------------------------------------------------------


def test_datatypes_and_io_from_config() -> None:
    assert triton_datatype("TYPE_FP32") == "FP32"
    assert triton_datatype("TYPE_STRING") == "BYTES"
    assert triton_datatype("INT8") == "INT8"
    io = ModelIO.from_config(CONFIG)
    assert io.max_batch_size == 16
    assert io.inputs == (TensorSpec("features", "FP32", (64,)),)
    assert [t.datatype for t in io.outputs] == ["FP32", "INT64", "BYTES"]
    assert ModelIO.from_dict(io.to_dict()) == io
    assert TensorSpec("x", "FP16", [2]).np_dtype == np.float16
    with pytest.raises(ValidationError):
        _ = TensorSpec("x", "COMPLEX", (1,)).np_dtype


def test_encode_casts_fits_shapes_and_names_bad_items() -> None:
    io = ModelIO.from_config(CONFIG)
    x64 = np.linspace(0, 1, 64)  # float64 -> FP32 (same kind)
    enc = io.encode_item(x64)
    assert enc["features"].dtype == np.float32 and enc["features"].shape == (64,)
    assert io.encode_item(list(range(64)))["features"].dtype == np.float32  # int -> float ok
    assert io.encode_item({"features": x64})["features"].shape == (64,)
    for bad, why in [
        (np.zeros(63), "shape [64]"),
        (np.zeros((8, 8)), "shape [64]"),
        (["a"] * 64, "numeric"),
        ({"other": x64}, "mapping"),
    ]:
        with pytest.raises(ValidationError) as e:
            io.encode_item(bad, "clf.inputs[3]")
        assert "clf.inputs[3]" in str(e.value) and why in str(e.value)
    ints = ModelIO((TensorSpec("label", "INT64", (1,)),), (), 8)
    assert ints.encode_item(7)["label"].tolist() == [7]  # a scalar fits [1]
    assert ints.encode_item([[7]])["label"].shape == (1,)  # extra size-1 dims dropped
    with pytest.raises(ValidationError):
        ints.encode_item(2.5)  # float -> int is not same-kind
    var = ModelIO((TensorSpec("seq", "INT32", (-1,)),), (), 8)
    assert var.encode_item([1, 2, 3])["seq"].shape == (3,)
    with pytest.raises(ValidationError):
        var.encode_item(5)  # a scalar does not fit a variable-length vector


def test_encode_bytes_and_multi_input() -> None:
    io = ModelIO(
        (TensorSpec("text", "BYTES", (1,)), TensorSpec("k", "INT32", (1,))),
        (TensorSpec("out", "BYTES", (2,)),),
        4,
    )
    enc = io.encode_item({"text": "héllo", "k": 3})
    assert enc["text"].dtype == object and enc["text"].tolist() == ["héllo".encode()]
    assert enc["k"].dtype == np.int32
    assert io.encode_item({"text": [b"raw"], "k": [1]})["text"].tolist() == [b"raw"]
    with pytest.raises(ValidationError):
        io.encode_item({"text": 3, "k": 1})  # BYTES wants str or bytes
    with pytest.raises(ValidationError):
        io.encode_item("just text")  # two inputs need a mapping
    batch = ModelIO.stack([enc, io.encode_item({"text": "b", "k": 1})], ["text", "k"])
    assert batch["text"].shape == (2, 1) and batch["k"].tolist() == [[3], [1]]


def test_decode_rows_scalars_strings_and_mappings() -> None:
    io = ModelIO.from_config(CONFIG)
    n = 3
    outs = {
        "probs": np.tile(np.arange(10, dtype=np.float32), (n, 1)),
        "label": np.array([[4], [2], [9]], dtype=np.int64),
        "name": np.array([[b"four"], [b"two"], [b"\xff"]], dtype=object),
    }
    labels = io.decode(outs, n, ["label"])
    assert labels == [4, 2, 9] and isinstance(labels[0], np.integer)
    assert io.decode(outs, n, ["name"]) == ["four", "two", b"\xff"]  # undecodable stays bytes
    both = io.decode(outs, n, ["probs", "label"])
    assert set(both[0]) == {"probs", "label"} and both[1]["probs"].shape == (10,)
    with pytest.raises(ValidationError):
        io.decode(outs, 4, ["label"])  # wrong number of rows
    with pytest.raises(ValidationError):
        io.decode({}, n, ["label"])
    words = ModelIO((), (TensorSpec("w", "BYTES", (2,)),), 4)
    out = words.decode({"w": np.array([[b"a", b"b"]], dtype=object)}, 1, ["w"])
    assert out[0].tolist() == ["a", "b"]
    unbatched = ModelIO((), (TensorSpec("y", "FP32", (2, 2)),), 0)
    (y,) = unbatched.decode({"y": np.eye(2, dtype=np.float32)}, 1, ["y"], batched=False)
    np.testing.assert_array_equal(y, np.eye(2))


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["FP32", "FP64", "INT32", "INT64", "UINT8"]),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
)
def test_encode_stack_decode_round_trip(dt: str, dims: list[int], n: int, seed: int) -> None:
    spec = TensorSpec("t", dt, tuple(dims))
    io = ModelIO((spec,), (spec,), 8)
    rng = np.random.default_rng(seed)
    items = [(rng.random(dims) * 100).astype(spec.np_dtype) for _ in range(n)]
    before = copy.deepcopy(items)
    enc = [io.encode_item(x) for x in items]
    out = io.decode(ModelIO.stack(enc, ["t"]), n, ["t"])
    for x, y, b in zip(items, out, before, strict=True):
        if all(d == 1 for d in dims):
            assert y == x.reshape(-1)[0]
        else:
            np.testing.assert_array_equal(y, x)
            assert y.dtype == x.dtype
        np.testing.assert_array_equal(x, b)  # inputs untouched


# -- configuration ---------------------------------------------------------------------------


def test_build_config_cpu_gpu_batcher_and_no_mutation() -> None:
    before = copy.deepcopy(CONFIG)
    cpu = build_config(CONFIG, max_batch_size=8, replicas=3)
    assert CONFIG == before  # the server's configuration is not changed in place
    assert cpu["max_batch_size"] == 8
    # the count of the model's group changes; its name and other fields stay
    assert cpu["instance_group"] == [{"name": "clf_0", "kind": "KIND_CPU", "count": 3, "gpus": []}]
    assert "dynamic_batching" not in cpu  # inferline's queue forms batches
    assert cpu["input"] == CONFIG["input"] and cpu["name"] == "clf"
    gpu = build_config(CONFIG, max_batch_size=8, replicas=5, gpus=[0, 1])
    assert gpu["instance_group"] == [
        {"count": 3, "kind": "KIND_GPU", "gpus": [0]},
        {"count": 2, "kind": "KIND_GPU", "gpus": [1]},
    ]
    assert instance_count(gpu) == 5 and instance_count(cpu) == 3
    assert (
        instance_count({"instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]}) == 4
    )
    on = build_config(CONFIG, max_batch_size=8, replicas=1, batcher=BatcherSettings(250, (4, 8)))
    assert on["dynamic_batching"] == {
        "max_queue_delay_microseconds": 250,
        "preferred_batch_size": [4, 8],
    }
    small = build_config(CONFIG, max_batch_size=4, replicas=1, batcher=BatcherSettings(0, (2, 8)))
    assert small["dynamic_batching"]["preferred_batch_size"] == [2]  # Triton refuses 8 > 4
    none = build_config(CONFIG, max_batch_size=4, replicas=1, batcher=BatcherSettings(0, (8,)))
    assert "preferred_batch_size" not in none["dynamic_batching"]
    with pytest.raises(ValidationError):
        build_config(CONFIG, max_batch_size=8, replicas=0)
    nobatch = dict(CONFIG, max_batch_size=0)
    assert build_config(nobatch, max_batch_size=1, replicas=1)["max_batch_size"] == 0
    with pytest.raises(ValidationError):
        build_config(nobatch, max_batch_size=4, replicas=1)


def test_batcher_and_model_info_round_trip() -> None:
    b = BatcherSettings(500, (8,))
    assert BatcherSettings.from_dict(b.to_dict()) == b
    assert BatcherSettings.from_config(b.to_config()) == b
    with pytest.raises(ValidationError):
        BatcherSettings(-1)
    with pytest.raises(ValidationError):
        BatcherSettings.from_dict({"delay": 1})
    info = TritonModelInfo.from_server(
        "clf", [{"name": "clf", "version": "1", "state": "READY"}], CONFIG
    )
    assert info.state == "READY" and info.instances == 1 and info.max_batch_size == 16
    assert info.batcher == BatcherSettings(100)
    assert TritonModelInfo.from_dict(info.to_dict()) == info
    idle = TritonModelInfo.from_server(
        "x", [{"name": "x", "state": "UNAVAILABLE", "reason": "unloaded"}], None
    )
    assert idle.io is None and idle.reason == "unloaded"
    assert TritonModelInfo.from_dict(idle.to_dict()) == idle


# -- statistics ------------------------------------------------------------------------------


def _snap(requests: int, inferences: int, batches: dict[int, int], fail: int = 0) -> dict:
    def pair(c: int, ns_each: int) -> dict:
        return {"count": c, "ns": c * ns_each}

    return {
        "inference_count": inferences,
        "execution_count": requests,
        "inference_stats": {
            "success": pair(requests, 2_000_000),
            "fail": pair(fail, 1_000_000),
            "queue": pair(requests, 100_000),
            "compute_input": pair(requests, 10_000),
            "compute_infer": pair(requests, 1_500_000),
            "compute_output": pair(requests, 20_000),
        },
        "batch_stats": [
            {"batch_size": b, "compute_infer": {"count": c, "ns": c * b * 1_000_000}}
            for b, c in batches.items()
        ],
    }


def test_interval_figures_are_differences_of_counters() -> None:
    a = _snap(10, 40, {1: 2, 8: 4, 4: 4})
    b = _snap(16, 72, {1: 2, 8: 8, 4: 6}, fail=1)
    iv = interval_figures(a, b, 2.0)
    assert iv["requests"] == 6 and iv["inferences"] == 32 and iv["executions"] == 6
    assert iv["failed_requests"] == 1 and not iv["counters_reset"]
    assert iv["mean_batch_size"] == pytest.approx(32 / 6)
    assert iv["requests_per_s"] == 3.0 and iv["inferences_per_s"] == 16.0
    assert iv["queue_ms_mean"] == pytest.approx(0.1) and iv["request_ms_mean"] == pytest.approx(2.0)
    assert iv["batches"] == {
        8: {"count": 4, "compute_infer_ms_mean": 8.0},
        4: {"count": 2, "compute_infer_ms_mean": 4.0},
    }
    first = interval_figures(None, a, None)
    assert first["requests"] == 10 and first["interval_s"] is None
    reset = interval_figures(b, _snap(3, 3, {1: 3}), 1.0)  # the server restarted
    assert (
        reset["counters_reset"]
        and reset["requests"] == 3
        and reset["batches"] == {1: {"count": 3, "compute_infer_ms_mean": 1.0}}
    )
    empty = interval_figures(b, b, 1.0)
    assert empty["requests"] == 0 and empty["mean_batch_size"] is None and empty["batches"] == {}
    cum = cumulative_figures(b)
    assert cum["inference_count"] == 72 and cum["batches"][8]["count"] == 8


def test_client_timing_summary() -> None:
    t = ClientTiming()
    for ms in range(1, 101):
        t.record(4, ms / 1000)
    t.record(1, 0.5)
    s = t.summary()
    assert s["requests"] == 101 and s["items"] == 401
    assert s["batches"][4]["count"] == 100
    assert s["batches"][4]["mean_ms"] == pytest.approx(50.5)
    assert 98 <= s["batches"][4]["p99_ms"] <= 100 and s["batches"][4]["max_ms"] == pytest.approx(
        100
    )


# -- client plumbing -------------------------------------------------------------------------


def test_classify_failures() -> None:
    pytest.importorskip("tritonclient.http", reason="tritonclient[http] (extra 'triton') missing")
    from tritonclient.utils import InferenceServerException

    def exc(msg: str, status: str | None = None) -> InferenceServerException:
        return InferenceServerException(msg=msg, status=status)

    assert isinstance(classify(exc("x", "StatusCode.UNAVAILABLE"), "w"), TritonConnectionError)
    assert isinstance(
        classify(exc("Request for unknown model: 'm' is not found"), "w"), TritonModelMissing
    )
    assert isinstance(classify(exc("model 'm' is not ready"), "w"), TritonModelMissing)
    assert isinstance(classify(exc("pixels out of range"), "w"), TritonServerError)
    assert isinstance(classify(TimeoutError(), "w"), TritonConnectionError)
    assert isinstance(classify(ConnectionRefusedError(), "w"), TritonConnectionError)
    import aiohttp

    assert isinstance(classify(aiohttp.ServerDisconnectedError(), "w"), TritonConnectionError)
    assert isinstance(classify(ValueError("odd"), "infer 'm'"), TritonServerError)
    assert "infer 'm'" in str(classify(ValueError("odd"), "infer 'm'"))


def test_grpc_json_integers() -> None:
    raw = {
        "model_stats": [
            {"inference_count": "12", "inference_stats": {"success": {"count": "3", "ns": "99"}}}
        ],
        "config": {"input": [{"dims": ["64"]}], "max_batch_size": 8, "name": "123"},
    }
    out = _ints(raw)
    assert out["model_stats"][0]["inference_count"] == 12
    assert out["model_stats"][0]["inference_stats"]["success"] == {"count": 3, "ns": 99}
    assert out["config"]["input"][0]["dims"] == [64]
    assert out["config"]["name"] == "123"  # only numeric fields are converted


def test_urls_options_and_offline_backend() -> None:
    assert parse_triton_url("triton://10.0.0.1:9000") == ("http", "10.0.0.1:9000", {})
    assert parse_triton_url("triton+http://h") == ("http", "h:8000", {})
    assert parse_triton_url("triton+grpc://[::1]:8001")[1] == "[::1]:8001"
    for bad in ("tfserving://h", "triton://:80", "triton://h:port", 7):
        with pytest.raises(ValidationError):
            parse_triton_url(bad)  # type: ignore[arg-type]
    # a number out of range was "expected a numeric port"; ":0" took the default port
    for bad in ("triton://h:99999", "triton://h:0", "triton+grpc://h:-1"):
        with pytest.raises(ValidationError) as e:
            parse_triton_url(bad)
        assert str(e.value) == f"url: expected a port in [1, 65535], got {bad!r}"
    b = TritonBackend("triton://127.0.0.1:1?cpu_cores=6&gpus=0,2&gpu_kind=gpu-k80&timeout_s=3")
    assert b.inventory() == {"cpu": 6, "gpu-k80": 2} and b.free() == {"cpu": 6, "gpu-k80": 2}
    assert b.client.timeout_s == 3.0 and b.protocol == "http"
    with pytest.raises(ValidationError):
        TritonBackend("triton://h?oversubscribe=maybe")
    with pytest.raises(ValidationError):
        TritonBackend("triton://h", cpu_cores=-1)
    # a misspelt option is named, with the ones there are (it said "expected a valid value")
    with pytest.raises(ValidationError, match="cpu_corez") as e:
        TritonBackend("triton://h?cpu_corez=2")
    assert "cpu_corez" in str(e.value) and "watch_interval_s" in str(e.value)
    with pytest.raises(ValidationError, match="watch_interval_s"):
        TritonBackend("triton://h?watch_interval_s=-1")
    assert TritonBackend("triton://h?watch_interval_s=0").watch_interval_s == 0
    with pytest.raises(NotFoundError):
        b.replicas("m")

    async def closed() -> None:
        await b.close()
        await b.close()
        with pytest.raises(BackendError):
            await b.deploy(ModelSpec("m"), ModelConfig("cpu", 1, 1))

    asyncio.run(closed())


def test_unreachable_server_is_a_backend_error() -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton') missing")
    from socket import socket

    with socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        for url in (f"triton://127.0.0.1:{port}", f"triton+grpc://127.0.0.1:{port}"):
            b = TritonBackend(url, timeout_s=5)
            try:
                with pytest.raises(BackendError):
                    await b.discover()
                with pytest.raises(BackendError):
                    await b.deploy(ModelSpec("m"), ModelConfig("cpu", 1, 1))
                assert not await b.client.ready()
            finally:
                await b.close()

    asyncio.run(main())
