"""A fleet's members from a DNS name re-resolved while it runs (``?resolve=dns``), and the
dtype check of a fleet's model contract (docs/fleets.md, "Kubernetes", "Attaching")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from types import SimpleNamespace as NS
from typing import Any

import pytest

from inferline.adapters.fleet import (
    DnsSource,
    FleetBackend,
    MembershipChange,
    MembershipPolicy,
    check_contracts,
    parse_dns_source,
)
from inferline.core import InferlineError, ModelConfig, ModelSpec, NotFoundError, ValidationError
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

pytestmark = pytest.mark.timeout(90)

SLEEP = ModelSpec("m", source="inferline.adapters.local.examples:Sleep", params={"base_s": 0.03})


def test_a_dns_url_is_read_and_checked_option_by_option() -> None:
    s = parse_dns_source("triton+grpc://triton.svc:8001?resolve=dns&refresh_s=2.5&cpu_cores=4")
    assert s is not None
    assert (s.host, s.port, s.refresh_s, s.drop_after) == ("triton.svc", 8001, 2.5, 2)
    assert s.member_url("10.0.0.7") == "triton+grpc://10.0.0.7:8001?cpu_cores=4"
    assert s.member_url("fd00::7") == "triton+grpc://[fd00::7]:8001?cpu_cores=4"
    assert DnsSource.from_dict(s.to_dict()) == s
    assert parse_dns_source("triton+grpc://h:8001?cpu_cores=4") is None
    assert parse_dns_source("local://?cores=0") is None
    bad = {
        "triton+grpc://h:8001?resolve=srv": "resolve",
        "triton+grpc://h:8001?refresh_s=5": "resolve",  # refresh without resolve=dns
        "triton+grpc://h:8001?resolve=dns&refresh_s=0": "refresh_s",
        "triton+grpc://h:8001?resolve=dns&refresh_s=soon": "refresh_s",
        "triton+grpc://h:8001?resolve=dns&drop_after=0": "drop_after",
        "triton+grpc://h?resolve=dns": "port",
    }
    for url, where in bad.items():
        with pytest.raises(ValidationError) as e:
            parse_dns_source(url)
        assert e.value.field == f"{url}: {where}", url


def test_the_policy_adds_at_once_and_removes_after_drop_after_answers() -> None:
    p = MembershipPolicy(drop_after=2)
    assert p.step(["a"], ["a", "b"]) == MembershipChange(("b",), ())
    assert not p.step(["a", "b"], ["b"])  # one answer without 'a' is not 'a' gone
    assert not p.step(["a", "b"], ["a", "b"])  # 'a' back: its count starts again
    assert not p.step(["a", "b"], ["b"])
    assert not p.step(["a", "b"], None)  # the resolver failed: nothing changes
    assert not p.step(["a", "b"], [])  # nor does an empty answer
    assert p.step(["a", "b"], ["b", "c"]) == MembershipChange(("c",), ("a",))
    assert p.absent == {}
    assert MembershipPolicy(1).step(["a", "b"], ["b"]) == MembershipChange((), ("a",))


def _triton(**dtypes: str) -> NS:
    """Stands in for Triton's ``TritonModelInfo`` (``io`` with names, dims and datatypes)."""
    t = lambda n: NS(name=n, dims=[64] if n == "x" else [10], datatype=dtypes[n])  # noqa: E731
    return NS(io=NS(inputs=[t("x")], outputs=[t("probabilities")]))


def test_members_must_agree_on_dtypes_and_the_error_names_tensor_and_servers() -> None:
    tf = {
        "servers": {"h2": [{"state": "AVAILABLE"}]},
        "signatures": {
            "serving_default": {
                "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [-1, 64]}},
                "outputs": {"probabilities": {"dtype": "DT_DOUBLE", "shape": [-1, 10]}},
            }
        },
    }
    a, b = "triton+grpc://h1:8001", "tfserving+grpc://h2:8500"
    check_contracts("d", {a: _triton(x="FP32", probabilities="FP64"), b: tf})  # one spelling
    with pytest.raises(ValidationError) as e:
        check_contracts("d", {a: _triton(x="FP32", probabilities="FP32"), b: tf})
    assert e.value.field == "adopt('d').outputs['probabilities'].dtype"
    assert a in str(e.value) and "FP32" in str(e.value) and "FP64" in str(e.value)
    with pytest.raises(ValidationError, match=r"inputs\['x'\]"):
        check_contracts("d", {a: _triton(x="INT64", probabilities="FP64"), b: tf})


def test_open_backend_builds_a_fleet_of_what_the_name_resolves_to() -> None:
    b = open_backend(plugin_host(), "triton+grpc://localhost:8001?resolve=dns&refresh_s=30")
    try:
        assert isinstance(b, FleetBackend)
        assert b.url == "triton+grpc://localhost:8001?resolve=dns&refresh_s=30"
        assert "triton+grpc://127.0.0.1:8001" in b.servers
    finally:
        asyncio.run(b.close())
    with pytest.raises(ValidationError, match="drop_after"):
        open_backend(plugin_host(), "triton+grpc://localhost:8001?resolve=dns&drop_after=x")


def test_a_deployment_file_names_the_fleet_by_its_dns_url() -> None:
    from inferline.deploy import Deployment

    url = "triton+grpc://localhost:8001?resolve=dns&refresh_s=5&cpu_cores=2"
    d = Deployment.from_dict(
        {
            "format": "inferline.deployment/1",
            "name": "f",
            "backend": url,
            "models": [{"name": "m", "source": "digits_pre"}],
            "apps": {},
        }
    )
    assert Deployment.from_dict(d.to_dict()) == d
    b = d.open_backend()
    try:
        assert isinstance(b, FleetBackend) and b.url == url
        assert b.servers == ["triton+grpc://127.0.0.1:8001?cpu_cores=2"]
        assert b.inventory() == {"cpu": 2}  # each member's options from the URL
    finally:
        asyncio.run(b.close())


A, B = "triton+grpc://10.0.0.1:8001", "triton+grpc://10.0.0.2:8001"
# each "pod" is a real local runtime: the FAKE resolver's addresses name them
PODS = {A: "local://?cores=0&oversubscribe=1", B: "local://?cores=1&oversubscribe=1"}


async def _until(cond: Any, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.05)


def test_members_join_and_leave_as_the_name_resolves_with_every_query_answered() -> None:
    answers: list[list[str]] = [["10.0.0.1"]]

    async def fake_resolver(host: str, port: int) -> Sequence[str]:  # FAKE: no DNS here
        assert (host, port) == ("pods.fake", 8001)
        return answers[-1]

    async def main() -> None:
        host = plugin_host()
        src = parse_dns_source("triton+grpc://pods.fake:8001?resolve=dns&refresh_s=0.2")
        assert src is not None
        b = FleetBackend(
            [open_backend(host, PODS[A])],
            source=src,
            addresses=["10.0.0.1"],
            urls=[A],
            resolver=fake_resolver,
            open_member=lambda u: open_backend(host, PODS[u]),
        )
        d = Dispatcher()
        try:
            await body(b, d)
        finally:
            await d.close()
            await b.close()

    async def body(b: FleetBackend, d: Dispatcher) -> None:
        await b.deploy(SLEEP, ModelConfig("cpu", 4, 2))
        d.add_model("m", batching=FixedBatching(4), max_retries=2)
        d.attach(b)
        out: list[Any] = []
        stop = asyncio.Event()
        loader = asyncio.create_task(_load(d, stop, out))
        await asyncio.sleep(0.2)

        answers.append(["10.0.0.1", "10.0.0.2"])  # a pod appears: its even share moves there
        await _until(lambda: sorted(h.server for h in b.replicas("m")) == [A, B])
        _note_pids(b)
        t_join = time.monotonic()
        await asyncio.sleep(0.4)
        assert {r[4] for r in out if r[0] == "ok" and r[2] > t_join} == {A, B}

        answers.append(["10.0.0.2"])  # and the first goes away (two answers: drop_after=2)
        await _until(lambda: [h.server for h in b.replicas("m")] == [B, B])
        assert b.servers == [B]
        _note_pids(b)
        t_left = time.monotonic()
        await asyncio.sleep(0.3)
        stop.set()
        tasks = await loader
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        errors = [r for r in out if r[0] != "ok"]
        assert len(out) == len(tasks) and not errors, errors[:3]
        assert {r[4] for r in out if r[2] > t_left} == {B}

        st = await b.stats("m")
        assert [s["server"] for s in st["servers"]] == [B]
        assert (st["target_replicas"], st["active_replicas"]) == (2, 2)
        ms = st["membership"]
        assert ms["addresses"] == ["10.0.0.2"] and ms["refresh_s"] == 0.2
        assert [(e["change"], e["server"]) for e in ms["events"]] == [("joined", B), ("left", A)]
        assert ms["events"][0]["replicas"] == {"m": 1}
        assert ms["events"][1]["replicas"] == {"m": {B: 1}}
        with pytest.raises(NotFoundError):
            b.drain(A)

    asyncio.run(main())


async def _load(d: Dispatcher, stop: asyncio.Event, out: list[Any]) -> list[asyncio.Task[None]]:
    """Open-loop queries every 5 ms until ``stop``: ``(kind, value, submitted, answered,
    the server of the replica that answered)`` each."""
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        t = time.monotonic()
        try:
            value = await d.submit("m", i, deadline=t + 10)
            out.append(("ok", value, t, time.monotonic(), _server(value)))
        except InferlineError as e:
            out.append(("error", e, t, time.monotonic(), None))

    i = 0
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(0.005)
    return tasks


_PID_SERVER: dict[int, str] = {}


def _note_pids(b: FleetBackend) -> None:
    """Which server each replica process belongs to (its handle's pid)."""
    for h in b.replicas("m"):
        _PID_SERVER[h.inner.pid] = h.server  # type: ignore[attr-defined]


def _server(value: Any) -> str:
    return _PID_SERVER.get(value["pid"], str(value["pid"]))
