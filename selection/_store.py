"""Where per-application / per-user / per-session policy state lives (Clipper's contextualization).

States are JSON objects (``state.to_dict()``). Three stores with one interface:

- ``MemoryStore``: in-process LRU with a capacity (states of evicted keys restart from ``init``).
- ``SQLiteStore``: persistent; WAL journal and ``synchronous=FULL`` so an update that returned
  (was acknowledged) survives a crash of the process (kill -9) or the machine.
- ``RedisStore``: shared by several frontends; optional (needs the ``redis`` package and a server).

An update may carry a *receipt* (``update(..., receipt=(keys, make))``): a small record written
in the same transaction as the state, readable with ``receipt(key)``. Feedback leaves one, so a
client retrying after a crash learns whether its first try counted (the query log is in memory).
Receipts are bounded: the newest ``receipt_capacity`` in memory and SQLite, a TTL in Redis.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from inferline.core.errors import BackendError, StorageError, ValidationError

__all__ = ["MemoryStore", "RedisStore", "SQLiteStore", "StateStore", "open_store"]

JSONState = dict[str, Any]
# keys to file the receipt under, and its record made from the state the update wrote
Receipt = tuple[Sequence[str], Callable[[JSONState], Mapping[str, Any]]]
UpdateFn = Callable[[JSONState | None], Mapping[str, Any]]  # old state (None: none) -> new


def _receipt_record(receipt: Receipt, new: JSONState) -> tuple[list[str], str]:
    """The checked keys and the JSON record of ``receipt`` for the state ``new``."""
    rkeys, make = receipt
    return [_check_key(k) for k in rkeys], json.dumps(dict(make(new)))


@runtime_checkable
class StateStore(Protocol):
    def get(self, key: str) -> JSONState | None: ...

    def put(self, key: str, state: Mapping[str, Any]) -> None: ...

    def update(self, key: str, fn: UpdateFn) -> JSONState: ...  # and ``receipt=`` (optional)

    def delete(self, key: str) -> None: ...

    def close(self) -> None: ...


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > 512:
        raise ValidationError("state key", "a non-empty string of at most 512 characters", key)
    return key


class MemoryStore:
    """In-memory LRU store; thread-safe."""

    def __init__(self, capacity: int = 100_000, receipt_capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValidationError("capacity", "an integer >= 1", capacity)
        self.capacity = capacity
        self.receipt_capacity = receipt_capacity
        self._data: OrderedDict[str, str] = OrderedDict()
        self._receipts: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> JSONState | None:
        with self._lock:
            raw = self._data.get(_check_key(key))
            if raw is None:
                return None
            self._data.move_to_end(key)
            return json.loads(raw)  # type: ignore[no-any-return]

    def put(self, key: str, state: Mapping[str, Any]) -> None:
        raw = json.dumps(dict(state))  # serialize: callers cannot mutate what is stored
        with self._lock:
            self._data[_check_key(key)] = raw
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def update(self, key: str, fn: UpdateFn, receipt: Receipt | None = None) -> JSONState:
        with self._lock:
            raw = self._data.get(_check_key(key))
            new = dict(fn(json.loads(raw) if raw is not None else None))
            self._data[key] = json.dumps(new)
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)
            if receipt is not None:
                rkeys, rec = _receipt_record(receipt, new)
                for rk in rkeys:
                    self._receipts[rk] = rec
                    self._receipts.move_to_end(rk)
                while len(self._receipts) > self.receipt_capacity:
                    self._receipts.popitem(last=False)
            return new

    def receipt(self, key: str) -> JSONState | None:
        with self._lock:
            raw = self._receipts.get(key)
        return None if raw is None else json.loads(raw)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(_check_key(key), None)

    def __len__(self) -> int:
        return len(self._data)

    def close(self) -> None:
        pass


class SQLiteStore:
    """Durable store in one SQLite file (WAL, synchronous=FULL).

    A write the file cannot take (disk full, read-only) raises ``StorageError`` (HTTP 503),
    and a store that cannot be written at all is refused when it opens."""

    def __init__(self, path: str | Path, receipt_capacity: int = 100_000) -> None:
        self.path = Path(path)
        self.receipt_capacity = receipt_capacity
        self._receipts_since_prune = 0
        self._lock = threading.Lock()
        with self._errors():
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: the commit is on disk before put() returns, so an acknowledged write survives
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            # a real write: a read-only file fails here, not at the first acknowledged update
            self._db.execute("CREATE TABLE IF NOT EXISTS writable (ok INTEGER PRIMARY KEY)")
            self._db.execute("INSERT OR REPLACE INTO writable VALUES (1)")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise StorageError(str(self.path), str(e)) from e

    def get(self, key: str) -> JSONState | None:
        with self._lock, self._errors():
            row = self._db.execute(
                "SELECT value FROM state WHERE key=?", (_check_key(key),)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, state: Mapping[str, Any]) -> None:
        raw = json.dumps(dict(state))
        with self._lock, self._errors():
            self._db.execute(
                "INSERT INTO state(key, value) VALUES(?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (_check_key(key), raw),
            )

    def update(self, key: str, fn: UpdateFn, receipt: Receipt | None = None) -> JSONState:
        with self._lock, self._errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT value FROM state WHERE key=?", (_check_key(key),)
                ).fetchone()
                new = dict(fn(json.loads(row[0]) if row else None))
                self._db.execute(
                    "INSERT INTO state(key, value) VALUES(?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (key, json.dumps(new)),
                )
                if receipt is not None:
                    self._write_receipt(receipt, new)
                self._db.execute("COMMIT")
            except BaseException:
                # a failed COMMIT (disk full) may have ended the transaction already
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return new

    def _write_receipt(self, receipt: Receipt, new: JSONState) -> None:
        rkeys, rec = _receipt_record(receipt, new)
        for rk in rkeys:
            # REPLACE gives the row a new, highest rowid: rowid order is write order
            self._db.execute("INSERT OR REPLACE INTO receipts(key, value) VALUES(?, ?)", (rk, rec))
        self._receipts_since_prune += 1
        if self._receipts_since_prune >= 256:  # keep the newest receipt_capacity rows
            self._receipts_since_prune = 0
            self._db.execute(
                "DELETE FROM receipts WHERE rowid <= (SELECT MAX(rowid) FROM receipts) - ?",
                (self.receipt_capacity,),
            )

    def receipt(self, key: str) -> JSONState | None:
        with self._lock, self._errors():
            row = self._db.execute("SELECT value FROM receipts WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def delete(self, key: str) -> None:
        with self._lock, self._errors():
            self._db.execute("DELETE FROM state WHERE key=?", (_check_key(key),))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM state").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStore:
    """Store shared by several frontends; updates use WATCH/MULTI optimistic transactions."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "inferline:state:",
        receipt_ttl_s: int = 7 * 86400,
    ) -> None:
        self.receipt_ttl_s = receipt_ttl_s
        try:
            import redis
        except ImportError:  # pragma: no cover - depends on the optional extra
            raise BackendError(
                "redis", "the 'redis' package is not installed (pip install inferline[redis])"
            ) from None
        self._redis = redis.Redis.from_url(url)
        self._watch_error = redis.WatchError
        self.prefix = prefix
        try:
            self._redis.ping()
        except redis.RedisError as e:
            raise BackendError(url, f"cannot reach redis: {e}") from None

    def _k(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def get(self, key: str) -> JSONState | None:
        raw = self._redis.get(self._k(key))
        return json.loads(raw) if raw is not None else None

    def put(self, key: str, state: Mapping[str, Any]) -> None:
        self._redis.set(self._k(key), json.dumps(dict(state)))

    def update(self, key: str, fn: UpdateFn, receipt: Receipt | None = None) -> JSONState:
        k = self._k(key)
        with self._redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(k)
                    raw = pipe.get(k)
                    new = dict(fn(json.loads(raw) if raw is not None else None))
                    pipe.multi()
                    pipe.set(k, json.dumps(new))
                    if receipt is not None:
                        rkeys, rec = _receipt_record(receipt, new)
                        for rk in rkeys:
                            pipe.set(self._rk(rk), rec, ex=self.receipt_ttl_s)
                    pipe.execute()
                    return new
                except self._watch_error:
                    continue

    def _rk(self, key: str) -> str:
        return self.prefix + "receipt:" + _check_key(key)

    def receipt(self, key: str) -> JSONState | None:
        raw = self._redis.get(self._rk(key))
        return json.loads(raw) if raw is not None else None

    def delete(self, key: str) -> None:
        self._redis.delete(self._k(key))

    def close(self) -> None:
        self._redis.close()


def open_store(spec: str | None) -> StateStore:
    """``None``/``"memory"`` -> MemoryStore; ``redis://...`` -> RedisStore; else a SQLite path."""
    if spec is None or spec == "memory":
        return MemoryStore()
    if spec.startswith(("redis://", "rediss://")):
        return RedisStore(spec)
    return SQLiteStore(spec)
