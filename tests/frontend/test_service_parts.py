"""The parts ``Service`` composes, each on its own: the guard only guards (the predict route
is ``PredictRoute``'s), the app registry, input decoding and outcome accounting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferline.core import (
    BackendError,
    DeadlineExceededError,
    NotFoundError,
    OverloadedError,
    ValidationError,
)
from inferline.server import App, DefaultAnswer, InputSpec, Service
from inferline.server._apps import AppRegistry
from inferline.server._decode import decode_input
from inferline.server._guard import Guard
from inferline.server._outcomes import QueryIds, QueryRunner
from inferline.server._predict_route import predict_app_name


class _Counter:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.reasons: list[str] = []

    def observe(self, app: str, latency_s: float, outcome: str) -> None:
        self.seen.append((app, outcome))

    def defaults(self, app: str, reason: str) -> None:
        self.reasons.append(reason)

    def refused(self, app: str, reason: str) -> None:
        self.reasons.append(f"refused: {reason}")

    def goodput(self, app: str) -> None:
        pass


def _run(handler: Any, *, default: bool) -> tuple[Any, _Counter]:
    counter = _Counter()
    runner = QueryRunner(counter, lambda: 0.0, QueryIds())
    kw: dict[str, Any] = {"default_output": -1} if default else {}
    app = App("a", handler, 0.05, max_wait_s=0.05, **kw)
    try:
        got: Any = asyncio.run(runner.run(app, 1))
    except BaseException as e:
        got = e
    return got, counter


async def _slow(x: Any, slo: float) -> Any:
    await asyncio.sleep(1)


def _raising(e: BaseException) -> Any:
    async def h(x: Any, slo: float) -> Any:
        raise e

    return h


def _returning(v: Any) -> Any:
    async def h(x: Any, slo: float) -> Any:
        return v

    return h


@pytest.mark.parametrize(
    ("handler", "default", "outcome", "result"),
    [
        (_returning(2), False, "ok", 2),
        (_slow, False, "error", DeadlineExceededError),
        (_slow, True, "default", -1),
        (_raising(OverloadedError("m", 10)), True, "overloaded", OverloadedError),
        (_raising(ValidationError("x", "y", "z")), True, "invalid", ValidationError),
        (_raising(BackendError("m", "down")), True, "default", -1),
        (_raising(BackendError("m", "down")), False, "error", BackendError),
        (_raising(RuntimeError("bug")), True, "error", RuntimeError),
        (_returning(OverloadedError("m", 10)), True, "error", OverloadedError),
        (_returning(ValueError("one input")), True, "default", -1),
        (_returning(ValueError("one input")), False, "error", ValueError),
        (_returning(DefaultAnswer("low", "why", "selection")), False, "default", "low"),
    ],
)
def test_every_query_ends_in_one_counted_outcome(handler, default, outcome, result):
    got, counter = _run(handler, default=default)
    assert counter.seen == [("a", outcome)]
    if isinstance(result, type):
        assert isinstance(got, result)
    else:
        assert got.output == result
        assert got.default == (outcome == "default")


def test_app_registry_names_are_unique_and_lookups_name_the_apps():
    reg = AppRegistry()
    reg.add(App("a", _returning(1), 1.0))
    with pytest.raises(ValidationError):
        reg.add(App("a", _returning(1), 1.0))
    with pytest.raises(NotFoundError):
        reg.get("b")
    assert list(reg.apps) == ["a"]


def test_decode_input_checks_against_the_spec():
    spec = InputSpec("float32", (2,))
    assert decode_input(spec, [1, 2], "input").tolist() == [1.0, 2.0]
    with pytest.raises(ValidationError):
        decode_input(spec, [True, 2], "input")
    assert decode_input(None, [1, "x"], "input", plain=True) == [1, "x"]


def test_service_composes_the_parts():
    svc = Service([App("a", _returning(3), 1.0)])
    assert svc.apps is svc._registry.apps
    assert asyncio.run(svc.predict("a", 0)).output == 3
    assert svc.health()["apps"] == ["a"]
    assert svc.variant_stages() == {}


def test_predict_path_names():
    assert predict_app_name("/apps/m/predict") == "m"
    for path in ("/apps//predict", "/apps/a/b/predict", "/apps/predict", "/apps/m/select"):
        assert predict_app_name(path) is None


def test_the_guard_passes_a_checked_predict_request_on():
    """The guard does not answer predict requests itself: the app behind it does."""
    reached: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = Guard(inner, None, 100)
    sent: list[Any] = []

    async def send(msg: Any) -> None:
        sent.append(msg)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/apps/m/predict",
        "headers": [
            (b"host", b"localhost"),
            (b"content-length", b"2"),
            (b"content-type", b"application/json"),
        ],
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(guard(scope, receive, send))
    assert reached == ["/apps/m/predict"]
    assert sent[0]["status"] == 204
