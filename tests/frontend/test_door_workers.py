"""Door worker processes (issue 44, item 3): ``inferline serve --door-workers N``.

Pure parts first (the channel's frames and tensors, the setting and the option), then one
real run: ``inferline serve --door-workers 2`` and ``inferline serve`` (the single process)
started side by side on the same deployment; every request, good and bad, gets the same
status and body from both (KServe v2 JSON and binary, TF Serving, the native route, the
guard's refusals). A worker killed with SIGKILL is replaced and the server keeps answering;
SIGTERM stops the server, its workers and its channel directory, exit status 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from inferline.cli import build_parser
from inferline.core import ValidationError
from inferline.demo.simple import noop_deployment
from inferline.deploy import ServeSettings
from inferline.server._frames import FrameChannel, pack_tensors, unpack_tensors

TOKEN = "w0rkers"
LIMIT = 4096


# ---------------------------------------------------------------- pure parts


def test_tensors_cross_the_channel_unchanged() -> None:
    obj = np.empty(3, dtype=object)
    obj[:] = [b"\x00\xffraw", "text", None]
    tensors = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i": np.array([[-129, 1000]], dtype=np.int64),
        "b": np.array([True, False]),
        "scalar": np.array(2.5),
        "empty": np.zeros((0, 4), dtype=np.uint8),
        "obj": obj,
        "strided": np.arange(10, dtype=np.float64)[::2],
    }
    meta, bufs = pack_tensors(tensors)
    header = json.loads(json.dumps(meta))  # as the frame carries it
    payload = memoryview(bytearray(b"".join(bytes(b) for b in bufs)))
    back = unpack_tensors(header, payload)
    assert list(back) == list(tensors)
    for k, a in tensors.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape, k
        assert back[k].tolist() == a.tolist(), k
    assert back["f"].flags.writeable  # as a decoded request's tensors are


def test_frames_survive_any_split_and_leave_in_one_write() -> None:
    got: list[tuple[dict[str, Any], bytes]] = []
    rx = FrameChannel(lambda h, p: got.append((h, bytes(p))), lambda e: None)

    class Wire:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.writes.append(data)

    async def send_three() -> Wire:
        tx = FrameChannel(lambda h, p: None, lambda e: None)
        wire = Wire()
        tx.connection_made(wire)  # type: ignore[arg-type]
        tx.send({"id": 1}, [b"abc"])
        tx.send({"id": 2, "t": [["x", "<f4", [1], 4]]}, [np.float32([1.5]).data])
        tx.send({"id": 3})
        await asyncio.sleep(0)
        return wire

    wire = asyncio.run(send_three())
    assert len(wire.writes) == 1  # three frames, one write
    data = wire.writes[0]
    for i in range(0, len(data), 5):  # in 5-byte pieces, as a socket may deliver them
        rx.data_received(data[i : i + 5])
    assert [h["id"] for h, _ in got] == [1, 2, 3]
    assert got[0][1] == b"abc" and got[1][1] == np.float32([1.5]).tobytes() and got[2][1] == b""


def test_the_setting_round_trips_and_the_option_sets_it() -> None:
    s = ServeSettings(door_workers=2)
    assert ServeSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert ServeSettings().door_workers == 0
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValidationError) as e:
            ServeSettings(door_workers=bad)  # type: ignore[arg-type]
        assert e.value.field == "door_workers"
    p = build_parser()
    assert p.parse_args(["serve", "--deployment", "d.json"]).door_workers == 0
    assert (
        p.parse_args(["serve", "--deployment", "d.json", "--door-workers", "4"]).door_workers == 4
    )
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--deployment", "d.json", "--door-workers", "-1"])


def test_requests_waiting_on_a_gone_queue_process_get_a_503() -> None:
    """The queue process dies (its end of the channel closes) while a worker's request waits
    for the answer: the client gets an explicit 503, not a hang or a reset."""
    from inferline.server._door_worker import QUEUE_GONE, QueueLink, WorkerApp

    class Wire:
        def write(self, data: bytes) -> None:
            pass

    async def run() -> list[dict[str, Any]]:
        link = QueueLink()
        link.channel.connection_made(Wire())  # type: ignore[arg-type]
        app = WorkerApp(link, {"max_body_bytes": LIMIT, "max_rows": 8, "kserve": True})
        sent: list[dict[str, Any]] = []
        msgs = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive() -> dict[str, Any]:
            return msgs.pop(0)

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": "POST", "path": "/apps/a/predict", "headers": []}
        task = asyncio.ensure_future(app(scope, receive, send))
        while not link.pending:
            await asyncio.sleep(0)
        link.channel.connection_lost(None)  # EOF from the queue process
        await asyncio.wait_for(task, 5)
        return sent

    sent = asyncio.run(run())
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == QUEUE_GONE


# ---------------------------------------------------------------- a real server


def _start(
    dep: Path, tmp: Path, name: str, workers: int, token: str = TOKEN, limit: int = LIMIT
) -> tuple[subprocess.Popen[bytes], Path]:
    ready = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "inferline", "serve", "--deployment", str(dep), "--port", "0"]
    cmd += ["--token", token, "--max-body-bytes", str(limit), "--ready-file", str(ready)]
    cmd += ["--tuner", "none", "--on-drift", "off", "--door-workers", str(workers)]
    with open(tmp / f"{name}.log", "wb") as log:  # the process keeps its own copy
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), ready


def _url(proc: subprocess.Popen[bytes], ready: Path, tmp: Path) -> str:
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            logs = "".join(p.read_text(errors="replace")[-1500:] for p in tmp.glob("*.log"))
            pytest.fail(f"inferline serve did not start:\n{logs}")
        time.sleep(0.05)
    return str(json.loads(ready.read_text())["url"])


def _binary_infer() -> tuple[bytes, dict[str, str]]:
    head = {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [2, 2],
                "parameters": {"binary_data_size": 16},
            }
        ],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
    }
    h = json.dumps(head).encode()
    body = h + struct.pack("<4f", 1.0, -2.0, 3.5, 0.25)
    return body, {
        "Inference-Header-Content-Length": str(len(h)),
        "Content-Type": "application/octet-stream",
    }


def _requests() -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(method, path, body, headers) for both servers: answers and refusals."""
    j = {"Content-Type": "application/json"}
    kserve = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "data": [1] * 6}]}
    wrap = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}
    short = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3], "data": [1, 2]}]}
    binary, bh = _binary_infer()
    return [
        ("POST", "/v2/models/app/infer", json.dumps(kserve).encode(), j),
        ("POST", "/v2/models/app/versions/1/infer", json.dumps(wrap).encode(), j),
        ("POST", "/v2/models/app/infer", binary, bh),
        ("POST", "/v2/models/app/infer", json.dumps(short).encode(), j),
        ("POST", "/v2/models/app/infer", b"{not json", j),
        ("POST", "/v2/models/app/infer", binary, {**bh, "Inference-Header-Content-Length": "9999"}),
        ("POST", "/v2/models/nope/infer", json.dumps(kserve).encode(), j),
        ("POST", "/v2/models/app/infer", b"x" * (LIMIT + 1), j),
        ("POST", "/v1/models/app:predict", b'{"instances": [[1.0, 2.0]]}', j),
        ("POST", "/v1/models/app:predict", b'{"instances": "no"}', j),
        ("POST", "/apps/app/predict", b'{"input": [1.0, 2.0]}', j),
        ("POST", "/apps/app/predict", b'{"input": [1.0]}', {"Content-Type": "text/plain"}),
        ("POST", "/apps/app/predict", b'{"input": "x"}', j),
        ("GET", "/v2/models/app", b"", {}),
        ("GET", "/healthz", b"", {}),
        ("GET", "/apps", b"", {}),
    ]


def _answers(url: str) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        for method, path, body, headers in _requests():
            r = c.request(method, path, content=body, headers={**auth, **headers})
            try:
                data: Any = r.json()
                if isinstance(data, dict):
                    data.pop("query_id", None)  # numbered per server
            except ValueError:
                data = r.content
            out.append((r.status_code, data))
        r = c.post("/v2/models/app/infer", content=b"{}")  # no token
        out.append((r.status_code, r.json()))
        r = c.get("/healthz", headers={**auth, "Host": "evil.example"})
        out.append((r.status_code, r.json()))
    return out


def _workers_of(pid: int) -> list[int]:
    return sorted(_worker_cmdlines(pid))


def _worker_cmdlines(pid: int) -> dict[int, list[str]]:
    import psutil

    out = {}
    for p in psutil.Process(pid).children():
        try:
            cmd = p.cmdline()
        except psutil.Error:  # gone meanwhile
            continue
        if "inferline.server._door_worker" in cmd:
            out[p.pid] = cmd
    return out


def test_serve_with_door_workers_answers_as_the_single_process(tmp_path: Path) -> None:
    d = noop_deployment()
    d["front_doors"] = ["kserve", "tfserving"]
    dep = tmp_path / "dep.json"
    dep.write_text(json.dumps(d))
    multi, multi_ready = _start(dep, tmp_path, "multi", 2)
    single, single_ready = _start(dep, tmp_path, "single", 0)
    try:
        multi_url = _url(multi, multi_ready, tmp_path)
        single_url = _url(single, single_ready, tmp_path)
        cmds = _worker_cmdlines(multi.pid)
        workers = sorted(cmds)
        assert len(workers) == 2
        channel_dir = Path(next(iter(cmds.values()))[-2]).parent
        assert channel_dir.is_dir()
        want = _answers(single_url)
        assert want[0][0] == 200 and want[2][0] == 200 and want[3][0] == 400  # the cases hold
        assert _answers(multi_url) == want

        os.kill(workers[0], signal.SIGKILL)  # a worker dies: replaced, the server answers
        deadline = time.monotonic() + 30
        while (now := _workers_of(multi.pid)) == workers or len(now) != 2:
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        workers += now
        for _ in range(8):  # new connections, spread over both workers
            assert _answers(multi_url)[0] == want[0]
    finally:
        for p in (single, multi):
            p.send_signal(signal.SIGTERM)
        assert multi.wait(30) == 0
        single.wait(30)
    assert _workers_of_gone(workers) and not channel_dir.exists()
    log = (tmp_path / "multi.log").read_text()
    assert "exited with status -9" in log and "Traceback" not in log, log


def _workers_of_gone(pids: list[int]) -> bool:
    import psutil

    return not any(psutil.pid_exists(p) for p in pids)


def test_serve_deploy_and_attach_all_take_door_workers() -> None:
    """attach carries requests too (an attached Triton or TF Serving model through the door),
    so it takes the same option as serve and deploy; 0 (one process) by default."""
    from inferline.cli import build_parser

    p = build_parser()
    for argv in (
        ["serve", "--deployment", "d.json"],
        ["deploy", "plan.json", "--deployment", "d.json"],
        ["attach", "triton://127.0.0.1:8001"],
    ):
        args, _ = p.parse_known_args(argv)
        assert args.door_workers == 0, argv
        args, _ = p.parse_known_args([*argv, "--door-workers", "3"])
        assert args.door_workers == 3, argv
