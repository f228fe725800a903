"""The native predict route parsed in the door workers (issue 44 leftover).

A worker parses and checks ``POST /apps/{app}/predict`` with the app's rules (its config)
and sends the queue process a ``native`` frame of checked inputs; a bad request is answered
by the worker (an ``invalid`` notice keeps the queue process's metrics). First the worker's
side alone, against a fake queue link (named so: it records frames instead of a socket);
then one real run: ``inferline serve --door-workers 2`` against ``--door-workers 0`` on the
same deployment, good and bad requests, identical answers and request metrics."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from test_door_workers import _start as start_serve  # the HTTP test's helpers
from test_door_workers import _url

from inferline.demo.simple import noop_deployment
from inferline.server._decode import InputSpec
from inferline.server._door_worker import WorkerApp
from inferline.server._frames import unpack_tensors
from inferline.server._predict import AppRules

TOKEN = "n4tive"
LIMIT = 4096
RULES = AppRules("app", 1.0, 4, InputSpec("float32", (None,)))


# ---------------------------------------------------------------- the worker alone


class FakeQueueLink:
    """Stands in for the queue process: records frames, answers with ``replies`` in turn."""

    def __init__(self, replies: list[tuple[dict[str, Any], bytes]]) -> None:
        self.replies = replies
        self.requests: list[tuple[dict[str, Any], bytes]] = []
        self.notices: list[dict[str, Any]] = []
        self.channel = self

    def send(self, header: dict[str, Any], payload: Any = ()) -> None:
        self.notices.append(header)

    async def request(self, header: dict[str, Any], payload: list[Any]) -> Any:
        self.requests.append((header, b"".join(bytes(p) for p in payload)))
        head, body = self.replies.pop(0)
        return head, memoryview(body)


def _worker(link: FakeQueueLink, apps: list[AppRules]) -> WorkerApp:
    config = {"max_body_bytes": LIMIT, "max_rows": 1, "kserve": False}
    return WorkerApp(link, {**config, "apps": [a.to_dict() for a in apps]})  # type: ignore[arg-type]


def _call(link: FakeQueueLink, body: bytes, app: WorkerApp | None = None) -> tuple[int, bytes]:
    app = app or _worker(link, [RULES])
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/apps/app/predict",
        "headers": [(b"content-length", str(len(body)).encode())],
        "query_string": b"",
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], sent[1]["body"]


def test_the_worker_sends_checked_tensors_and_answers_bad_requests_itself() -> None:
    ok = ({"st": 200, "media": "application/json", "h": None}, b'{"output":1}')
    link = FakeQueueLink([ok])
    body = b'{"input_batch": [[1, 2.5], [3]], "latency_slo_ms": 250, "priority": 2}'
    assert _call(link, body) == (200, b'{"output":1}')
    ((head, payload),) = link.requests
    assert head["k"] == "native" and head["r"] == RULES.to_dict()
    assert (head["slo"], head["b"], head["prio"]) == (0.25, True, 2)
    xs = unpack_tensors(head["t"], memoryview(bytearray(payload)))
    assert [x.dtype.name for x in xs.values()] == ["float32", "float32"]
    assert [x.tolist() for x in xs.values()] == [[1.0, 2.5], [3.0]]

    link = FakeQueueLink([])
    status, answer = _call(link, b'{"input": [1], "priority": "high"}')
    assert status == 422 and json.loads(answer)["field"] == "priority"
    assert link.requests == [] and link.notices == [{"k": "invalid", "app": "app"}]


def test_rules_changed_since_the_worker_got_them_go_whole() -> None:
    new = AppRules("app", 0.5, 4, InputSpec("int64", (2,)))
    stale = ({"stale": True, "apps": [new.to_dict()]}, b"")
    whole = ({"st": 422, "media": "application/json", "h": None}, b'{"field":"input"}')
    link = FakeQueueLink([stale, whole])
    assert _call(link, b'{"input": [1.5]}') == (422, b'{"field":"input"}')
    assert [h["k"] for h, _ in link.requests] == ["native", "post"]
    assert link.requests[1][1] == b'{"input": [1.5]}'  # the body itself, parsed there


def test_an_app_the_worker_does_not_know_goes_whole_and_brings_its_rules() -> None:
    ok = ({"st": 200, "media": "application/json", "h": None, "apps": [RULES.to_dict()]}, b"{}")
    link = FakeQueueLink([ok, ok])
    app = _worker(link, [])  # started before the app was added
    assert _call(link, b'{"input": [1.0]}', app) == (200, b"{}")
    assert link.requests[0][0]["k"] == "post" and link.requests[0][0]["ask"] is True
    assert app.rules == {"app": RULES}
    _call(link, b'{"input": [1.0]}', app)
    assert link.requests[1][0]["k"] == "native"


# ---------------------------------------------------------------- a real server


def _start(dep: Path, tmp: Path, name: str, workers: int) -> tuple[subprocess.Popen[bytes], Path]:
    return start_serve(dep, tmp, name, workers, token=TOKEN, limit=LIMIT)


BODIES: list[bytes] = [
    b'{"input": [1.0, 2.0]}',
    b'{"input_batch": [[1.0], [2.0, 3.0]]}',
    b'{"input": [1, 2], "latency_slo_ms": 500, "priority": 3}',
    b'{"input": {"dtype": "float32", "shape": [2], "b64": "AACAPwAAAEA="}}',
    b'{"input": ["x"]}',  # wrong dtype
    b'{"input": [true, 1.0]}',
    b'{"input": [[1.0, 2.0]]}',  # wrong shape
    b'{"input": [1e400]}',  # not finite
    b'{"latency_slo_ms": 10}',  # missing input
    b'{"input": [1.0], "input_batch": [[1.0]]}',
    b'{"input": [1.0], "latency_slo_ms": -1}',
    b'{"input": [1.0], "latency_slo_ms": "fast"}',
    b'{"input": [1.0], "priority": "high"}',
    b'{"input": [1.0], "priority": 1000000000}',
    b'{"input": [1.0], "extra": 1}',
    b'{"input_batch": []}',
    b"[1, 2]",
    b"{not json",
    b"",
]


def _answers(url: str) -> list[tuple[int, dict[str, str], Any]]:
    out = []
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=30) as c:
        reqs = [("/apps/app/predict", b, auth) for b in BODIES]
        reqs += [
            ("/apps/nope/predict", BODIES[0], auth),
            ("/apps/app/predict", b'{"input": [' + b"1.0," * LIMIT + b"1.0]}", auth),
            ("/apps/app/predict", BODIES[0], {**auth, "Authorization": "Bearer wrong"}),
        ]
        for path, body, headers in reqs:
            r = c.post(path, content=body, headers=headers)
            data = r.json()
            data.pop("query_id", None)  # numbered per server
            for item in data.get("results", []):
                item.pop("query_id", None)
            keep = {k: v for k, v in r.headers.items() if k not in ("date", "server")}
            out.append((r.status_code, keep, data))
        text = c.get("/metrics", headers=auth).text
    counts = re.findall(
        r'^inferline_requests_total\{app="[^"]*",outcome="(?:invalid|not_found)[^\n]*', text, re.M
    )
    out.append((0, {}, sorted(counts)))
    return out


def test_native_route_through_workers_answers_as_the_single_process(tmp_path: Path) -> None:
    dep = tmp_path / "dep.json"
    dep.write_text(json.dumps(noop_deployment()))
    multi, multi_ready = _start(dep, tmp_path, "multi", 2)
    single, single_ready = _start(dep, tmp_path, "single", 0)
    try:
        want = _answers(_url(single, single_ready, tmp_path))
        got = _answers(_url(multi, multi_ready, tmp_path))
    finally:
        for p in (single, multi):
            p.send_signal(signal.SIGTERM)
        multi.wait(30)
        single.wait(30)
    statuses = [s for s, _, _ in want]
    assert statuses == [200] * 4 + [422] * 13 + [400, 422, 404, 413, 401, 0]
    assert want[-1][2], want[-1]  # the refusals were counted
    assert got == want
    assert "Traceback" not in (tmp_path / "multi.log").read_text()
