"""Velox on a real Redis server (skipped when redis-server is not installed)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _velox_helpers import make_model, make_table

from inferline.core.errors import ValidationError
from inferline.velox import RedisStore, VeloxConfig, VeloxService, partition_of


def test_redis_store_two_partitioned_frontends_retrain_and_restart(redis_url: str) -> None:
    async def main() -> None:
        a = VeloxService(RedisStore(redis_url))
        b = VeloxService(RedisStore(redis_url))
        await a.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(0,)))
        await b.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(1,)))
        table = make_table()
        rng = np.random.default_rng(0)
        weights = {}
        for u in range(6):
            uid = f"user{u}"
            owner = a if partition_of(uid, 2) == 0 else b
            weights[uid] = rng.normal(size=table.dim)
            for x in range(12):
                await owner.observe("m", uid, x, float(table.lookup(x) @ weights[uid]))
        seqs = [o.seq for o in a.observations("m")]
        assert seqs == list(range(1, 73))  # one gap-free log shared by both frontends
        await a.retrain("m", wait=True)
        assert await b.sync("m") and b.current_version("m") == 2
        expected = {}
        for u in range(6):
            uid = f"user{u}"
            owner = a if partition_of(uid, 2) == 0 else b
            expected[uid] = owner.user("m", uid)["weights"]
        await a.close()
        await b.close()
        # A single frontend restarts from Redis alone and serves every user at version 2.
        c = VeloxService(RedisStore(redis_url))
        await c.register(make_model())
        assert c.current_version("m") == 2
        for uid, w in expected.items():
            np.testing.assert_allclose(c.user("m", uid)["weights"], w, atol=1e-9)
        assert [e["kind"] for e in c.events("m")] == ["version", "retrained", "sync"]
        assert await c.rollback("m", 1)
        assert c.user("m", "user0")["observations"] == 12
        await c.close()

    asyncio.run(main())


def test_redis_a_second_server_on_the_same_users_is_refused(redis_url: str) -> None:
    """As with SQLite's locks (test_velox_service), but a lease: renewed while its server
    runs (so it outlives its TTL), released by close()."""
    ttl = 0.6

    async def main() -> None:
        a = VeloxService(RedisStore(redis_url, claim_ttl_s=ttl))
        await a.register(make_model())
        await asyncio.sleep(3 * ttl)  # renewed, not expired
        b = VeloxService(RedisStore(redis_url, claim_ttl_s=ttl))
        with pytest.raises(ValidationError, match=r"velox\.store: .* no other running server"):
            await b.register(make_model())
        with pytest.raises(ValidationError, match="all its users"):
            await b.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(1,)))
        c = VeloxService(RedisStore(redis_url, claim_ttl_s=ttl))
        await c.register(make_model("n"), VeloxConfig(partitions=2, owned_partitions=(1,)))
        d = VeloxService(RedisStore(redis_url, claim_ttl_s=ttl))
        await d.register(make_model("n"), VeloxConfig(partitions=2, owned_partitions=(0,)))
        with pytest.raises(ValidationError, match="partition 1 of 2"):
            await b.register(make_model("n"), VeloxConfig(partitions=2, owned_partitions=(1,)))
        with pytest.raises(ValidationError, match=r"partition \d of 2; held by"):
            await b.register(make_model("n"))  # all users: refused while any partition is held
        await c.close()
        await d.close()
        await a.observe("m", "u", 1, 2.0)
        await a.close()
        t0 = time.monotonic()
        await b.register(make_model())  # free at once: close() released the lease
        assert time.monotonic() - t0 < ttl
        assert b.user("m", "u")["observations"] == 1
        await b.close()

    asyncio.run(main())


_HOLDER = """
import asyncio, sys
sys.path[:0] = sys.argv[2:]
from _velox_helpers import make_model
from inferline.velox import RedisStore, VeloxService

async def main():
    s = VeloxService(RedisStore(sys.argv[1], claim_ttl_s=1.0))
    await s.register(make_model())
    await s.observe("m", "u", 1, 2.0)
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_redis_lease_of_a_killed_server_expires(redis_url: str) -> None:
    """A server killed without closing cannot release its lease: the next one waits for it
    to expire (one TTL), then resumes with the killed server's acknowledged observation."""
    here = str(Path(__file__).parent)
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, redis_url, here], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"

        async def refused() -> None:
            s = VeloxService(RedisStore(redis_url, claim_ttl_s=1.0))
            with pytest.raises(ValidationError, match=f"held by .*:{p.pid}:.*got 'redis://"):
                await s.register(make_model())

        asyncio.run(refused())
    finally:
        p.kill()
        p.wait()

    async def after() -> None:
        s = VeloxService(RedisStore(redis_url, claim_ttl_s=1.0))
        t0 = time.monotonic()
        await s.register(make_model())
        assert time.monotonic() - t0 < 1.6
        assert s.user("m", "u")["observations"] == 1
        await s.close()

    asyncio.run(after())
