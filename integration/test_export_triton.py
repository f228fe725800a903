"""``inferline export --to triton`` into a copy of a real model repository, loaded by the real
Triton server of ``triton_harness`` (2.51, Python-backend models trained on scikit-learn's
digits): the server takes the exported configs, reports the planned instance count, max batch
and dynamic batcher on its config endpoint, loads the operator's ensemble of two of them with
the batch bound export lowered, and the models still answer (their backend, inputs and outputs
came from the operator's configs).

Skips, naming what is missing, as ``integration/test_triton.py`` does when the server cannot
be had (no network to the package registry, no tritonclient, not Linux).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "tritonclient.http", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton') not installed")
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test models")

import tritonclient.http as httpclient
from triton_harness import Digits, SetupError, TritonServer, build_repository, ensure_installed
from tritonclient.utils import InferenceServerException

from inferline.cli import main
from inferline.core import ModelConfig, Plan, save

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Different from the repository's own configs (max batch 64, one instance, no batcher), so the
# server can only report these if it loaded the exported files.
PLANNED = {
    "digits_pre": ModelConfig("cpu", 16, 2, 1.5),
    "digits_mlp": ModelConfig("cpu", 8, 3),
}
# The operator's ensemble of the two: it allows batches of 64, more than digits_mlp's planned 8,
# which Triton refuses to load; export lowers it.
ENSEMBLE = """
name: "digits"
platform: "ensemble"
max_batch_size: 64
input [ { name: "image", data_type: TYPE_FP32, dims: [8, 8] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [1] } ]
ensemble_scheduling { step [
  { model_name: "digits_pre", model_version: -1,
    input_map { key: "image" value: "image" } output_map { key: "features" value: "f" } },
  { model_name: "digits_mlp", model_version: -1,
    input_map { key: "features" value: "f" } output_map { key: "label" value: "label" } }
] }
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Digits]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root = tmp_path_factory.mktemp("export")
    digits = build_repository(root / "operator")
    (root / "operator" / "digits" / "1").mkdir(parents=True)
    (root / "operator" / "digits" / "config.pbtxt").write_text(ENSEMBLE)
    save(Plan("digits", 0.2, PLANNED), root / "plan.json")
    argv = ["export", str(root / "plan.json"), "--to", "triton", str(root / "exported")]
    rc = main([*argv, "--repository", str(root / "operator"), "--copy-models"])
    assert rc == 0
    server = TritonServer(install, root / "exported", load=[*PLANNED, "digits"])
    server.start()
    try:
        yield server, digits
    finally:
        server.stop()


def _client(server: TritonServer) -> Any:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def test_the_server_runs_the_planned_configuration(exported: tuple[TritonServer, Any]) -> None:
    server, _ = exported
    client = _client(server)
    try:
        for name, cfg in PLANNED.items():
            assert client.is_model_ready(name)
            got = client.get_model_config(name)
            groups = got["instance_group"]
            assert sum(int(g["count"]) for g in groups) == cfg.replicas
            assert {g["kind"] for g in groups} == {"KIND_CPU"}
            assert int(got["max_batch_size"]) == cfg.max_batch_size
            db = got["dynamic_batching"]
            assert int(db.get("max_queue_delay_microseconds", 0)) == round(cfg.batch_wait_ms * 1e3)
            assert [int(b) for b in db["preferred_batch_size"]] == [cfg.max_batch_size]
            assert got["backend"] == "python"  # the operator's field, kept
        ens = client.get_model_config("digits")
        assert client.is_model_ready("digits") and int(ens["max_batch_size"]) == 8
    finally:
        client.close()


def test_the_exported_models_still_answer(exported: tuple[TritonServer, Digits]) -> None:
    server, digits = exported
    client = _client(server)
    try:
        images = np.asarray(digits.test_images[:16], dtype=np.float32)  # a full planned batch
        inp = httpclient.InferInput("image", list(images.shape), "FP32")
        inp.set_data_from_numpy(images)
        features = client.infer("digits_pre", [inp]).as_numpy("features")
        assert features.shape == (16, 64)
        inp = httpclient.InferInput("features", [8, 64], "FP32")
        inp.set_data_from_numpy(features[:8])  # digits_mlp's planned max batch is 8
        labels = client.infer("digits_mlp", [inp]).as_numpy("label").reshape(-1)
        assert np.mean(labels == digits.test_labels[:8]) >= 0.75
        # one more than the planned batch: the server enforces the exported max_batch_size
        inp = httpclient.InferInput("features", [9, 64], "FP32")
        inp.set_data_from_numpy(features[:9])
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            client.infer("digits_mlp", [inp])
        inp = httpclient.InferInput("image", [8, 8, 8], "FP32")
        inp.set_data_from_numpy(images[:8])
        through = client.infer("digits", [inp]).as_numpy("label").reshape(-1)
        np.testing.assert_array_equal(through, labels)  # the ensemble, as exported, serves
    finally:
        client.close()
