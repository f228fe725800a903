"""Attach keeps the operator's Triton configuration (issue 35, items 2 and 3), on a real
``tritonserver`` started by the harness:

* the operator loads ``digits_pre`` with a named, rate-limited, host-policy instance group and
  its own dynamic batcher; ``inferline attach`` serves it with a plan of 2 replicas and a
  bigger batch: during attach only ``instance_group[0].count`` and ``max_batch_size`` differ;
* ``inferline detach --server``, SIGTERM or SIGINT to the attach process, and ``inferline
  detach URL --snapshot PATH`` after a SIGKILL each give back the configuration exactly;
* a server not in explicit model-control mode is refused with one line naming
  ``--model-control-mode=explicit``.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from triton_harness import SetupError, TritonServer, build_repository, ensure_installed

from inferline.core import ModelConfig, Pipeline, Plan, save

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "digits_pre"
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


def _config(server: TritonServer) -> dict[str, Any]:
    return dict(_http(server, f"/v2/models/{MODEL}/config"))


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path]]:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    root: Path = tmp_path_factory.mktemp("detach-triton")
    build_repository(root / "models")
    server = TritonServer(install, root / "models", load=[MODEL]).start()
    try:
        # the operator's own configuration: what inferline must keep and give back
        cfg = _config(server)
        cfg["instance_group"] = [
            {
                "name": "operators_group",
                "kind": "KIND_CPU",
                "count": 1,
                "host_policy": "policy_x",
                "rate_limiter": {"resources": [{"name": "R1", "count": 2}], "priority": 3},
            }
        ]
        cfg["dynamic_batching"] = {"max_queue_delay_microseconds": 700, "preserve_ordering": True}
        _http(
            server,
            f"/v2/repository/models/{MODEL}/load",
            {"parameters": {"config": json.dumps(cfg)}},
        )
        save(Pipeline("attached", (MODEL,)), str(root / "pipeline.json"))
        plan = Plan("attached", 1.0, {MODEL: ModelConfig("cpu", 128, 2)}, estimated_latency_s=0.1)
        save(plan, str(root / "plan.json"))
        yield server, root
    finally:
        server.stop()


class _Attach:
    """One ``inferline attach`` process serving the model with the plan."""

    def __init__(self, server: TritonServer, root: Path, tag: str) -> None:
        self.ready = root / f"ready-{tag}.json"
        self.snapshot = root / f"snapshot-{tag}.json"
        self.log_path = root / f"attach-{tag}.log"
        self.ready.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "inferline", "attach", server.http_url,
            "--models", MODEL, "--no-profile",
            "--pipeline", str(root / "pipeline.json"), "--plan", str(root / "plan.json"),
            "--slo-ms", "1000", "--port", "0", "--grpc-port", "-1",
            "--ready-file", str(self.ready), "--snapshot", str(self.snapshot),
        ]  # fmt: skip
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + 90
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"attach did not start: {self.log()[-3000:]}")
            time.sleep(0.1)
        self.info = json.loads(self.ready.read_text())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float = 60) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._log.close()


def _check_during(server: TritonServer, before: dict[str, Any]) -> None:
    during = _config(server)
    changed = {k for k in set(before) | set(during) if before.get(k) != during.get(k)}
    assert changed == {"instance_group", "max_batch_size"}, changed
    assert during["max_batch_size"] == 128
    (group,) = during["instance_group"]
    assert group["count"] == 2
    assert {**group, "count": 1} == before["instance_group"][0]  # name, rate limiter, policy
    assert during["dynamic_batching"] == before["dynamic_batching"]  # the operator's batcher


def test_detach_by_request_restores_the_operators_configuration(
    triton: tuple[TritonServer, Path],
) -> None:
    server, root = triton
    before = _config(server)
    att = _Attach(server, root, "request")
    snap = json.loads(att.snapshot.read_text())
    assert snap["kind"] == "triton" and snap["models"][MODEL] == before
    _check_during(server, before)
    r = subprocess.run(
        [sys.executable, "-m", "inferline", "detach", "--server", att.info["url"]],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr
    assert "detached" in r.stdout
    assert att.wait() == 0, att.log()[-3000:]
    assert _config(server) == before
    assert not att.snapshot.exists()  # spent once restored
    # nothing answers any more: a clear one-line error
    again = subprocess.run(
        [sys.executable, "-m", "inferline", "detach", "--server", att.info["url"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert again.returncode == 2
    assert "no attach server answered" in again.stderr and "--snapshot" in again.stderr


# time (~13 s): three `inferline attach` processes on the real Triton (SIGTERM, SIGINT,
# SIGKILL then restore from the snapshot), each discovering, planning and applying.
def test_sigterm_and_sigint_restore_and_a_crash_is_restored_from_the_snapshot(
    triton: tuple[TritonServer, Path],
) -> None:
    server, root = triton
    before = _config(server)
    for sig, status in ((signal.SIGTERM, 0), (signal.SIGINT, 130)):
        att = _Attach(server, root, sig.name)
        _check_during(server, before)
        att.proc.send_signal(sig)
        assert att.wait() == status, att.log()[-3000:]
        assert "restored the operator's settings" in att.log()
        assert _config(server) == before, sig.name
        assert not att.snapshot.exists()

    crashed = _Attach(server, root, "crash")
    _check_during(server, before)
    saved = copy.deepcopy(json.loads(crashed.snapshot.read_text()))
    crashed.proc.kill()  # no chance to restore
    crashed.wait()
    assert _config(server)["instance_group"][0]["count"] == 2
    r = subprocess.run(
        [
            sys.executable, "-m", "inferline", "detach", server.http_url,
            "--snapshot", str(crashed.snapshot),
        ],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert _config(server) == before == saved["models"][MODEL]


def test_attach_refuses_a_server_not_in_explicit_mode(tmp_path: Path) -> None:
    try:
        install = ensure_installed()
    except SetupError as e:
        pytest.skip(f"no Triton server available: {e}")
    build_repository(tmp_path / "models")
    with TritonServer(install, tmp_path / "models", model_control_mode="none") as server:
        r = subprocess.run(
            [
                sys.executable, "-m", "inferline", "attach", server.http_url,
                "--models", MODEL, "--no-profile",
            ],
            capture_output=True, text=True, timeout=120, env=ENV,
        )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "--model-control-mode=explicit" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
