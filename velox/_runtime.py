"""Per-model Velox runtime: predict, top_k and observe over versioned split models (thesis ch. 2).

One :class:`VeloxService` per frontend process serves any number of registered
:class:`~inferline.velox.VeloxModel` s. Per model it keeps the *live version*: the shared state,
its feature function, and the owned users' online ridge models. Everything a request reads comes
from one live object taken at the start of the request; a retrain or rollback builds a complete
new one and swaps it in with a single assignment on the event loop, so no request ever mixes two
versions (a request that awaited features across a swap starts over under the new version).

Caches (both :class:`~inferline.queueing.PredictionCache`, keyed by model and version):
- feature cache: ``f(x)`` per version; a new version simply uses new keys, and rollback finds
  the old version's features still cached if they were not evicted;
- prediction cache: ``w_u . f(x)`` keyed additionally by the user's update stamp, so an observe
  makes that user's old entries unreachable; entries of a retired version are dropped.

Durability: ``observe`` appends to the store's log (committed) before it updates memory and
acknowledges. User states are snapshotted every ``checkpoint_every`` observations in a worker
thread; on start the snapshot is loaded and the log after it replayed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from inferline.core.errors import InferlineError, NotFoundError, ValidationError
from inferline.queueing import PredictionCache, cache_key

from ._bootstrap import Bootstrap, initial_result, with_features
from ._config import VeloxConfig
from ._live import Live
from ._model import (
    NewObservation,
    Observation,
    RetrainResult,
    VeloxModel,
    check_features,
)
from ._partition import WrongPartitionError, check_uid, partition_of
from ._results import ObserveResult, Prediction, Ranked, RetrainJob, TopK
from ._ridge import UserRidge
from ._staleness import StalenessDetector, StalenessVerdict, retrain_blocker
from ._store import UserRow, VeloxStore, VersionRecord

__all__ = ["Runtime"]

log = logging.getLogger(__name__)


class Runtime:
    """Per-model state and logic; :class:`VeloxService` routes calls here by model name."""

    def __init__(
        self,
        model: VeloxModel,
        config: VeloxConfig,
        store: VeloxStore,
        fcache: PredictionCache,
        pcache: PredictionCache,
        clock: Callable[[], float],
        bootstrap: Bootstrap | None = None,
    ) -> None:
        self.model = model
        self.boot = bootstrap or Bootstrap()
        self.name = model.name
        self.dim = int(model.dim)
        self.config = config
        self.store = store
        self.fcache = fcache
        self.pcache = pcache
        self.clock = clock
        self.detector = StalenessDetector(config.staleness)
        self.live: Live | None = None
        self._epochs = itertools.count(1)
        self._since_checkpoint = 0
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._retrain_task: asyncio.Task[None] | None = None
        self._jobs = itertools.count(1)
        self.jobs: list[RetrainJob] = []
        self._switch_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ helpers

    def owns(self, uid: str) -> bool:
        owned = self.config.owned_partitions
        return owned is None or partition_of(uid, self.config.partitions) in owned

    def check_owner(self, uid: str) -> None:
        check_uid(uid)
        owned = self.config.owned_partitions
        if owned is not None:
            p = partition_of(uid, self.config.partitions)
            if p not in owned:
                raise WrongPartitionError(uid, p, owned)

    def _live(self) -> Live:
        assert self.live is not None, "model not loaded"
        return self.live

    def _refresh(self, live: Live) -> None:
        """Follow the feature model's version: a redeployed backend model gets new cache keys
        (and its old entries are dropped), so its old features are never served again."""
        old = live.tokens(live._fv)
        if live.prefixes(self.model.feature_version()):
            self.fcache.invalidate(model=self.name, version=old[0])
            self.pcache.invalidate(model=self.name, version=old[1])

    async def features(self, live: Live, x: Any) -> np.ndarray:
        self._refresh(live)
        key = cache_key(self.name, live.version, x, prefix=live.fprefix)
        featurizer = live.featurizer

        async def compute() -> np.ndarray:
            return check_features(await featurizer(x), self.dim, self.name)

        return await self.fcache.get_or_compute(key, compute)

    async def feature_matrix(self, live: Live, items: Sequence[Any]) -> np.ndarray:
        """Features of many items: one batched cache read, misses computed concurrently."""
        self._refresh(live)
        prefix = live.fprefix
        keys = [cache_key(self.name, live.version, x, prefix=prefix) for x in items]
        found = self.fcache.get_many(keys)
        missing = [i for i, (hit, _) in enumerate(found) if not hit]
        rows = [v for _, v in found]
        if missing:
            featurizer = live.featurizer

            def compute(x: Any) -> Callable[[], Any]:
                async def run() -> np.ndarray:
                    return check_features(await featurizer(x), self.dim, self.name)

                return run

            got = await asyncio.gather(
                *(self.fcache.get_or_compute(keys[i], compute(items[i])) for i in missing)
            )
            for i, v in zip(missing, got, strict=True):
                rows[i] = v
        return np.array(rows)

    def _user_or_new(self, live: Live, uid: str) -> tuple[UserRidge, bool]:
        u = live.users.get(uid)
        if u is not None:
            return u, False
        if self.config.new_users == "reject":
            raise NotFoundError("user", uid)
        return UserRidge(live.average(), self.config.ridge_lambda), True

    # ------------------------------------------------------------------ serving

    async def predict(self, uid: str, x: Any) -> Prediction:
        self.check_owner(uid)
        while True:
            live = self._live()
            self._refresh(live)
            u = live.users.get(uid)
            if u is not None:
                hit, score = self.pcache.get(
                    cache_key(self.name, 0, [uid, u.epoch, x], prefix=live.pprefix)
                )
                if hit:
                    return Prediction(uid, score, live.version, False, cached=True)
            f = await self.features(live, x)
            if live is self.live:
                break  # a version switch during the await: start over under the new one
        u, new = self._user_or_new(live, uid)
        score = u.predict(f)
        if not new:
            self.pcache.put(cache_key(self.name, 0, [uid, u.epoch, x], prefix=live.pprefix), score)
        return Prediction(uid, score, live.version, new)

    async def top_k(self, uid: str, items: Sequence[Any], k: int, alpha: float | None) -> TopK:
        self.check_owner(uid)
        if not isinstance(items, (list, tuple)) or not items:
            raise ValidationError("items", "a non-empty list of items", items)
        if len(items) > self.config.max_items:
            raise ValidationError("items", f"at most {self.config.max_items} items", len(items))
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(items):
            raise ValidationError("k", f"an int in [1, {len(items)}]", k)
        a = self.config.alpha if alpha is None else alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
            raise ValidationError("alpha", "a finite number >= 0", alpha)
        while True:
            live = self._live()
            feats = await self.feature_matrix(live, items)
            if live is self.live:
                break
        u, new = self._user_or_new(live, uid)
        scores = feats @ u.w
        bonus = a * u.uncertainty(feats) if a > 0 else np.zeros(len(items))
        total = scores + bonus
        if k < len(total):
            top = np.argpartition(-total, k - 1)[:k]
            top = top[np.lexsort((top, -total[top]))]  # by score, ties by position
        else:
            top = np.lexsort((np.arange(len(total)), -total))
        ranked = tuple(Ranked(items[i], int(i), float(scores[i]), float(bonus[i])) for i in top)
        return TopK(uid, live.version, float(a), new, ranked)

    async def observe(self, uid: str, x: Any, y: float) -> ObserveResult:
        self.check_owner(uid)
        if isinstance(y, bool) or not isinstance(y, (int, float)) or not math.isfinite(y):
            raise ValidationError("y", "a finite number", y)
        y = float(y)
        while True:
            live = self._live()
            f = await self.features(live, x)
            if live is self.live:
                break
        # From here to the return there is no await: the log append and the memory update are
        # one step as far as other requests (and version switches) can tell.
        u = live.users.get(uid)
        new = u is None
        if u is None:
            u = UserRidge(live.average(), self.config.ridge_lambda)
        y_hat = u.predict(f)
        try:
            loss = float(self.model.loss(y, y_hat, x, uid))
        except OverflowError:
            loss = math.inf
        # A label or features this large would turn the user's Gram matrix and the loss
        # average into inf/NaN for good: refuse before anything is logged.
        if not math.isfinite(loss) or not math.isfinite(y * y):
            raise ValidationError("y", "a label whose squared error is finite (|y| < 1e150)", y)
        if not math.isfinite(float(f @ f)):
            raise ValidationError("x", "an item whose features have a finite square norm", x)
        obs = NewObservation(uid, x, y, live.version, self.clock(), f)
        seq = self.store.append_observation(self.name, obs)
        if new:
            live.add_user(uid, u)
        live.w_sum -= u.w
        u.update(f, y, self.config.refactor_every)
        live.w_sum += u.w
        u.epoch = next(self._epochs)
        live.upto[uid] = seq
        live.observed += 1
        live.dirty.add(uid)
        verdict = self.detector.update(uid, loss)
        job = self._on_stale(live, verdict) if verdict.stale else None
        self._since_checkpoint += 1
        if self._since_checkpoint >= self.config.checkpoint_every:
            self.start_checkpoint()
        return ObserveResult(uid, seq, y_hat, loss, live.version, new, verdict.stale, job)

    def _on_stale(self, live: Live, verdict: StalenessVerdict) -> RetrainJob | None:
        """Record the stale verdict; retrain only when the retrain can change something."""
        cfg = self.config.staleness
        detail = {**verdict.to_dict(), "threshold": cfg.threshold, "version": live.version}
        now = self.clock()
        self.store.record_event(self.name, "stale", detail, now)
        log.info("model %r is stale: %s", self.name, detail)
        blocker = retrain_blocker(
            cfg,
            can_change=self.model.retrain_can_change(live.built_with),
            new_observations=live.observed,
        )
        if blocker is not None:
            self.store.record_event(
                self.name, "retrain_skipped", {"why": blocker, "version": live.version}, now
            )
            return None
        why = (
            f"loss trend {verdict.trend:.3f} > {cfg.threshold}"
            if verdict.reason == "loss rising"
            else f"{verdict.reason} ({self.detector.reference:.4g})"
        )
        return self.start_retrain(f"stale: {why} after {verdict.observations} observations")

    # ------------------------------------------------------------------ checkpoints

    def _snapshot_rows(self, live: Live) -> list[UserRow]:
        rows = []
        for uid in live.dirty:
            u = live.users[uid]
            rows.append(
                UserRow(
                    uid, u.n, live.upto.get(uid, live.record.base_seq), u.gram.copy(), u.b.copy()
                )
            )
        live.dirty.clear()
        return rows

    def start_checkpoint(self) -> None:
        if self._checkpoint_task is not None and not self._checkpoint_task.done():
            return
        self._since_checkpoint = 0
        live = self._live()
        rows = self._snapshot_rows(live)  # copies taken on the loop; the write runs in a thread
        if rows:
            self._checkpoint_task = asyncio.ensure_future(self._write_rows(live, rows))

    async def _write_rows(self, live: Live, rows: list[UserRow]) -> None:
        try:
            await asyncio.to_thread(self.store.save_users, self.name, live.version, rows)
        except Exception:
            # Not fatal: the log still has every observation; keep the users dirty to retry.
            log.exception("checkpoint of %r failed", self.name)
            live.dirty.update(r.uid for r in rows)

    async def checkpoint(self) -> int:
        """Write every dirty user of the live version now; returns the number written."""
        if self._checkpoint_task is not None:
            await asyncio.shield(self._checkpoint_task)
        live = self._live()
        rows = self._snapshot_rows(live)
        if rows:
            await asyncio.to_thread(self.store.save_users, self.name, live.version, rows)
        self._since_checkpoint = 0
        return len(rows)

    # ------------------------------------------------------------------ versions

    def _build_users(
        self, result: RetrainResult, upto: int
    ) -> tuple[dict[str, UserRidge], list[UserRow]]:
        lam = self.config.ridge_lambda
        users: dict[str, UserRidge] = {}
        rows: list[UserRow] = []
        for uid, w in result.user_weights.items():
            w = np.asarray(w, dtype=np.float64)
            if w.shape != (self.dim,) or not np.all(np.isfinite(w)):
                raise InferlineError(
                    f"retrain of {self.name!r} returned bad weights for user {uid!r}"
                )
            feats = result.user_features.get(uid)
            f = np.zeros((0, self.dim)) if feats is None else np.asarray(feats, dtype=np.float64)
            u = UserRidge.from_weights(w, f, lam)
            rows.append(UserRow(uid, u.n, upto, u.gram, u.b))
            if self.owns(uid):
                users[uid] = u
        return users, rows

    async def create_initial(self) -> None:
        result = await initial_result(self.model, self.boot, self.config.ridge_lambda)
        upto = self.store.last_seq(self.name)
        info = {
            **dict(result.info),
            "training_rows": len(self.boot.training),
            "features_version": self.model.feature_version(),
        }
        record = VersionRecord(1, None, self.clock(), "initial", upto, info)
        encoded = self.model.encode_state(result.state)
        if not await asyncio.to_thread(self.store.put_version, self.name, record, encoded):
            # Another frontend created version 1 at the same moment: serve what it stored.
            current = self.store.current(self.name)
            self.live = await self.load_version(1 if current is None else current)
            return
        users, rows = await asyncio.to_thread(self._build_users, result, upto)
        await asyncio.to_thread(self.store.save_users, self.name, 1, rows)
        self.store.set_current(self.name, 1)
        self.store.record_event(
            self.name, "version", {"version": 1, "reason": "initial"}, self.clock()
        )
        live = self._make_live(record, result.state, users)
        if result.user_weights:
            live.default_w = np.mean(
                [np.asarray(w, dtype=np.float64) for w in result.user_weights.values()], axis=0
            )
        await self._catch_up(live, upto)
        self.live = live

    def _make_live(self, record: VersionRecord, state: Any, users: dict[str, UserRidge]) -> Live:
        live = Live(self.name, record, state, self.model.featurizer(state), self.dim)
        for uid, u in users.items():
            u.epoch = next(self._epochs)
            live.add_user(uid, u)
            live.upto[uid] = record.base_seq
        return live

    async def load_version(self, version: int) -> Live:
        """Materialize a stored version: its state, user snapshots, and the log after them."""
        records = {r.version: r for r in self.store.versions(self.name)}
        if version not in records:
            raise NotFoundError("version", version, sorted(records))
        record = records[version]
        data = await asyncio.to_thread(self.store.version_state, self.name, version)
        state = self.model.decode_state(data)
        rows = await asyncio.to_thread(self.store.load_users, self.name, version)
        lam = self.config.ridge_lambda
        users = {
            r.uid: UserRidge.from_stats(r.gram, r.b, r.n, lam) for r in rows if self.owns(r.uid)
        }
        live = self._make_live(record, state, users)
        for r in rows:
            if r.uid in users:
                live.upto[r.uid] = r.upto_seq
        if users:
            live.default_w = live.average()
        start = min([record.base_seq, *live.upto.values()])
        await self._catch_up(live, start)
        return live

    async def _catch_up(self, live: Live, after_seq: int) -> int:
        """Fold every owned observation after ``after_seq`` that ``live`` has not seen.

        Loops until the log has nothing new, and returns without awaiting after that last
        check, so the caller can swap ``live`` in before any new observation is appended.
        """
        applied = 0
        last = after_seq
        while True:
            pending = self.store.observations(self.name, after_seq=last)
            if not pending:
                return applied
            for o in pending:
                last = o.seq
                if not self.owns(o.uid) or o.seq <= live.upto.get(o.uid, live.record.base_seq):
                    continue
                if (
                    o.version == live.version
                    and o.features is not None
                    and len(o.features) == self.dim
                ):
                    f = o.features
                else:
                    try:
                        f = await self.features(live, o.x)
                    except InferlineError as e:
                        log.warning("replay of %r skips observation %d: %s", self.name, o.seq, e)
                        continue
                self._apply(live, o, f)
                applied += 1

    def _apply(self, live: Live, o: Observation, f: np.ndarray) -> None:
        u = live.users.get(o.uid)
        if u is None:
            u = UserRidge(live.average(), self.config.ridge_lambda)
            live.add_user(o.uid, u)
        live.w_sum -= u.w
        u.update(f, o.y, self.config.refactor_every)
        live.w_sum += u.w
        u.epoch = next(self._epochs)
        live.upto[o.uid] = o.seq
        if o.seq > live.record.base_seq:
            live.observed += 1
        live.dirty.add(o.uid)

    def _switch(self, new: Live, event: str, detail: dict[str, Any]) -> None:
        """Make ``new`` live. Synchronous: callers must not await between catch-up and this."""
        old = self.live
        self.live = new
        self.store.set_current(self.name, new.version)
        self.detector.reset()
        if old is not None and old is not new:
            self.pcache.invalidate(model=self.name, version=old.tokens(old._fv)[1])
            rows = self._snapshot_rows(old)
            if rows:  # keep the retired version's users current, so a rollback replays little
                task = asyncio.ensure_future(self._write_rows(old, rows))
                self._background.add(task)  # keep a reference until done (asyncio holds weak ones)
                task.add_done_callback(self._background.discard)
        self.store.record_event(
            self.name,
            event,
            {
                **detail,
                "version": new.version,
                "from_version": None if old is None else old.version,
            },
            self.clock(),
        )
        log.info("model %r now serves version %d (%s)", self.name, new.version, event)

    def start_retrain(self, reason: str) -> RetrainJob:
        """Start a background retrain unless one is running (then return that one)."""
        if self._retrain_task is not None and not self._retrain_task.done():
            return self.jobs[-1]
        job = RetrainJob(
            next(self._jobs),
            self.name,
            reason,
            "running",
            self.clock(),
            from_version=self._live().version,
        )
        self.jobs.append(job)
        self._retrain_task = asyncio.ensure_future(self._retrain(job))
        return job

    def _finish_job(self, job: RetrainJob, **changes: Any) -> None:
        i = next(i for i, j in enumerate(self.jobs) if j.job == job.job)
        self.jobs[i] = replace(self.jobs[i], finished_s=self.clock(), **changes)

    async def _retrain(self, job: RetrainJob) -> None:
        t0 = time.monotonic()
        try:
            live = self._live()
            upto = self.store.last_seq(self.name)
            obs = await asyncio.to_thread(self.store.observations, self.name, 0, upto)
            fv = self.model.feature_version()
            rows = [*self.boot.training, *obs]  # the training data, then everything observed
            if self.model.uses_logged_features:
                rows = await with_features(
                    rows, lambda x: self.features(live, x), refresh_all=fv != live.built_with
                )
            weights = {uid: u.w.copy() for uid, u in live.users.items()}
            result = await asyncio.to_thread(
                self.model.retrain, live.state, rows, weights, self.config.ridge_lambda
            )
            async with self._switch_lock:
                info = {
                    **dict(result.info),
                    "observations": len(obs),
                    "training_rows": len(self.boot.training),
                    "features_version": fv,
                }
                users, rows = await asyncio.to_thread(self._build_users, result, upto)
                encoded = self.model.encode_state(result.state)
                version = max(r.version for r in self.store.versions(self.name)) + 1
                while True:  # a number taken by another frontend's retrain: take the next
                    record = VersionRecord(
                        version, live.version, self.clock(), job.reason, upto, info
                    )
                    if await asyncio.to_thread(self.store.put_version, self.name, record, encoded):
                        break
                    version += 1
                await asyncio.to_thread(self.store.save_users, self.name, version, rows)
                new = self._make_live(record, result.state, users)
                if users:
                    new.default_w = new.average()
                await self._catch_up(new, upto)
                self._switch(
                    new,
                    "retrained",
                    {"reason": job.reason, "job": job.job, "seconds": time.monotonic() - t0},
                )
            self._finish_job(job, status="done", version=version)
        except asyncio.CancelledError:
            self._finish_job(job, status="failed", error="cancelled")
            self.store.record_event(self.name, "retrain_cancelled", {"job": job.job}, self.clock())
            raise
        except Exception as e:
            log.exception("retrain of %r failed", self.name)
            self._finish_job(job, status="failed", error=f"{type(e).__name__}: {e}")
            self.store.record_event(
                self.name, "retrain_failed", {"job": job.job, "error": repr(e)}, self.clock()
            )
            self.detector.reset()  # re-arm: a later rise may trigger another attempt

    async def wait_retrain(self) -> None:
        if self._retrain_task is not None:
            await asyncio.gather(self._retrain_task, return_exceptions=True)

    async def rollback(self, version: int) -> VersionRecord:
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValidationError("version", "an int", version)
        if self._retrain_task is not None and not self._retrain_task.done():
            self._retrain_task.cancel()
            await asyncio.gather(self._retrain_task, return_exceptions=True)
        async with self._switch_lock:
            live = self._live()
            if version == live.version:
                return live.record
            await self.checkpoint()
            new = await self.load_version(version)
            await self._catch_up(new, min([new.record.base_seq, *new.upto.values()]))
            self._switch(new, "rollback", {"reason": "rollback"})
            return new.record

    async def sync(self) -> bool:
        """Adopt the store's current version if another frontend changed it."""
        current = self.store.current(self.name)
        if current is None or (self.live is not None and current == self.live.version):
            return False
        async with self._switch_lock:
            new = await self.load_version(current)
            await self._catch_up(new, min([new.record.base_seq, *new.upto.values()]))
            self._switch(new, "sync", {"reason": "version changed in the store"})
        return True

    async def close(self) -> None:
        if self._retrain_task is not None and not self._retrain_task.done():
            self._retrain_task.cancel()
            await asyncio.gather(self._retrain_task, return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.live is not None:
            await self.checkpoint()
