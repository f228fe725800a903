"""The Triton adapter against a real Triton Inference Server (2.51, from the nvidia-pytriton
wheel) serving real Python-backend models trained here on scikit-learn's digits.

The server is fetched and unpacked on first use (``triton_harness.setup_server``); the tests
skip, naming what is missing, only when it cannot be had (no network to the package registry,
no tritonclient, not Linux).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "tritonclient.http", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton') not installed")
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test models")

from triton_harness import (
    Digits,
    SetupError,
    TritonServer,
    build_repository,
    ensure_installed,
)

from inferline.adapters import PluginHost
from inferline.adapters.triton import (
    TritonBackend,
    TritonReplica,
    parse_triton_url,
)
from inferline.core import (
    Backend,
    BackendError,
    CapacityError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ReplicaError,
    ReplicaHandle,
    ValidationError,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Digits]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root = tmp_path_factory.mktemp("triton")
    digits = build_repository(root / "models")
    server = TritonServer(install, root / "models", load=["digits_pre"])
    server.start()
    try:
        yield server, digits
    finally:
        server.stop()


def _urls(server: TritonServer) -> dict[str, str]:
    return {"http": server.http_url, "grpc": server.grpc_url}


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def _until(probe: Any, want: bool, timeout_s: float = 30.0) -> None:
    """Until ``await probe()`` is ``want`` (an unload returns before the model is gone)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await probe() != want:
        assert asyncio.get_running_loop().time() < deadline, f"not {want} in {timeout_s} s"
        await asyncio.sleep(0.05)


async def _restore_pre(server: TritonServer) -> None:
    """Leave the server as the other tests expect it: ``digits_pre`` loaded with its
    repository config. Checking that it was ready left another test's batch bound and
    instances behind (the discover test, run after it in reverse order, saw
    max_batch_size 1), and a load without a config keeps a config loaded earlier while the
    repository's files are unchanged: so unload, then load from the repository."""
    fresh = TritonBackend(server.http_url)
    try:
        if await fresh.client.model_ready("digits_pre"):
            await fresh.client.unload("digits_pre")
            await _until(lambda: fresh.client.model_ready("digits_pre"), False)
        await fresh.client.load("digits_pre")
    finally:
        await fresh.close()


# -- attach / discover -----------------------------------------------------------------------


def test_discover_and_adopt_a_running_model(triton: tuple[TritonServer, Digits]) -> None:
    server, digits = triton

    async def main() -> None:
        await _restore_pre(server)  # the module's server, as the repository configures it
        b = TritonBackend(server.http_url)
        try:
            assert isinstance(b, Backend)
            meta = await b.server_metadata()
            assert meta["version"] == "2.51.0"
            found = await b.discover()
            assert set(found) >= {"digits_pre", "digits_mlp", "digits_knn", "digit_name"}
            pre = found["digits_pre"]
            assert pre.state == "READY" and pre.instances == 1 and pre.max_batch_size == 64
            assert pre.io is not None
            assert [t.to_dict() for t in pre.io.inputs] == [
                {"name": "image", "datatype": "FP32", "dims": [8, 8]}
            ]
            assert found["digits_mlp"].state != "READY" and found["digits_mlp"].io is None
            md = await b.model_metadata("digits_pre")
            assert md["inputs"][0]["shape"] == [-1, 8, 8]

            seen: list[tuple[str, list[str]]] = []
            b.subscribe(lambda m, hs: seen.append((m, [h.id for h in hs])))
            cfg = await b.adopt("digits_pre", name="pre")
            assert cfg == ModelConfig("cpu", 64, 1)
            assert seen == [("pre", ["pre/0.0"])]
            (h,) = b.replicas("pre")
            assert isinstance(h, ReplicaHandle) and h.model == "pre" and h.hardware == "cpu"
            imgs = list(digits.test_images[:10])
            out = await h.predict_batch(imgs)
            assert len(out) == 10
            assert all(isinstance(o, np.ndarray) and o.shape == (64,) for o in out)
            assert out[0].dtype == np.float32
            # standardized features: same image, same features; different images differ
            again = await h.predict_batch([imgs[3]])
            np.testing.assert_array_equal(again[0], out[3])
            assert not np.allclose(out[0], out[1])
        finally:
            await b.close()

    run(main())


# -- deploy, predict, scale ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_deploy_predict_scale(triton: tuple[TritonServer, Digits], protocol: str) -> None:
    server, digits = triton
    url = _urls(server)[protocol]
    model = f"mlp_{protocol}"

    async def main() -> None:
        b = TritonBackend(url, cpu_cores=4)
        changes: list[tuple[str, list[str]]] = []
        b.subscribe(lambda m, hs: changes.append((m, [h.id for h in hs])))
        try:
            await b.adopt("digits_pre", name="pre")
            spec = ModelSpec(model, source="digits_mlp", params={"outputs": ["label"]})
            await b.deploy(spec, ModelConfig("cpu", 16, 2))
            cfg = await b.client.model_config("digits_mlp")
            assert cfg["max_batch_size"] == 16
            assert [(g["kind"], g["count"]) for g in cfg["instance_group"]] == [("KIND_CPU", 2)]
            assert "dynamic_batching" not in cfg  # inferline's queue forms the batches
            handles = b.replicas(model)
            assert [h.id for h in handles] == [f"{model}/0.0", f"{model}/1.0"]
            assert b.free() == {"cpu": 1}  # 4 cores: 1 for the adopted model, 2 for this one

            pre = b.replicas("pre")[0]
            n = 120
            feats = await pre.predict_batch(list(digits.test_images[:n]))
            # two batches of 16 at once, one per instance, until all are done
            labels: list[Any] = [None] * n

            async def worker(h: ReplicaHandle, start: int) -> None:
                for k in range(start, n, 32):
                    chunk = feats[k : k + 16]
                    labels[k : k + len(chunk)] = await h.predict_batch(chunk)

            await asyncio.gather(worker(handles[0], 0), worker(handles[1], 16))
            assert all(isinstance(v, np.integer) for v in labels)
            acc = float(np.mean(np.asarray(labels) == digits.test_labels[:n]))
            assert acc >= 0.9, acc

            # scale up in place: the running instances keep their handles
            await b.scale(model, 3)
            cfg = await b.client.model_config("digits_mlp")
            assert sum(g["count"] for g in cfg["instance_group"]) == 3
            ids = [h.id for h in b.replicas(model)]
            assert ids == [f"{model}/0.0", f"{model}/1.0", f"{model}/2.0"]
            out = await asyncio.gather(*(h.predict_batch(feats[:4]) for h in b.replicas(model)))
            assert all(list(map(int, o)) == list(map(int, labels[:4])) for o in out)

            # scale down: the removed handle leaves the active set and refuses work
            gone = b.replicas(model)[1:]
            await b.scale(model, 1)
            cfg = await b.client.model_config("digits_mlp")
            assert sum(g["count"] for g in cfg["instance_group"]) == 1
            assert [h.id for h in b.replicas(model)] == [f"{model}/0.0"]
            for h in gone:
                assert not h.alive
                with pytest.raises(ReplicaError):
                    await h.predict_batch(feats[:1])
            assert (await b.replicas(model)[0].predict_batch(feats[:2])) == labels[:2]

            mine = [c for c in changes if c[0] == model]
            assert mine[0][1] == [f"{model}/0.0", f"{model}/1.0"]
            assert mine[-1][1] == [f"{model}/0.0"]
            assert any(len(c[1]) == 3 for c in mine)

            await b.remove(model)
            with pytest.raises(NotFoundError):
                b.replicas(model)
            assert changes[-1] == (model, [])
        finally:
            await b.close()

    run(main())


def test_strings_multiple_outputs_and_item_errors(triton: tuple[TritonServer, Digits]) -> None:
    server, digits = triton

    async def main() -> None:
        b = TritonBackend(server.grpc_url, oversubscribe=True)
        try:
            await b.adopt("digits_pre", name="pre")
            await b.deploy(ModelSpec("name", source="digit_name"), ModelConfig("cpu", 8, 1))
            (h,) = b.replicas("name")
            # scalar, [1]-shaped, numpy scalar and list inputs all fit a [1] INT64 input
            out = await h.predict_batch([3, np.int64(7), [0], np.array([9])])
            assert out == ["three", "seven", "zero", "nine"]
            # per-query validation: bad items get their own error, the rest are answered
            out = await h.predict_batch([1, "x", 2.5, [1, 2], 4])
            assert out[0] == "one" and out[4] == "four"
            assert all(isinstance(e, ValidationError) for e in out[1:4])
            assert "name.inputs[1]" in str(out[1])
            # a batch larger than the model's max_batch_size is split, order kept
            names = await h.predict_batch([i % 10 for i in range(20)])
            assert names[:3] == ["zero", "one", "two"] and names[19] == "nine"

            # several outputs come back as a mapping per query
            await b.deploy(ModelSpec("mlp_all", source="digits_mlp"), ModelConfig("cpu", 8, 1))
            feats = await b.replicas("pre")[0].predict_batch(list(digits.test_images[:3]))
            res = await b.replicas("mlp_all")[0].predict_batch(feats)
            assert set(res[0]) == {"probs", "label"}
            assert res[0]["probs"].shape == (10,)
            assert abs(float(res[0]["probs"].sum()) - 1.0) < 1e-4
            assert int(res[0]["label"]) == int(np.argmax(res[0]["probs"]))

            # the model rejects one image of a batch: that query alone gets a BackendError
            imgs = [im.copy() for im in digits.test_images[:6]]
            imgs[4][0, 0] = 99.0
            out = await b.replicas("pre")[0].predict_batch(imgs)
            assert isinstance(out[4], BackendError) and "within [0, 16]" in str(out[4])
            assert all(isinstance(o, np.ndarray) for i, o in enumerate(out) if i != 4)
            await b.remove("name")
            await b.remove("mlp_all")
        finally:
            await b.close()

    run(main())


def test_statistics_per_interval(triton: tuple[TritonServer, Digits]) -> None:
    server, digits = triton

    async def main() -> None:
        b = TritonBackend(server.http_url, oversubscribe=True)
        try:
            await b.deploy(ModelSpec("knn", source="digits_knn"), ModelConfig("cpu", 32, 1))
            pre = TritonBackend(server.http_url)
            await pre.adopt("digits_pre")
            feats = await pre.replicas("digits_pre")[0].predict_batch(list(digits.test_images[:64]))
            await pre.close()
            (h,) = b.replicas("knn")
            labels = await h.predict_batch(feats[:32])
            acc = float(np.mean(np.asarray(labels, dtype=int) == digits.test_labels[:32]))
            assert acc >= 0.9, acc
            # Triton counts a request just after answering it: let it count this one before the
            # snapshot the interval starts from (under load it was counted in the next interval)
            await asyncio.sleep(0.5)
            first = await b.stats("knn")
            assert first["server"]["interval"]["interval_s"] is None  # since the load
            for size in (1, 4, 4, 8):
                await h.predict_batch(feats[:size])
            await asyncio.sleep(0.5)  # Triton counts a request just after answering it
            s = await b.stats("knn")
            iv = s["server"]["interval"]
            assert iv["interval_s"] > 0 and not iv["counters_reset"]
            assert iv["requests"] == 4 and iv["inferences"] == 17 and iv["executions"] == 4
            assert iv["failed_requests"] == 0
            assert iv["mean_batch_size"] == pytest.approx(17 / 4)
            assert set(iv["batches"]) == {1, 4, 8} and iv["batches"][4]["count"] == 2
            assert iv["compute_infer_ms_mean"] > 0 and iv["queue_ms_mean"] >= 0
            cum = s["server"]["cumulative"]
            assert cum["inference_count"] == 32 + 17 and cum["execution_count"] == 5
            client = s["client"]
            assert client["requests"] == 5 and client["items"] == 49
            assert client["batches"][4]["count"] == 2 and client["batches"][4]["p99_ms"] > 0
            # nothing new: an empty interval
            assert (await b.stats("knn"))["server"]["interval"]["requests"] == 0
            json.dumps(s)  # JSON-able for the CLI and the frontend
            await b.remove("knn")
        finally:
            await b.close()

    run(main())


def test_triton_batcher_on_request_and_config_errors(triton: tuple[TritonServer, Digits]) -> None:
    server, _ = triton

    async def main() -> None:
        b = TritonBackend(server.http_url, cpu_cores=2)
        try:
            spec = ModelSpec(
                "knn_native",
                source="digits_knn",
                params={
                    "dynamic_batching": {"max_queue_delay_us": 500, "preferred_batch_sizes": [8]}
                },
            )
            await b.deploy(spec, ModelConfig("cpu", 8, 1))
            cfg = await b.client.model_config("digits_knn")
            assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 500
            assert cfg["dynamic_batching"]["preferred_batch_size"] == [8]
            # scaling keeps the batcher the deployment asked for
            await b.scale("knn_native", 2)
            cfg = await b.client.model_config("digits_knn")
            assert "dynamic_batching" in cfg and sum(g["count"] for g in cfg["instance_group"]) == 2
            with pytest.raises(CapacityError):
                await b.scale("knn_native", 3)  # 2 cores offered, 2 in use
            # a new plan for the model: another max batch size and one instance
            (keep,) = b.replicas("knn_native")[:1]
            await b.reconfigure("knn_native", ModelConfig("cpu", 4, 1))
            cfg = await b.client.model_config("digits_knn")
            assert (
                cfg["max_batch_size"] == 4 and sum(g["count"] for g in cfg["instance_group"]) == 1
            )
            assert b.replicas("knn_native") == [keep]
            out = await keep.predict_batch([np.zeros(64, dtype=np.float32)] * 6)  # sent as 4 + 2
            assert len(out) == 6 and all(isinstance(o, np.integer) for o in out)
            st = await b.stats("knn_native")
            assert st["max_batch_size"] == 4 and set(st["client"]["batches"]) == {4, 2}
            with pytest.raises(CapacityError):
                await b.reconfigure("knn_native", ModelConfig("cpu", 8, 3))
            await b.remove("knn_native")

            with pytest.raises(NotFoundError) as nf:
                await b.deploy(ModelSpec("nope"), ModelConfig("cpu", 1, 1))
            assert "digits_knn" in str(nf.value)
            with pytest.raises(NotFoundError):
                await b.deploy(ModelSpec("g", source="digits_knn"), ModelConfig("gpu-v100", 1, 1))
            with pytest.raises(ValidationError):
                await b.deploy(
                    ModelSpec("p", source="digits_knn", params={"bogus": 1}),
                    ModelConfig("cpu", 1, 1),
                )
            with pytest.raises(ValidationError):
                await b.deploy(
                    ModelSpec("o", source="digits_knn", params={"outputs": ["nope"]}),
                    ModelConfig("cpu", 1, 1),
                )
            with pytest.raises(NotFoundError):
                await b.scale("never-deployed", 1)
            with pytest.raises(NotFoundError):
                await b.adopt("digits_knn")  # not loaded now
        finally:
            await b.close()
        await b.close()  # idempotent
        with pytest.raises(BackendError):
            await b.deploy(ModelSpec("x", source="digits_knn"), ModelConfig("cpu", 1, 1))

    run(main())


def test_closed_backend_refuses_and_handles_die(triton: tuple[TritonServer, Digits]) -> None:
    server, digits = triton

    async def main() -> None:
        b = TritonBackend(server.http_url)
        seen: list[tuple[str, int]] = []
        b.subscribe(lambda m, hs: seen.append((m, len(hs))))
        await b.adopt("digits_pre")
        (h,) = b.replicas("digits_pre")
        await b.close()
        assert seen[-1] == ("digits_pre", 0)
        assert not h.alive
        with pytest.raises(ReplicaError):
            await h.predict_batch([digits.test_images[0]])
        await b.close()

    run(main())


def test_urls_and_plugin_registration(triton: tuple[TritonServer, Digits]) -> None:
    server, _ = triton
    assert parse_triton_url("triton://h:9000") == ("http", "h:9000", {})
    assert parse_triton_url("triton+grpc://h") == ("grpc", "h:8001", {})
    assert parse_triton_url("triton://h?cpu_cores=3")[2] == {"cpu_cores": "3"}
    for bad in ("http://h:1", "triton://", "triton://h:x"):
        with pytest.raises(ValidationError):
            parse_triton_url(bad)
    with pytest.raises(ValidationError):
        TritonBackend("triton://h:1?colour=red")

    from inferline.adapters.triton import plugin

    host = PluginHost()
    host.load_entrypoints()
    if "triton" not in host.schemes():
        host.register(plugin, "triton")
    assert {"triton", "triton+grpc", "triton+http"} <= set(host.schemes())
    b = host.backend_for(f"{server.http_url}?cpu_cores=3&gpus=0,1", gpu_kind="gpu-k80")
    assert isinstance(b, TritonBackend)
    assert b.inventory() == {"cpu": 3, "gpu-k80": 2}
    g = host.backend_for(server.grpc_url)
    assert isinstance(g, TritonBackend) and g.protocol == "grpc"


def test_profile_through_the_live_server(triton: tuple[TritonServer, Digits]) -> None:
    """The project's profiler drives the adapter's replica handles; Triton's own statistics
    see the same batch sizes (read from Triton's statistics API before the profiler unloads
    the model: an adapter that split batches, or sent each query alone, fails here)."""
    import tritonclient.http as httpclient

    from inferline.measure._profiler import ProfilerOptions, profile_models

    server, digits = triton
    triton_batches: dict[int, int] = {}

    def read_stats(name: str) -> None:
        c = httpclient.InferenceServerClient(server.http_url.split("://")[-1])
        try:
            st = c.get_inference_statistics(model_name=name)
        finally:
            c.close()
        for m in st["model_stats"]:
            for bs in m.get("batch_stats", ()):
                n = int(bs["compute_infer"]["count"])
                triton_batches[int(bs["batch_size"])] = (
                    triton_batches.get(int(bs["batch_size"]), 0) + n
                )

    async def main() -> None:
        b = TritonBackend(server.http_url, cpu_cores=1)
        remove = b.remove

        async def read_then_remove(name: str) -> None:
            await asyncio.to_thread(read_stats, "digits_knn")  # the name on the server
            await remove(name)

        b.remove = read_then_remove  # type: ignore[method-assign]
        try:
            pre = TritonBackend(server.http_url)
            await pre.adopt("digits_pre")
            feats = await pre.replicas("digits_pre")[0].predict_batch(list(digits.test_images[:16]))
            await pre.close()
            opts = ProfilerOptions(
                max_batch_size=8,
                warmup=2,
                min_samples=10,
                max_samples=20,
                max_seconds_per_point=2.0,
            )
            res = await profile_models(
                b, [ModelSpec("knn", source="digits_knn")], {"knn": feats}, opts
            )
            sizes = res.profiles.batch_sizes("knn", "cpu")
            assert sizes == [1, 2, 4, 8]
            for bs in sizes:
                assert res.profiles.models["knn"]["cpu"][bs].latency_s > 0
            assert b.models() == []  # the profiler removed what it deployed
        finally:
            await b.close()

    run(main())
    # every profiled batch size reached Triton whole, at least min_samples times
    assert {1, 2, 4, 8} <= set(triton_batches), triton_batches
    for bs in (1, 2, 4, 8):
        assert triton_batches[bs] >= 10, triton_batches


def test_handles_are_one_per_instance_and_typed(triton: tuple[TritonServer, Digits]) -> None:
    server, _ = triton

    async def main() -> None:
        b = TritonBackend(server.http_url, cpu_cores=8)
        try:
            await b.deploy(ModelSpec("k", source="digits_knn", threads=2), ModelConfig("cpu", 4, 3))
            hs = b.replicas("k")
            assert len(hs) == 3 and all(isinstance(h, TritonReplica) for h in hs)
            assert len({h.id for h in hs}) == 3
            assert b.free() == {"cpu": 2}  # 3 replicas x 2 threads of 8 cores
            assert await hs[0].predict_batch([]) == []
            await b.remove("k")
            assert b.free() == {"cpu": 8}
        finally:
            await b.close()

    run(main())


# time (~26 s): profiles three models through the real Triton and one on the bundled
# runtime, plans, then serves a replay through the whole four-model pipeline.
def test_attach_profile_plan_deploy_serve_across_triton_and_the_bundled_runtime(
    triton: tuple[TritonServer, Digits], tmp_path: Path
) -> None:
    """The operator's path end to end: attach to the running server, profile its models
    through it (and a model of the bundled runtime), plan a configuration for a trace and an
    SLO with InferLine's planner, apply it, and serve a pipeline that spans both backends
    through inferline's queue: preprocessing on Triton, then an MLP on Triton and a logistic
    regression on the bundled runtime in parallel, then a name lookup on Triton."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits
    from triton_harness import load_digits_split

    from inferline.adapters.local import LocalBackend
    from inferline.core import Pipeline, Profiles, gamma_trace, plan_inferline
    from inferline.measure._profiler import ProfilerOptions, profile_models
    from inferline.queueing import Dispatcher, FixedBatching, PipelineRunner

    server, digits = triton
    mdir = server.repository / "digits_pre" / "1"
    mean, std = np.load(mdir / "mean.npy"), np.load(mdir / "std.npy")
    xtr, _, ytr, _ = load_digits_split(0)
    with threadpool_limits(1):
        lr = LogisticRegression(max_iter=500).fit((xtr - mean) / std, ytr)
    np.save(tmp_path / "w.npy", lr.coef_.T.astype(np.float32))
    np.save(tmp_path / "b.npy", lr.intercept_.astype(np.float32))
    images = digits.test_images
    feats = list(((images.reshape(-1, 64) - mean) / std).astype(np.float32))
    specs = {
        "pre": ModelSpec("pre", source="digits_pre"),
        "mlp": ModelSpec("mlp", source="digits_mlp", params={"outputs": ["label"]}),
        "name": ModelSpec("name", source="digit_name"),
        "logreg": ModelSpec(
            "logreg",
            source="inferline.adapters.local.examples:linear",
            params={"weights": str(tmp_path / "w.npy"), "bias": str(tmp_path / "b.npy")},
        ),
    }
    pipeline = Pipeline(
        "digits",
        ("pre", "mlp", "logreg", "name"),
        (("pre", "mlp"), ("pre", "logreg"), ("mlp", "name")),
    )
    slo_s = 0.3

    async def serve(x: Any, ctx: Any) -> dict[str, Any]:
        f = await ctx.predict("pre", x)
        by_triton, by_local = await asyncio.gather(ctx.predict("mlp", f), ctx.predict("logreg", f))
        name = await ctx.predict("name", by_triton)
        return {"triton": int(by_triton), "local": int(by_local), "name": name}

    async def main() -> None:
        tb = TritonBackend(server.http_url, oversubscribe=True)
        lb = LocalBackend("local://", oversubscribe=True)
        d = Dispatcher()
        try:
            # attach: what does the running server have?
            found = await tb.discover()
            assert found["digits_pre"].state == "READY"
            assert {"digits_mlp", "digit_name"} <= set(found)
            # profile through the live backends (quick settings: a noisy shared machine)
            opts = ProfilerOptions(
                max_batch_size=4, warmup=2, min_samples=6, max_samples=10, max_seconds_per_point=1.0
            )
            inputs = {"pre": list(images[:16]), "mlp": feats[:16], "name": list(range(10)) * 2}
            tri = await profile_models(tb, [specs[m] for m in ("pre", "mlp", "name")], inputs, opts)
            loc = await profile_models(lb, [specs["logreg"]], {"logreg": feats[:16]}, opts)
            profiles = Profiles({**tri.profiles.models, **loc.profiles.models})
            assert set(profiles.models) == {"pre", "mlp", "name", "logreg"}
            # plan for a trace and an SLO
            trace = gamma_trace(60.0, 1.0, 20.0, np.random.default_rng(0))
            plan = plan_inferline(pipeline, profiles, trace, slo_s)
            assert set(plan.models) == set(pipeline.models)
            assert plan.estimated_latency_s <= slo_s
            # apply the plan
            for m, cfg in plan.models.items():
                await (lb if m == "logreg" else tb).deploy(specs[m], cfg)
                d.add_model(m, batching=FixedBatching(cfg.max_batch_size))
                assert len((lb if m == "logreg" else tb).replicas(m)) == cfg.replicas
            cfg = await tb.client.model_config("digits_mlp")
            assert cfg["max_batch_size"] == plan.models["mlp"].max_batch_size
            d.attach(tb)
            d.attach(lb)
            # serve the first 3 s of the trace, open loop
            runner = PipelineRunner(d, serve, slo_s=slo_s)
            arrivals = trace[trace - trace[0] < 3.0] - trace[0]
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            latencies: list[float] = []

            async def one(i: int, at: float) -> Any:
                await asyncio.sleep(max(0.0, t0 + at - loop.time()))
                r = await runner.run_detailed(images[i % len(images)])
                latencies.append(r.latency_s)
                return r.output

            out = await asyncio.gather(*(one(i, float(t)) for i, t in enumerate(arrivals)))
            n = len(out)
            truth = digits.test_labels[np.arange(n) % len(images)]
            names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
            assert np.mean([o["triton"] for o in out] == truth) >= 0.9
            assert np.mean([o["local"] for o in out] == truth) >= 0.9
            assert all(o["name"] == names[o["triton"]] for o in out)
            for m in pipeline.models:
                st = d.stats(m)
                assert st.completed == n and st.failed == 0
            await asyncio.sleep(0.3)  # Triton counts a request just after answering it
            ts = await tb.stats("mlp")
            assert ts["server"]["interval"]["executions"] == d.stats("mlp").batches
            p99 = float(np.percentile(latencies, 99))
            # timing on a shared 2-core machine is noisy: report, and only catch the absurd
            print(
                f"\nplan {plan.to_dict()['models']} est {plan.estimated_latency_s:.3f}s; served {n} queries, P99 {p99:.3f}s (SLO {slo_s}s)"
            )
            assert p99 < 10 * slo_s
        finally:
            await d.close()
            await lb.close()
            await tb.close()
            await _restore_pre(server)

    run(main())


def test_conformance_suite(triton: tuple[TritonServer, Digits]) -> None:
    """The project's backend conformance suite, on a backend made through the plugin host."""
    from inferline.adapters.checks import CHECKS, run_conformance
    from inferline.adapters.triton import plugin

    server, _ = triton
    host = PluginHost()
    host.load_entrypoints()
    if "triton" not in host.schemes():
        host.register(plugin, "triton")
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

    def check(x: Any, y: Any) -> None:
        assert y == names[int(x)]

    done = run(
        run_conformance(
            lambda: host.backend_for(f"{server.http_url}?oversubscribe=1"),
            ModelSpec("name", source="digit_name"),
            [1, 2, 3, 4],
            bad_input="not a label",
            check_output=check,
        )
    )
    assert done == list(CHECKS)


def test_a_stage_moves_between_model_variants_on_triton(
    triton: tuple[TritonServer, Digits],
) -> None:
    """Model variants on the real server: the repository's MLP and k-NN classifiers serve the
    stage ``cls``. The plan's variant is loaded and the other deployed unloaded; a new plan
    moves the stage to the other while queries flow, loading it before the stage moves and
    unloading the first after its queue drained. Every query is answered."""
    from inferline.core import (
        Pipeline,
        PipelineVariants,
        Plan,
        Profiles,
        VariantPlan,
        plan_with_variants_section,
    )
    from inferline.deploy._apply import apply_plan
    from inferline.deploy._format import Deployment
    from inferline.deploy._start import start_service

    server, digits = triton
    pipeline = Pipeline("digits", ("pre", "cls"), (("pre", "cls"),))
    variants = PipelineVariants.from_dict(
        {
            "format": "inferline.variants/1",
            "pipeline": "digits",
            "stages": {
                "cls": {
                    "variants": [
                        {"name": "cls-mlp", "accuracy": 0.97},
                        {"name": "cls-knn", "accuracy": 0.98},
                    ]
                }
            },
        }
    )
    # what a switch is priced with; this test moves the stage by a plan, not by the tuner
    profiles = Profiles.from_latencies(
        {m: {"cpu": {1: 0.005, 4: 0.01}} for m in ("pre", "cls-mlp", "cls-knn")}
    )

    def plan(variant: str) -> Plan:
        p = Plan("digits", 1.0, {"pre": ModelConfig("cpu", 4, 1), "cls": ModelConfig("cpu", 4, 1)})
        vp = VariantPlan(p, {"cls": variant}, variants.stages["cls"].accuracy_of(variant))
        return plan_with_variants_section(vp, pipeline, variants, profiles)

    dep = Deployment.from_dict(
        {
            "format": "inferline.deployment/1",
            "name": "digits",
            "backend": "triton://" + server.http_url.split("://", 1)[1],
            "models": [
                {"name": "pre", "source": "digits_pre"},
                {"name": "cls-mlp", "source": "digits_mlp", "params": {"outputs": ["label"]}},
                {"name": "cls-knn", "source": "digits_knn"},
            ],
            "apps": {
                "digits": {
                    "pipeline": "triton_harness.models:digits_stage_pipeline",
                    "slo_ms": 5000,
                }
            },
        }
    )

    async def main() -> tuple[list[Any], dict[str, str], dict[str, bool]]:
        tb = TritonBackend(server.http_url, oversubscribe=True)
        try:
            svc = await start_service(dep, plan("cls-mlp"), backend=tb)
            try:
                assert svc.dispatcher.resolve("cls") == "cls-mlp"
                assert len(tb.replicas("cls-mlp")) == 1 and len(tb.replicas("cls-knn")) == 0
                assert not await tb.client.model_ready("digits_knn")
                images = digits.test_images
                tasks = [
                    asyncio.create_task(svc.predict("digits", images[i % len(images)]))
                    for i in range(60)
                ]
                await asyncio.sleep(0.05)
                done = await apply_plan(svc, plan("cls-knn"))
                tasks += [
                    asyncio.create_task(svc.predict("digits", images[i % len(images)]))
                    for i in range(60, 90)
                ]
                outs = await asyncio.gather(*tasks)
                ready = {m: await tb.client.model_ready(m) for m in ("digits_mlp", "digits_knn")}
                assert svc.dispatcher.resolve("cls") == "cls-knn", done
                return outs, done, ready
            finally:
                await svc.close()
        finally:
            await tb.close()
            await _restore_pre(server)

    outs, done, ready = run(main())
    truth = digits.test_labels[np.arange(90) % len(digits.test_images)]
    assert np.mean([p.output for p in outs] == truth) >= 0.9, [p.output for p in outs][:10]
    assert not any(p.default for p in outs)
    assert done["cls"] == "served by cls-knn" and done["cls-mlp"].startswith("0 replicas"), done
    assert ready == {"digits_mlp": False, "digits_knn": True}


def test_a_plan_s_batch_size_reaches_triton(triton: tuple[TritonServer, Digits]) -> None:
    """PUT /admin/plan's batch sizes: the queue's batch and Triton's ``max_batch_size`` move
    together (before, only the replica count reached Triton, and a larger planned batch was
    split into several requests)."""
    from inferline.core import Plan
    from inferline.deploy._apply import apply_plan
    from inferline.deploy._format import Deployment
    from inferline.deploy._start import start_service

    server, digits = triton
    dep = Deployment.from_dict(
        {
            "format": "inferline.deployment/1",
            "name": "digits-batch",
            "backend": "triton://" + server.http_url.split("://", 1)[1],
            "models": [{"name": "pre", "source": "digits_pre"}],
            "apps": {
                "pre": {"pipeline": "triton_harness.models:digits_pre_pipeline", "slo_ms": 5000}
            },
        }
    )

    async def main() -> None:
        tb = TritonBackend(server.http_url, oversubscribe=True)
        try:
            svc = await start_service(
                dep, Plan("digits-batch", 5.0, {"pre": ModelConfig("cpu", 4, 1)}), backend=tb
            )
            try:
                assert (await tb.client.model_config("digits_pre"))["max_batch_size"] == 4
                done = await apply_plan(
                    svc, Plan("digits-batch", 5.0, {"pre": ModelConfig("cpu", 16, 2)})
                )
                cfg = await tb.client.model_config("digits_pre")
                assert cfg["max_batch_size"] == 16, done
                assert sum(int(g.get("count", 1)) for g in cfg["instance_group"]) == 2
                assert len(tb.replicas("pre")) == 2
                assert svc.plan is not None and svc.plan.models["pre"].max_batch_size == 16
                out = await svc.predict("pre", digits.test_images[0])
                assert not out.default
            finally:
                await svc.close()
        finally:
            await tb.close()
            await _restore_pre(server)

    run(main())
