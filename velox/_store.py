"""Durable state of Velox models: the observation log, versions, user-state snapshots, events.

The observation log is the source of truth. ``append_observation`` returns only after the row is
committed, so an acknowledged observation survives a crash of the server process; user states
are snapshots that bound how much of the log a restart replays. A user's snapshot row records
``upto_seq``, the last log entry folded into it, so replay is exact even when several frontends
(each owning some uid partitions) checkpoint at different times.

Storage formats: inputs as the JSON codec (no pickle), vectors and matrices as little-endian
float64 bytes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from inferline.core.errors import NotFoundError, StorageError, ValidationError

from ._codec import dumps, loads, vector_from_bytes, vector_to_bytes
from ._model import NewObservation, Observation

__all__ = ["SQLiteStore", "UserRow", "VeloxStore", "VersionRecord"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionRecord:
    """One version of a model: its lineage, why it exists, and the log position it covers.

    ``base_seq``: every observation with a larger seq is replayed into this version's users
    when it is loaded (its retrain saw the log up to ``base_seq``).
    """

    version: int
    parent: int | None
    created_s: float
    reason: str
    base_seq: int
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "parent": self.parent,
            "created_s": self.created_s,
            "reason": self.reason,
            "base_seq": self.base_seq,
            "info": dict(self.info),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VersionRecord:
        return cls(
            version=int(d["version"]),
            parent=None if d.get("parent") is None else int(d["parent"]),
            created_s=float(d["created_s"]),
            reason=str(d["reason"]),
            base_seq=int(d["base_seq"]),
            info=dict(d.get("info", {})),
        )


@dataclass(frozen=True)
class UserRow:
    """Snapshot of one user's sufficient statistics (``A``, ``b``) in one version."""

    uid: str
    n: int
    upto_seq: int
    gram: np.ndarray
    b: np.ndarray


@runtime_checkable
class VeloxStore(Protocol):
    def append_observation(self, model: str, obs: NewObservation) -> int: ...
    def observations(
        self, model: str, after_seq: int = 0, upto_seq: int | None = None
    ) -> list[Observation]: ...
    def last_seq(self, model: str) -> int: ...
    def put_version(self, model: str, record: VersionRecord, state: Any) -> bool: ...
    def version_state(self, model: str, version: int) -> Any: ...
    def versions(self, model: str) -> list[VersionRecord]: ...
    def set_current(self, model: str, version: int) -> None: ...
    def current(self, model: str) -> int | None: ...
    def save_users(self, model: str, version: int, rows: Iterable[UserRow]) -> None: ...
    def load_users(self, model: str, version: int) -> list[UserRow]: ...
    def record_event(self, model: str, kind: str, detail: dict[str, Any], ts: float) -> None: ...
    def events(self, model: str) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


def _safe(name: str) -> str:
    """A model name as a file-name part."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


_INSERT_OBS = (
    "INSERT INTO observations (model, uid, x, y, version, features, ts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _obs_row(model: str, o: NewObservation) -> tuple[Any, ...]:
    """One observation as the columns of ``_INSERT_OBS`` (one encoding for single and bulk)."""
    f = None if o.features is None else vector_to_bytes(o.features)
    return (model, o.uid, dumps(o.x), float(o.y), int(o.version), f, float(o.ts))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL, uid TEXT NOT NULL, x TEXT NOT NULL, y REAL NOT NULL,
    version INTEGER NOT NULL, features BLOB, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS observations_model ON observations (model, seq);
CREATE TABLE IF NOT EXISTS versions (
    model TEXT NOT NULL, version INTEGER NOT NULL, record TEXT NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (model, version));
CREATE TABLE IF NOT EXISTS current (model TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    model TEXT NOT NULL, version INTEGER NOT NULL, uid TEXT NOT NULL, n INTEGER NOT NULL,
    upto_seq INTEGER NOT NULL, gram BLOB NOT NULL, b BLOB NOT NULL,
    PRIMARY KEY (model, version, uid));
CREATE TABLE IF NOT EXISTS writable (ok INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, ts REAL NOT NULL,
    kind TEXT NOT NULL, detail TEXT NOT NULL);
"""


class SQLiteStore:
    """SQLite in WAL mode: one file, safe for several processes and threads.

    Several processes may share the file only for disjoint users (``owned_partitions``): a
    process's user snapshots claim every log entry up to their sequence number, so two servers
    writing the same users would each hide the other's observations on the next resume.
    :meth:`claim` enforces that with an advisory lock per (model, partition) that the OS
    drops when the process dies.

    ``synchronous="NORMAL"`` (default) makes every committed write survive the death of the
    process (kill -9): WAL appends reach the OS before commit returns. ``"FULL"`` adds an fsync
    per commit, which also survives power loss, at ~ms per observation. Each thread gets its own
    connection (the retrain and checkpoint workers read and write off the event loop).
    """

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 10_000,
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValidationError("synchronous", "OFF, NORMAL, FULL or EXTRA", synchronous)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if str(path) == ":memory:":
            # A throwaway file rather than SQLite's shared-cache memory mode, whose table locks
            # are not covered by busy_timeout and would fail under the worker threads.
            self._tmp = tempfile.TemporaryDirectory(prefix="velox-")
            path = Path(self._tmp.name) / "velox.sqlite"
        self.path = str(path)
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self._uri = Path(self.path).resolve().as_uri()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._claims: list[Any] = []
        try:
            self._conn().executescript(_SCHEMA)
            # a real write: a read-only file fails here, not at the first acknowledged observe
            self._conn().execute("INSERT OR REPLACE INTO writable VALUES (1)")
        except sqlite3.Error as e:
            raise StorageError(self.path, f"cannot be written: {e}") from e

    def claim(
        self, model: str, partitions: Sequence[int] | None, n_partitions: int
    ) -> Callable[[], None]:
        """Serve ``model``'s users in ``partitions`` (None: all) from this process alone, or
        raise ValidationError naming the store when another server already does. Returns
        the release (the claim also ends with the store or the process)."""
        import fcntl

        # The model's lock: exclusive for a server of every user, shared among partitioned
        # ones, which also hold their partitions' locks exclusively.
        base = f"{self.path}.{_safe(model)}"
        wanted = [(Path(f"{base}.lock"), fcntl.LOCK_SH if partitions else fcntl.LOCK_EX, None)]
        wanted += [
            (Path(f"{base}.p{p}of{n_partitions}.lock"), fcntl.LOCK_EX, p) for p in partitions or ()
        ]
        held = []
        for lock, mode, p in wanted:
            f = lock.open("a+")
            try:
                fcntl.flock(f, mode | fcntl.LOCK_NB)
            except OSError:
                f.close()
                for h in held:
                    h.close()
                which = "all its users" if p is None else f"partition {p}"
                raise ValidationError(
                    "velox.store",
                    f"a store that no other running server writes model {model!r} ({which}) "
                    "to (give each server its own store, or disjoint owned_partitions)",
                    self.path,
                ) from None
            held.append(f)
        with self._lock:
            self._claims += held

        def release() -> None:
            for f in held:
                f.close()
            with self._lock:
                self._claims = [c for c in self._claims if c not in held]

        return release

    def _conn(self) -> sqlite3.Connection:
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            if self._closed:
                raise ValidationError("store", "an open store", "closed")
            # isolation_level=None: autocommit, so each statement outside an explicit
            # transaction commits (and is durable) before the call returns.
            c = sqlite3.connect(
                self._uri,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout_ms / 1000,
            )
            c.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            c.execute("PRAGMA journal_mode = WAL")
            c.execute(f"PRAGMA synchronous = {self.synchronous}")
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    # -- observation log

    def append_observation(self, model: str, obs: NewObservation) -> int:
        try:
            cur = self._conn().execute(_INSERT_OBS, _obs_row(model, obs))
        except sqlite3.Error as e:  # disk full, read-only: not acknowledged, the client retries
            raise StorageError(self.path, str(e)) from e
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def append_many(self, model: str, rows: Sequence[NewObservation]) -> int:
        """Bulk-load observations in one transaction; returns the last seq."""
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(_INSERT_OBS, [_obs_row(model, r) for r in rows])
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:  # a failed COMMIT (disk full) may have ended it already
                c.execute("ROLLBACK")
            raise
        return self.last_seq(model)

    def observations(
        self, model: str, after_seq: int = 0, upto_seq: int | None = None
    ) -> list[Observation]:
        q = "SELECT seq, uid, x, y, version, features, ts FROM observations WHERE model = ? AND seq > ?"
        args: list[Any] = [model, after_seq]
        if upto_seq is not None:
            q += " AND seq <= ?"
            args.append(upto_seq)
        rows = self._conn().execute(q + " ORDER BY seq", args).fetchall()
        return [
            Observation(
                uid,
                loads(x),
                y,
                version,
                ts,
                None if f is None else vector_from_bytes(f, (len(f) // 8,)),
                seq=seq,
            )
            for seq, uid, x, y, version, f, ts in rows
        ]

    def last_seq(self, model: str) -> int:
        row = (
            self._conn()
            .execute("SELECT MAX(seq) FROM observations WHERE model = ?", (model,))
            .fetchone()
        )
        return int(row[0] or 0)

    # -- versions

    def put_version(self, model: str, record: VersionRecord, state: Any) -> bool:
        """Store a new version; False (and no change) if that number exists already, which
        is how two frontends creating a version at once find out that one of them lost."""
        cur = self._conn().execute(
            "INSERT OR IGNORE INTO versions (model, version, record, state) VALUES (?, ?, ?, ?)",
            (model, record.version, json.dumps(record.to_dict()), json.dumps(state)),
        )
        return cur.rowcount == 1

    def version_state(self, model: str, version: int) -> Any:
        row = (
            self._conn()
            .execute("SELECT state FROM versions WHERE model = ? AND version = ?", (model, version))
            .fetchone()
        )
        if row is None:
            raise NotFoundError("version", version, [v.version for v in self.versions(model)])
        return json.loads(row[0])

    def versions(self, model: str) -> list[VersionRecord]:
        rows = (
            self._conn()
            .execute("SELECT record FROM versions WHERE model = ? ORDER BY version", (model,))
            .fetchall()
        )
        return [VersionRecord.from_dict(json.loads(r[0])) for r in rows]

    def set_current(self, model: str, version: int) -> None:
        self._conn().execute(
            "INSERT INTO current (model, version) VALUES (?, ?)"
            " ON CONFLICT (model) DO UPDATE SET version = excluded.version",
            (model, version),
        )

    def current(self, model: str) -> int | None:
        row = (
            self._conn().execute("SELECT version FROM current WHERE model = ?", (model,)).fetchone()
        )
        return None if row is None else int(row[0])

    # -- user snapshots

    def save_users(self, model: str, version: int, rows: Iterable[UserRow]) -> None:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(
                "INSERT INTO users (model, version, uid, n, upto_seq, gram, b)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (model, version, uid) DO UPDATE SET"
                " n = excluded.n, upto_seq = excluded.upto_seq, gram = excluded.gram, b = excluded.b"
                " WHERE excluded.upto_seq >= users.upto_seq",
                [
                    (
                        model,
                        version,
                        r.uid,
                        r.n,
                        r.upto_seq,
                        vector_to_bytes(r.gram),
                        vector_to_bytes(r.b),
                    )
                    for r in rows
                ],
            )
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:  # a failed COMMIT (disk full) may have ended it already
                c.execute("ROLLBACK")
            raise

    def load_users(self, model: str, version: int) -> list[UserRow]:
        rows = (
            self._conn()
            .execute(
                "SELECT uid, n, upto_seq, gram, b FROM users WHERE model = ? AND version = ?",
                (model, version),
            )
            .fetchall()
        )
        out = []
        for uid, n, upto, gram, b in rows:
            d = len(b) // 8
            out.append(
                UserRow(uid, n, upto, vector_from_bytes(gram, (d, d)), vector_from_bytes(b, (d,)))
            )
        return out

    # -- events

    def record_event(self, model: str, kind: str, detail: dict[str, Any], ts: float) -> None:
        self._conn().execute(
            "INSERT INTO events (model, ts, kind, detail) VALUES (?, ?, ?, ?)",
            (model, float(ts), kind, json.dumps(detail, allow_nan=True)),
        )

    def events(self, model: str) -> list[dict[str, Any]]:
        rows = (
            self._conn()
            .execute(
                "SELECT id, ts, kind, detail FROM events WHERE model = ? ORDER BY id", (model,)
            )
            .fetchall()
        )
        return [{"id": i, "ts": ts, "kind": k, "detail": json.loads(d)} for i, ts, k, d in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
            claims, self._claims = self._claims, []
        for f in claims:
            f.close()  # releases the lock
        for c in conns:
            try:
                c.close()
            except sqlite3.ProgrammingError:
                log.debug("connection already closed")
        if self._tmp is not None:
            self._tmp.cleanup()
