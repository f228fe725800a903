"""An acknowledged observation survives kill -9 of the serving process (real subprocesses)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from _velox_helpers import make_model

from inferline.velox import SQLiteStore, VeloxConfig, VeloxService

# The child serves observations as fast as it can and prints each acknowledgement (the seq the
# store returned) only after observe() returned, i.e. exactly what a client would have seen.
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from _velox_helpers import make_model
    from inferline.velox import SQLiteStore, VeloxConfig, VeloxService

    async def main():
        svc = VeloxService(SQLiteStore({db!r}))
        await svc.register(make_model(), VeloxConfig(checkpoint_every=25, {partition}))
        i = 0
        while True:
            uid = f"user{{i % 7}}"
            if svc.runtime("m").owns(uid):
                res = await svc.observe("m", uid, i % 40, float(i % 5))
                print(res.seq, uid, i % 40, float(i % 5), flush=True)
            i += 1

    asyncio.run(main())
    """
)


def _spawn(db: Path, partition: str = "") -> subprocess.Popen[str]:
    code = CHILD.format(tests=str(Path(__file__).parent), db=str(db), partition=partition)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _parse(line: str) -> tuple[int, str, int, float]:
    seq, uid, x, y = line.split()
    return int(seq), uid, int(x), float(y)


def _kill_after(procs: list[subprocess.Popen[str]], n: int) -> list[tuple[int, str, int, float]]:
    """Wait for ``n`` acknowledgements from each process, SIGKILL them all, then collect every
    acknowledgement they printed (including those still in the pipe at the kill)."""
    acks = []
    deadline = time.monotonic() + 60
    for p in procs:
        assert p.stdout is not None
        got = 0
        while got < n and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            acks.append(_parse(line))
            got += 1
        assert got == n, "child stopped acknowledging"
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        assert p.stdout is not None
        rest = p.stdout.read()  # EOF once the process is dead
        # complete lines only: the kill can cut the last one short ('301 user6 20 ')
        acks.extend(_parse(line) for line in rest.split("\n")[:-1] if len(line.split()) == 4)
        p.wait()
        assert p.returncode == -signal.SIGKILL
    return acks


def test_acknowledged_observations_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "velox.sqlite"
    acks = _kill_after([_spawn(db)], 300)
    assert len(acks) >= 300

    store = SQLiteStore(db)
    logged = {o.seq: (o.uid, o.x, o.y) for o in store.observations("m")}
    for seq, uid, x, y in acks:
        assert logged[seq] == (uid, x, y)  # every acknowledged observation is in the log
    # At most the one observation in flight at the kill may be there unacknowledged.
    assert len(logged) - len(acks) in (0, 1)

    # A restarted server rebuilds exactly the state of the log (snapshot + replay).
    async def restart() -> None:
        svc = VeloxService(store)
        await svc.register(make_model(), VeloxConfig(checkpoint_every=25))
        by_user: dict[str, int] = {}
        for uid, _, _ in logged.values():
            by_user[uid] = by_user.get(uid, 0) + 1
        for uid, n in by_user.items():
            assert svc.user("m", uid)["observations"] == n
        # Same weights as folding the log into a fresh service (nothing double-counted).
        fresh = VeloxService()
        await fresh.register(make_model())
        for o in store.observations("m"):
            await fresh.observe("m", o.uid, o.x, o.y)
        for uid in by_user:
            np.testing.assert_allclose(
                svc.user("m", uid)["weights"], fresh.user("m", uid)["weights"], atol=1e-8
            )
        await fresh.close()
        await svc.close()

    asyncio.run(restart())
    store.close()


def test_two_partitioned_processes_write_one_store_then_both_are_killed(tmp_path: Path) -> None:
    db = tmp_path / "velox.sqlite"

    # Create version 1 first so the two frontends do not race to create it.
    async def init() -> None:
        svc = VeloxService(SQLiteStore(db))
        await svc.register(make_model())
        await svc.close()

    asyncio.run(init())
    procs = [
        _spawn(db, "partitions=2, owned_partitions=(0,)"),
        _spawn(db, "partitions=2, owned_partitions=(1,)"),
    ]
    acks = _kill_after(procs, 150)
    store = SQLiteStore(db)
    logged = {o.seq: (o.uid, o.x, o.y) for o in store.observations("m")}
    assert all(logged[seq] == (uid, x, y) for seq, uid, x, y in acks)
    assert len(logged) - len(acks) in (0, 1, 2)
    # Each user was written by one process only.
    owners: dict[str, set[int]] = {}
    from inferline.velox import partition_of

    for uid, _, _ in logged.values():
        owners.setdefault(uid, set()).add(partition_of(uid, 2))
    assert all(len(p) == 1 for p in owners.values()) and len(owners) == 7
    store.close()
