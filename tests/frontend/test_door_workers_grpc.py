"""The KServe v2 gRPC front in door worker processes (issue 44): ``inferline serve
--door-workers 2 --grpc-port 0`` and the single process, started side by side on the same
deployment, give every gRPC call, good and bad, the same status and answer (inference, raw
and typed contents, validation, unknown model, token, message size, metadata, model config,
readiness, TF Serving, unserved RPCs). The workers, not the queue process, listen on the
gRPC port, new connections land on both of them, and SIGTERM stops everything cleanly.
A worker's overload refusal and a gone queue process are checked without a server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_door_workers import _url, _workers_of, _workers_of_gone  # the HTTP test's helpers

from inferline.demo.simple import noop_deployment

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

TOKEN = "gw0rkers"
LIMIT = 4096
AUTH = (("authorization", f"Bearer {TOKEN}"),)
# a connection of its own per channel (grpc shares one per target by default)
OWN = [("grpc.use_local_subchannel_pool", 1)]


# ---------------------------------------------------------------- without a server


class _Link:
    """A worker's channel end whose queue process never answers (or is gone)."""

    def __init__(self, gone: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = gone
        self.channel = self
        self.waiting = asyncio.Event()

    def send(self, header: dict[str, Any], payload: Any = ()) -> None:
        self.sent.append(header)

    async def request(self, header: dict[str, Any], payload: Any) -> Any:
        if self.gone:
            raise ConnectionError("the queue process closed the channel")
        self.waiting.set()
        await asyncio.Event().wait()


def _infer_request(model: str = "app") -> Any:
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name="input", datatype="FP32", shape=[1, 2])
    r.raw_input_contents.append(np.float32([1, 2]).tobytes())
    return r


def test_a_worker_refuses_past_its_bound_counts_it_and_answers_unavailable_when_alone() -> None:
    from inferline.server.frontdoors._grpc_relay import RelayAbort, RelayContext
    from inferline.server.frontdoors._grpc_worker import WorkerGrpc

    cfg = {"max_inflight": 1, "methods": {}, "infer": True}

    async def run() -> tuple[Any, Any, list[dict[str, Any]]]:
        link = _Link()
        w = WorkerGrpc(link, cfg, None, 8)
        first = asyncio.ensure_future(w.infer(_infer_request(), RelayContext([], None)))
        await link.waiting.wait()  # the first call holds the one slot
        with pytest.raises(RelayAbort) as refused:
            await w.infer(_infer_request("m2"), RelayContext([], None))
        first.cancel()
        gone = WorkerGrpc(_Link(gone=True), cfg, None, 8)
        with pytest.raises(RelayAbort) as unavailable:
            await gone.infer(_infer_request(), RelayContext([], None))
        return refused.value, unavailable.value, link.sent

    refused, unavailable, sent = asyncio.run(run())
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sent == [{"k": "overloaded", "model": "m2"}]  # the queue process counts it
    assert unavailable.code == grpc.StatusCode.UNAVAILABLE


# ---------------------------------------------------------------- a real server


def _start(dep: Path, tmp: Path, name: str, workers: int) -> tuple[subprocess.Popen[bytes], Path]:
    ready = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "inferline", "serve", "--deployment", str(dep), "--port", "0"]
    cmd += ["--grpc-port", "0", "--token", TOKEN, "--max-body-bytes", str(LIMIT)]
    cmd += ["--ready-file", str(ready), "--tuner", "none", "--on-drift", "off"]
    cmd += ["--door-workers", str(workers)]
    with open(tmp / f"{name}.log", "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), ready


def _info(proc: subprocess.Popen[bytes], ready: Path, tmp: Path) -> dict[str, Any]:
    _url(proc, ready, tmp)  # waits for the ready file (or fails with the logs)
    return dict(json.loads(ready.read_text()))


def _calls() -> list[tuple[str, Any, tuple[tuple[str, str], ...]]]:
    """(method, request, metadata): answers and refusals."""
    typed = pb.ModelInferRequest(model_name="app", id="t1")
    typed.inputs.add(name="input", datatype="INT64", shape=[1, 2]).contents.int64_contents[:] = [
        1,
        2,
    ]
    text = pb.ModelInferRequest(model_name="app")  # refused by the queue process's check
    text.inputs.add(name="input", datatype="BYTES", shape=[1, 1])
    text.raw_input_contents.append(b"\x03\x00\x00\x00abc")
    short = _infer_request()
    short.raw_input_contents[0] = b"\x00" * 5
    wrong_field = pb.ModelInferRequest(model_name="app")
    wrong_field.inputs.add(name="input", datatype="FP32", shape=[1, 1]).contents.int_contents[:] = [
        1
    ]
    big = _infer_request()
    big.raw_input_contents[0] = b"\x00" * (LIMIT + 8)
    bad_priority = _infer_request()
    bad_priority.parameters["priority"].string_param = "high"
    asked = _infer_request()
    asked.outputs.add(name="output")
    k = "/inference.GRPCInferenceService/"
    return [
        (k + "ModelInfer", _infer_request(), AUTH),
        (k + "ModelInfer", typed, AUTH),
        (k + "ModelInfer", asked, AUTH),
        (k + "ModelInfer", text, AUTH),
        (k + "ModelInfer", short, AUTH),
        (k + "ModelInfer", wrong_field, AUTH),
        (k + "ModelInfer", big, AUTH),
        (k + "ModelInfer", bad_priority, AUTH),
        (k + "ModelInfer", _infer_request("nope"), AUTH),
        (k + "ModelInfer", _infer_request(), (("authorization", "Bearer wrong"),)),
        (k + "ModelInfer", _infer_request(), ()),
        (k + "ServerLive", pb.ServerLiveRequest(), AUTH),
        (k + "ServerLive", pb.ServerLiveRequest(), ()),
        (k + "ModelReady", pb.ModelReadyRequest(name="app"), AUTH),
        (k + "ModelMetadata", pb.ModelMetadataRequest(name="app"), AUTH),
        (k + "ModelMetadata", pb.ModelMetadataRequest(name="nope"), AUTH),
        (k + "ModelConfig", pb.ModelConfigRequest(name="app"), AUTH),
        (k + "RepositoryIndex", pb.RepositoryIndexRequest(), AUTH),
        ("/tensorflow.serving.PredictionService/Classify", pb.ServerLiveRequest(), AUTH),
        ("/no.Such/Method", pb.ServerLiveRequest(), AUTH),
    ]


def _answers(target: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    with grpc.insecure_channel(target, options=OWN) as ch:
        for method, req, md in _calls():
            rpc = ch.unary_unary(method, request_serializer=type(req).SerializeToString)
            try:
                out.append(("OK", rpc(req, metadata=md, timeout=30)))
            except grpc.RpcError as e:
                out.append((e.code().name, e.details()))
        stream = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        try:
            list(stream(iter([b""]), metadata=AUTH, timeout=30))
        except grpc.RpcError as e:
            out.append((e.code().name, e.details()))
    return out


def _tcp(pid: int, port: int, status: str) -> int:
    import psutil

    conns = psutil.Process(pid).net_connections(kind="tcp")
    return sum(1 for c in conns if c.laddr and c.laddr.port == port and c.status == status)


def _spread(target: str, port: int, workers: list[int]) -> set[int]:
    """Open connections (one inference each) until both workers hold some: the kernel
    spreads new connections over the listening sockets (40 tries: 2^-39 to miss one)."""
    seen: set[int] = set()
    chans = []
    try:
        for _ in range(40):
            ch = grpc.insecure_channel(target, options=OWN)
            chans.append(ch)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            stub.ModelInfer(_infer_request(), metadata=AUTH, timeout=30)
            seen = {w for w in workers if _tcp(w, port, "ESTABLISHED")}
            if len(seen) == len(workers):
                break
    finally:
        for ch in chans:
            ch.close()
    return seen


def _serve_both(tmp: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """The bundled no-op deployment with both protocol doors: 2 door workers, and none."""
    d = noop_deployment()
    d["front_doors"] = ["kserve", "tfserving"]
    (tmp / "dep.json").write_text(json.dumps(d))
    return [_start(tmp / "dep.json", tmp, name, w) for name, w in (("multi", 2), ("single", 0))]


def test_grpc_door_workers_answer_as_the_single_process(tmp_path: Path) -> None:
    (multi, multi_ready), (single, single_ready) = _serve_both(tmp_path)
    workers: list[int] = []
    try:
        multi_info = _info(multi, multi_ready, tmp_path)
        single_info = _info(single, single_ready, tmp_path)
        want = _answers(single_info["grpc"])
        assert want[0][0] == "OK" and want[4][0] == "INVALID_ARGUMENT", want  # cases hold
        assert [c for c, _ in want[6:10]] == [
            "RESOURCE_EXHAUSTED",
            "INVALID_ARGUMENT",
            "NOT_FOUND",
            "UNAUTHENTICATED",
        ]
        assert _answers(multi_info["grpc"]) == want

        port = int(multi_info["grpc"].rsplit(":", 1)[1])
        workers = _workers_of(multi.pid)
        assert len(workers) == 2
        assert _tcp(multi.pid, port, "LISTEN") == 0  # the queue process only holds the port
        assert all(_tcp(w, port, "LISTEN") == 1 for w in workers)
        assert _spread(multi_info["grpc"], port, workers) == set(workers)
    finally:
        for p in (single, multi):
            p.send_signal(signal.SIGTERM)
        assert multi.wait(30) == 0
        single.wait(30)
    assert _workers_of_gone(workers)
    log = (tmp_path / "multi.log").read_text()
    assert "Traceback" not in log and "exited with status" not in log, log
