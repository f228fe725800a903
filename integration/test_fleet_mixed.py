"""A mixed fleet: one real Triton server (the harness) and one TF Serving STAND-IN (or a real
``tensorflow_model_server`` when installed) serving the same model contract, ``digits_dense``:
input ``x`` FP32 [64] -> output ``probabilities`` FP32 [10], the same weights on both.

``inferline attach URL URL`` adopts it on both servers as one model (each member keeps the
parameters its own server has: Triton's config, TF Serving's base_path and signature); queries
through one queue are answered by replicas on both servers, with the same answers.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test model")

from tfserving_standin import TFServer, export_model
from triton_harness import SetupError, TritonServer, ensure_installed

from inferline.adapters.tfserving import ServedModel
from inferline.cli import main
from inferline.core import ModelConfig, ModelSpec, ValidationError
from inferline.deploy import attach, open_backend, plugin_host
from inferline.queueing import FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# a Triton Python-backend model with the TF Serving model's contract (one dense layer, softmax)
_MODEL_PY = """
import os, sys
_site = os.environ.get("INFERLINE_TRITON_SITE")
if _site and _site not in sys.path:
    sys.path.insert(0, _site)
from pathlib import Path
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        here = Path(__file__).parent
        self.w, self.b = np.load(here / "w.npy"), np.load(here / "b.npy")

    def execute(self, requests):
        out = []
        for r in requests:
            z = pb_utils.get_input_tensor_by_name(r, "x").as_numpy() @ self.w + self.b
            e = np.exp(z - z.max(axis=1, keepdims=True))
            p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("probabilities", p)]))
        return out
"""
_CONFIG = textwrap.dedent(
    """\
    name: "digits_dense"
    backend: "python"
    max_batch_size: 16
    input [ { name: "x", data_type: TYPE_FP32, dims: [64] } ]
    output [ { name: "probabilities", data_type: TYPE_FP32, dims: [10] } ]
    instance_group [ { count: 1, kind: KIND_CPU } ]
    """
)


def _weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A digits logistic regression: weights, bias and held-out inputs."""
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    warnings.simplefilter("ignore", ConvergenceWarning)  # few iterations keep the test fast

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    lr = LogisticRegression(max_iter=60).fit(x[:1000], y[:1000])
    return lr.coef_.T.astype(np.float32), lr.intercept_.astype(np.float32), x[1000:1100]


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TritonServer, TFServer, np.ndarray, np.ndarray, np.ndarray]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root = tmp_path_factory.mktemp("mixed")
    w, b, x = _weights()
    vdir = root / "triton" / "models" / "digits_dense" / "1"
    vdir.mkdir(parents=True)
    (vdir / "model.py").write_text(_MODEL_PY)
    np.save(vdir / "w.npy", w)
    np.save(vdir / "b.npy", b)
    (vdir.parent / "config.pbtxt").write_text(_CONFIG)
    export_model(root / "tf" / "digits_dense", 1, [(w, b)])
    sig = root / "tf" / "digits_dense" / "1" / "signature.json"
    if sig.exists():  # the stand-in's format: the same one output as the Triton model
        s = json.loads(sig.read_text())
        s["outputs"] = {"probabilities": s["outputs"]["probabilities"]}
        sig.write_text(json.dumps(s))
    tri = TritonServer(install, root / "triton" / "models", load=["digits_dense"])
    tf = TFServer(root / "tfs", [ServedModel("digits_dense", str(root / "tf" / "digits_dense"))])
    try:
        tf.start()
        tri.start()
        yield tri, tf, w, b, x
    finally:
        tri.kill()
        tf.kill()
        shutil.rmtree(root, ignore_errors=True)


def _urls(tri: TritonServer, tf: TFServer) -> list[str]:
    return [
        tri.grpc_url,
        f"tfserving+grpc://{tf.grpc}?model_config_file={tf.config_file}&default_max_batch_size=16",
    ]


def test_attach_cli_adopts_one_model_on_a_triton_and_a_tfserving_server(
    servers: Any, tmp_path: Path
) -> None:
    tri, tf, *_ = servers
    out = tmp_path / "found.json"
    rc = main(["attach", *_urls(tri, tf), "--no-profile", "--summary-out", str(out)])
    assert rc == 0
    found = json.loads(out.read_text())
    assert json.loads(found["url"]) == _urls(tri, tf)
    # one model, a replica on each server, the largest batch both take
    assert found["adopted"]["digits_dense"]["replicas"] == 2
    assert found["adopted"]["digits_dense"]["max_batch_size"] == 16
    sig = found["signatures"]["digits_dense"]
    assert [t["name"] for t in sig["inputs"]] == ["x"]


def test_a_mixed_fleet_answers_through_both_servers(servers: Any) -> None:
    tri, tf, w, b, x = servers
    z = x @ w + b
    want = np.exp(z - z.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)

    async def run() -> None:
        from inferline.deploy import start_attachment_service

        att = await attach(_urls(tri, tf))
        svc, _ = await start_attachment_service(att)
        try:
            st = await att.backend.stats("digits_dense")
            assert sorted(r["server"] for r in st["replicas"]) == sorted(_urls(tri, tf))
            d = svc.dispatcher
            assert d is not None
            d.set_batching("digits_dense", FixedBatching(4))
            # rounds of queries until both servers answered some (the replica that is free
            # first takes a batch: a warm TF Serving stand-in may take a whole round)
            rounds = tri_items = tf_items = 0
            while rounds < 10 and not (tri_items and tf_items):
                rounds += 1
                t = time.monotonic() + 10.0
                got = await asyncio.gather(*(d.submit("digits_dense", r, deadline=t) for r in x))
                np.testing.assert_allclose(np.stack(got), want, rtol=1e-4, atol=1e-5)
                tri_items, tf_items = await _answered(att.backend)
            assert tri_items > 0 and tf_items > 0, (tri_items, tf_items)
            assert tri_items + tf_items == rounds * len(x)  # each query answered once
            print(
                f"mixed fleet: {tri_items} queries answered by Triton, {tf_items} by TF "
                f"Serving ({tf.kind}) in {rounds} round(s)"
            )
            # a plan's larger batch: Triton reloads with it, TF Serving's model is kept
            await att.backend.reconfigure("digits_dense", ModelConfig("cpu", 32, 2))
            assert sorted(h.server for h in att.backend.replicas("digits_dense")) == sorted(
                _urls(tri, tf)
            )
            t = time.monotonic() + 10.0
            got = await asyncio.gather(*(d.submit("digits_dense", r, deadline=t) for r in x))
            np.testing.assert_allclose(np.stack(got), want, rtol=1e-4, atol=1e-5)
        finally:
            await svc.close()

    asyncio.run(run())


async def _answered(fleet: Any) -> tuple[int, int]:
    """Queries answered by each server: Triton counts its inferences, the TF member its items."""
    tri, tf = (s["stats"] for s in (await fleet.stats("digits_dense"))["servers"])
    return int(tri["server"]["cumulative"]["inference_count"]), int(tf["items"])


def test_a_mixed_fleet_deploys_with_per_member_params(servers: Any, tmp_path: Path) -> None:
    """``params.members``: TF Serving's ``base_path`` (and its own model name) for the TF
    Serving member only; Triton, which refuses ``base_path``, loads from its repository."""
    tri, tf, w, b, x = servers
    base = tmp_path / "dense_b"
    shutil.copytree(Path(str(tf.config_file)).parent.parent / "tf" / "digits_dense", base)
    urls = [tri.grpc_url, f"tfserving+grpc://{tf.grpc}?model_config_file={tf.config_file}"]
    spec = ModelSpec(
        "dense",
        source="digits_dense",
        params={"members": {"tfserving+grpc": {"base_path": str(base), "source": "dense_b"}}},
    )

    async def run() -> None:
        fleet = open_backend(plugin_host(), urls)
        try:
            with pytest.raises(ValidationError, match=r"params\.members\['triton'\]"):
                bad = {"members": {"triton": {"outputs": ["probabilities"]}}}
                await fleet.deploy(ModelSpec("typo", params=bad), ModelConfig("cpu", 8, 2))
            await fleet.deploy(spec, ModelConfig("cpu", 8, 2))
            assert sorted(h.server for h in fleet.replicas("dense")) == sorted(urls)
            for h in fleet.replicas("dense"):  # each server answers the same
                got = await h.predict_batch([x[0], x[1]])
                z = x[:2] @ w + b
                p = np.exp(z - z.max(axis=1, keepdims=True))
                np.testing.assert_allclose(
                    np.stack(got), p / p.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-5
                )
            await fleet.remove("dense")
        finally:
            await fleet.close()

    asyncio.run(run())
