"""The drift loop running live: estimated vs measured P99 per app, recalibration, re-planning.

Wiring only; the decision rule is :class:`DriftPolicy` (pure, ``_drift_policy.py``). The
monitor wraps each app's handler (as the live tuner does) to record every query's arrival
and latency, and listens to the dispatcher's batches for their service times. Every
``tick_s`` it runs the estimator for the plan in force (live replica counts) on the arrivals
of the last ``window_s`` seconds, off the event loop (in a worker process, see
``_drift_work.py``; in a thread where none was started), sets the
``inferline_estimated_p99_seconds`` / ``inferline_measured_p99_seconds`` gauges and asks the
policy. On ``recalibrate`` it calibrates the profiles to the window's live service times
(``calibrate_profiles``, what ``inferline calibrate`` does offline), re-estimates, and when the
plan no longer meets its SLO plans again on the last ``plan_trace_s`` seconds of arrivals
(in a worker thread) and applies the new plan through the service's plan target.
``GET /admin/drift`` shows the figures, the config and the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    HardwareCatalog,
    InfeasibleError,
    InferlineError,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
)
from inferline.deploy._apply import apply_plan
from inferline.deploy._drift_policy import (
    DriftConfig,
    DriftDecision,
    DriftObservation,
    DriftPolicy,
    DriftState,
)
from inferline.deploy._drift_work import estimate_p99s, replan
from inferline.measure import calibrate_profiles
from inferline.queueing import BatchEvent, RecentService

__all__ = ["DriftEvent", "DriftMonitor", "DriftRoutes", "drift_monitor", "make_drift_router"]

log = logging.getLogger(__name__)

_MONITORS: weakref.WeakKeyDictionary[Any, DriftMonitor] = weakref.WeakKeyDictionary()


def drift_monitor(service: Any) -> DriftMonitor | None:
    """The drift monitor attached to ``service`` (None: the loop is off)."""
    return _MONITORS.get(service)


@dataclass(frozen=True)
class DriftEvent:
    """Something the loop saw or did: ``drift`` (the policy acted), ``recalibrated``,
    ``replanned``, ``kept`` (the plan still fits), ``error``."""

    time_s: float
    kind: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "kind": self.kind, "detail": self.detail, **self.data}


class DriftMonitor:
    """Runs a :class:`DriftPolicy` against a live ``Service`` (see the module docstring).

    ``profiles`` / ``pipeline``: what the estimate needs (calibration replaces
    ``profiles``); ``estimator``: base options (shared cores, say) to which the config's
    per-hop overhead and spread are added. ``clock`` is the only time source."""

    def __init__(
        self,
        config: DriftConfig,
        profiles: Profiles,
        pipeline: Pipeline,
        *,
        clock: Callable[[], float] = time.perf_counter,
        estimator: EstimatorOptions | None = None,
        catalog: HardwareCatalog = DEFAULT_CATALOG,
        planner: PlannerOptions | None = None,
    ) -> None:
        self.config = config
        # a re-plan's base options: the deployment's admission rule (Deployment.planner_admission)
        self.planner = planner or PlannerOptions()
        self.profiles = profiles
        self.pipeline = pipeline
        self.policy = DriftPolicy(config)
        self.state = DriftState()
        self.catalog = catalog
        self.estimator = replace(
            estimator or EstimatorOptions(),
            hop_overhead_s=config.hop_overhead_s,
            service_spread=config.service_spread,
        )
        self._clock = clock
        self._queries: dict[str, deque[list[float]]] = {}  # app -> [arrival, latency or nan]
        self._batches: deque[BatchEvent] = deque()
        self.last: dict[str, DriftObservation] = {}
        self.last_decision: DriftDecision | None = None
        self.events: deque[DriftEvent] = deque(maxlen=200)
        self.calibrations = 0
        self.replans = 0
        self._service: Any = None
        self._task: asyncio.Task[None] | None = None
        self._acting: asyncio.Task[None] | None = None
        self._gauges: Any = None
        self._pool: ProcessPoolExecutor | None = None

    # -- feeding ---------------------------------------------------------------------------
    def attach(self, service: Any, apps: Iterable[str] | None = None) -> None:
        """Record arrivals and latencies of ``apps`` (default: all), batches of the service's
        dispatcher, export gauges to its registry, stop with it."""
        self._service = service
        for name in list(service.apps) if apps is None else list(apps):
            app = service.app(name)
            self._queries[name] = deque()
            app.handler = _timing(app.handler, self._queries[name], self._clock)
        if service.dispatcher is not None:
            service.dispatcher.add_listener(self._on_event)
        if getattr(service, "metrics", None) is not None:
            self._gauges = _DriftMetrics(service.metrics.registry)
        service.on_close(self.stop)
        _MONITORS[service] = self

    def _on_event(self, ev: Any) -> None:
        if isinstance(ev, BatchEvent) and ev.ok:
            self._batches.append(ev)

    def _prune(self, now: float) -> None:
        keep = now - max(self.config.window_s, self.config.plan_trace_s)
        for q in self._queries.values():
            while q and q[0][0] < keep:
                q.popleft()
        while self._batches and self._batches[0].start < now - self.config.window_s:
            self._batches.popleft()

    # -- the loop --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def launch(self, service: Any, apps: Iterable[str] | None = None) -> None:
        self.attach(service, apps)
        # a process of its own (see _drift_work.py); the kernel compiles there on its first
        # call: do it now
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        await self._estimates({"warm-up": np.arange(5) * 0.01}, self._configs())
        self._task = asyncio.get_running_loop().create_task(self._loop())
        c = self.config
        log.info(
            "drift loop on (%s): window %g s, tick %g s, threshold %.0f%%, sustain %d, "
            "cooldown %g s",
            c.mode,
            c.window_s,
            c.tick_s,
            c.threshold * 100,
            c.sustain,
            c.cooldown_s,
        )

    async def stop(self) -> None:
        for t in (self._task, self._acting):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        self._task = self._acting = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the loop outlives a bad tick
                log.exception("drift tick failed")
                self._event("error", f"tick failed: {type(e).__name__}: {e}")

    async def tick(self) -> DriftDecision:
        """One observation, decision and (in the background) action; none while an action
        runs (its estimates and re-plan use the worker)."""
        now = self._clock()
        if self._acting is not None and not self._acting.done():
            return DriftDecision(now, "none", (), "acting")
        self._prune(now)
        window = {a: self._window(a, now) for a in self._queries}
        configs = self._configs()
        plan = None if self._service is None else self._service.plan
        slo = plan.slo_s if plan is not None else 0.0
        est = await self._estimates({a: arr for a, (arr, _) in window.items()}, configs)
        obs = []
        for a, (arr, lat) in window.items():
            measured = float(np.percentile(lat, 99)) if lat.size else 0.0
            o = DriftObservation(a, est[a], measured, int(arr.size), slo)
            obs.append(o)
            self.last[a] = o
            if self._gauges is not None and arr.size:
                self._gauges.set(a, o)
        decision, self.state = self.policy.decide(self.state, obs, now)
        self.last_decision = decision
        if decision.action != "none":
            log.warning("drift (%s): %s", decision.action, decision.reason)
            self._event(
                "drift",
                decision.reason,
                action=decision.action,
                apps=list(decision.apps),
                observations=[o.to_dict() for o in obs if o.app in decision.apps],
            )
            if self._gauges is not None:
                self._gauges.acted(decision.action)
        if decision.action == "recalibrate" and (self._acting is None or self._acting.done()):
            self._acting = asyncio.get_running_loop().create_task(self._recalibrate(now))
        return decision

    def _window(self, app: str, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Arrivals of the last window (from 0) and their latencies (elapsed, if unanswered)."""
        rows = [r for r in self._queries[app] if r[0] >= now - self.config.window_s]
        if not rows:
            return np.zeros(0), np.zeros(0)
        a = np.array(rows, dtype=float)
        lat = np.where(np.isnan(a[:, 1]), now - a[:, 0], a[:, 1])
        return a[:, 0] - a[0, 0], lat

    def _configs(self) -> dict[str, ModelConfig]:
        """The plan in force, with the replica counts the backend runs now (a tuner may
        have moved them)."""
        svc = self._service
        plan = None if svc is None else svc.plan
        if plan is None:
            return {}
        out = dict(plan.models)
        backend = svc.backend
        for m, c in plan.models.items():
            with contextlib.suppress(InferlineError, AttributeError):
                n = len(backend.replicas(m))
                if n > 0:
                    out[m] = replace(c, replicas=n)
        return out

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._pool is None:
            return await asyncio.to_thread(fn, *args)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except BrokenProcessPool:  # the worker died: a new one for the next call
            self._pool.shutdown(wait=False)
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            raise

    async def _estimates(
        self,
        arrivals: dict[str, np.ndarray],
        configs: dict[str, ModelConfig],
        profiles: Profiles | None = None,
    ) -> dict[str, float]:
        """The estimator's P99 per app, off the loop."""
        return await self._off_loop(  # type: ignore[no-any-return]
            estimate_p99s,
            self.pipeline,
            configs,
            profiles or self.profiles,
            arrivals,
            self.estimator,
            self.catalog,
        )

    # -- acting ----------------------------------------------------------------------------
    def live_service(self, since: float = -np.inf) -> dict[str, dict[int, RecentService]]:
        """Per model and batch size, the window's batches (those started at ``since`` or
        later): count, median and P99."""
        by: dict[str, dict[int, list[float]]] = {}
        for ev in self._batches:
            if ev.start < since:
                continue
            by.setdefault(ev.model, {}).setdefault(ev.size, []).append(ev.service_s)
        out: dict[str, dict[int, RecentService]] = {}
        for m, sizes in by.items():
            out[m] = {}
            for b, xs in sizes.items():
                q50, q99 = np.percentile(xs, [50, 99])
                out[m][b] = RecentService(len(xs), float(q50), float(q99))
        return out

    async def _recalibrate(self, now: float) -> None:
        svc = self._service
        plan: Plan | None = svc.plan
        if plan is None:
            return
        hardware = {m: c.hardware for m, c in plan.models.items()}
        c = self.config
        # the service times since the gap opened (the sustained ticks) say what the models
        # do now; the whole window where that is too few batches
        live = self.live_service(now - max(1, c.sustain - 1) * c.tick_s)
        if not any(r.batches >= c.min_batches for by_b in live.values() for r in by_b.values()):
            live = self.live_service()
        try:
            profiles, rows = calibrate_profiles(self.profiles, hardware, live, c.min_batches)
        except InferlineError as e:
            self._event("error", f"calibration failed: {e}")
            return
        done = [r for r in rows if r.calibrated]
        if not done:
            self._event("error", "nothing to calibrate: " + "; ".join(r.note for r in rows))
            return
        self.profiles = profiles
        self.calibrations += 1
        self._event(
            "recalibrated",
            ", ".join(
                f"{r.model}: median x{r.p50_factor:.2f}, P99 x{r.p99_factor:.2f}" for r in done
            ),
            rows=[r.to_dict() for r in rows],
        )
        if self.config.mode != "replan":
            return
        arrivals = self._plan_trace(self._clock())
        configs = self._configs()
        est = (await self._estimates({"trace": arrivals}, configs, profiles))["trace"]
        if est <= plan.slo_s:
            self.state = self.policy.settled(self.state, now, changed=False)
            self._event(
                "kept",
                f"the plan still fits: estimated P99 {est * 1e3:.1f} ms <= SLO "
                f"{plan.slo_s * 1e3:.0f} ms",
                estimated_p99_s=est,
            )
            return
        try:
            new = await self._off_loop(
                replan,
                self.pipeline,
                profiles,
                arrivals,
                plan.slo_s,
                plan.percentile,
                self.catalog,
                replace(
                    self.planner, estimator=self.estimator, rate_margin=self.config.rate_margin
                ),
            )
        except Exception as e:  # InfeasibleError, or whatever the worker raised
            what = "infeasible" if isinstance(e, InfeasibleError) else type(e).__name__
            self._event("error", f"re-plan failed ({what}): {e}", estimated_p99_s=est)
            return
        result = await apply_plan(svc, new)
        failed = {m: what for m, what in result.items() if what.startswith("failed")}
        if failed:  # what is in force stays in GET /admin/plan; the next drift tries again
            self._event("error", f"the new plan did not reach {sorted(failed)}", applied=result)
            return
        self.replans += 1
        self._event(
            "replanned",
            f"estimated P99 {est * 1e3:.1f} ms > SLO {plan.slo_s * 1e3:.0f} ms: "
            + ", ".join(
                f"{m}: {c.replicas} x {c.hardware} batch<={c.max_batch_size}"
                for m, c in new.models.items()
            ),
            estimated_p99_s=new.estimated_latency_s,
            applied=result,
        )

    def _plan_trace(self, now: float) -> np.ndarray:
        rows = [
            r[0]
            for q in self._queries.values()
            for r in q
            if r[0] >= now - self.config.plan_trace_s
        ]
        arr = np.sort(np.asarray(rows, dtype=float))
        return arr - arr[0] if arr.size else arr

    def _event(self, kind: str, detail: str, **data: Any) -> None:
        ev = DriftEvent(self._clock(), kind, detail, data)
        self.events.append(ev)
        if kind != "drift":
            (log.warning if kind == "error" else log.info)("drift loop: %s: %s", kind, detail)

    def snapshot(self) -> dict[str, Any]:
        """What ``GET /admin/drift`` answers."""
        return {
            "enabled": True,
            "now_s": self._clock(),
            "config": self.config.to_dict(),
            "apps": {a: o.to_dict() for a, o in self.last.items()},
            "apart_ticks": dict(self.state.apart),
            "last_decision": None if self.last_decision is None else self.last_decision.to_dict(),
            "calibrations": self.calibrations,
            "replans": self.replans,
            "events": [e.to_dict() for e in self.events],
        }


def _timing(handler: Any, rows: deque[list[float]], clock: Callable[[], float]) -> Any:
    async def handler_timing_queries(x: Any, slo: float) -> Any:
        row = [clock(), float("nan")]
        rows.append(row)
        try:
            return await handler(x, slo)
        finally:
            row[1] = clock() - row[0]

    return handler_timing_queries


class _DriftMetrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        self._est = Gauge(
            "inferline_estimated_p99_seconds",
            "Estimator's P99 for the plan in force on the last window's arrivals",
            ["app"],
            registry=registry,
        )
        self._meas = Gauge(
            "inferline_measured_p99_seconds",
            "Measured P99 of the last window's queries",
            ["app"],
            registry=registry,
        )
        self._acts = Counter(
            "inferline_drift_actions",
            "Drift loop actions (sustained estimate/measurement gap), by action",
            ["action"],
            registry=registry,
        )

    def set(self, app: str, o: DriftObservation) -> None:
        self._est.labels(app).set(o.estimated_p99_s)
        self._meas.labels(app).set(o.measured_p99_s)

    def acted(self, action: str) -> None:
        self._acts.labels(action).inc()


class DriftRoutes:
    """``GET /admin/drift``: the drift loop's figures and events (``enabled`` false when off).
    Behind the same guard (bearer token) as every other endpoint."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def router(self) -> Any:
        from fastapi import APIRouter

        r = APIRouter(prefix="/admin", tags=["admin"])
        r.add_api_route("/drift", self.get, methods=["GET"], summary="Estimated vs measured P99")
        return r

    async def get(self) -> Any:
        import json

        from fastapi.responses import Response

        mon = drift_monitor(self.service)
        body = mon.snapshot() if mon is not None else {"enabled": False}
        return Response(json.dumps(body, default=str).encode(), media_type="application/json")


def make_drift_router(service: Any) -> Any:
    """The ``/admin/drift`` router of ``service`` (a ``create_app`` router factory)."""
    return DriftRoutes(service).router()
