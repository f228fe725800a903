"""What Triton does when its server goes away or stops running a model as inferline loaded it.

The loops are the shared ones (``adapters/_recovery.py``); this module supplies Triton's part.
The whole server is one failure domain (key ``None``): a broken connection or a model the
restarted server no longer has takes the affected models' handles out of service, and the
recovery waits for the server, reloads every managed model with its last configuration and
publishes fresh handles (a new generation of the same instance slots). A server that stays away
past ``recovery_timeout_s`` leaves its models ``failed`` and is probed every
``_SLOW_PROBE_S`` until it comes back. The watch compares each loaded model's configuration
with inferline's (a restarted server comes back with its repository's configuration, or none).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable

from .._remote import RemoteBackend
from ._client import TritonClient, TritonConnectionError, TritonFailure, TritonModelMissing
from ._config import config_differs
from ._replica import TritonReplica, _Managed

__all__ = ["TritonRecovery"]

log = logging.getLogger(__name__)

_SLOW_PROBE_S = 5.0  # how often recovery probes a server that stayed away past its timeout


class TritonRecovery(RemoteBackend):
    """The managed models' handles and their recovery; the base of ``TritonBackend``."""

    _models: dict[str, _Managed]
    _client: TritonClient
    address: str
    _failure = TritonFailure
    _keep_probing_s = _SLOW_PROBE_S

    def _init_models(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def _control_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _add_handles(self, m: _Managed, n: int) -> None:
        for _ in range(n):
            m.handles.append(TritonReplica(self, m, m.next_index))
            m.next_index += 1

    # -- failures -----------------------------------------------------------------------------

    async def _lost(self, m: _Managed, failure: TritonFailure) -> None:
        """A request of ``m`` failed with ``failure`` (a broken connection or a missing
        model): a slow request is not an outage, a server that is gone is."""
        if isinstance(failure, TritonModelMissing):
            self._start_recovery({m.name}, str(failure))
            return
        t = self.probe_timeout_s
        try:
            if await self._client.ready(timeout_s=t) and await self._client.model_ready(
                m.server_name, timeout_s=t
            ):
                return
        except TritonFailure:
            pass  # gone between the two probes: an outage
        self._start_recovery(None, str(failure))

    def _start_recovery(self, models: set[str] | None, reason: str) -> None:
        if self._closed or getattr(self, "_restored", False):  # the operator's again
            return
        targets = set(self._models) if models is None else models & set(self._models)
        handles = []
        for name in targets:
            m = self._models[name]
            if m.state == "unloaded":
                continue
            m.state = "recovering"
            handles += m.handles
            m.handles = []
        self._take_down(handles)
        if self._recovering():
            return  # the running recovery re-checks every model that is recovering
        log.warning("Triton at %s: %s; recovering %s", self._url, reason, sorted(targets))
        self._begin_recovery(None, f"inferline-triton-recover-{self.address}")

    async def reconnect(self) -> None:
        """Wait for the server and reload every model that needs it (what recovery does
        after a failure); also retries models whose recovery failed before."""
        self._check_open()
        for m in self._models.values():
            if m.state == "failed":
                m.state, m.unreachable = "recovering", False
        await self._join_recovery()

    # -- the hooks of the shared recovery and watch loops -------------------------------------

    def _pending(self) -> list[_Managed]:
        return [
            m
            for m in self._models.values()
            if m.state == "recovering" or (m.state == "failed" and m.unreachable)
        ]

    def _recovery_pending(self, key: Hashable) -> bool:
        return bool(self._pending())

    async def _probe(self, key: Hashable) -> bool:
        return await self._client.ready(timeout_s=self.probe_timeout_s)

    def _overdue(self, key: Hashable) -> None:
        pending = self._pending()
        if any(m.state == "recovering" for m in pending):
            log.error(
                "Triton at %s did not come back within %ss: %s failed; still probing every %ss",
                self._url,
                self.recovery_timeout_s,
                sorted(m.name for m in pending),
                _SLOW_PROBE_S,
            )
        for m in pending:
            m.state, m.unreachable = "failed", True

    async def _restore(self, key: Hashable) -> bool:
        pending = self._pending()
        for m in pending:
            if m.unreachable:
                m.state, m.unreachable = "recovering", False
        async with self._control_lock():
            for m in pending:
                if m.state != "recovering" or self._closed:
                    continue
                try:
                    await self._ensure_loaded(m)
                except TritonConnectionError:
                    continue  # went away again: the loop waits for it
                except TritonFailure as e:
                    log.error("could not reload %r on %s: %s", m.name, self._url, e)
                    m.state = "failed"
                    continue
                m.generation += 1
                m.restarts += 1
                m.handles, m.next_index = [], 0  # same slots, new generation
                self._add_handles(m, m.config.replicas)
                m.state = "ready"
                m.stats.reset()  # the counters restarted with the model
                self._notify(m.name)
                log.info("Triton model %r is back with %d instances", m.name, m.config.replicas)
        return not self._pending()

    async def _ensure_loaded(self, m: _Managed) -> None:
        if await self._client.model_ready(m.server_name):
            cfg = await self._client.model_config(m.server_name)
            if config_differs(cfg, m.triton_config) is None:
                return
        await self._client.load(m.server_name, m.triton_config)

    def _watch_wanted(self) -> bool:
        return any(m.state == "ready" for m in self._models.values())

    async def _changed_models(self) -> dict[str, str]:
        """Managed models the server no longer runs as inferline loaded them, and how."""
        changed: dict[str, str] = {}
        async with self._control_lock():  # scale() and reconfigure() change triton_config
            for m in list(self._models.values()):
                if m.state != "ready" or self._closed:
                    continue
                if not await self._client.model_ready(
                    m.server_name, timeout_s=self.probe_timeout_s
                ):
                    changed[m.name] = "no longer loaded on the server"
                    continue
                try:
                    cfg = await self._client.model_config(m.server_name)
                except TritonModelMissing:
                    changed[m.name] = "no longer loaded on the server"
                    continue
                diff = config_differs(cfg, m.triton_config)
                if diff is not None:
                    changed[m.name] = f"the server runs it with {diff}"
        return changed

    def _lose(self, key: Hashable, models: set[str] | None, reason: str) -> None:
        self._start_recovery(models, reason)
