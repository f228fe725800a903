"""The admin API is closed to other origins: a ``Host`` outside the allowlist gets 421 on
every route before its body is read (DNS rebinding), mutating routes need a JSON body (415:
a page's text/plain form post cannot reach them), plans are bounded by the backend's
inventory (422 naming ``models.<name>.replicas``), and the OpenAPI document declares the
bearer scheme. Over a real uvicorn server where the wire matters."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from _served_app import served

from inferline.cli import build_parser
from inferline.core import ModelConfig, Plan
from inferline.server import App, Service, create_app, make_admin_router
from inferline.server._guard import Guard


async def _echo(x: Any, slo: float) -> Any:
    return x


class FakeTarget:
    def __init__(self) -> None:
        self.plans: list[Plan] = []

    async def apply(self, service: Service, plan: Plan) -> dict[str, str]:
        self.plans.append(plan)
        service.plan = plan
        return dict.fromkeys(plan.models, "ok")


class FakeBackend:
    """Only what the admin routes read: an inventory, replica units, oversubscription."""

    def __init__(self, oversubscribe: bool = False) -> None:
        self.oversubscribe = oversubscribe

    def inventory(self) -> dict[str, int]:
        return {"cpu": 8, "gpu-t4": 2}

    def replica_units(self) -> dict[str, int]:
        return {"big": 4}


def _service(backend: Any = None) -> tuple[Service, FakeTarget]:
    target = FakeTarget()
    svc = Service([App("echo", _echo, 1.0)], backend=backend, plan_target=target)
    return svc, target


def _plan(**replicas: tuple[str, int]) -> dict[str, Any]:
    return Plan("p", 0.1, {m: ModelConfig(hw, 1, n) for m, (hw, n) in replicas.items()}).to_dict()


_JSON = {"content-type": "application/json"}


def _raw(port: int, head: str) -> bytes:
    """One request as raw bytes; what comes back before the server closes or 3 s pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(head.encode())
        got = b""
        try:
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            pass
        return got


def test_foreign_hosts_get_421_on_every_route_before_the_body_is_read() -> None:
    svc, target = _service()
    app = create_app(svc, routers=[make_admin_router])
    with served(app) as port:
        # the body never comes: the answer cannot have waited for it
        got = _raw(
            port,
            "PUT /admin/plan HTTP/1.1\r\nhost: rebound.attacker.example:8000\r\n"
            "content-type: application/json\r\ncontent-length: 1000\r\n\r\n",
        )
        assert got.startswith(b"HTTP/1.1 421"), got
        assert b"MisdirectedRequest" in got
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base) as c:
            for method, path in [
                ("GET", "/healthz"),
                ("GET", "/admin/plan"),
                ("GET", "/openapi.json"),
                ("POST", "/apps/echo/predict"),
                ("PUT", "/admin/plan"),
            ]:
                r = c.request(method, path, headers={"host": "evil.example"}, json={})
                assert r.status_code == 421, (method, path, r.text)
            for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}"):
                r = c.get("/healthz", headers={"host": host})
                assert r.status_code == 200, (host, r.text)
            r = c.put("/admin/plan", json=_plan(m=("cpu", 1)))
            assert r.status_code == 200, r.text
    assert len(target.plans) == 1


def test_the_allowlist_is_configurable() -> None:
    svc, _target = _service()
    app = create_app(svc, allowed_hosts=["api.example.com", "*.corp.test", "[::1]"])
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        for host, status in [
            ("api.example.com", 200),
            ("API.example.com:443", 200),
            ("a.b.corp.test", 200),
            ("[::1]:8000", 200),
            ("corp.test.evil", 421),
            ("example.com", 421),
            ("127.0.0.1", 421),  # a list given replaces the default
        ]:
            assert c.get("/healthz", headers={"host": host}).status_code == status, host
    svc2, _ = _service()
    anyhost = create_app(svc2, allowed_hosts=["*"])
    with served(anyhost) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.get("/healthz", headers={"host": "whatever.example"}).status_code == 200


_WILDCARD_CASES = [
    ("a.corp.test", True),
    ("A.Corp.Test:8443", True),
    ("a.b.corp.test", True),
    ("corp.test", False),  # the bare parent: "*.corp.test" names subdomains only
    ("evilcorp.test", False),  # lookalikes that merely end in "corp.test"
    ("xcorp.test", False),
    ("a.xcorp.test", False),
    ("corp.test.evil", False),
]


def test_wildcard_entries_match_subdomains_only() -> None:
    """``*.corp.test`` accepts ``a.corp.test`` and refuses the bare parent and lookalikes,
    at the guard and over a real server (421). Fails if the wildcard's suffix loses its dot
    (``endswith("corp.test")``: ``evilcorp.test`` and ``corp.test`` let in)."""
    guard = Guard(create_app(_service()[0]), None, 1 << 20, allowed_hosts=["*.corp.test"])
    scope = {"type": "http", "server": ("127.0.0.1", 8000)}
    for host, ok in _WILDCARD_CASES:
        assert guard.host_allowed(scope, host.encode()) is ok, host
    svc, _target = _service()
    app = create_app(svc, allowed_hosts=["*.corp.test"])
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        for host, ok in _WILDCARD_CASES:
            r = c.get("/healthz", headers={"host": host})
            assert r.status_code == (200 if ok else 421), (host, r.status_code, r.text)


def test_allowed_hosts_option_on_serve_deploy_and_attach() -> None:
    p = build_parser()
    for argv in (
        ["serve", "--deployment", "d.json"],
        ["deploy", "plan.json", "--deployment", "d.json"],
        ["attach", "--url", "http://127.0.0.1:8001"],
    ):
        args, _ = p.parse_known_args([*argv, "--allowed-hosts", "a.example, *.b.example"])
        assert args.allowed_hosts == ["a.example", "*.b.example"], argv
        args, _ = p.parse_known_args(argv)
        assert args.allowed_hosts is None
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--deployment", "d.json", "--allowed-hosts", "http://x/"])


def test_mutating_routes_need_json_but_protocol_routes_keep_their_types() -> None:
    svc, target = _service()
    app = create_app(svc, routers=[make_admin_router])
    body = json.dumps(_plan(m=("cpu", 1)))
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"content-type": ctype} if ctype else {}
            r = c.put("/admin/plan", content=body, headers=headers)
            assert r.status_code == 415, (ctype, r.text)
            assert r.json()["error"] == "UnsupportedMediaType"
        assert target.plans == []
        for path in ("/apps/echo/feedback", "/apps/echo/select", "/velox/m/observe"):
            r = c.post(path, content=b"{}", headers={"content-type": "text/plain"})
            assert r.status_code == 415, (path, r.text)
        r = c.put(
            "/admin/plan", content=body, headers={"content-type": "application/json; charset=utf-8"}
        )
        assert r.status_code == 200, r.text
        # the native predict route takes JSON only: a cross-origin page may POST text/plain
        # or a form without a preflight (and, without a token, spend the replicas' time)
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "x", None):
            headers = {"content-type": ctype} if ctype else {}
            r = c.post("/apps/echo/predict", content=b'{"input": 1}', headers=headers)
            assert r.status_code == 415, (ctype, r.text)
        r = c.post("/apps/echo/predict", content=b'{"input": 1}', headers=_JSON)
        assert r.status_code == 200 and r.json()["output"] == 1, r.text
        # KServe binary tensors and TF Serving bodies are not refused by the guard
        for path in ("/v2/models/echo/infer", "/v1/models/echo:predict"):
            r = c.post(path, content=b"{}", headers={"content-type": "application/octet-stream"})
            assert r.status_code != 415, (path, r.text)


@pytest.mark.parametrize(
    ("models", "status", "field"),
    [
        ({"a": ("cpu", 8)}, 200, None),
        ({"a": ("cpu", 9)}, 422, "models.a.replicas"),
        ({"a": ("cpu", 5), "b": ("cpu", 4)}, 422, "models.b.replicas"),  # together
        ({"big": ("cpu", 3)}, 422, "models.big.replicas"),  # 4 threads each
        ({"big": ("cpu", 2), "g": ("gpu-t4", 2)}, 200, None),
        ({"g": ("gpu-t4", 1_000_000)}, 422, "models.g.replicas"),
        ({"g": ("gpu-v100", 1)}, 422, "models.g.hardware"),
    ],
)
def test_plans_are_bounded_by_the_backends_inventory(
    models: dict[str, tuple[str, int]], status: int, field: str | None
) -> None:
    svc, target = _service(FakeBackend())
    app = create_app(svc, routers=[make_admin_router])
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        r = c.put("/admin/plan", json=_plan(**models))
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["field"] == field, r.text
        assert target.plans == []  # refused before anything was applied
    else:
        assert len(target.plans) == 1


def test_an_oversubscribing_backend_bounds_its_own_replicas() -> None:
    svc, target = _service(FakeBackend(oversubscribe=True))
    app = create_app(svc, routers=[make_admin_router])
    with served(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        r = c.put("/admin/plan", json=_plan(a=("cpu", 40)))
    assert r.status_code == 200, r.text
    assert target.plans[0].models["a"].replicas == 40


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_openapi_declares_the_bearer_scheme(token: str | None) -> None:
    svc, _ = _service()
    app = create_app(svc, token=token, routers=[make_admin_router])
    with served(app) as port:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        doc = httpx.get(f"http://127.0.0.1:{port}/openapi.json", headers=headers).json()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    assert {"bearer": []} in doc["security"]
    assert ({} in doc["security"]) is (token is None)  # optional without a token
