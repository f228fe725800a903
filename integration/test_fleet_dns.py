"""A fleet whose members come from a DNS name re-resolved while it serves (``?resolve=dns``),
over two real Triton servers (the harness).

The servers play two pods behind a headless Service: each serves gRPC on its own loopback
address (127.0.0.2, 127.0.0.3) and the same port, as pods do. A FAKE resolver stands in for
the cluster's DNS (no cluster here): its answer goes from [A] to [A, B] to [B] under
open-loop load, and every query is answered while B joins (its share started there) and A
leaves (drained, its share placed on B).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient[http,grpc] (extra 'triton') not installed"
)
pytest.importorskip("sklearn", reason="scikit-learn (extra 'models') trains the test models")

from _fleet_helpers import OpenLoad, serve_with, two_triton_servers, until
from triton_harness import Digits, TritonServer

from inferline.adapters import free_port
from inferline.adapters.fleet import FleetBackend, parse_dns_source
from inferline.core import ModelConfig, ModelSpec
from inferline.deploy import open_backend, plugin_host
from inferline.queueing import Dispatcher, FixedBatching

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ADDRESSES = ("127.0.0.2", "127.0.0.3")


class PodServer(TritonServer):
    """A harness server whose gRPC listens on ``address`` (a pod's IP) at a given port."""

    def __init__(self, *a: Any, address: str, grpc_port: int, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.address, self.grpc_port = address, grpc_port

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--grpc-address") + 1] = self.address
        return cmd


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Digits]]:
    port = free_port()

    def pod(install: Any, models: Path, log: Path, k: int) -> PodServer:
        return PodServer(install, models, log_path=log, address=ADDRESSES[k], grpc_port=port)

    with two_triton_servers(tmp_path_factory.mktemp("triton-pods"), pod) as (_, _, digits):
        yield port, digits


def test_members_follow_the_resolved_addresses_with_every_query_answered(
    pods: tuple[int, Digits],
) -> None:
    port, digits = pods
    images = digits.test_images[:50]
    a, b = (f"triton+grpc://{x}:{port}?oversubscribe=1" for x in ADDRESSES)
    answers: list[list[str]] = [[ADDRESSES[0]]]

    async def fake_resolver(host: str, p: int) -> Sequence[str]:  # FAKE: the cluster's DNS
        assert (host, p) == ("triton.serving.fake", port)
        return answers[-1]

    async def main() -> None:
        url = f"triton+grpc://triton.serving.fake:{port}?resolve=dns&refresh_s=0.2&oversubscribe=1"
        host = plugin_host()
        f = FleetBackend(
            [open_backend(host, a)],
            source=parse_dns_source(url),
            addresses=[ADDRESSES[0]],
            urls=[a],
            resolver=fake_resolver,
            open_member=lambda u: open_backend(host, u),
        )
        await serve_with(f, body)

    def on(f: FleetBackend) -> list[str]:
        return sorted(h.server for h in f.replicas("pre"))  # type: ignore[attr-defined]

    async def body(f: FleetBackend, d: Dispatcher) -> None:
        await f.deploy(ModelSpec("pre", source="digits_pre"), ModelConfig("cpu", 8, 2))
        d.add_model("pre", batching=FixedBatching(8), max_retries=2)
        d.attach(f)
        load = OpenLoad(d, "pre", lambda i: images[i % 50], deadline_s=5.0)
        load.start()
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        answers.append(list(ADDRESSES))  # a pod appears
        await until(lambda: on(f) == [a, b], 20, "b's share started")
        t_join = time.monotonic()
        await asyncio.sleep(0.3)
        answers.append([ADDRESSES[1]])  # the first pod goes (gone after 2 answers)
        await until(lambda: on(f) == [b, b], 20, "a's share placed on b")
        t_left = time.monotonic()
        await asyncio.sleep(0.3)
        await load.finish(30)
        errors = load.failed()
        st = await f.stats("pre")
        print(
            f"\njoin {t_join - t0:.2f} s, leave {t_left - t_join - 0.3:.2f} s, "
            f"{len(load.out)} queries, {len(errors)} errors; events {st['membership']['events']}"
        )
        assert len(load.out) == len(load.tasks) and not errors, errors[:3]
        assert [e["change"] for e in st["membership"]["events"]] == ["joined", "left"]
        assert f.servers == [b] and st["active_replicas"] == 2

    asyncio.run(main())
