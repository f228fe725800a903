"""The steer loop running live: the server's counters in, instance counts and re-plans out.

Wiring only; the decisions are :class:`SteerController` (tuner, ``_steer_policy.py``) and
:class:`DriftPolicy` (``_drift_policy.py``). Every ``tick_s`` the loop reads the backend's
``server_counters`` for the app's model and the planned models, lets the controller decide
the instance counts and applies a decision with ``apply_server_batcher`` (the plan's batcher,
the new count) in the background. It also keeps the last ``window_s`` seconds of the app's
arrivals, estimates the plan in force on them (the estimator, with the server's batchers) and
sets ``inferline_estimated_p99_seconds`` / ``inferline_measured_p99_seconds`` (measured: the
server's own latency summary). With ``DriftConfig.mode == "replan"`` a sustained gap
re-plans on the last ``plan_trace_s`` seconds of arrivals and applies the new plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    EstimatorOptions,
    HardwareCatalog,
    InferlineError,
    ModelConfig,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    TunerConfig,
)
from inferline.core.planning import plan_estimator_options
from inferline.deploy._drift import DriftEvent, _DriftMetrics
from inferline.deploy._drift_policy import DriftConfig, DriftObservation, DriftPolicy, DriftState
from inferline.deploy._drift_work import estimate_p99s, replan
from inferline.deploy._steer_policy import SteerController, SteerTick

__all__ = ["SteerLoop", "apply_server_plan"]

log = logging.getLogger(__name__)


async def apply_server_plan(
    backend: Any, plan: Plan, replicas: dict[str, int] | None = None
) -> dict[str, str]:
    """Every planned model's server batcher and instance count (``replicas`` overriding the
    plan's) through ``backend.apply_server_batcher``; what was done per model."""
    done = {}
    for m, cfg in plan.models.items():
        n = (replicas or {}).get(m, cfg.replicas)
        doc = plan.server_batchers.get(m)
        if doc is None:
            raise InferlineError(f"plan has no server batcher for {m!r} (plan with server=...)")
        await backend.apply_server_batcher(m, doc, n)
        done[m] = f"{n} instances, {dict(doc)}"
    return done


class SteerLoop:
    """See the module docstring. ``clock`` is the only time source; ``rng`` spreads each
    tick's arrivals (seeded for tests)."""

    def __init__(
        self,
        backend: Any,
        plan: Plan,
        app: str,
        pipeline: Pipeline,
        profiles: Profiles | None,
        *,
        tick_s: float = 1.0,
        drift: DriftConfig = DriftConfig(),  # noqa: B008 (frozen)
        tuner_config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
        rng: np.random.Generator | None = None,
        catalog: HardwareCatalog = DEFAULT_CATALOG,
    ) -> None:
        self.backend = backend
        self.plan = plan
        self.app = app
        self.pipeline = pipeline
        self.profiles = profiles
        self.tick_s = float(tick_s)
        self.drift = drift
        self.catalog = catalog
        self._clock = clock
        self._rng = rng if rng is not None else np.random.default_rng()
        self.controller = SteerController(plan, app, tuner_config, clock())
        self.drift_policy = DriftPolicy(drift)
        self.drift_state = DriftState()
        self._arrivals: deque[float] = deque()
        self._ticks: deque[SteerTick] = deque()
        self.last: SteerTick | None = None
        self.last_observation: DriftObservation | None = None
        self.events: deque[DriftEvent] = deque(maxlen=200)
        self.instances = {m: c.replicas for m, c in plan.models.items()}
        self.scalings = 0
        self._pending: dict[str, int] | None = None
        self.replans = 0
        self._task: asyncio.Task[None] | None = None
        self._acting: asyncio.Task[None] | None = None
        self._gauges = _DriftMetrics(registry) if registry is not None else None

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        for t in (self._task, self._acting):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        self._task = self._acting = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the loop outlives a bad tick (a server restarting)
                log.warning("steer tick failed: %s", e)
                self._event("error", f"tick failed: {type(e).__name__}: {e}")
            await asyncio.sleep(self.tick_s)

    async def tick(self) -> SteerTick:
        """Read the counters, decide, start applying; estimate and judge drift."""
        counters = await self.backend.server_counters([self.app, *self.plan.models])
        now = self._clock()
        t = self.controller.observe(counters, now, self._rng)
        self.last = t
        self._arrivals.extend(t.arrivals.tolist())
        keep = now - max(self.drift.window_s, self.drift.plan_trace_s)
        while self._arrivals and self._arrivals[0] < keep:
            self._arrivals.popleft()
        if t.decision is not None:  # a newer target replaces one not yet applied
            self._pending = dict(t.decision.replicas)
            self._event("scale", t.decision.reason, replicas=self._pending)
        busy = self._acting is not None and not self._acting.done()
        if busy:
            return t
        if self._pending is not None:
            self._acting = asyncio.get_running_loop().create_task(self._scale())
        elif t.interval_s > 0:
            await self._judge(now, t)
        return t

    async def _scale(self) -> None:
        while self._pending is not None:
            counts, self._pending = self._pending, None
            changed = {m: n for m, n in counts.items() if n != self.instances.get(m)}
            for m, n in changed.items():
                await self.backend.apply_server_batcher(m, self.plan.server_batchers[m], n)
                self.instances[m] = n
            if changed:
                self.scalings += 1
                log.info("steer: instances %s", self.instances)

    # -- drift -----------------------------------------------------------------------------
    def _configs(self) -> dict[str, ModelConfig]:
        return {m: replace(c, replicas=self.instances[m]) for m, c in self.plan.models.items()}

    def _window(self, now: float, span_s: float) -> np.ndarray:
        a = np.asarray([x for x in self._arrivals if x >= now - span_s], dtype=float)
        return a - a[0] if a.size else a

    async def _judge(self, now: float, t: SteerTick) -> None:
        arr = self._window(now, self.drift.window_s)
        if self.profiles is None or arr.size < 2:
            return
        est_opts = plan_estimator_options(self.plan, EstimatorOptions())
        est = await asyncio.to_thread(
            estimate_p99s,
            self.pipeline,
            self._configs(),
            self.profiles,
            {self.app: arr},
            est_opts,
            self.catalog,
        )
        measured = t.measured_p99_s
        # no summary on the server: nothing measured, so the window is not judged
        o = DriftObservation(
            self.app,
            est[self.app],
            measured or 0.0,
            int(arr.size) if measured else 0,
            self.plan.slo_s,
        )
        self.last_observation = o
        if self._gauges is not None:
            self._gauges.set(self.app, o)
        decision, self.drift_state = self.drift_policy.decide(self.drift_state, [o], now)
        if decision.action == "none":
            return
        self._event("drift", decision.reason, action=decision.action)
        if self._gauges is not None:
            self._gauges.acted(decision.action)
        if decision.action == "recalibrate":
            self._acting = asyncio.get_running_loop().create_task(self._replan(now))

    async def _replan(self, now: float) -> None:
        """Plan again for the recent arrivals (the server's batchers) and apply the plan."""
        assert self.profiles is not None
        arrivals = self._window(now, self.drift.plan_trace_s)
        opts = PlannerOptions(server="triton", rate_margin=self.drift.rate_margin)
        try:
            new = await asyncio.to_thread(
                replan,
                self.pipeline,
                self.profiles,
                arrivals,
                self.plan.slo_s,
                self.plan.percentile,
                self.catalog,
                opts,
            )
            done = await apply_server_plan(self.backend, new)
        except Exception as e:  # InfeasibleError, a server refusing: the next drift retries
            self._event("error", f"re-plan failed: {type(e).__name__}: {e}")
            return
        self.plan = new
        self.instances = {m: c.replicas for m, c in new.models.items()}
        self.controller.replan(new, self._clock())
        self.replans += 1
        self._event("replanned", "applied a new plan", applied=done)

    def _event(self, kind: str, detail: str, **data: Any) -> None:
        self.events.append(DriftEvent(self._clock(), kind, detail, data))

    # -- views -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What ``GET /admin/drift`` answers (the drift loop's figures and the steer state)."""
        t = self.last
        return {
            "enabled": True,
            "steer": True,
            "now_s": self._clock(),
            "config": self.drift.to_dict(),
            "apps": {}
            if self.last_observation is None
            else {self.app: self.last_observation.to_dict()},
            "instances": dict(self.instances),
            "scalings": self.scalings,
            "replans": self.replans,
            "figures": {} if t is None else {m: f.to_dict() for m, f in t.figures.items()},
            "plan": self.plan.to_dict(),
            "events": [e.to_dict() for e in self.events],
        }
