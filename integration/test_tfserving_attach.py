"""``inferline attach`` on a running TF Serving (real when present, else the STAND-IN: see the
test ids), then existing clients pointed at inferline instead of the server: tritonclient
(KServe v2, HTTP binary and JSON, and gRPC), TF Serving REST and TF Serving gRPC stubs. Every
answer goes through inferline's queue and must equal scikit-learn's own prediction.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from tfserving_standin import Digits, TFServer, server_kind

from inferline.adapters.tfserving import grpc_available
from inferline.core import Pipeline, gamma_trace, save, save_trace

KIND = server_kind()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def attached(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, Any], Digits, TFServer, Path]]:
    root = tmp_path_factory.mktemp("attach")
    digits = Digits(root / "models")
    server = TFServer(root / "server", digits.served("digits_lr", "digits_mlp")).start()
    save(Pipeline("digits", ("digits_lr",)), str(root / "pipeline.json"))
    save_trace(gamma_trace(20.0, 1.0, 10.0, np.random.default_rng(0)), str(root / "trace.txt"))
    ready = root / "ready.json"
    cmd = [
        sys.executable,
        "-m",
        "inferline",
        "attach",
        f"tfserving://{server.rest}",
        "--option",
        f"grpc_port={server.grpc_port}",
        "--option",
        f"model_config_file={server.config_file}",
        "--pipeline",
        str(root / "pipeline.json"),
        "--slo-ms",
        "300",
        "--trace",
        str(root / "trace.txt"),
        "--rate-margin",
        "0.05",
        "--quick",
        "--max-batch",
        "4",
        "--samples",
        "8",
        "--port",
        "0",
        "--grpc-port",
        "0",
        # the attached door in worker processes (inferline serve's tests cover one process)
        "--door-workers",
        "2",
        "--ready-file",
        str(ready),
        "--summary-out",
        str(root / "found.json"),
        "--plan-out",
        str(root / "plan.json"),
        "--snapshot",
        str(root / "snapshot.json"),
    ]
    log = open(root / "attach.log", "wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"attach did not start: {(root / 'attach.log').read_text()[-3000:]}"
                )
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        yield info, digits, server, root
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        try:
            _check_restored(server, root)
        finally:
            server.stop()


def _check_restored(server: TFServer, root: Path) -> None:
    """SIGTERM put the operator's model config back exactly and spent the snapshot."""
    if not grpc_available() or KIND != "standin":
        return  # the readback is a STAND-IN-only route; the restore needs the gRPC stubs
    from google.protobuf import text_format

    from inferline.adapters.tfserving._protos import stubs

    out = (root / "attach.log").read_text()
    assert "restored the operator's settings" in out, out[-2000:]
    assert not (root / "snapshot.json").exists()
    cfg = stubs().model_server_config_pb2.ModelServerConfig
    want, got = cfg(), cfg()
    text_format.Parse(server.config_file.read_text(), want)
    r = requests.get(f"http://{server.rest}/standin/model_config", timeout=10)
    text_format.Parse(r.json()["model_config"], got)
    assert got == want


@pytest.mark.parametrize("kind", [KIND])
def test_attach_discovers_profiles_plans_and_serves(kind: str, attached: Any) -> None:
    info, digits, _server, root = attached
    found = json.loads((root / "found.json").read_text())
    assert set(found["adopted"]) == {"digits_lr", "digits_mlp"}
    assert found["signatures"]["digits_lr"]["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [64]}
    ]
    plan = json.loads((root / "plan.json").read_text())
    assert set(plan["models"]) == {"digits_lr"}
    out = (root / "attach.log").read_text()
    assert (
        "models at tfserving://" in out and "batch latency fit" in out and "plan: digits_lr" in out
    )
    # the pipeline app, through inferline's own route
    r = requests.post(
        f"{info['url']}/apps/pipeline/predict", json={"input": digits.x[0].tolist()}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert int(r.json()["output"]["classes"]) == int(digits.lr.predict(digits.x[:1])[0])


@pytest.mark.parametrize("kind", [KIND])
def test_tritonclient_http_and_grpc_against_inferline(kind: str, attached: Any) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    info, digits, _server, _root = attached
    x = digits.x[:6].astype(np.float32)
    want = digits.lr.predict_proba(x)
    hc = httpclient.InferenceServerClient(info["url"].removeprefix("http://"))
    assert hc.is_server_live() and hc.is_model_ready("digits_lr")
    meta = hc.get_model_metadata("digits_lr")
    assert meta["inputs"][0]["name"] == "x" and meta["inputs"][0]["datatype"] == "FP32"
    for binary in (True, False):
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        outs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary)]
        res = hc.infer("digits_lr", [inp], outputs=outs)
        np.testing.assert_allclose(res.as_numpy("probabilities"), want, atol=1e-5)
    res = hc.infer("digits_lr", [inp])  # no outputs named: all, binary
    assert list(res.as_numpy("classes")) == list(digits.lr.predict(x))
    with pytest.raises(InferenceServerException):
        hc.infer("no_such_model", [inp])
    hc.close()

    gc = grpcclient.InferenceServerClient(info["grpc"])
    assert gc.is_server_ready() and gc.is_model_ready("digits_mlp")
    gi = grpcclient.InferInput("x", list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    res = gc.infer("digits_mlp", [gi], outputs=[grpcclient.InferRequestedOutput("probabilities")])
    np.testing.assert_allclose(
        res.as_numpy("probabilities"), digits.mlp.predict_proba(x), atol=1e-5
    )
    with pytest.raises(InferenceServerException):
        gc.infer("no_such_model", [gi])
    gc.close()


@pytest.mark.parametrize("kind", [KIND])
def test_tfserving_clients_against_inferline(kind: str, attached: Any) -> None:
    info, digits, _server, _root = attached
    x = digits.x[:5]
    base = f"{info['url']}/v1/models"
    st = requests.get(f"{base}/digits_mlp", timeout=10).json()
    assert st["model_version_status"][0]["state"] == "AVAILABLE"
    meta = requests.get(f"{base}/digits_mlp/metadata", timeout=10).json()
    assert "x" in meta["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    row = requests.post(
        f"{base}/digits_mlp:predict", json={"instances": x.tolist()}, timeout=30
    ).json()
    np.testing.assert_allclose(
        [p["probabilities"] for p in row["predictions"]], digits.mlp.predict_proba(x), atol=1e-5
    )
    col = requests.post(
        f"{base}/digits_lr:predict", json={"inputs": {"x": x.tolist()}}, timeout=30
    ).json()
    np.testing.assert_allclose(
        col["outputs"]["probabilities"], digits.lr.predict_proba(x), atol=1e-5
    )
    assert (
        requests.post(
            f"{base}/nope:predict", json={"instances": x.tolist()}, timeout=10
        ).status_code
        == 404
    )
    if not grpc_available():
        pytest.skip("tensorflow-serving-api not installed: TF Serving gRPC client not run")
    import grpc

    from inferline.adapters.tfserving._protos import from_tensor_proto, stubs, to_tensor_proto

    st_ = stubs()
    with grpc.insecure_channel(info["grpc"]) as ch:
        stub = st_.prediction_service_pb2_grpc.PredictionServiceStub(ch)
        req = st_.predict_pb2.PredictRequest()
        req.model_spec.name = "digits_lr"
        req.inputs["x"].CopyFrom(to_tensor_proto(x.astype(np.float32), st_))
        resp = stub.Predict(req, timeout=30)
        np.testing.assert_allclose(
            from_tensor_proto(resp.outputs["probabilities"]), digits.lr.predict_proba(x), atol=1e-5
        )
        req.model_spec.name = "nope"
        with pytest.raises(grpc.RpcError) as ei:
            stub.Predict(req, timeout=10)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        ms = st_.model_service_pb2_grpc.ModelServiceStub(ch)
        sreq = st_.get_model_status_pb2.GetModelStatusRequest()
        sreq.model_spec.name = "digits_mlp"
        assert ms.GetModelStatus(sreq, timeout=10).model_version_status[0].state == 30


@pytest.mark.parametrize("kind", [KIND])
def test_operations_script_in_the_docs_runs(kind: str, attached: Any) -> None:
    import re

    _info, _digits, server, root = attached
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations-script.md").read_text()
    script = re.findall(r"```python\n(.*?)```", doc, re.S)[0]
    path = root / "ops.py"
    path.write_text(script)
    env = {
        **os.environ,
        "TFS_URL": f"tfserving://{server.rest}",
        "TFS_GRPC_PORT": str(server.grpc_port),
        # no TFS_MODEL_CONFIG (optional in the doc): attach asks the server about MODEL
        "MODEL": "digits_mlp",
        "SLO_MS": "300",
    }
    r = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "plan: " in r.stdout and "serving at http://127.0.0.1:" in r.stdout
    assert (
        "outputs: {" in r.stdout
        and "'probabilities': [4, 10]" in r.stdout
        and r.stdout.rstrip().endswith("done")
    )
