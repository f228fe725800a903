"""State stores: LRU behaviour, durability of acknowledged SQLite writes across kill -9, Redis."""

import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from inferline.adapters import free_port
from inferline.core import ValidationError
from inferline.selection import MemoryStore, RedisStore, SQLiteStore, open_store


def test_memory_store_evicts_least_recently_used():
    s = MemoryStore(capacity=2)
    s.put("a", {"v": 1})
    s.put("b", {"v": 2})
    assert s.get("a") == {"v": 1}  # touch a, so b is the LRU
    s.put("c", {"v": 3})
    assert s.get("b") is None and s.get("a") == {"v": 1} and len(s) == 2


def test_stored_state_is_a_copy():
    s = MemoryStore()
    d = {"v": [1]}
    s.put("k", d)
    d["v"].append(2)
    assert s.get("k") == {"v": [1]}


@pytest.mark.parametrize("factory", [MemoryStore, lambda: SQLiteStore(":memory:")])
def test_update_is_read_modify_write(factory):
    s = factory()
    for _ in range(5):
        s.update("n", lambda old: {"n": (old or {"n": 0})["n"] + 1})
    assert s.get("n") == {"n": 5}
    with pytest.raises(ValidationError, match="state key"):
        s.get("")


def test_acknowledged_sqlite_updates_survive_kill_9(tmp_path):
    db = tmp_path / "state.db"
    child = textwrap.dedent(
        f"""
        import sys
        from inferline.selection import SQLiteStore
        s = SQLiteStore({str(db)!r})
        for i in range(1, 100000):
            s.update("ctx", lambda old, i=i: {{"n": i}}, receipt=([f"r{{i}}"], lambda n: n))
            print(i, flush=True)  # acknowledged only after update() returned
        """
    )
    p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    acked = 0
    deadline = time.monotonic() + 20
    while acked < 50 and time.monotonic() < deadline:
        line = p.stdout.readline()
        if line:
            acked = int(line)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert acked >= 50
    reopened = SQLiteStore(db)
    stored = reopened.get("ctx")["n"]
    assert stored >= acked  # every acknowledged write is there (one more may have landed)
    assert reopened.receipt(f"r{acked}") == {"n": acked}  # and its receipt, same transaction


@pytest.fixture
def redis_url(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis", reason="the redis Python package is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait()


def test_redis_store_shared_between_clients(redis_url):
    a, b = RedisStore(redis_url), open_store(redis_url)
    a.update("k", lambda old: {"n": 1})
    b.update("k", lambda old: {"n": old["n"] + 1})
    assert a.get("k") == {"n": 2}
    a.delete("k")
    assert b.get("k") is None
    b.update("k", lambda old: {"n": 7}, receipt=(["q1", "in1"], lambda n: {"steps": n["n"]}))
    assert a.receipt("q1") == a.receipt("in1") == {"steps": 7} and a.receipt("q2") is None
    assert 0 < a._redis.ttl(a._rk("q1")) <= 7 * 86400  # bounded by a TTL
