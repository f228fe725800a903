"""GPU-aware placement on a real NVIDIA GPU (bundled runtime, real replica processes, a CNN
trained at test time). Skips, naming what it looked for, on machines without a GPU or without
a CUDA build of torch; ``benchmarks/gpu_placement.py`` measures the same path under load."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from inferline.adapters.local import LocalBackend, detect_gpus
from inferline.core import (
    DEFAULT_CATALOG,
    CapacityError,
    Hardware,
    HardwareCatalog,
    ModelConfig,
    ModelSpec,
    PlannerOptions,
    gamma_trace,
    plan_inferline,
)
from inferline.core.planning import inventory_use
from inferline.demo.cnn import cnn_deployment_dict, train_cnn
from inferline.demo.models import preprocess
from inferline.demo.pipeline import sample_inputs
from inferline.deploy import Deployment
from inferline.measure import ProfilerOptions, ServerProcess, profile_deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GPUS = detect_gpus()
KIND = "gpu-test"
EX = "inferline.adapters.local.examples"


def _torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not GPUS:
    pytest.skip("no NVIDIA GPU: `nvidia-smi -L` lists none", allow_module_level=True)
if not _torch_has_cuda():
    pytest.skip(
        "torch here has no CUDA (torch.cuda.is_available() is False)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cnn") / "cnn.pt"
    trained = train_cnn(path, width=256, epochs=6)
    assert trained["device"] == "cuda" and trained["accuracy"] > 0.9, trained
    return path


def _cores(n: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))[-n:]


def test_gpu_replicas_see_their_gpu_and_answer_like_cpu_replicas(weights: Path) -> None:
    feats = preprocess().predict_batch(sample_inputs(16))

    async def body() -> None:
        b = LocalBackend(cores=_cores(3), gpus=GPUS[:1], gpu_kind=KIND)
        try:
            assert b.inventory() == {"cpu": 3, KIND: 1}
            spec = ModelSpec("p", f"{EX}:probe", {"import_torch": True})
            await b.deploy(spec, ModelConfig(KIND, 1, 1))
            (info,) = await b.replicas("p")[0].predict_batch([0])
            assert info["cuda"] == GPUS[0] and len(info["cores"]) == 1
            # the GPU is taken: a second GPU replica is refused, naming the kind
            with pytest.raises(CapacityError, match=KIND):
                await b.scale("p", 2)
            assert b.free() == {"cpu": 2, KIND: 0}
            await b.remove("p")
            params = {"weights": str(weights), "width": 256}
            await b.deploy(
                ModelSpec("g", "inferline.demo.cnn:cnn", params), ModelConfig(KIND, 16, 1)
            )
            await b.deploy(
                ModelSpec("c", "inferline.demo.cnn:cnn", params), ModelConfig("cpu", 16, 1)
            )
            on_gpu = np.stack(await b.replicas("g")[0].predict_batch(feats))
            on_cpu = np.stack(await b.replicas("c")[0].predict_batch(feats))
            assert (on_gpu.argmax(1) == on_cpu.argmax(1)).all()
            assert np.abs(on_gpu - on_cpu).max() < 1e-2  # TF32 convolutions on the GPU
            stats = await b.stats("g")
            assert [r["gpu"] for r in stats["replicas"]] == [GPUS[0]]
        finally:
            await b.close()

    asyncio.run(body())


def test_a_plan_within_the_inventory_puts_the_cnn_on_the_gpu_and_serves(
    weights: Path, tmp_path: Path
) -> None:
    cores = _cores(3)
    url = f"local://?cores={','.join(map(str, cores))}&gpus={GPUS[0]}&gpu_kind={KIND}"
    dep_d = cnn_deployment_dict(weights, 256, backend=url)
    (tmp_path / "d.json").write_text(json.dumps(dep_d))
    popts = ProfilerOptions(
        max_batch_size=8, warmup=3, min_samples=20, max_samples=40, max_seconds_per_point=1.0
    )
    result, pipeline = asyncio.run(
        profile_deployment(Deployment.from_dict(dep_d), popts, samples=sample_inputs(40))
    )
    prof = result.profiles
    cpu_b1 = prof.latency("cnn", "cpu", 1)
    assert prof.latency("cnn", KIND, 8) < prof.latency("cnn", "cpu", 8) / 4, prof.to_dict()
    catalog = DEFAULT_CATALOG.merged(HardwareCatalog({KIND: Hardware("gpu", 12.29)}))
    options = PlannerOptions(
        inventory={"cpu": 3, KIND: 1}, gpu_host_units={"cnn": 1}, replica_units={}
    )
    # No CPU configuration meets an SLO under the CNN's own batch-1 latency on a core.
    slo_s = 0.9 * cpu_b1
    trace = gamma_trace(50.0, 1.0, 20.0, np.random.default_rng(0))
    plan = plan_inferline(pipeline, prof, trace, slo_s, catalog=catalog, options=options)
    assert plan.models["cnn"].hardware == KIND and plan.models["cnn"].replicas == 1
    use = inventory_use(plan.models, catalog, {}, {"cnn": 1})
    assert use[KIND] == 1 and use["cpu"] <= 3  # the GPU replica's host core counted
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))

    with ServerProcess(tmp_path / "d.json", tmp_path / "plan.json") as srv:
        answers: list[Any] = []
        for x in sample_inputs(30, seed=1):
            r = httpx.post(f"{srv.url}/apps/digits/predict", json={"input": x.tolist()}, timeout=30)
            assert r.status_code == 200, r.text
            answers.append(r.json())
        assert all(a["output"]["model"] == "cnn" for a in answers), answers[:3]
        models = httpx.get(f"{srv.url}/admin/models", timeout=30).json()
        reps = models["cnn"]["backend"]["replicas"]
        assert [r["gpu"] for r in reps] == [GPUS[0]]
        cores_used = [
            c for m in models.values() for r in m["backend"]["replicas"] for c in r["cores"]
        ]
        assert len(cores_used) == len(set(cores_used)) and set(cores_used) <= set(cores)
