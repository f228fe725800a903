"""The fleet from the shell: ``inferline serve`` of a deployment whose backend is a list of two
``local://`` runtimes (real replica processes), then ``inferline drain`` and ``inferline
undrain`` against it with its token, while queries keep coming over HTTP."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from inferline.cli import main
from inferline.core import ModelConfig, Plan, save
from inferline.demo.simple import sleep_deployment
from inferline.measure import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
URLS = ["local://?cores=0", "local://?cores=1"]


def _queries(url: str, token: str, stop: threading.Event, codes: list[int]) -> None:
    """Closed-loop queries until ``stop``; every status code lands in ``codes``."""
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            r = c.post(f"{url}/apps/app/predict", json={"input": [1.0, 2.0]}, headers=h)
            codes.append(r.status_code)


def test_serve_a_fleet_then_drain_and_undrain_from_the_cli(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dep = tmp_path / "d.json"
    dep.write_text(json.dumps(sleep_deployment(base_s=0.005, backend=URLS)))  # type: ignore[arg-type]
    plan = tmp_path / "plan.json"
    save(Plan("sleep", 1.0, {"m": ModelConfig("cpu", 4, 2)}), plan)
    monkeypatch.setenv("INFERLINE_TOKEN", "tok")  # as `inferline detach`: the token from env
    with ServerProcess(dep, plan, token="tok") as srv:
        h = {"Authorization": "Bearer tok"}
        models = httpx.get(srv.url + "/admin/models", headers=h).json()
        assert sorted(r["server"] for r in models["m"]["backend"]["replicas"]) == URLS
        stop, codes = threading.Event(), []
        t = threading.Thread(target=_queries, args=(srv.url, "tok", stop, codes))
        t.start()
        try:
            assert main(["drain", URLS[1], "--server", srv.url, "--wait-s", "10"]) == 0
            assert "is drained" in capsys.readouterr().out
            status = httpx.get(srv.url + "/admin/drain", headers=h).json()
            assert [s["draining"] for s in status["servers"]] == [False, True]
            n = len(codes)
            assert main(["undrain", URLS[1], "--server", srv.url]) == 0
            assert "takes batches again" in capsys.readouterr().out
            assert main(["drain", "local://?cores=7", "--server", srv.url]) == 2  # not a member
            assert "local://?cores=7" in capsys.readouterr().err
        finally:
            stop.set()
            t.join(30)
        assert len(codes) > n > 0 and set(codes) == {200}, sorted(set(codes))
        models = httpx.get(srv.url + "/admin/models", headers=h).json()
        assert [s["draining"] for s in models["m"]["backend"]["servers"]] == [False, False]
