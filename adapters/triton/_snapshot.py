"""The operator's Triton model configurations as inferline first read them, and putting them
back; and the check that the server takes model control at all.

When attach stops (SIGTERM or ``inferline detach``) every model inferline adopted gets back the
configuration the server reported before inferline touched it (instance groups, batch size,
dynamic batcher: the whole of ``GET /v2/models/{m}/config``), loaded only where it differs;
the models inferline loaded itself are unloaded. The snapshot is JSON
(``{"kind": "triton", "url": ..., "models": {server name: configuration or null}}``, null:
loaded by inferline), so ``inferline detach`` can restore it after a crash with
``restore_snapshot(url, snapshot)`` alone.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from inferline.core import BackendError, ValidationError

from .._remote import bearer_headers
from ._client import TritonClient, TritonFailure, TritonModelMissing
from ._recovery import TritonRecovery
from ._url import parse_triton_url

__all__ = ["KIND", "TritonOperatorSettings", "check_model_control", "restore_snapshot"]

log = logging.getLogger(__name__)

KIND = "triton"
# unloading a model the repository does not have is a no-op in explicit mode, and refused in
# NONE and POLL modes ("explicit model load / unload is not allowed if polling is enabled"):
# a probe that cannot change anything
_PROBE = "__inferline_model_control_probe__"
NOT_EXPLICIT = (
    "the server is not in explicit model-control mode; inferline scales and restores models "
    "by loading them: start tritonserver with --model-control-mode=explicit"
)


async def check_model_control(client: TritonClient, url: str) -> None:
    """``BackendError`` naming ``--model-control-mode=explicit`` unless the server takes
    load / unload requests."""
    try:
        await client.unload(_PROBE)
    except TritonModelMissing:
        return
    except TritonFailure as e:
        text = str(e).lower()
        if "not allowed" in text or "polling" in text:
            raise BackendError(url, NOT_EXPLICIT) from None
        raise BackendError(url, str(e)) from None


async def _restore_models(
    client: TritonClient, configs: Mapping[str, Mapping[str, Any] | None], url: str
) -> dict[str, str]:
    """Each model back to its configuration (None: unloaded); what was done per model.
    Every model is tried; the failures are raised together as ``BackendError``."""
    done: dict[str, str] = {}
    errors = []
    # ensembles after their steps: Triton refuses an ensemble allowing a larger batch than a
    # step takes, so one lowered for a steered step goes back up only once the step has
    ordered = sorted(configs.items(), key=lambda kv: (kv[1] or {}).get("platform") == "ensemble")
    for name, cfg in ordered:
        try:
            if cfg is None:
                try:
                    await client.unload(name)
                except TritonModelMissing:
                    pass
                done[name] = "unloaded"
                continue
            current = None
            if await client.model_ready(name):
                current = await client.model_config(name)
            if current == dict(cfg):
                done[name] = "unchanged"
                continue
            await client.load(name, cfg)
            done[name] = "restored"
        except TritonFailure as e:
            errors.append(f"{name}: {e}")
    if errors:
        raise BackendError(url, "operator configuration not restored for " + "; ".join(errors))
    return done


def _snapshot_models(snapshot: Any) -> dict[str, dict[str, Any] | None]:
    """The models of a snapshot; ``ValidationError`` naming the field that is wrong."""
    if not isinstance(snapshot, Mapping) or snapshot.get("kind") != KIND:
        got = snapshot.get("kind") if isinstance(snapshot, Mapping) else type(snapshot).__name__
        raise ValidationError("snapshot.kind", repr(KIND), got)
    models = snapshot.get("models")
    if not isinstance(models, Mapping):
        raise ValidationError("snapshot.models", "a mapping {model: configuration or null}", models)
    for name, cfg in models.items():
        if cfg is not None and not isinstance(cfg, Mapping):
            raise ValidationError(f"snapshot.models.{name}", "a configuration or null", cfg)
    return {str(k): None if v is None else dict(v) for k, v in models.items()}


async def restore_snapshot(
    url: str,
    snapshot: Mapping[str, Any],
    *,
    token: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, str]:
    """Put back the configurations of ``snapshot`` (``TritonBackend.operator_snapshot()``)
    on the server at ``url`` (``triton://`` or ``triton+grpc://``); what was done per model."""
    models = _snapshot_models(snapshot)
    protocol, address, _ = parse_triton_url(url)
    client = TritonClient(address, protocol, timeout_s=timeout_s, headers=bearer_headers(token))
    try:
        await check_model_control(client, url)
        return await _restore_models(client, models, url)
    except TritonFailure as e:
        raise BackendError(url, str(e)) from None
    finally:
        await client.close()


class TritonOperatorSettings(TritonRecovery):
    """The operator's configurations of the models ``TritonBackend`` manages, as first read."""

    _client: TritonClient

    def _init_operator_settings(self) -> None:
        self._operator_configs: dict[str, dict[str, Any] | None] = {}
        self._restored = False
        self._control_checked = False

    def _remember_operator(self, server_name: str, cfg: Mapping[str, Any] | None) -> None:
        """The first configuration seen wins: a later deploy or scale is inferline's own."""
        if server_name not in self._operator_configs:
            self._operator_configs[server_name] = None if cfg is None else copy.deepcopy(dict(cfg))

    async def check_model_control(self) -> None:
        """A one-line ``BackendError`` naming ``--model-control-mode=explicit`` when the
        server does not take model control (checked once, when the first model is adopted)."""
        if not self._control_checked:
            await check_model_control(self._client, self._url)
            self._control_checked = True

    def operator_snapshot(self) -> dict[str, Any]:
        """What ``restore_operator_settings`` puts back, as JSON: per model inferline manages,
        the operator's configuration (null: inferline loaded it, so it is unloaded)."""
        return {"kind": KIND, "url": self._url, "models": copy.deepcopy(self._operator_configs)}

    async def restore_operator_settings(self) -> None:
        """Put every managed model back as the operator had it: adopted ones get their
        configuration back (instance groups, batch size, batcher), those inferline loaded are
        unloaded. For when attach stops: the watch and recovery stop and the handles leave
        service first (recovery would otherwise reload inferline's configuration)."""
        self._restored = True
        await self._stop_loops()
        self._take_down([h for m in self._models.values() for h in m.handles])
        async with self._control_lock():
            for m in self._models.values():
                m.handles, m.state = [], "unloaded"
            done = await _restore_models(self._client, self._operator_configs, self._url)
        log.info("restored the operator's Triton configuration: %s", done)
