"""A fleet's members from a DNS name re-resolved while it runs (``?resolve=dns``), and the
dtype check of a fleet's model contract (docs/fleets.md, "Kubernetes", "Attaching")."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from inferline.adapters.fleet import (
    DnsSource,
    FleetBackend,
    MembershipChange,
    MembershipPolicy,
    check_contracts,
    parse_dns_source,
)
from inferline.core import ModelConfig, ModelSpec, NotFoundError, ValidationError
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from _fleet_fakes import tf_digits_metadata, triton_info
from _fleet_helpers import OpenLoad, Outcome, serve_with, until

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


def _triton(x: str, probabilities: str) -> NS:
    return triton_info(
        {"x": [64]}, {"probabilities": [10]}, {"x": x, "probabilities": probabilities}
    )


def test_members_must_agree_on_dtypes_and_the_error_names_tensor_and_servers() -> None:
    tf = tf_digits_metadata("DT_DOUBLE")
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
        await serve_with(b, body)

    async def body(b: FleetBackend, d: Dispatcher) -> None:
        await b.deploy(SLEEP, ModelConfig("cpu", 4, 2))
        d.add_model("m", batching=FixedBatching(4), max_retries=2)
        d.attach(b)
        load = OpenLoad(d, "m")
        load.start()
        await asyncio.sleep(0.2)

        answers.append(["10.0.0.1", "10.0.0.2"])  # a pod appears: its even share moves there
        await until(lambda: sorted(h.server for h in b.replicas("m")) == [A, B], 20, "B's share")
        _note_pids(b)
        t_join = time.monotonic()
        await asyncio.sleep(0.4)
        assert _servers(load.out, t_join) == {A, B}

        answers.append(["10.0.0.2"])  # and the first goes away (two answers: drop_after=2)
        await until(lambda: [h.server for h in b.replicas("m")] == [B, B], 20, "A's share on B")
        assert b.servers == [B]
        _note_pids(b)
        t_left = time.monotonic()
        await asyncio.sleep(0.3)
        await load.finish(15)
        errors = load.failed()
        assert len(load.out) == len(load.tasks) and not errors, errors[:3]
        assert _servers(load.out, t_left) == {B}

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


_PID_SERVER: dict[int, str] = {}


def _note_pids(b: FleetBackend) -> None:
    """Which server each replica process belongs to (its handle's pid)."""
    for h in b.replicas("m"):
        _PID_SERVER[h.inner.pid] = h.server  # type: ignore[attr-defined]


def _servers(out: list[Outcome], after: float) -> set[str]:
    """The servers whose replicas answered the queries submitted after ``after``."""
    pids = [o.value["pid"] for o in out if o.kind == "ok" and o.submitted > after]
    return {_PID_SERVER.get(pid, str(pid)) for pid in pids}
