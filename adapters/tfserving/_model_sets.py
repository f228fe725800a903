"""TF Serving model-set reloads, and what TF Serving does when a server goes away.

``ModelService/HandleReloadConfigRequest`` replaces a server's whole model set, so every change
(a replica more or less, a reload after a restart) sends the server's full set, changed or not,
under the server's lock, then waits until the models it added are AVAILABLE. A server whose set
is unknown is read-only: a reload on it is refused with ``ValidationError``.

Each server is its own failure domain for the shared recovery loop (``adapters/_recovery.py``):
a request that cannot reach its server, or finds the model gone, takes every handle on that
server out of service; the recovery restarts a launched server that died, waits for it to
answer, reloads its model set if a model is missing and publishes fresh handles. A server that
stays away past ``recovery_timeout_s`` is given up on (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any

from inferline.core import BackendError, ValidationError

from .._remote import RemoteBackend
from ._client import TFServingFailure, TFServingNotFound
from ._config import ServedModel, format_text, merged
from ._replica import TFServingReplica, _Managed
from ._servers import Endpoint, start_server, stop_server
from ._snapshot import (
    make_snapshot,
    reload_and_wait,
    reload_staged,
    remove_added_versions,
    stage_operator_versions,
)

__all__ = ["TFServingModelSets"]

log = logging.getLogger(__name__)


class TFServingModelSets(RemoteBackend):
    """The servers' model sets and their recovery; the base of ``TFServingBackend``."""

    _models: dict[str, _Managed]
    _failure = TFServingFailure
    _first_pause_s = _max_pause_s = 0.2  # between probes of a lost server
    load_timeout_s: float
    start_timeout_s: float

    def _init_servers(self, endpoints: list[Endpoint], started: bool) -> None:
        self._endpoints = endpoints
        self._started = started
        self._ids = itertools.count()
        self._restored = False
        # the operator's model sets as first read, for restore_operator_settings (servers
        # inferline launched are its own: they stop with it)
        self._operator_sets = [
            (ep, list(ep.models.values()))
            for ep in endpoints
            if ep.models is not None and ep.command is None
        ]

    def _lock(self, ep: Endpoint) -> asyncio.Lock:
        if ep.lock is None:
            ep.lock = asyncio.Lock()
        return ep.lock

    async def _status(self, ep: Endpoint, name: str) -> list[dict[str, Any]] | None:
        """The model's version states on ``ep``; None where the server does not know it."""
        assert ep.client is not None
        try:
            return await ep.client.status(name)
        except TFServingNotFound:
            return None
        except TFServingFailure as e:
            raise self._error(e) from None

    # -- launched servers ---------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        self._check_open()
        if self._started:
            return
        self._started = True
        try:
            await asyncio.gather(
                *(
                    start_server(ep, self.start_timeout_s, self._url)
                    for ep in self._endpoints
                    if ep.command
                )
            )
        except BaseException:
            self._started = False
            for ep in self._endpoints:
                stop_server(ep)
            raise

    def server_pids(self) -> list[int]:
        """Process ids of the servers this backend launched and that still run."""
        return [
            ep.proc.pid for ep in self._endpoints if ep.proc is not None and ep.proc.poll() is None
        ]

    # -- model sets ---------------------------------------------------------------------------

    async def _set_models(
        self, ep: Endpoint, models: dict[str, ServedModel], wait_for: Sequence[str]
    ) -> None:
        """Reload ``ep`` with exactly ``models`` and wait until ``wait_for`` are AVAILABLE."""
        if ep.models is None:
            raise ValidationError(
                f"model set of server {ep.name}",
                "known, so that a reload can carry it (pass model_config_file=, or let the backend launch the server)",
                None,
            )
        if ep.control is None:
            raise ValidationError(
                f"gRPC address of server {ep.name}",
                "host:port (model management is gRPC only)",
                None,
            )
        try:
            await reload_staged(ep.control, list(models.values()), wait_for, self.load_timeout_s)
        except TFServingFailure as e:
            raise self._error(e) from None
        ep.models = dict(models)
        if ep.config_path is not None:  # a launched server restarts with the same set
            ep.config_path.write_text(format_text(list(models.values())))
        for name in wait_for:
            await self._wait_available(ep, name)

    async def _wait_available(self, ep: Endpoint, name: str) -> None:
        assert ep.client is not None
        deadline = time.monotonic() + self.load_timeout_s
        last: Any = None
        while True:
            try:
                st = await ep.client.status(name)
                last = st
                if any(s["state"] == "AVAILABLE" for s in st):
                    return
                bad = [s for s in st if s["state"] == "END" and s["error_code"] != "OK"]
                if bad:
                    raise BackendError(
                        self._url,
                        f"{name!r} failed to load on {ep.name}: {bad[0]['error_message']}",
                    )
            except TFServingNotFound as e:
                last = str(e)
            except TFServingFailure as e:
                raise self._error(e) from None
            if time.monotonic() > deadline:
                raise BackendError(
                    self._url,
                    f"{name!r} not AVAILABLE on {ep.name} within {self.load_timeout_s} s: {last}",
                )
            await asyncio.sleep(0.05)

    async def _load_signature(self, m: _Managed, ep: Endpoint) -> None:
        assert ep.client is not None
        try:
            meta = await ep.client.metadata(m.server_name)
        except TFServingFailure as e:
            raise self._error(e) from None
        sigs = meta["signatures"]
        if m.signature not in sigs:
            raise ValidationError(
                f"{m.name}.params.signature_name", f"one of {sorted(sigs)}", m.signature
            )
        sig = sigs[m.signature]
        m.inputs = sig["inputs"]
        outs = m.spec.params.get("outputs")
        if outs is None:
            m.outputs = tuple(sorted(sig["outputs"]))
        else:
            if isinstance(outs, str) or not outs or not set(outs) <= set(sig["outputs"]):
                raise ValidationError(
                    f"{m.name}.params.outputs", f"a list among {sorted(sig['outputs'])}", outs
                )
            m.outputs = tuple(outs)
        m.output_dtypes = {k: v["dtype"] for k, v in sig["outputs"].items()}

    async def _grow(self, m: _Managed, eps: Sequence[Endpoint]) -> None:
        """Add ``m`` to the model sets of ``eps`` (all or nothing) and give it their handles."""
        assert m.entry is not None
        done: list[Endpoint] = []
        try:
            for ep in eps:
                async with self._lock(ep):
                    models = merged(ep.models or {}, put=[m.entry])
                    await self._set_models(ep, models, [m.server_name])
                done.append(ep)
            if not m.inputs and eps:
                await self._load_signature(m, eps[0])
        except BaseException:
            for ep in done:  # all or nothing
                with contextlib.suppress(Exception):
                    await self._shrink_endpoint(m, ep)
            raise
        for ep in eps:
            m.handles.append(TFServingReplica(self, m, ep, next(self._ids)))

    async def _shrink_endpoint(self, m: _Managed, ep: Endpoint) -> None:
        async with self._lock(ep):
            if ep.models is not None and m.server_name in ep.models:
                await self._set_models(ep, merged(ep.models, drop=[m.server_name]), [])

    # -- the operator's model sets -------------------------------------------------------------

    def operator_snapshot(self) -> dict[str, Any]:
        """What ``restore_operator_settings`` puts back, as JSON: per given server, its model
        set as inferline first read it (``restore_snapshot(url, snapshot)`` reloads it)."""
        return make_snapshot(
            self._url, [(ep.rest, ep.grpc, models) for ep, models in self._operator_sets]
        )

    async def restore_operator_settings(self) -> None:
        """Put back every given server's model set exactly as inferline first read it: the
        models inferline added are unloaded, adopted and scaled ones get their operator
        entries back, and the version directories the steer path added are removed once the
        operator's versions serve again (``_snapshot``). For when attach stops: recovery
        stops and the managed handles leave service first (a recovery would otherwise reload
        inferline's set). Every server is tried; failures are raised together as
        ``BackendError``."""
        self._restored = True
        await self._stop_loops()
        self._take_down([h for m in self._models.values() for h in m.handles])
        errors: list[str] = []
        usable = []
        for ep, models in self._operator_sets:
            if ep.control is None:
                errors.append(f"{ep.name}: no gRPC address (model management is gRPC only)")
            else:
                usable.append((ep, ep.control, models))
        staged_ok = await self._each(usable, stage_operator_versions, errors)
        if staged_ok:  # a server still on inferline's version keeps its directory
            remove_added_versions([m for _, _, ms in usable for m in ms])
        for ep, _, models in usable:
            if await self._each([(ep, ep.control, models)], reload_and_wait, errors):
                ep.models = {m.name: m for m in models}
        if errors:
            raise BackendError(self._url, "model sets not restored on " + "; ".join(errors))
        log.info("restored the operator's model sets on %d server(s)", len(self._operator_sets))

    async def _each(self, servers: Sequence[Any], step: Any, errors: list[str]) -> bool:
        """``step(client, models, timeout)`` on each (endpoint, client, models) under the
        endpoint's lock; failures added to ``errors``; True if none failed."""
        ok = True
        for ep, client, models in servers:
            async with self._lock(ep):
                try:
                    await step(client, models, self.load_timeout_s)
                except TFServingFailure as e:
                    errors.append(f"{ep.name}: {e}")
                    ok = False
        return ok

    # -- a lost server ------------------------------------------------------------------------

    def _lost(self, h: TFServingReplica, reason: str) -> None:
        """``h``'s server could not be reached or lost the model: every handle on that server
        leaves the active set and the server is recovered."""
        ep = h.endpoint
        if self._restored:  # the operator's set is back: nothing of ours to recover
            self._take_down([h])
            return
        on_ep = [hh for mm in self._models.values() for hh in mm.handles if hh.endpoint is ep]
        log.warning("TF Serving server %s lost (%s); recovering", ep.name, reason)
        self._take_down(on_ep)
        self._begin_recovery(ep, f"tfserving-recover-{ep.name}")

    def _domain_name(self, key: Hashable) -> str:
        return key.name if isinstance(key, Endpoint) else super()._domain_name(key)

    async def _probe(self, key: Hashable) -> bool:
        assert isinstance(key, Endpoint) and key.client is not None
        ep = key
        if ep.proc is not None and ep.proc.poll() is not None:
            log.warning(
                "launched server %s exited with %s; restarting it", ep.name, ep.proc.returncode
            )
            await start_server(ep, self.start_timeout_s, self._url)
        return await ep.client.ready(timeout_s=1.0)

    async def _restore(self, key: Hashable) -> bool:
        assert isinstance(key, Endpoint) and key.client is not None
        ep = key
        mine = [mm for mm in self._models.values() if any(hh.endpoint is ep for hh in mm.handles)]
        missing = []
        for mm in mine:
            try:
                st = await ep.client.status(mm.server_name)
                if not any(s["state"] == "AVAILABLE" for s in st):
                    missing.append(mm.server_name)
            except TFServingNotFound:
                missing.append(mm.server_name)
        if missing and ep.models is not None:
            async with self._lock(ep):
                await self._set_models(ep, dict(ep.models), missing)
        elif missing:
            await asyncio.sleep(0.5)  # not ours to reload: wait for its operator
            return False
        for mm in mine:
            for i, hh in enumerate(mm.handles):
                if hh.endpoint is ep:
                    mm.handles[i] = TFServingReplica(self, mm, ep, next(self._ids))
            self._notify(mm.name)
        log.info("TF Serving server %s recovered", ep.name)
        return True

    def _overdue(self, key: Hashable) -> None:
        log.error(
            "TF Serving server %s did not come back within %s s",
            self._domain_name(key),
            self.recovery_timeout_s,
        )
