"""Velox on a real Redis server (skipped when redis-server is not installed)."""

from __future__ import annotations

import asyncio

import numpy as np
from _velox_helpers import make_model, make_table

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
