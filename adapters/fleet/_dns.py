"""A fleet whose member list is a DNS name, re-resolved while inferline runs (a Kubernetes
headless Service: one address per ready pod; docs/fleets.md, "Kubernetes").

``triton+grpc://triton.serving.svc:8001?resolve=dns&refresh_s=10&cpu_cores=4`` names the
fleet: every address the name resolves to is a member ``triton+grpc://ADDRESS:8001?cpu_cores=4``
(the URL's other options are each member's). ``refresh_s`` (default 10) is how often the name
is resolved again; ``drop_after`` (default 2) how many answers in a row must lack an address
before its member is removed (one DNS answer that misses a pod is not a pod gone).

``MembershipPolicy`` is the pure part: the addresses the fleet has and the resolver's answer
in, the addresses to add and to remove out. The resolver is injected (``resolve_dns`` by
default); a failed or empty answer changes nothing (a DNS blip must not empty the fleet).
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from inferline.core import ValidationError

__all__ = [
    "DnsSource",
    "MembershipChange",
    "MembershipPolicy",
    "Resolver",
    "parse_dns_source",
    "resolve_dns",
    "resolve_dns_now",
]

# (host, port) -> the addresses it resolves to now
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

_OWN = ("resolve", "refresh_s", "drop_after")  # the fleet's options; the rest are the members'


@dataclass(frozen=True)
class DnsSource:
    """Where a fleet's members come from: ``scheme://host:port`` resolved every ``refresh_s``
    seconds, each address a member with the options in ``query``."""

    url: str
    scheme: str
    host: str
    port: int
    query: tuple[tuple[str, str], ...] = ()
    refresh_s: float = 10.0
    drop_after: int = 2

    def member_url(self, address: str) -> str:
        """The member URL of one resolved address (IPv6 in brackets)."""
        host = f"[{address}]" if ":" in address else address
        q = f"?{urlencode(self.query)}" if self.query else ""
        return f"{self.scheme}://{host}:{self.port}{q}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "query": [list(p) for p in self.query],
            "refresh_s": self.refresh_s,
            "drop_after": self.drop_after,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DnsSource:
        return cls(
            str(d["url"]),
            str(d["scheme"]),
            str(d["host"]),
            int(d["port"]),
            tuple((str(k), str(v)) for k, v in d.get("query", ())),
            float(d.get("refresh_s", 10.0)),
            int(d.get("drop_after", 2)),
        )


def parse_dns_source(url: Any) -> DnsSource | None:
    """The ``DnsSource`` of a backend URL with ``resolve=dns``; None for any other URL. A
    malformed one is a ``ValidationError`` naming the option."""
    if not isinstance(url, str) or "://" not in url:
        return None
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    opts = dict(pairs)
    if not any(k in opts for k in _OWN):
        return None
    if opts.get("resolve") != "dns":
        raise ValidationError(
            f"{url}: resolve", "'dns' (with refresh_s, drop_after)", opts.get("resolve")
        )
    if not parts.hostname:
        raise ValidationError(f"{url}: host", "a DNS name, e.g. a headless Service's", url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not port:
        raise ValidationError(f"{url}: port", "an explicit port in [1, 65535]", url)
    refresh = _number(url, "refresh_s", opts.get("refresh_s", "10"), float)
    if not (math.isfinite(refresh) and refresh > 0):
        raise ValidationError(f"{url}: refresh_s", "seconds > 0", opts["refresh_s"])
    drop = _number(url, "drop_after", opts.get("drop_after", "2"), int)
    if drop < 1:
        raise ValidationError(f"{url}: drop_after", "an integer >= 1", opts["drop_after"])
    rest = tuple((k, v) for k, v in pairs if k not in _OWN)
    return DnsSource(url, parts.scheme.lower(), parts.hostname, port, rest, refresh, drop)


def _number(url: str, key: str, text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        what = "an integer >= 1" if kind is int else "seconds > 0"
        raise ValidationError(f"{url}: {key}", what, text) from None


async def resolve_dns(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now (sorted, once each): the system resolver, as
    a headless Service is read."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(i[4][0]) for i in infos})


def resolve_dns_now(host: str, port: int) -> list[str]:
    """``resolve_dns`` for the first member list, before an event loop runs."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(i[4][0]) for i in infos})


@dataclass(frozen=True)
class MembershipChange:
    """What one refresh changes: addresses to add and to remove (both sorted)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass
class MembershipPolicy:
    """Diff the fleet's addresses against the resolver's answers. An address is added the
    first time it is answered; it is removed when ``drop_after`` answers in a row lacked it.
    ``None`` (the resolver failed) and an empty answer change nothing."""

    drop_after: int = 2
    absent: dict[str, int] = field(default_factory=dict)  # address -> answers missing it

    def step(self, current: Sequence[str], answer: Sequence[str] | None) -> MembershipChange:
        if not answer:
            return MembershipChange()
        now = set(answer)
        have = set(current)
        removed = []
        for a in sorted(have):
            if a in now:
                self.absent.pop(a, None)
                continue
            self.absent[a] = self.absent.get(a, 0) + 1
            if self.absent[a] >= self.drop_after:
                removed.append(a)
                del self.absent[a]
        for a in list(self.absent):  # an address no longer a member is forgotten
            if a not in have:
                del self.absent[a]
        return MembershipChange(tuple(sorted(now - have)), tuple(removed))
