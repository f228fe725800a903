"""``RemoteBackend``: what the backends over servers inferline does not run itself (Triton,
TF Serving) share; each keeps only its protocol.

The base keeps the managed models (``ManagedModel`` records, each with its handles), tells
subscribers about their active sets, takes handles out of service (scale-down waits for their
last batch; a lost server kills them), runs recovery and the watch (``RecoveryLoops``), turns
cumulative server counters into interval figures (``StatsInterval``), and reads the URL and
its query options the same way. Handles are ``RemoteReplica`` objects (``_replica.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from inferline.core import BackendError, ModelConfig, ModelSpec, ValidationError

from ._recovery import RecoveryLoops
from ._replica import RemoteReplica
from ._subscribers import ModelRegistry, ReplicaSubscribers

__all__ = [
    "ManagedModel",
    "RemoteBackend",
    "StatsInterval",
    "bearer_headers",
    "flag",
    "query_options",
    "settle_options",
    "split_url",
]


@dataclass
class StatsInterval:
    """The previous snapshot of a server's cumulative counters and when it was taken."""

    last: Any = None
    at: float | None = None

    def advance(self, snapshot: Any, now: float | None = None) -> tuple[Any, float | None]:
        """Keep ``snapshot``; return the previous one and the seconds since it (None, None
        for the first snapshot or after ``reset``)."""
        now = time.monotonic() if now is None else now
        prev, at = self.last, self.at
        self.last, self.at = snapshot, now
        return prev, (now - at if prev is not None and at else None)

    def reset(self) -> None:
        """The counters restarted (the model was reloaded): the next interval starts at zero."""
        self.last = None


@dataclass
class ManagedModel:
    """A model a remote backend manages: its names, what was asked for, and its handles."""

    name: str  # inferline's name
    server_name: str  # the model's name on the server
    spec: ModelSpec
    config: ModelConfig
    handles: list[Any] = field(default_factory=list)  # RemoteReplica subclasses
    # batch calls cut at their batch's deadline (RemoteReplica._late), and their queries
    late_calls: int = 0
    late_items: int = 0

    def active(self) -> int:
        return sum(1 for h in self.handles if h.alive)

    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.handles)


class RemoteBackend(RecoveryLoops, ModelRegistry):
    """The shared half of the Triton and TF Serving backends.

    A subclass calls ``super().__init__(url, options)`` with its settled options
    (``settle_options``), sets ``_failure`` to its client's failure class and implements the
    recovery hooks of ``RecoveryLoops``. The options every remote backend reads here:
    ``timeout_s`` (one request), ``recovery_timeout_s``, ``unload_on_close``, and where the
    backend offers them ``drain_timeout_s`` (default 30 s) and ``watch_interval_s`` (default
    0: no watch).
    """

    _models: dict[str, Any]

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        self._url = url
        self.timeout_s = float(options["timeout_s"])
        self.recovery_timeout_s = float(options["recovery_timeout_s"])
        self.unload_on_close = bool(options["unload_on_close"])
        self.drain_timeout_s = float(options.get("drain_timeout_s", 30.0))
        self.watch_interval_s = float(options.get("watch_interval_s", 0.0))
        if not self.watch_interval_s >= 0:
            raise ValidationError("watch_interval_s", "seconds >= 0", self.watch_interval_s)
        self._models = {}
        self._subscribers = ReplicaSubscribers()
        self._closed = False
        self._init_recovery()

    @property
    def url(self) -> str:
        return self._url

    @property
    def closed(self) -> bool:
        return self._closed

    def _error(self, e: Exception) -> BackendError:
        """A protocol client's failure as inferline's error."""
        return BackendError(self._url, str(e))

    # -- the operator's settings ----------------------------------------------------------------

    def operator_snapshot(self) -> dict[str, Any]:
        """What ``restore_operator_settings`` would put back, as JSON (``{"kind": ..., "url":
        ...}`` plus the backend's own fields): written by ``inferline attach --snapshot`` so
        ``inferline detach URL --snapshot PATH`` can restore it after a crash, through the
        adapter package's ``restore_snapshot(url, snapshot)``."""
        raise NotImplementedError(f"{type(self).__name__}.operator_snapshot")

    async def restore_operator_settings(self) -> None:
        """Put back what inferline changed on the server since it first saw it (instance
        counts, batching settings; the models it loaded itself are unloaded), and stop
        managing: called when attach stops (SIGTERM/SIGINT or ``inferline detach``)."""
        raise NotImplementedError(f"{type(self).__name__}.restore_operator_settings")

    # -- checks -------------------------------------------------------------------------------

    def _check_new(self, spec: ModelSpec, param_keys: Iterable[str]) -> None:
        """``spec`` is not deployed yet and its ``params`` are among ``param_keys``."""
        if spec.name in self._models:
            raise ValidationError(
                "model", "a model that is not deployed yet (use scale() or remove())", spec.name
            )
        known = frozenset(param_keys)
        extra = set(spec.params) - known
        if extra:
            raise ValidationError(
                f"{spec.name}.params", f"keys among {sorted(known)}", sorted(extra)
            )

    def _check_adoptable(self, name: str) -> None:
        if name in self._models:
            raise ValidationError("model", "a model not managed yet", name)

    @staticmethod
    def _check_replicas(replicas: Any) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValidationError("replicas", "an integer >= 0", replicas)

    # -- handles ------------------------------------------------------------------------------

    def _take_down(self, handles: Iterable[RemoteReplica]) -> None:
        """Kill ``handles`` and tell subscribers about each model whose active set shrank."""
        changed: dict[str, None] = {}
        for h in handles:
            if h._alive:
                changed[h.model] = None
            h._kill()
        for name in changed:
            self._notify(name)

    async def _retire(self, model: str, victims: list[RemoteReplica], timeout_s: float) -> bool:
        """Take ``victims`` (already out of the model's handles) out of the active set at
        once, then wait up to ``timeout_s`` for their in-flight batches; False if one is
        still busy."""
        for h in victims:
            h._kill()
        self._notify(model)
        done = await asyncio.gather(*(h.drained(timeout_s) for h in victims))
        return all(done)

    async def _close_handles(self, timeout_s: float) -> None:
        """Closing: every model's active set is empty; in-flight batches get ``timeout_s``."""
        handles = [h for m in self._models.values() for h in m.handles]
        for name in list(self._models):
            self._subscribers.notify(name, [])
        await asyncio.gather(*(h.drained(timeout_s) for h in handles), return_exceptions=True)
        for h in handles:
            h._kill()

    def _stats_head(self, m: ManagedModel) -> dict[str, Any]:
        """The figures every remote backend's ``stats()`` starts with."""
        return {
            "model": m.name,
            "backend": self._url,
            "hardware": m.config.hardware,
            "active_replicas": m.active(),
            "in_flight": m.in_flight(),
            "late_calls": m.late_calls,
            "late_items": m.late_items,
        }


# -- URL and options -------------------------------------------------------------------------


def split_url(url: Any, schemes: Mapping[str, str], example: str) -> tuple[str, SplitResult]:
    """``url``'s protocol (by its scheme in ``schemes``) and its parts."""
    if not isinstance(url, str) or "://" not in url:
        raise ValidationError("url", example, url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ValidationError("url", f"a scheme among {sorted(schemes)}", scheme)
    return schemes[scheme], parts


_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def flag(text: str) -> bool:
    """``1/true/yes`` or ``0/false/no`` (any case)."""
    return _FLAGS[text.lower()]


def query_options(
    url: str, query: str | Mapping[str, str], readers: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """The URL's query options, each read by its reader; an unknown option or a value its
    reader refuses is a ``ValidationError`` naming it."""
    pairs = dict(parse_qsl(query)) if isinstance(query, str) else dict(query)
    out: dict[str, Any] = {}
    for key, val in pairs.items():
        read = readers.get(key)
        if read is None:  # outside the try: ValidationError is a ValueError
            raise ValidationError(f"{url}: option", f"one of {sorted(readers)}", key)
        try:
            out[key] = read(val)
        except (KeyError, ValueError):
            raise ValidationError(f"{url}: {key}", "a valid value", val) from None
    return out


def settle_options(
    url: str,
    query: str | Mapping[str, str],
    readers: Mapping[str, Callable[[str], Any]],
    given: Mapping[str, Any],
) -> dict[str, Any]:
    """A backend's options: ``given`` (its keyword arguments, by option name) with those the
    URL's query sets instead, read by ``readers``."""
    return {**given, **query_options(url, query, readers)}


def bearer_headers(token: str | None) -> dict[str, str]:
    """The headers that carry ``token`` (for a server behind an auth proxy)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
