"""The ``ray://`` data path's parts that need no Ray cluster: sizing a batch for the choice of
path, the actor's reported address, and the driver's ``DirectPath`` against a real replica
gRPC server (the one a ``ray://`` actor and a ``local://`` replica process both run, here in
this process) with the backend's token. The paths on a real cluster (a broken port falling
back to Ray, deadlines on both paths) are in ``integration/test_ray_backend.py``."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from inferline.adapters.local import ContainerStats, load_container, serve_grpc
from inferline.adapters.ray._direct import DirectPath, target_of
from inferline.adapters.ray._values import payload_bytes
from inferline.adapters.ray.plugin import query_options
from inferline.core import InferlineError, ValidationError

EX = "inferline.adapters.local.examples"


def test_payload_bytes_counts_data_and_stops_past_the_limit() -> None:
    x = np.zeros(1000, dtype=np.float32)
    assert payload_bytes([x, x], 1 << 20) == 8000
    assert payload_bytes(["abc", b"de", 7, None], 1 << 20) == 5 + 16
    assert payload_bytes([{"a": [x, "xy"]}, (x,)], 1 << 20) == 8 + 4000 + 2 + 4000
    # past the limit it stops counting: the caller only asks which side a batch is on
    assert 1000 < payload_bytes([x] * 10_000, 1000) <= 1000 + 4000
    assert payload_bytes([], 0) == 0


def test_target_of_the_actors_report() -> None:
    assert target_of({"host": "10.0.0.5", "port": 4321}) == "10.0.0.5:4321"
    assert target_of({"host": "fe80::1", "port": 7}) == "[fe80::1]:7"
    assert target_of({"error": "OSError: no port"}) == "" == target_of({})


def test_object_store_min_bytes_is_a_url_option() -> None:
    opts = query_options("ray://h:1?object_store_min_bytes=0&max_message_bytes=1048576")
    assert opts == {"object_store_min_bytes": 0, "max_message_bytes": 1 << 20}
    with pytest.raises(ValidationError, match="object_store_min_bytes"):
        query_options("ray://h:1?object_store_min_bytes=lots")


def test_direct_path_against_a_real_replica_server() -> None:
    """Values cross as on ``local://`` (bad inputs answered in their slots), a wrong token is
    refused, and a stopped server is reported as unreachable."""
    container = load_container(f"{EX}:noop", {}, 1)
    stats = ContainerStats()
    lock = threading.Lock()  # shared with the actor's own method on a real replica
    cfg = {"model": "noop", "replica": "noop-0", "threads": 1}
    server, port = serve_grpc(container, cfg, stats, token="s3cret", lock=lock)

    async def body() -> None:
        d = DirectPath(f"127.0.0.1:{port}", "s3cret", 1 << 20)
        wrong = DirectPath(f"127.0.0.1:{port}", "guess", 1 << 20)
        try:
            assert await d.check(5.0) == ""
            assert (await wrong.check(5.0)).startswith("UNAUTHENTICATED")
            x = np.arange(4, dtype=np.float32)
            req, bad = d.encode([x, "s", object(), {"k": [1, 2]}])
            assert list(bad) == [2] and len(req.inputs) == 3
            out = d.decode(await d.call(req, 5.0), 4, bad, "noop")
            assert out.batch_error == ""
            np.testing.assert_array_equal(out.outputs[0], x)
            assert out.outputs[0].flags.writeable
            assert out.outputs[1] == "s" and out.outputs[3] == {"k": [1, 2]}
            assert isinstance(out.outputs[2], InferlineError)
            assert stats.batches == 1 and stats.items == 3
            server.stop(None).wait(5)
            assert (await d.check(2.0)).startswith("UNAVAILABLE")
        finally:
            await d.close()
            await wrong.close()

    try:
        asyncio.run(body())
    finally:
        server.stop(None)
