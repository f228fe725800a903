"""Redis storage for Velox, for several frontend processes on several machines.

Same contract as :class:`~inferline.velox.SQLiteStore`. The observation log is a sorted set
scored by a sequence number that a Lua script allocates and appends atomically, so frontends
interleave without conflicts; each frontend writes only the users of its uid partitions, and a
lease per model (``claim``) refuses a second server of the same users.
Durability is the Redis server's: run it with ``appendonly yes`` (and ``appendfsync always`` to
survive power loss) for an acknowledged observation to survive a server restart.

Keys (prefix ``velox`` by default): ``{p}:{model}:seq``, ``:obs`` (zset seq -> record),
``:versions`` (hash), ``:state:{v}``, ``:current``, ``:users:{v}`` (hash uid -> record),
``:events`` (list), ``:claims`` (zset name -> lease expiry), ``:claim_owners``. Records are JSON; vectors base64 little-endian float64. Nothing is pickled.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from inferline.core.errors import NotFoundError, ValidationError

from ._codec import dumps, loads, vector_from_bytes, vector_to_bytes
from ._model import NewObservation, Observation
from ._redis_claim import claim_users
from ._store import UserRow, VersionRecord

__all__ = ["RedisStore"]

# INCR the sequence and add the record under it in one atomic step.
_APPEND = """
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, seq .. '|' .. ARGV[1])
return seq
"""

# Create a version only if its number is free (record and state together).
_PUT_VERSION = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def _b64(v: np.ndarray) -> str:
    return base64.b64encode(vector_to_bytes(v)).decode("ascii")


def _unb64(s: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    raw = base64.b64decode(s)
    return vector_from_bytes(raw, shape if shape is not None else (len(raw) // 8,))


class RedisStore:
    """Velox state in Redis. ``url`` like ``redis://127.0.0.1:6379/0``; needs ``redis`` (pip)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "velox",
        client: Any = None,
        claim_ttl_s: float = 10.0,
    ) -> None:
        self._where = url if client is None else f"{prefix} (given client)"
        if client is None:
            try:
                import redis
            except ImportError as e:  # optional dependency: pip install inferline[redis]
                raise ValidationError(
                    "store", "the 'redis' package (pip install redis)", "missing"
                ) from e
            client = redis.Redis.from_url(url, decode_responses=True)
        if not 0 < claim_ttl_s <= 3600:
            raise ValidationError("claim_ttl_s", "seconds in (0, 3600]", claim_ttl_s)
        self.r = client
        self.prefix = prefix
        self.claim_ttl_s = claim_ttl_s
        self._append = self.r.register_script(_APPEND)
        self._put_version = self.r.register_script(_PUT_VERSION)

    def _k(self, model: str, *parts: object) -> str:
        return ":".join([self.prefix, model, *map(str, parts)])

    def claim(
        self, model: str, partitions: Sequence[int] | None, n_partitions: int
    ) -> Callable[[], None]:
        """Serve ``model``'s users in ``partitions`` (None: all) from this process alone: a
        lease renewed until the returned release (see ``_redis_claim``); another running
        server's lease is refused with ValidationError naming the store."""
        return claim_users(
            self.r,
            (self._k(model, "claims"), self._k(model, "claim_owners")),
            model,
            partitions,
            n_partitions,
            ttl_s=self.claim_ttl_s,
            where=self._where,
        )

    # -- observation log

    def append_observation(self, model: str, obs: NewObservation) -> int:
        rec = json.dumps(
            {
                "uid": obs.uid,
                "x": dumps(obs.x),
                "y": float(obs.y),
                "version": int(obs.version),
                "f": None if obs.features is None else _b64(obs.features),
                "ts": float(obs.ts),
            }
        )
        return int(self._append(keys=[self._k(model, "seq"), self._k(model, "obs")], args=[rec]))

    def observations(
        self, model: str, after_seq: int = 0, upto_seq: int | None = None
    ) -> list[Observation]:
        hi = "+inf" if upto_seq is None else upto_seq
        out = []
        for member in self.r.zrangebyscore(self._k(model, "obs"), f"({after_seq}", hi):
            seq, _, body = member.partition("|")
            d = json.loads(body)
            out.append(
                Observation(
                    d["uid"],
                    loads(d["x"]),
                    d["y"],
                    d["version"],
                    d["ts"],
                    None if d["f"] is None else _unb64(d["f"]),
                    seq=int(seq),
                )
            )
        return out

    def last_seq(self, model: str) -> int:
        v = self.r.get(self._k(model, "seq"))
        return int(v or 0)

    # -- versions

    def put_version(self, model: str, record: VersionRecord, state: Any) -> bool:
        """Store a new version atomically; False if that number exists already."""
        return bool(
            self._put_version(
                keys=[self._k(model, "versions"), self._k(model, "state", record.version)],
                args=[str(record.version), json.dumps(record.to_dict()), json.dumps(state)],
            )
        )

    def version_state(self, model: str, version: int) -> Any:
        s = self.r.get(self._k(model, "state", version))
        if s is None:
            raise NotFoundError("version", version, [v.version for v in self.versions(model)])
        return json.loads(s)

    def versions(self, model: str) -> list[VersionRecord]:
        recs = [
            VersionRecord.from_dict(json.loads(v)) for v in self.r.hvals(self._k(model, "versions"))
        ]
        return sorted(recs, key=lambda r: r.version)

    def set_current(self, model: str, version: int) -> None:
        self.r.set(self._k(model, "current"), int(version))

    def current(self, model: str) -> int | None:
        v = self.r.get(self._k(model, "current"))
        return None if v is None else int(v)

    # -- user snapshots

    def save_users(self, model: str, version: int, rows: Iterable[UserRow]) -> None:
        mapping = {
            r.uid: json.dumps({"n": r.n, "upto": r.upto_seq, "gram": _b64(r.gram), "b": _b64(r.b)})
            for r in rows
        }
        if mapping:
            # Only the partition owner writes a uid, so a plain HSET cannot lose a newer snapshot.
            self.r.hset(self._k(model, "users", version), mapping=mapping)

    def load_users(self, model: str, version: int) -> list[UserRow]:
        out = []
        for uid, body in self.r.hgetall(self._k(model, "users", version)).items():
            d = json.loads(body)
            b = _unb64(d["b"])
            out.append(UserRow(uid, d["n"], d["upto"], _unb64(d["gram"], (len(b), len(b))), b))
        return out

    # -- events

    def record_event(self, model: str, kind: str, detail: dict[str, Any], ts: float) -> None:
        self.r.rpush(
            self._k(model, "events"), json.dumps({"ts": ts, "kind": kind, "detail": detail})
        )

    def events(self, model: str) -> list[dict[str, Any]]:
        out = []
        for i, body in enumerate(self.r.lrange(self._k(model, "events"), 0, -1), start=1):
            d = json.loads(body)
            out.append({"id": i, **d})
        return out

    def close(self) -> None:
        self.r.close()
