"""The GPU-sized CNN stage (``inferline.demo.cnn``) on CPU: trained at test time, served by a
real replica process of the bundled runtime, traced into its pipeline. ``test_gpu.py`` runs
the same model on a GPU where there is one."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import numpy as np
import pytest

from inferline.adapters.local import LocalBackend
from inferline.core import ModelConfig, ModelSpec
from inferline.demo import pipeline as demo_pipeline
from inferline.demo.cnn import CNN, cnn_deployment_dict, train_cnn
from inferline.demo.models import preprocess
from inferline.demo.pipeline import sample_inputs
from inferline.deploy import Deployment
from inferline.measure import trace_deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cnn") / "cnn.pt"
    trained = train_cnn(path, width=16, epochs=8, device="cpu")
    assert trained["accuracy"] > 0.85, trained  # a real classifier, not random weights
    return path


def test_a_replica_answers_as_the_trained_network_does(weights: Path) -> None:
    xt, yt = demo_pipeline.test_inputs()
    feats = preprocess().predict_batch(list(xt[:64]))
    local = CNN(str(weights), 16)
    local.load()
    want = np.stack(local.predict_batch(feats))
    assert (want.argmax(1) == yt[:64]).mean() > 0.8

    async def body() -> np.ndarray:
        b = LocalBackend(oversubscribe=True, gpus=[])
        try:
            spec = ModelSpec(
                "cnn", "inferline.demo.cnn:cnn", {"weights": str(weights), "width": 16}
            )
            await b.deploy(spec, ModelConfig("cpu", 16, 1))
            (r,) = b.replicas("cnn")
            return np.stack(await r.predict_batch(feats))
        finally:
            await b.close()

    got = asyncio.run(body())
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_deployment_traces_into_preprocess_then_cnn(weights: Path) -> None:
    dep = Deployment.from_dict(cnn_deployment_dict(weights, 16))
    pipeline, inputs = asyncio.run(trace_deployment(dep, samples=sample_inputs(20)))
    assert pipeline.models == ("preprocess", "cnn")
    assert len(inputs["cnn"]) == 20 and pipeline.scale_factor("cnn") == 1.0


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # torch on our file
def test_weights_that_are_not_plain_tensors_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(pickle.dumps({"conv": object()}))  # never unpickled by a replica
    with pytest.raises(Exception, match=r"(?i)weights_only|unpickl"):
        CNN(str(bad), 8).load()
