"""Which Velox server writes which users of a model in a shared Redis store: leases.

Two servers that both own a user each snapshot that user with the log position of their own
last write, so on resume each hides the other's acknowledged observations. SQLite stores
refuse the second server with a file lock; in Redis a claim is a lease that its server
renews (every third of its TTL) and that expires when the server dies without releasing it.
A server of every user (claim ``all``) excludes every other; partitioned servers exclude
only each other's partitions, as with SQLite's locks.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.errors import ValidationError

log = logging.getLogger(__name__)

# Drop expired leases, then take (or renew) every name unless another owner holds it or,
# for 'all', holds anything; for a partition, holds 'all'. Returns the conflicting name.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token, ttl = ARGV[1], tonumber(ARGV[2])
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], name)
  redis.call('HDEL', KEYS[2], name)
end
local function other(name)
  local owner = redis.call('HGET', KEYS[2], name)
  if owner and owner ~= token then return owner end
  return nil
end
for i = 3, #ARGV do
  local name = ARGV[i]
  if name == 'all' then
    for _, held in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
      local o = other(held)
      if o then return {held, o} end
    end
  else
    local o = other('all')
    if o then return {'all', o} end
    o = other(name)
    if o then return {name, o} end
  end
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], token)
end
return false
"""

_RELEASE = """
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
return 0
"""


def claim_users(
    r: Any,
    keys: tuple[str, str],
    model: str,
    partitions: Sequence[int] | None,
    n_partitions: int,
    *,
    ttl_s: float,
    where: str,
) -> Callable[[], None]:
    """Lease ``model``'s users in ``partitions`` (None: all) in Redis ``r`` for this process,
    renewing the lease until the returned release is called. A lease held by another server
    is waited for up to one TTL (a server killed without releasing it), then refused."""
    names = ["all"] if not partitions else [f"p{p}of{n_partitions}" for p in partitions]
    token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    ttl_ms = max(1, int(ttl_s * 1000))
    take = r.register_script(_CLAIM)
    give = r.register_script(_RELEASE)

    def attempt() -> list[str] | None:
        got = take(keys=list(keys), args=[token, ttl_ms, *names])
        return [str(v) for v in got] if got else None

    deadline = time.monotonic() + ttl_s + 0.5
    conflict = attempt()
    if conflict is not None:
        log.info("velox: waiting up to %.0f s for %s's lease on %r", ttl_s, conflict[1], model)
    while conflict is not None and time.monotonic() < deadline:
        time.sleep(min(0.25, ttl_s / 4))
        conflict = attempt()
    if conflict is not None:
        held = conflict[0]
        which = "all its users" if held == "all" else "partition " + held[1:].replace("of", " of ")
        raise ValidationError(
            "velox.store",
            f"a store in which no other running server writes model {model!r} ({which}; "
            f"held by {conflict[1]}): give each server disjoint owned_partitions",
            where,
        )

    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                lost = attempt()
            except Exception as e:  # Redis unreachable: keep trying until it is back
                log.warning("velox: cannot renew the lease on %r: %s", model, e)
                continue
            if lost is not None:
                log.error(
                    "velox: lost the lease on model %r (%s) to %s: observations of its "
                    "users may be hidden on resume",
                    model,
                    lost[0],
                    lost[1],
                )

    t = threading.Thread(target=renew, name=f"velox-lease-{model}", daemon=True)
    t.start()

    def release() -> None:
        if stop.is_set():
            return
        stop.set()
        t.join(5)
        try:
            give(keys=list(keys), args=[token, *names])
        except Exception as e:  # the lease then expires by itself
            log.warning("velox: cannot release the lease on %r: %s", model, e)

    return release
