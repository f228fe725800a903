"""Clipper's prediction cache: a bounded function cache for ``predict(model, version, x)``.

Eviction is CLOCK (thesis ch. 3, "Caching"): entries sit in a ring of ``capacity`` slots, each
with a reference bit. A hit sets the bit; when the ring is full, the hand sweeps forward clearing
set bits and evicts the first entry whose bit is already clear. A newly inserted entry starts
with its bit clear, so an entry that is never read again is evicted before any entry that was.
CLOCK approximates LRU without moving entries on every hit, which keeps ``get`` O(1) and cheap.

Keys come from :func:`cache_key`: the model name and version travel in clear in the key's
prefix (so :meth:`PredictionCache.invalidate` can drop one model or one version without keeping
a side index), followed by a digest of a canonical encoding of the input. Inputs are encoded by
type, never pickled: numpy arrays by dtype, shape and bytes; ``str`` as UTF-8; ``bytes`` as is;
JSON-like values (numbers, bools, None, lists, tuples, dicts with string keys) structurally.

``get_or_compute`` coalesces concurrent identical queries under asyncio: the first caller starts
one computation, later callers await the same one; a failure reaches every waiter and is not
cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import logging
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np

from inferline.core.errors import ValidationError

__all__ = ["PredictionCache", "cache_key", "key_prefix", "parse_key"]

log = logging.getLogger(__name__)

_DIGEST_BYTES = 16  # 128-bit blake2b: collisions are not a practical concern at cache sizes
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _encode_version(version: str | int) -> bytes:
    # The type is part of the key so version 3 and version "3" never share entries.
    if isinstance(version, bool) or not isinstance(version, (int, str)):
        raise ValidationError("version", "a str or int", version)
    return (b"i" if isinstance(version, int) else b"s") + str(version).encode()


def key_prefix(model: str, version: str | int) -> bytes:
    """The clear-text prefix shared by every key of one model version.

    Callers that build many keys for one version (a top-K over 1,000 items) compute it once and
    pass it to :func:`cache_key` via ``prefix=``.
    """
    if not isinstance(model, str) or not model:
        raise ValidationError("model", "a non-empty str", model)
    m = model.encode()
    v = _encode_version(version)
    if len(m) > 0xFFFF or len(v) > 0xFFFF:
        raise ValidationError("model", "a name shorter than 65,536 bytes", len(m))
    return _U16.pack(len(m)) + m + _U16.pack(len(v)) + v


def parse_key(key: bytes) -> tuple[str, str | int] | None:
    """(model, version) of a key made by :func:`cache_key`; None for a foreign key."""
    try:
        (n,) = _U16.unpack_from(key, 0)
        model = key[2 : 2 + n].decode()
        (k,) = _U16.unpack_from(key, 2 + n)
        v = key[4 + n : 4 + n + k]
        if len(v) != k or not v:
            return None
        text = v[1:].decode()
        version: str | int = int(text) if v[:1] == b"i" else text
        return model, version
    except (struct.error, UnicodeDecodeError, ValueError):
        return None


def _encode(x: Any, out: list[bytes]) -> None:
    """Append a canonical, type-tagged, length-prefixed encoding of ``x`` to ``out``.

    Every variable-length part carries its length, so two different inputs cannot produce the
    same byte string by concatenation.
    """
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.asarray(x)
        if a.dtype.hasobject:
            raise ValidationError(
                "x", "a numeric or string array (object arrays are not hashed)", a.dtype
            )
        a = np.ascontiguousarray(a)
        dt = a.dtype.str.encode()
        raw = a.tobytes()
        out.append(b"A" + _U16.pack(len(dt)) + dt + _U16.pack(a.ndim))
        out.append(b"".join(_U32.pack(s) for s in a.shape))
        out.append(_U32.pack(len(raw)))
        out.append(raw)
    elif isinstance(x, str):
        b = x.encode()
        out.append(b"S" + _U32.pack(len(b)))
        out.append(b)
    elif isinstance(x, (bytes, bytearray, memoryview)):
        b = bytes(x)
        out.append(b"B" + _U32.pack(len(b)))
        out.append(b)
    elif x is None or isinstance(x, (bool, int, float)):
        # json.dumps gives the shortest repr that round-trips a float, and keeps bool and int
        # apart ("true" vs "1"); NaN and infinities are spelled out rather than rejected.
        b = json.dumps(x).encode()
        out.append(b"J" + _U32.pack(len(b)))
        out.append(b)
    elif isinstance(x, (list, tuple)):
        out.append((b"L" if isinstance(x, list) else b"T") + _U32.pack(len(x)))
        for item in x:
            _encode(item, out)
    elif isinstance(x, dict):
        keys = list(x)
        if not all(isinstance(k, str) for k in keys):
            raise ValidationError("x", "a dict with str keys", keys)
        out.append(b"D" + _U32.pack(len(keys)))
        for k in sorted(keys):
            _encode(k, out)
            _encode(x[k], out)
    else:
        raise ValidationError(
            "x", "an ndarray, str, bytes, number, bool, None, list, tuple or dict", type(x).__name__
        )


def cache_key(model: str, version: str | int, x: Any, *, prefix: bytes | None = None) -> bytes:
    """Cache key of ``predict(model, version, x)``.

    Fast path: an int or str input (an item id, the common case for top-K over a catalog) is
    appended in clear instead of hashed, because hashing costs more than the lookup it serves.
    """
    p = key_prefix(model, version) if prefix is None else prefix
    if type(x) is int:
        return p + b"i" + str(x).encode()
    if type(x) is str and len(x) <= 64:
        return p + b"s" + x.encode()
    parts: list[bytes] = []
    _encode(x, parts)
    return p + b"h" + hashlib.blake2b(b"".join(parts), digest_size=_DIGEST_BYTES).digest()


class PredictionCache:
    """Bounded cache with CLOCK eviction and asyncio in-flight coalescing.

    ``capacity`` 0 disables caching (every ``get`` misses, ``put`` stores nothing), which keeps
    call sites free of special cases. The ring operations hold a lock because a background
    retrain thread may invalidate while the event loop reads.
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValidationError("capacity", "an int >= 0", capacity)
        self.capacity = capacity
        self._slots: list[bytes | None] = [None] * capacity
        self._ref = bytearray(capacity)
        self._where: dict[bytes, int] = {}
        self._values: list[Any] = [None] * capacity
        self._free: list[int] = list(range(capacity))  # a heap: fill the lowest free slot first
        self._hand = 0
        self._lock = threading.Lock()
        self._inflight: dict[bytes, asyncio.Future[Any]] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.coalesced = 0

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def keys(self) -> list[bytes]:
        """Resident keys in slot order (for tests and debugging)."""
        with self._lock:
            return [k for k in self._slots if k is not None]

    def get(self, key: bytes) -> tuple[bool, Any]:
        with self._lock:
            i = self._where.get(key)
            if i is None:
                self.misses += 1
                return False, None
            self._ref[i] = 1
            self.hits += 1
            return True, self._values[i]

    def get_many(self, keys: Iterable[bytes]) -> list[tuple[bool, Any]]:
        """``get`` for many keys under one lock acquisition (the top-K path)."""
        out: list[tuple[bool, Any]] = []
        with self._lock:
            where, ref, values = self._where, self._ref, self._values
            for key in keys:
                i = where.get(key)
                if i is None:
                    out.append((False, None))
                else:
                    ref[i] = 1
                    out.append((True, values[i]))
            hits = sum(1 for h, _ in out if h)
            self.hits += hits
            self.misses += len(out) - hits
        return out

    def put(self, key: bytes, value: Any) -> None:
        if not isinstance(key, bytes):
            raise ValidationError("key", "bytes (from cache_key)", type(key).__name__)
        if self.capacity == 0:
            return
        with self._lock:
            i = self._where.get(key)
            if i is not None:
                # Overwrite in place; a re-put is a use, so it earns a second chance.
                self._values[i] = value
                self._ref[i] = 1
                return
            i = heapq.heappop(self._free) if self._free else self._evict_one()
            self._slots[i] = key
            self._values[i] = value
            self._ref[i] = 0
            self._where[key] = i

    def _evict_one(self) -> int:
        # Called with the lock held and the ring full, so the sweep finds a victim within two
        # turns: the first turn clears every set bit it passes.
        n = self.capacity
        while True:
            i = self._hand
            self._hand = (i + 1) % n
            if self._ref[i]:
                self._ref[i] = 0
                continue
            victim = self._slots[i]
            assert victim is not None
            del self._where[victim]
            self.evictions += 1
            log.debug("evicted slot %d", i)
            return i

    def _drop(self, i: int) -> None:
        key = self._slots[i]
        assert key is not None
        del self._where[key]
        self._slots[i] = None
        self._values[i] = None
        self._ref[i] = 0
        heapq.heappush(self._free, i)

    def invalidate(
        self,
        predicate: Callable[[bytes], bool] | None = None,
        *,
        model: str | None = None,
        version: str | int | None = None,
    ) -> int:
        """Drop entries matching ``predicate(key)`` and/or a model (and version); returns count.

        With no argument at all, drops everything.
        """
        if version is not None and model is None:
            raise ValidationError("model", "a model name when version is given", None)

        def match(key: bytes) -> bool:
            if model is not None:
                mv = parse_key(key)
                if mv is None or mv[0] != model or (version is not None and mv[1] != version):
                    return False
            return predicate is None or predicate(key)

        with self._lock:
            victims = [i for i, k in enumerate(self._slots) if k is not None and match(k)]
            for i in victims:
                self._drop(i)
        return len(victims)

    def clear(self) -> None:
        self.invalidate()

    def stats(self) -> dict[str, int]:
        return {
            "capacity": self.capacity,
            "size": len(self._where),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "coalesced": self.coalesced,
        }

    async def get_or_compute(self, key: bytes, coro_factory: Callable[[], Awaitable[Any]]) -> Any:
        """The cached value, or the result of one shared evaluation of ``coro_factory()``.

        The computation runs as its own task so that a cancelled caller does not cancel it for
        the other waiters; each caller awaits it through ``shield``. Every caller that finds no
        cached value counts as a miss; those that joined a running computation also count in
        ``coalesced``.
        """
        hit, value = self.get(key)
        if hit:
            return value
        fut = self._inflight.get(key)
        # A future left behind by an event loop that was closed mid-computation is ignored.
        if fut is not None and not fut.done() and fut.get_loop() is asyncio.get_running_loop():
            self.coalesced += 1
            return await asyncio.shield(fut)

        async def run() -> Any:
            try:
                result = await coro_factory()
            finally:
                # Remove before waking waiters: a caller arriving after a failure must retry,
                # not see the failed future.
                self._inflight.pop(key, None)
            self.put(key, result)
            return result

        task = asyncio.ensure_future(run())
        # If every waiter was cancelled, nobody retrieves a failure; mark it retrieved here so
        # asyncio does not log "exception was never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._inflight[key] = task
        return await asyncio.shield(task)
