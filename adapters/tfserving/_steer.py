"""Steering TF Serving's own batcher (``inferline attach --steer``): the plan's batching
parameters applied through the server, and the server's counters read back.

``apply_server_batcher(model, batcher, instances)`` follows TF Serving's rules: a version's
``batching_params.pbtxt`` is read when that version loads (``--enable_per_model_batching_parameters``;
a config reload alone does not re-read it, TF Serving #2008). So it adds a NEW version
directory (a copy of the served version, ``_versions``) with the new parameters and reloads
each server that serves the model in two steps, under that server's lock: first with both
versions (``specific``), waiting until the new one is AVAILABLE while the old one serves, then
with the new one only (the old one retires once its queued requests ran). No request finds
the model unavailable. A directory inferline made earlier is removed once no server serves
it. The entry inferline reloads with is its own (``specific { versions: N }``, no labels): the
operator's entry comes back on restore (``_snapshot``), which also removes every directory
inferline made.

``instances`` is the batcher's ``num_batch_threads``: on one TF Serving server the planner's
instances are the batches of the model that run at once (``core/planning/_server.py``), not
servers; the servers (the backend's replicas, ``scale()``) are left as they are. The batch
queue bound ``max_enqueued_batches`` scales with it (the planner derives it as threads times
the batches one thread finishes within the SLO).

``server_counters(models)``: cumulative counters per model from each serving server's
Prometheus page (``_metrics``), summed over servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from inferline.core import BackendError, NotFoundError, TFServingBatcher, ValidationError

from ._batching import BATCHING_PARAMS, batching_text
from ._client import TFServingFailure, TFServingNotFound
from ._config import ServedModel, merged
from ._metrics import METRICS_PATH, parse_tfserving_metrics
from ._model_sets import TFServingModelSets
from ._servers import Endpoint
from ._versions import added_versions, local_root, make_version, remove_added

__all__ = ["TFServingSteer", "steer_batcher"]

log = logging.getLogger(__name__)

_HEAD = "# written by inferline attach --steer (the plan's TF Serving batcher)\n"


def steer_batcher(model: str, batcher: Mapping[str, Any], instances: int) -> TFServingBatcher:
    """The plan's batcher document with ``num_batch_threads = instances`` (the queue bound
    scaled alike); ``ValidationError`` naming the field."""
    where = f"server_batchers.{model}"
    if not isinstance(batcher, Mapping) or batcher.get("kind", "tfserving") != "tfserving":
        got = batcher.get("kind") if isinstance(batcher, Mapping) else batcher
        raise ValidationError(f"{where}.kind", "'tfserving'", got)
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ValidationError(f"{where}.instances", "an integer of at least 1", instances)
    b = TFServingBatcher.from_dict(batcher, f"{where}.")
    if b.num_batch_threads == instances:
        return b
    enq = max(1, math.ceil(b.max_enqueued_batches * instances / b.num_batch_threads))
    return replace(b, num_batch_threads=instances, max_enqueued_batches=enq)


class TFServingSteer(TFServingModelSets):
    """The steer calls of ``TFServingBackend``."""

    metrics_path: str = METRICS_PATH

    def _server_name(self, model: str) -> str:
        return self._models[model].server_name if model in self._models else model

    async def _served_version(self, ep: Endpoint, name: str) -> int:
        st = await self._status(ep, name)
        avail = [s["version"] for s in st or [] if s["state"] == "AVAILABLE"]
        if not avail:
            raise NotFoundError("served model", name, f"no AVAILABLE version on {ep.name}")
        return max(avail)

    async def _wait_version(self, ep: Endpoint, name: str, version: int) -> None:
        """Until ``version`` of ``name`` is AVAILABLE on ``ep`` (``BackendError`` if it
        fails to load or takes longer than ``load_timeout_s``)."""
        assert ep.client is not None
        deadline = time.monotonic() + self.load_timeout_s
        last: Any = None
        while True:
            try:
                last = await ep.client.status(name)
            except TFServingNotFound as e:
                last = str(e)
            except TFServingFailure as e:
                raise self._error(e) from None
            for s in last if isinstance(last, list) else []:
                if s["version"] == version and s["state"] == "AVAILABLE":
                    return
                if s["version"] == version and s["state"] == "END":
                    raise BackendError(
                        self._url,
                        f"version {version} of {name!r} failed to load on {ep.name}: "
                        f"{s['error_message']}",
                    )
            if time.monotonic() > deadline:
                raise BackendError(
                    self._url,
                    f"version {version} of {name!r} not AVAILABLE on {ep.name} "
                    f"within {self.load_timeout_s} s: {last}",
                )
            await asyncio.sleep(0.05)

    async def apply_server_batcher(
        self, model: str, batcher: Mapping[str, Any], instances: int
    ) -> None:
        """Serve ``model`` with ``batcher`` (the plan's ``server_batchers[model]``, a
        ``TFServingBatcher`` document) and ``num_batch_threads = instances``, through a new
        version directory and two reloads per server (module docs). Nothing changes when the
        served version already has these parameters. The servers must run with
        ``--enable_batching --enable_per_model_batching_parameters``, and the model's base
        path must be a local directory this process can write."""
        await self._ensure_started()
        b = steer_batcher(model, batcher, instances)
        name = self._server_name(model)
        eps = [ep for ep in self._endpoints if ep.models is not None and name in ep.models]
        if not eps:
            raise ValidationError(
                f"server_batchers.{model}",
                "a model in a server's known model set (model_config_file=, or one inferline deployed)",
                None,
            )
        entry = eps[0].models[name]  # type: ignore[index]
        root = local_root(entry, f"{model}.base_path")
        text = batching_text(b, _HEAD)
        served = {ep: await self._served_version(ep, name) for ep in eps}
        files = [root / str(v) / BATCHING_PARAMS for v in served.values()]
        if all(f.is_file() and f.read_text() == text for f in files):
            return  # already served with these parameters
        new = make_version(root, served[eps[0]], text, name)
        final = ServedModel(name, entry.base_path, entry.platform, (new,))
        switched = 0
        try:
            for ep in eps:
                before = (ep.models or {})[name]
                async with self._lock(ep):
                    both = replace(final, versions=tuple(sorted({served[ep], new})))
                    try:
                        await self._set_models(ep, merged(ep.models or {}, put=[both]), [])
                        await self._wait_version(ep, name, new)
                    except BaseException:  # the old version still serves: its entry back
                        with contextlib.suppress(Exception):
                            await self._set_models(ep, merged(ep.models or {}, put=[before]), [])
                        raise
                    await self._set_models(ep, merged(ep.models or {}, put=[final]), [])
                switched += 1
        finally:
            if not switched:  # no server serves it: the directory goes
                remove_added(root, [new])
        if model in self._models:
            self._models[model].entry = final
        retired = set(served.values()) & set(added_versions(root)) - {new}
        remove_added(root, sorted(retired))
        log.info(
            "%s: version %d serves the batcher %s (%d servers)", model, new, b.to_dict(), switched
        )

    async def server_counters(self, models: Sequence[str]) -> dict[str, dict[str, float]]:
        """Cumulative counters per model (``_metrics``: ``request_success``,
        ``request_failure``, ``request_us``, ``compute_us``, ``queue_us``, ``exec_count``
        where the server gives them), summed over the servers that serve it. As Triton's,
        ``compute_us`` and ``queue_us`` add up per request (each request counts the run of
        its batch). The servers
        must serve their Prometheus page (``--monitoring_config_file``) at ``metrics_path``."""
        await self._ensure_started()
        models = list(dict.fromkeys(models))  # the app may also be a planned model
        names = {m: self._server_name(m) for m in models}
        out: dict[str, dict[str, float]] = {m: {} for m in models}
        for ep in self._endpoints:
            hosted = [m for m in models if ep.models is None or names[m] in ep.models]
            if not hosted:
                continue
            if ep.client is None or not ep.rest:
                raise ValidationError(
                    f"REST address of server {ep.name}", "host:port (metrics are on REST)", None
                )
            try:
                text = await ep.client.get_text(self.metrics_path)
            except TFServingFailure as e:
                raise BackendError(
                    self._url,
                    f"no Prometheus page at {self.metrics_path} on {ep.name} ({e}); start "
                    "the server with --monitoring_config_file holding prometheus_config "
                    f'{{ enable: true path: "{self.metrics_path}" }}',
                ) from None
            got = parse_tfserving_metrics(text, sorted({names[m] for m in hosted}))
            for m in hosted:
                for k, v in got[names[m]].items():
                    out[m][k] = out[m].get(k, 0.0) + v
        return out
