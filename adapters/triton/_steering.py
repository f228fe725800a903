"""Steering Triton's own batcher and instances (``inferline attach --steer``): the two methods
the steer loop asks of a backend, ``apply_server_batcher`` and ``server_counters``, plus what
steering an ensemble needs (``server_config``, ``fit_ensemble``). A mixin of
``TritonBackend``: every load goes through the same model-control lock, and the first
configuration seen of each model is remembered for ``restore_operator_settings``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from inferline.core import ModelConfig, NotFoundError

from ._client import TritonFailure, TritonModelMissing
from ._config import BatcherSettings, instance_count, steer_config
from ._metrics import fetch_metrics, parse_triton_metrics
from ._snapshot import TritonOperatorSettings

__all__ = ["TritonSteering"]

log = logging.getLogger(__name__)


class TritonSteering(TritonOperatorSettings):
    """Steering methods of ``TritonBackend`` (see the module docstring)."""

    metrics_url: str
    _headers: dict[str, str]
    _seen_configs: dict[str, dict[str, Any]]

    async def _loaded_names(self) -> list[str]:
        return [
            str(e["name"])
            for e in await self._client.repository_index()
            if e.get("state") == "READY"
        ]

    async def server_config(self, model: str) -> dict[str, Any]:
        """The configuration the server runs ``model`` (a server name) with."""
        try:
            return await self._client.model_config(model)
        except TritonModelMissing:
            raise NotFoundError("loaded model", model, sorted(await self._loaded_names())) from None
        except TritonFailure as e:
            raise self._error(e) from None

    async def apply_server_batcher(
        self, model: str, batcher: Mapping[str, Any], instances: int
    ) -> None:
        """Run ``model`` (a server name) with a planned batcher (``TritonBatcher.to_dict()``)
        and ``instances`` instances, by an explicit-mode load of its whole configuration
        (``steer_config``: every setting the plan does not own stays the operator's). A change
        of the instance count alone updates the model in place; the first configuration seen
        is remembered for ``restore_operator_settings``."""
        self._check_open()
        self._check_replicas(instances)
        await self.check_model_control()
        async with self._control_lock():
            current = await self.server_config(model)
            self._remember_operator(model, current)
            desired = steer_config(current, batcher, max(1, instances))
            if desired == current:
                return
            try:
                await self._client.load(model, desired)
            except TritonFailure as e:
                raise self._error(e) from None
            self._seen_configs[model] = desired
            for m in self._models.values():  # an adopted model: the watch expects this now
                if m.server_name == model:
                    m.triton_config = desired
                    m.config = ModelConfig(
                        m.config.hardware,
                        max(1, int(desired.get("max_batch_size", 0) or 1)),
                        instance_count(desired),
                    )
                    m.batcher = BatcherSettings.from_config(desired.get("dynamic_batching") or {})
                    m.adopted = False  # scale() now keeps the plan's batcher, not the operator's
        log.info("steered %r: %d instances, batcher %s", model, instances, dict(batcher))

    async def fit_ensemble(self, ensemble: str, max_batch_size: int) -> bool:
        """Lower an ensemble's ``max_batch_size`` to ``max_batch_size`` when it allows more
        (Triton refuses an ensemble allowing a larger batch than a step takes); remembered for
        ``restore_operator_settings`` (restored after its steps). True if it changed."""
        async with self._control_lock():
            current = await self.server_config(ensemble)
            mb = int(current.get("max_batch_size", 0) or 0)
            if mb <= max_batch_size or mb == 0:
                return False
            self._remember_operator(ensemble, current)
            try:
                await self._client.load(ensemble, {**current, "max_batch_size": max_batch_size})
            except TritonFailure as e:
                raise self._error(e) from None
        return True

    async def server_counters(self, models: Sequence[str]) -> dict[str, dict[str, float]]:
        """Cumulative counters per model from the server's Prometheus page (``_metrics``):
        request_success, request_failure, inference_count, exec_count, queue_us, compute_us,
        request_us (plus request_p99_us where the server exports latency summaries); a
        model the page does not name is absent."""
        self._check_open()
        text = await fetch_metrics(self.metrics_url, self._headers, min(self.timeout_s, 10.0))
        return parse_triton_metrics(text, models)
