"""The TF Serving adapter against a server: the real ``tensorflow_model_server`` when one is on
PATH (or ``$TENSORFLOW_MODEL_SERVER``), else the STAND-IN in ``tfserving_standin``. Every test
id carries which one ran (``[real]`` or ``[standin]``).

Models: two digits classifiers trained here (multinomial logistic regression and a small MLP,
scikit-learn), exported in the server's format; outputs are compared with scikit-learn's own
``predict_proba``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from tfserving_standin import Digits, TFServer, server_command, server_kind

from inferline.adapters import PluginHost
from inferline.adapters.checks import run_conformance
from inferline.adapters.tfserving import (
    TFServingBackend,
    TFServingClient,
    TFServingNotFound,
    grpc_available,
)
from inferline.core import ModelConfig, ModelSpec, ReplicaError

KIND = server_kind()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
needs_grpc = pytest.mark.skipif(
    not grpc_available(), reason="tensorflow-serving-api (gRPC stubs) not installed"
)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return Digits(tmp_path_factory.mktemp("tfs-models"))


@pytest.fixture(scope="module")
def server(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TFServer]:
    s = TFServer(tmp_path_factory.mktemp("tfs-server"), digits.served("digits_lr", "digits_mlp"))
    with s:
        yield s


def _launch_url(n: int) -> tuple[str, dict[str, Any]]:
    return f"tfserving://127.0.0.1?launch={n}", {"binary": server_command()}


@pytest.mark.parametrize("kind", [KIND])
def test_rest_routes_and_semantics(kind: str, server: TFServer, digits: Digits) -> None:
    base = f"http://{server.rest}/v1/models"
    st = requests.get(f"{base}/digits_lr", timeout=10).json()
    assert st["model_version_status"][0]["state"] == "AVAILABLE"
    meta = requests.get(f"{base}/digits_lr/metadata", timeout=10).json()
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["x"]["dtype"] == "DT_FLOAT"
    rows = digits.x[:5].tolist()
    row = requests.post(f"{base}/digits_lr:predict", json={"instances": rows}, timeout=10).json()
    col = requests.post(
        f"{base}/digits_lr:predict", json={"inputs": {"x": rows}}, timeout=10
    ).json()
    want = digits.lr.predict_proba(digits.x[:5])
    np.testing.assert_allclose([p["probabilities"] for p in row["predictions"]], want, atol=1e-5)
    np.testing.assert_allclose(col["outputs"]["probabilities"], want, atol=1e-5)
    r = requests.post(f"{base}/nope:predict", json={"instances": rows}, timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    r = requests.post(f"{base}/digits_lr:predict", json={"instances": [[1.0, 2.0]]}, timeout=10)
    assert r.status_code == 400 and "error" in r.json()
    assert requests.get(f"{base}/nope", timeout=10).status_code == 404


@needs_grpc
@pytest.mark.parametrize("kind", [KIND])
def test_grpc_reload_replaces_the_whole_set(kind: str, digits: Digits, tmp_path: Path) -> None:
    async def main(s: TFServer) -> None:
        c = TFServingClient(s.rest, s.grpc, "grpc")
        try:
            assert (await c.status("digits_lr"))[0]["state"] == "AVAILABLE"
            out = await c.predict("digits_lr", {"x": digits.x[:4]})
            np.testing.assert_allclose(
                out["probabilities"], digits.lr.predict_proba(digits.x[:4]), atol=1e-5
            )
            meta = await c.metadata("digits_lr")
            assert meta["signatures"]["serving_default"]["inputs"]["x"]["shape"] == [-1, 64]
            # reload with only the MLP: the LR model is unloaded (its versions END)
            await c.reload(digits.served("digits_mlp"))
            assert (await c.status("digits_mlp"))[0]["state"] == "AVAILABLE"
            with pytest.raises(TFServingNotFound):
                await c.predict("digits_lr", {"x": digits.x[:1]})
            lr = await c.status("digits_lr")
            assert all(v["state"] == "END" for v in lr)
            with pytest.raises(TFServingNotFound):
                await c.status("never_loaded")
        finally:
            await c.close()

    with TFServer(tmp_path, digits.served("digits_lr")) as s:
        asyncio.run(main(s))


@pytest.mark.parametrize("kind,protocol", [(KIND, "rest"), (KIND, "grpc")])
def test_conformance(kind: str, protocol: str, digits: Digits) -> None:
    if not grpc_available():
        # deploy/scale use ModelService/HandleReloadConfigRequest, which TF Serving offers
        # over gRPC only
        pytest.skip("tensorflow-serving-api (gRPC stubs) not installed: no model management")
    url, opts = _launch_url(2)
    if protocol == "grpc":
        url = url.replace("tfserving://", "tfserving+grpc://")
    host = PluginHost.default()
    spec = ModelSpec("mlp", "digits_mlp", {"base_path": str(digits.paths["digits_mlp"])})
    want = {
        tuple(x): p
        for x, p in zip(digits.x[:4].tolist(), digits.mlp.predict_proba(digits.x[:4]), strict=True)
    }

    def check(x: Any, y: Any) -> None:
        np.testing.assert_allclose(
            y["probabilities"], want[tuple(np.asarray(x).tolist())], atol=1e-5
        )

    done = asyncio.run(
        run_conformance(
            lambda: host.backend_for(url, **opts),
            spec,
            list(digits.x[:4]),
            bad_input=np.ones(3, np.float32),
            check_output=check,
        )
    )
    assert "errors" in done and done[-1] == "close"


@needs_grpc
@pytest.mark.parametrize("kind", [KIND])
def test_reload_carries_models_and_recovers_a_killed_server(kind: str, digits: Digits) -> None:
    async def main() -> None:
        url, opts = _launch_url(2)
        b = TFServingBackend(url, load_timeout_s=30, recovery_timeout_s=60, **opts)
        try:
            lr = ModelSpec("lr", "digits_lr", {"base_path": str(digits.paths["digits_lr"])})
            mlp = ModelSpec(
                "mlp",
                "digits_mlp",
                {"base_path": str(digits.paths["digits_mlp"]), "outputs": ["classes"]},
            )
            await b.deploy(lr, ModelConfig("cpu", 8, 2))
            await b.deploy(mlp, ModelConfig("cpu", 8, 1))
            ep_mlp = b.replicas("mlp")[0].endpoint  # type: ignore[attr-defined]
            assert set(ep_mlp.models) == {"digits_lr", "digits_mlp"}
            # the server that keeps the MLP loses the LR: the reload must carry the MLP
            victim = next(h for h in b.replicas("lr") if h.endpoint is ep_mlp)  # type: ignore[attr-defined]
            keep = [h for h in b.replicas("lr") if h is not victim]
            b._get("lr").handles = [*keep, victim]  # scale-down removes the last handles
            await b.scale("lr", 1)
            assert set(ep_mlp.models) == {"digits_mlp"}
            assert (await ep_mlp.client.status("digits_mlp"))[0]["state"] == "AVAILABLE"
            got = await b.replicas("mlp")[0].predict_batch(list(digits.x[:10]))
            assert [int(c) for c in got] == list(digits.mlp.predict(digits.x[:10]))

            # kill -9 the MLP's server: explicit errors, then recovery (restart + reload)
            seen: list[int] = []
            b.subscribe(lambda m, hs: seen.append(len(hs)) if m == "mlp" else None)
            ep_mlp.proc.kill()
            ep_mlp.proc.wait()
            h = b.replicas("mlp")[0]
            with pytest.raises(ReplicaError):
                await h.predict_batch(list(digits.x[:3]))
            assert b.replicas("mlp") == [] and seen[0] == 0
            for _ in range(600):
                if b.replicas("mlp"):
                    break
                await asyncio.sleep(0.05)
            assert len(b.replicas("mlp")) == 1 and seen[-1] == 1
            got = await b.replicas("mlp")[0].predict_batch(list(digits.x[:5]))
            assert [int(c) for c in got] == list(digits.mlp.predict(digits.x[:5]))
        finally:
            await b.close()
        assert b.server_pids() == []

    asyncio.run(main())


@pytest.mark.parametrize("kind", [KIND])
def test_attach_discover_adopt_and_serve(kind: str, server: TFServer, digits: Digits) -> None:
    from inferline.queueing import Dispatcher, FixedBatching, PipelineRunner

    async def main() -> None:
        url = f"tfserving://{server.rest}?grpc_port={server.grpc_port}&model_config_file={server.config_file}"
        b = PluginHost.default().backend_for(url)
        try:
            found = await b.discover()
            assert set(found) == {"digits_lr", "digits_mlp"}
            assert (
                found["digits_lr"]["signatures"]["serving_default"]["outputs"]["classes"]["dtype"]
                == "DT_INT64"
            )
            for name in found:
                cfg = await b.adopt(name, outputs=["probabilities"])
                assert cfg.replicas == 1
            d = Dispatcher()
            for name in found:
                d.add_model(name, batching=FixedBatching(8))
            d.attach(b)

            async def ensemble(x: Any, ctx: Any) -> int:
                p, q = await asyncio.gather(
                    ctx.predict("digits_lr", x), ctx.predict("digits_mlp", x)
                )
                return int(np.argmax(p + q))

            runner = PipelineRunner(d, ensemble, slo_s=1.0)
            got = await asyncio.gather(*(runner.run(x) for x in digits.x[:120]))
            acc = float(np.mean(np.array(got) == digits.y[:120]))
            assert acc > 0.9, acc
            st = await b.stats("digits_lr")
            assert st["items"] == 120 and st["batches"] < 120  # batched by inferline's queue
            await d.close()
        finally:
            await b.close()
        # attached models stay loaded after close
        r = requests.get(f"http://{server.rest}/v1/models/digits_lr", timeout=5).json()
        assert r["model_version_status"][0]["state"] == "AVAILABLE"

    asyncio.run(main())


def test_which_server_ran(record_property: Any) -> None:
    """Says in the report which TF Serving the tests used."""
    record_property("tfserving_server", KIND)
    print(json.dumps({"tfserving_server": KIND, "command": server_command()}))
    assert KIND in ("real", "standin")
