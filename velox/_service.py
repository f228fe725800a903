"""The Velox service facade: one per frontend process, routing calls to per-model runtimes.

See :mod:`inferline.velox._runtime` for how versions, caches and durability work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from inferline.core.errors import NotFoundError, ValidationError
from inferline.queueing import PredictionCache

from ._bootstrap import Bootstrap
from ._config import VeloxConfig
from ._model import Observation, VeloxModel
from ._results import ObserveResult, Prediction, RetrainJob, TopK
from ._runtime import Runtime
from ._store import SQLiteStore, VeloxStore, VersionRecord

__all__ = ["VeloxService"]

log = logging.getLogger(__name__)


class VeloxService:
    """Velox for one frontend process: register models, then predict / top_k / observe.

    ``store`` defaults to a throwaway SQLite file (pass ``SQLiteStore(path)`` to persist).
    ``clock`` stamps observations, versions and events (wall-clock seconds by default).
    The methods are coroutines: feature functions may call a backend.
    """

    def __init__(
        self,
        store: VeloxStore | None = None,
        *,
        feature_cache_size: int = 100_000,
        prediction_cache_size: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._owns_store = store is None
        self._releases: list[Callable[[], None]] = []  # store claims, ended by close()
        self.store: VeloxStore = SQLiteStore(":memory:") if store is None else store
        self.feature_cache = PredictionCache(feature_cache_size)
        self.prediction_cache = PredictionCache(prediction_cache_size)
        self.clock = clock
        self._models: dict[str, Runtime] = {}

    # ------------------------------------------------------------------ registry

    async def register(
        self,
        model: VeloxModel,
        config: VeloxConfig | None = None,
        *,
        bootstrap: Bootstrap | None = None,
    ) -> None:
        """Serve ``model``: resume its current stored version (replaying the log), or create
        version 1 from ``model.initial()`` and ``bootstrap`` (starting weights, or a fit on the
        training data). Every retrain uses ``bootstrap.training`` and the log."""
        if not isinstance(model, VeloxModel):
            raise ValidationError("model", "a VeloxModel", type(model).__name__)
        name = getattr(model, "name", None)
        if not isinstance(name, str) or not name or "/" in name:
            raise ValidationError("model.name", "a non-empty name without '/'", name)
        if name in self._models:
            raise ValidationError("model.name", "a name not registered yet", name)
        cfg = config or VeloxConfig()
        claim = getattr(self.store, "claim", None)  # stores that are one process's alone
        release = claim(name, cfg.owned_partitions, cfg.partitions) if claim else None
        try:
            rt = Runtime(
                model,
                cfg,
                self.store,
                self.feature_cache,
                self.prediction_cache,
                self.clock,
                bootstrap,
            )
            current = self.store.current(name)
            if current is None:
                await rt.create_initial()
            else:
                rt.live = await rt.load_version(current)
                log.info(
                    "model %r resumed at version %d with %d users",
                    name,
                    current,
                    len(rt.live.users),
                )
        except BaseException:
            if release is not None:
                release()
            raise
        if release is not None:
            self._releases.append(release)
        self._models[name] = rt

    def models(self) -> list[str]:
        return sorted(self._models)

    def runtime(self, model: str) -> Runtime:
        rt = self._models.get(model)
        if rt is None:
            raise NotFoundError("velox model", model, sorted(self._models))
        return rt

    # ------------------------------------------------------------------ serving API

    async def predict(self, model: str, uid: str, x: Any) -> Prediction:
        return await self.runtime(model).predict(uid, x)

    async def top_k(
        self, model: str, uid: str, items: Sequence[Any], k: int = 10, alpha: float | None = None
    ) -> TopK:
        """The ``k`` items with the best ``w.f + alpha * sqrt(f^T A^-1 f)`` (LinUCB)."""
        return await self.runtime(model).top_k(uid, items, k, alpha)

    async def observe(self, model: str, uid: str, x: Any, y: float) -> ObserveResult:
        """Learn from feedback; durable when it returns."""
        return await self.runtime(model).observe(uid, x, y)

    # ------------------------------------------------------------------ management API

    async def retrain(
        self, model: str, reason: str = "manual", *, wait: bool = False
    ) -> RetrainJob:
        """Start a background retrain (or join the running one); ``wait`` for it to finish."""
        rt = self.runtime(model)
        job = rt.start_retrain(reason)
        if wait:
            await rt.wait_retrain()
            return next(j for j in rt.jobs if j.job == job.job)
        return job

    def jobs(self, model: str) -> list[RetrainJob]:
        return list(self.runtime(model).jobs)

    def versions(self, model: str) -> list[VersionRecord]:
        return self.store.versions(self.runtime(model).name)

    def current_version(self, model: str) -> int:
        return self.runtime(model)._live().version

    async def rollback(self, model: str, version: int) -> VersionRecord:
        return await self.runtime(model).rollback(version)

    async def sync(self, model: str) -> bool:
        return await self.runtime(model).sync()

    def events(self, model: str) -> list[dict[str, Any]]:
        return self.store.events(self.runtime(model).name)

    def observations(self, model: str, after_seq: int = 0) -> list[Observation]:
        return self.store.observations(self.runtime(model).name, after_seq)

    def user(self, model: str, uid: str) -> dict[str, Any]:
        """A user's model summary and running loss; NotFoundError for an unknown user."""
        rt = self.runtime(model)
        rt.check_owner(uid)
        live = rt._live()
        u = live.users.get(uid)
        if u is None:
            raise NotFoundError("user", uid)
        loss = rt.detector.users.get(uid)
        return {
            "uid": uid,
            "version": live.version,
            "observations": u.n,
            "weights": u.w.tolist(),
            "loss": None if loss is None else loss.to_dict(),
        }

    def stats(self, model: str) -> dict[str, Any]:
        rt = self.runtime(model)
        live = rt._live()
        return {
            "model": model,
            "version": live.version,
            "users": len(live.users),
            "staleness": rt.detector.snapshot(),
            # the feature model's version now, and the one this version was fitted under
            "features_version": rt.model.feature_version(),
            "built_with": live.built_with,
            "feature_cache": self.feature_cache.stats(),
            "prediction_cache": self.prediction_cache.stats(),
            "retrain": None if not rt.jobs else rt.jobs[-1].to_dict(),
        }

    async def checkpoint(self, model: str | None = None) -> int:
        names = [model] if model is not None else list(self._models)
        return sum([await self.runtime(n).checkpoint() for n in names])

    async def close(self) -> None:
        """Finish: cancel running retrains, checkpoint users, close an owned store."""
        for rt in self._models.values():
            await rt.close()
        for release in self._releases:
            release()
        self._releases.clear()
        if self._owns_store:
            self.store.close()
