"""The data path off FastAPI (issue 44, item 1): KServe v2 ``/infer`` (JSON and the binary
tensor extension), TF Serving ``:predict`` and ``/apps/{app}/predict`` are answered by the raw
ASGI layer in front of FastAPI, byte for byte as FastAPI's routes of the same paths answer.

Each request is sent twice to the same ASGI app: with a ``Content-Length`` (the fast path) and
chunked (no length: FastAPI's route). Status, the header list (names, values, order) and the
body must be the same; the fast path must not reach FastAPI's router."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from starlette.routing import Router

from inferline.server import App, InputSpec, Service, create_app
from inferline.server.frontdoors import (
    FrontDoor,
    Signature,
    TensorInfo,
    make_kserve_router,
    make_tfserving_router,
)

TOKEN = "s3cret"
LIMIT = 4000


async def double(x: Any, slo: float) -> Any:
    return np.asarray(x) * 2


async def broken(x: Any, slo: float) -> Any:
    raise RuntimeError("a bug in the app")


def _app() -> Any:
    svc = Service(
        [
            App("dbl", double, 1.0, input_spec=InputSpec("float32", (None,))),
            App("bug", broken, 1.0, input_spec=InputSpec("float32", (None,))),
        ]
    )
    sig = Signature((TensorInfo("x", "float32", (3,)),), (TensorInfo("y", "float32", (3,)),))
    door = FrontDoor(svc, {"dbl": sig})
    routers = [make_kserve_router(door), make_tfserving_router(door)]
    return create_app(svc, token=TOKEN, max_body_bytes=LIMIT, routers=routers)


async def _call(app: Any, path: str, body: bytes, headers: dict[str, str], chunked: bool) -> Any:
    """One request straight through the ASGI app: ``(status, [headers], body)``."""
    hs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    hs.append(
        (b"transfer-encoding", b"chunked") if chunked else (b"content-length", b"%d" % len(body))
    )
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": hs,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
    }
    parts = [body[: len(body) // 2], body[len(body) // 2 :]] if chunked else [body]
    msgs = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], list(start["headers"]), data


def _binary_infer() -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "id": "7",
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 24},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    raw = head + np.arange(6, dtype="<f4").tobytes()
    return raw, {**_AUTH, "inference-header-content-length": str(len(head))}


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


_KS = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
_AUTH = {"authorization": f"Bearer {TOKEN}", "host": "localhost"}
_CT = {**_AUTH, "content-type": "application/json"}
CASES: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("kserve json", "/v2/models/dbl/infer", _json(_KS), _AUTH),
    ("kserve version path", "/v2/models/dbl/versions/1/infer", _json(_KS), _AUTH),
    ("kserve binary", "/v2/models/dbl/infer", *_binary_infer()),
    ("kserve app by any name", "/v2/models/bug/infer", _json(_KS), _AUTH),
    ("kserve unknown model", "/v2/models/nope/infer", _json(_KS), _AUTH),
    ("kserve malformed", "/v2/models/dbl/infer", b"{not json", _AUTH),
    (
        "kserve bad header length",
        "/v2/models/dbl/infer",
        _json(_KS),
        {**_AUTH, "inference-header-content-length": "x"},
    ),
    (
        "kserve bad timeout",
        "/v2/models/dbl/infer",
        _json({**_KS, "parameters": {"timeout": -1}}),
        _AUTH,
    ),
    (
        "kserve bad priority",
        "/v2/models/dbl/infer",
        _json({**_KS, "parameters": {"priority": "high"}}),
        _AUTH,
    ),
    ("tf rows", "/v1/models/dbl:predict", _json({"instances": [[1, 2, 3], [4, 5, 6]]}), _AUTH),
    ("tf columns", "/v1/models/dbl/versions/1:predict", _json({"inputs": [[1, 2, 3]]}), _AUTH),
    (
        "tf wrong version",
        "/v1/models/dbl/versions/2:predict",
        _json({"inputs": [[1, 2, 3]]}),
        _AUTH,
    ),
    ("tf malformed path", "/v1/models/dbl/metadata", b"{}", _AUTH),
    ("tf bad value", "/v1/models/dbl:predict", _json({"instances": [["a", 2, 3]]}), _AUTH),
    ("native", "/apps/dbl/predict", _json({"input": [1, 2]}), _CT),
    ("native bad", "/apps/dbl/predict", _json({"input": [1], "priority": 1000}), _CT),
    ("no token", "/v2/models/dbl/infer", _json(_KS), {"host": "localhost"}),
    ("foreign host", "/v1/models/dbl:predict", b"{}", {**_AUTH, "host": "evil.example"}),
    (
        "native text/plain",
        "/apps/dbl/predict",
        _json({"input": [1]}),
        {**_AUTH, "content-type": "text/plain"},
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "headers"), CASES, ids=[c[0] for c in CASES])
def test_fast_path_answers_byte_for_byte_as_fastapi(
    case: str, path: str, body: bytes, headers: dict[str, str], monkeypatch: Any
) -> None:
    app = _app()
    routed: list[str] = []
    orig = Router.__call__

    async def counting(self: Any, scope: Any, receive: Any, send: Any) -> None:
        routed.append(scope["path"])
        await orig(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", counting)

    async def main() -> tuple[Any, Any]:
        fast = await _call(app, path, body, headers, chunked=False)
        assert routed == [], "the fast path went through FastAPI's router"
        slow = await _call(app, path, body, headers, chunked=True)
        return fast, slow

    fast, slow = asyncio.run(main())
    if case == "native":  # each query has its own id
        slow = (*slow[:2], slow[2].replace(b"-2", b"-1"))
    assert fast == slow
    if case in ("kserve json", "kserve binary", "tf rows", "native"):
        assert fast[0] == 200
    if case == "kserve binary":
        _, hs, data = fast
        n = int(dict(hs)[b"inference-header-content-length"])
        assert np.frombuffer(data[n:], "<f4").tolist() == [0, 2, 4, 6, 8, 10]
    if case.startswith("kserve bad t"):
        assert fast[0] == 400 and json.loads(fast[2])["field"] == "parameters.timeout"
    if case == "kserve bad priority":
        assert fast[0] == 400 and json.loads(fast[2])["field"] == "parameters.priority"
    if case == "kserve app by any name":
        assert fast[0] == 500 and json.loads(fast[2])["error"] == "InternalError"


def test_fast_path_body_limit() -> None:
    """A body over the limit is refused before it is read (413), as before; a body of the
    declared length exactly at the limit is served."""
    app = _app()
    big = _json({"instances": [[1.0, 2.0, 3.0]] * 400})
    assert len(big) > LIMIT
    status, _, data = asyncio.run(_call(app, "/v1/models/dbl:predict", big, _AUTH, chunked=False))
    assert status == 413 and json.loads(data)["error"] == "PayloadTooLarge"
    ok = _json({"instances": [[1.0, 2.0, 3.0]] * 100})
    assert len(ok) <= LIMIT
    status, _, data = asyncio.run(_call(app, "/v1/models/dbl:predict", ok, _AUTH, chunked=False))
    assert status == 200 and len(json.loads(data)["predictions"]) == 100
