"""``inferline attach URL --steer`` on a real ``tritonserver`` (issue 43, item 3): a two-step
ensemble of the digits Python models (``digits_pre`` -> ``digits_mlp``) steered through
Triton's own API, inferline out of the data path.

* ``--dry-run``: planned for the ensemble's end-to-end P99 and applied; the server's configs
  show the plan (max batch, instances, queue delay, REJECT queue policy from the SLO); the
  operator's second instance group and parameters stay; ``inferline detach URL --snapshot``
  gives every configuration back exactly.
* the loop: with a plan whose tuner counts 25 q/s per instance, an open-loop load of 60 q/s
  straight at Triton's ensemble makes the loop scale the steps' instance counts while no
  request fails; SIGTERM gives the operator's configurations back exactly.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from triton_harness import SetupError, TritonServer, build_repository, ensure_installed
from triton_harness.models import write_ensemble

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = "digits"
STEPS = ("digits_pre", "digits_mlp")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _http(server: TritonServer, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{path}",
        data=data,
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
    return json.loads(text) if text else None


def _configs(server: TritonServer) -> dict[str, dict[str, Any]]:
    return {m: dict(_http(server, f"/v2/models/{m}/config")) for m in (*STEPS, APP)}


def _load(server: TritonServer, model: str, cfg: dict[str, Any]) -> None:
    body = {"parameters": {"config": json.dumps(cfg)}}
    _http(server, f"/v2/repository/models/{model}/load", body)


@pytest.fixture(scope="module")
def triton(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TritonServer, Path, dict[str, Any], np.ndarray]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root: Path = tmp_path_factory.mktemp("steer-triton")
    digits = build_repository(root / "models")
    write_ensemble(root / "models", APP)
    server = TritonServer(
        install,
        root / "models",
        load=[*STEPS, APP],
        extra_args=["--metrics-config", "summary_latencies=true"],
    ).start()
    try:
        # the operator's own settings the plan does not own: they must survive steer and restore
        cfgs = _configs(server)
        pre = cfgs["digits_pre"]
        pre["instance_group"] = [
            *pre["instance_group"],
            {"name": "operators_pinned", "kind": "KIND_CPU", "count": 1},
        ]
        _load(server, "digits_pre", pre)
        mlp = cfgs["digits_mlp"]
        mlp["parameters"] = {"operator_note": {"string_value": "keep me"}}
        _load(server, "digits_mlp", mlp)
        operator = _configs(server)
        trace = np.cumsum(np.random.default_rng(0).exponential(1 / 40, 400))
        (root / "trace.txt").write_text("".join(f"{float(x)!r}\n" for x in trace))
        yield server, root, operator, digits.test_images[:50]
    finally:
        server.stop()


def _attach(server: TritonServer, root: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "inferline", "attach", server.http_url, "--steer",
        "--app", APP, "--slo-ms", "100", "--quick", "--max-batch", "4",
        "--option", f"metrics_url={server.metrics_url}",
        "--snapshot", str(root / "snap.json"), "--ready-file", str(root / "ready.json"),
        *extra,
    ]  # fmt: skip


def _kept(cfgs: dict[str, Any]) -> None:
    """The operator's settings the plan does not own are on the server."""
    groups = cfgs["digits_pre"]["instance_group"]
    assert groups[1]["name"] == "operators_pinned" and groups[1]["count"] == 1
    assert cfgs["digits_mlp"]["parameters"] == {"operator_note": {"string_value": "keep me"}}


def test_dry_run_applies_the_plan_and_detach_restores(triton) -> None:
    server, root, operator, _ = triton
    (root / "ready.json").unlink(missing_ok=True)
    cmd = _attach(server, root, "--trace", str(root / "trace.txt"), "--dry-run")
    r = subprocess.run(
        [*cmd, "--plan-out", str(root / "plan.json")],
        capture_output=True, text=True, timeout=180, env=ENV,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (root / "ready.json").is_file()
    plan = json.loads((root / "plan.json").read_text())
    assert set(plan["models"]) == set(STEPS)  # every composing model planned
    cfgs = _configs(server)
    for m in STEPS:
        want, b = plan["models"][m], plan["server_batchers"][m]
        c = cfgs[m]
        assert c["max_batch_size"] == want["max_batch_size"]
        held = 1 if m == "digits_pre" else 0  # the operator's pinned group counts
        assert sum(g["count"] for g in c["instance_group"]) == max(want["replicas"], held + 1)
        db = c["dynamic_batching"]
        assert db["max_queue_delay_microseconds"] == b["max_queue_delay_microseconds"]
        q = db["default_queue_policy"]
        assert q["timeout_action"] == "REJECT" and q["allow_timeout_override"] is True
        assert q["default_timeout_microseconds"] == b["default_timeout_microseconds"] > 0
    assert cfgs[APP]["max_batch_size"] <= min(c["max_batch_size"] for c in plan["models"].values())
    _kept(cfgs)
    d = subprocess.run(
        [sys.executable, "-m", "inferline", "detach", server.http_url,
         "--snapshot", str(root / "snap.json")],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert d.returncode == 0, d.stdout + d.stderr
    assert _configs(server) == operator


def _scaling_plan(path: Path) -> None:
    """A plan whose tuner counts 25 q/s per instance and 20 q/s planned: 60 q/s asks ~3."""
    rate, per = 20.0, 25.0
    windows = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    server = {"kind": "triton", "max_batch_size": 4, "preferred_batch_size": [],
              "max_queue_delay_microseconds": 0, "default_timeout_microseconds": 90000}  # fmt: skip
    doc = {
        "format": "inferline.plan/1",
        "pipeline": APP,
        "slo_s": 0.1,
        "models": {m: {"hardware": "cpu", "max_batch_size": 4, "replicas": 2} for m in STEPS},
        "server_batchers": {m: server for m in STEPS},
        "tuner": {
            "service_time_s": 0.004,
            "envelope": [[w, math.ceil(rate * w)] for w in windows],
            "mean_rate_qps": rate,
            "models": {
                m: {"scale_factor": 1.0, "throughput_qps": per, "max_provisioning_ratio": 1.0}
                for m in STEPS
            },
        },
    }
    path.write_text(json.dumps(doc))


async def _drive(port: int, images: np.ndarray, rate: float, seconds: float) -> list[str]:
    """Open-loop Poisson load straight at Triton's ensemble; the errors (none expected)."""
    import tritonclient.http.aio as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=200)
    errors: list[str] = []

    async def one(i: int) -> None:
        x = httpclient.InferInput("image", [1, 8, 8], "FP32")
        x.set_data_from_numpy(images[i % len(images)].reshape(1, 8, 8).astype(np.float32))
        try:
            await client.infer(APP, [x])
        except Exception as e:
            errors.append(str(e))

    gaps = np.random.default_rng(1).exponential(1 / rate, int(rate * seconds))
    start = time.monotonic()
    tasks = []
    for i, t in enumerate(np.cumsum(gaps)):
        await asyncio.sleep(max(0.0, start + t - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    await client.close()
    return errors


def _wait_ready(proc: subprocess.Popen[bytes], path: Path, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 150
    while not path.is_file():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return dict(json.loads(path.read_text()))


def test_loop_scales_under_load_without_failures_and_sigterm_restores(triton) -> None:
    server, root, operator, images = triton
    (root / "ready.json").unlink(missing_ok=True)
    _scaling_plan(root / "scaling-plan.json")
    log = root / "steer.log"
    cmd = _attach(server, root, "--plan", str(root / "scaling-plan.json"), "--port", "0")
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [*cmd, "--tick-s", "0.5", "--seed", "0"], stdout=fh, stderr=subprocess.STDOUT, env=ENV
        )
    try:
        info = _wait_ready(proc, root / "ready.json", log)
        before = _configs(server)
        assert [sum(g["count"] for g in before[m]["instance_group"]) for m in STEPS] == [2, 2]
        errors = asyncio.run(_drive(server.http_port, images, 60.0, 5.0))
        assert errors == [], errors[:3]
        with urllib.request.urlopen(info["url"] + "/admin/drift", timeout=10) as r:
            state = json.loads(r.read())
        assert state["scalings"] >= 1, (state["events"], log.read_text()[-2000:])
        counts = [sum(g["count"] for g in c["instance_group"]) for c in _configs(server).values()]
        assert max(counts) >= 3, counts  # the loop scaled through Triton's own API
        with urllib.request.urlopen(info["url"] + "/metrics", timeout=10) as r:
            page = r.read()
        # the estimate, and Triton's own summary as the measurement
        assert b"inferline_estimated_p99_seconds{" in page
        assert b"inferline_measured_p99_seconds{" in page
        _kept(_configs(server))
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0, log.read_text()[-3000:]
    assert "restored the operator's settings" in log.read_text()
    assert _configs(server) == operator
