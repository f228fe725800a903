"""The serving CLI end to end: `serve` (with a token), `deploy PLAN --url`, `trace`, `replay`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from inferline.core import ModelConfig, Plan, save
from inferline.demo.simple import sleep_deployment
from inferline.measure import ServerProcess

pytestmark = pytest.mark.integration


def _cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if token:
        env["INFERLINE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "inferline", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


# time (~13 s): `inferline serve`, `deploy` and `replay` as the user runs them: separate
# processes, each an interpreter start and the project's imports.
def test_serve_deploy_replay(tmp_path):
    dep = tmp_path / "d.json"
    dep.write_text(json.dumps(sleep_deployment(base_s=0.002)))
    plan = tmp_path / "plan.json"
    save(Plan("sleep", 0.5, {"m": ModelConfig("cpu", 4, 2)}), plan)
    bad_plan = tmp_path / "bad.json"
    save(Plan("sleep", 0.5, {"zz": ModelConfig("cpu", 4, 2)}), bad_plan)

    r = _cli("deploy", str(plan), "--deployment", str(dep), "--dry-run")
    assert r.returncode == 0 and "m: 2 x cpu, max batch 4" in r.stdout
    r = _cli("deploy", str(bad_plan), "--deployment", str(dep), "--dry-run")
    assert r.returncode == 2 and "zz" in r.stderr
    r = _cli("serve", "--deployment", str(dep), "--tuner-hysteresis", "-1")
    assert r.returncode == 2 and "hysteresis" in r.stderr  # refused before anything starts

    with ServerProcess(dep, token="tok") as srv:
        h = {"Authorization": "Bearer tok"}
        assert httpx.get(srv.url + "/healthz").status_code == 401
        # a port in use: one line naming the address, not a traceback
        port = srv.url.rsplit(":", 1)[1]
        r = _cli("serve", "--deployment", str(dep), "--port", port)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"127.0.0.1:{port} (Address already in use)" in r.stderr, r.stderr
        r = _cli("deploy", str(plan), "--deployment", str(dep), "--url", srv.url, token="tok")
        assert r.returncode == 0, r.stderr
        assert "m: 2 replicas, max batch 4" in r.stdout
        models = httpx.get(srv.url + "/admin/models", headers=h).json()
        assert models["m"]["backend"]["active_replicas"] == 2
        replica_pids = [r["pid"] for r in models["m"]["backend"]["replicas"]]
        assert models["m"]["queue"]["max_batch_size"] == 4
        assert httpx.get(srv.url + "/admin/plan", headers=h).json()["models"]["m"]["replicas"] == 2

        trace = tmp_path / "t.txt"
        r = _cli("trace", "gamma", "--rate", "80", "--duration-s", "2", "-o", str(trace))
        assert r.returncode == 0, r.stderr
        out = tmp_path / "replay.json"
        r = _cli(
            "replay",
            str(trace),
            "--url",
            srv.url,
            "--app",
            "app",
            "--deployment",
            str(dep),
            "--slo-ms",
            "5000",
            "-o",
            str(out),
            token="tok",
        )
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "P99 latency" in r.stdout
        s = json.loads(out.read_text())["summary"]
        assert s["answered"] == s["queries"] == s["ok"] > 100
        # 80 q/s on two replicas of a 5 ms model: nothing comes near 5 s (a 50% allowance here
        # let a replay that mismeasured latencies pass)
        assert s["slo_miss_rate"] == 0.0 and s["slo_ms"] == 5000
        r = _cli("replay", str(trace), "--url", srv.url, "--app", "app", "--deployment", str(dep))
        assert r.returncode == 1  # no token: every query refused (401), reported as errors
        assert "401" in r.stdout
        # no --slo-ms: the miss rate is measured against the app's SLO in the deployment
        assert "100.00% (SLO 1000 ms)" in r.stdout, r.stdout
        # a graceful stop (SIGTERM) exits 0, as Triton and TF Serving do, not by the signal
        assert srv.stop() == 0, srv.log_tail()
    # and it stops the replica processes too
    deadline = time.monotonic() + 10
    while any(
        psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in replica_pids
    ):
        assert time.monotonic() < deadline, replica_pids
        time.sleep(0.1)


def test_calibrate_scales_profiles_to_the_live_service_times(tmp_path):
    """`calibrate` reads a running server's recent service quantiles per batch size and writes
    profiles scaled to them; without live batches it refuses, naming what it needs."""
    from inferline.core import BatchProfile, Profiles, WakeProfile, load_profiles

    dep = tmp_path / "d.json"
    dep.write_text(json.dumps(sleep_deployment(base_s=0.008)))
    plan = tmp_path / "plan.json"
    save(Plan("sleep", 0.5, {"m": ModelConfig("cpu", 1, 1)}), plan)
    # a profile 4x faster than the 8 ms the model sleeps (as if measured on a faster machine)
    prof = Profiles(
        {"m": {"cpu": {b: BatchProfile(0.002, 0.002, 0.0025) for b in (1, 2, 4)}}},
        {"m": {"cpu": WakeProfile((0.01,), (0.001,))}},
    )
    prof_path, out = tmp_path / "p.json", tmp_path / "cal.json"
    save(prof, prof_path)
    args = ["calibrate", "--profiles", str(prof_path), "--plan", str(plan), "-o", str(out)]
    with ServerProcess(dep, token="tok") as srv:
        r = _cli(*args, "--url", srv.url, "--min-batches", "20", token="tok")
        assert r.returncode == 2 and "serve traffic first" in r.stderr, r.stderr
        assert not out.exists()
        r = _cli(*args, "--url", srv.url)  # no token
        assert r.returncode == 2 and "401" in r.stderr, r.stderr
        trace = tmp_path / "t.txt"
        r = _cli("trace", "gamma", "--rate", "40", "--duration-s", "2", "-o", str(trace))
        assert r.returncode == 0, r.stderr
        r = _cli(
            "replay", str(trace), "--url", srv.url, "--app", "app", "--deployment", str(dep),
            token="tok",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        r = _cli(*args, "--url", srv.url, "--min-batches", "20", "--json", token="tok")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["model"] == "m" and row["sizes"] == [1] and row["batches"] >= 20
    # the replica sleeps 8 ms (plus its RPC): at least 3.5x the profile's 2 ms median
    assert row["p50_factor"] > 3.5 and row["p99_factor"] > 3.0
    cal = load_profiles(out)
    assert cal.batch_profile("m", "cpu", 4).p50_s == pytest.approx(0.002 * row["p50_factor"])
    assert cal.wake("m", "cpu") is None
