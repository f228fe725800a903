"""The tuner running live: fed by the frontend's arrival times, scaling through the backend.

Wiring only; the decision rule is :class:`inferline.core.TunerPolicy` (pure). Every
``interval_s`` the loop hands the arrivals recorded since the previous tick to the online
envelope, asks the policy, and, on a decision, logs it, exports it to ``/metrics`` and applies
the new counts with ``backend.scale()`` in a background task (starting a replica takes time;
the loop keeps watching meanwhile and a newer target for a model replaces an older one that
has not been applied yet).

Arrivals are recorded by wrapping each app's handler (the instant a query enters its
pipeline), so nothing in the frontend's hot path changes when no tuner runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import (
    CapacityError,
    InferlineError,
    Plan,
    Tuner,
    TunerConfig,
    TunerDecision,
    TunerPolicy,
    ValidationError,
    VariantDecision,
    VariantTuner,
)
from inferline.deploy._batching import with_max_batch
from inferline.deploy._tuning_queue import check_variant_queue, share_variant_stages

__all__ = ["AppliedDecision", "LiveTuner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedDecision:
    """A decision and when (tuner clock) its ``scale()`` calls started and returned."""

    decision: TunerDecision
    started_s: float
    finished_s: float
    error: str | None = None


class LiveTuner:
    """Runs a :class:`~inferline.core.Tuner` against a live backend.

    ``clock`` is the only time source (arrival stamps and ticks use it); the loop sleeps on
    the event loop between ticks.
    """

    def __init__(
        self,
        backend: Any,
        plan: Plan,
        config: TunerConfig = TunerConfig(),  # noqa: B008 (frozen)
        *,
        clock: Callable[[], float] = time.perf_counter,
        registry: Any = None,
        observer: Callable[..., Any] | None = None,
        dispatcher: Any = None,
        retry_s: float = 0.5,
        retry_max_s: float = 8.0,
        variants: bool = True,
        drain_timeout_s: float = 30.0,
        variant_queue: str = "shared",
    ) -> None:
        """``observer(model, before, after, time_s=, reason=)`` is called for every model a
        decision changes (``PluginHost.scaling_observer("tuner")`` fits). ``dispatcher``: the
        queue whose max batch sizes follow the decisions of a tuner with a ladder (without
        one, only replica counts change). A ``scale()`` that fails is retried after
        ``retry_s``, doubling up to ``retry_max_s``, for as long as no newer decision has set
        that model's target (the tuner's state already counts the replicas it asked for; a
        backend that is restarting would otherwise be left short until the next decision).

        A plan made with model variants (``Plan.variants``) gets the variant-aware tuner
        (``VariantTuner``, unless ``variants=False``): a scale-up may instead switch a stage to
        a cheaper variant. A switch starts the new variant's replicas, moves the stage to them
        once they serve (``Dispatcher.route``), then lets the old variant drain (at most
        ``drain_timeout_s``) before its replicas go. ``variant_queue`` ``"shared"`` (default):
        a variant stage's variants share one queue (``_tuning_queue``), so the old variant
        drains only its batch in flight and the queries queued at the switch go to the new
        one; ``"per_variant"``: the old variant drains its own queue, as before."""
        if retry_s <= 0 or retry_max_s < retry_s:
            raise ValidationError("retry_s", "0 < retry_s <= retry_max_s", (retry_s, retry_max_s))
        self.retry_s = float(retry_s)
        self.retry_max_s = float(retry_max_s)
        self._wake: asyncio.Event | None = None
        self.backend = backend
        self.dispatcher = dispatcher
        self._observer = observer
        self.plan = plan
        self.config = config
        self._clock = clock
        self.use_variants = bool(variants)
        self.drain_timeout_s = float(drain_timeout_s)
        self.variant_queue = check_variant_queue(variant_queue)
        self.queues: dict[str, str] = {}  # stage -> "shared" or why it stays per variant
        self.policy = TunerPolicy.from_plan(plan, config)
        self.tuner = Tuner(self.policy, start_s=clock())
        self.variant_tuner = self._variant_tuner(plan)
        self.variant_decisions: list[VariantDecision] = []
        self._arrivals: list[float] = []
        self._targets: dict[str, int] = {}  # by deployment model
        # counts known to be in place (the plan's, then every scale() that returned): the floor
        # of the search for what fits when the backend has no room for a whole target
        self._in_place: dict[str, int] = {m: c.replicas for m, c in plan.models.items()}
        self._switches: dict[str, tuple[str, str]] = {}  # stage -> (old, new) variant
        self._pending_decision: TunerDecision | None = None
        self._applier: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.applied: list[AppliedDecision] = []
        self._metrics = _TunerMetrics(self, registry) if registry is not None else None

    def replan(self, plan: Plan) -> None:
        """Follow a new plan (``PUT /admin/plan``): its envelope, ladder and counts replace the
        old ones; targets not yet applied are dropped (the plan was just applied)."""
        self.policy = TunerPolicy.from_plan(plan, self.config)
        self.plan = plan
        self.tuner = Tuner(self.policy, start_s=self._clock())
        self.variant_tuner = self._variant_tuner(plan)
        self._targets = {}
        self._switches = {}
        self._in_place = {m: c.replicas for m, c in plan.models.items()}
        self.share_queues()  # a new plan's variant stages (the shared ones stay shared)
        log.info("tuner follows the new plan: planned counts %s", self.policy.planned)

    def _variant_tuner(self, plan: Plan) -> VariantTuner | None:
        if not self.use_variants or plan.variants is None:
            return None
        return VariantTuner.from_plan(plan, self.config)

    def share_queues(self) -> dict[str, str]:
        """With variant switching on and ``variant_queue`` ``"shared"``: give each variant
        stage one queue across its variants (``share_variant_stages``; a stage whose variants
        cannot share keeps its queues, with a warning). Returns ``queues``."""
        if self.variant_tuner is not None and self.dispatcher is not None:
            if self.variant_queue == "shared":
                self.queues.update(share_variant_stages(self.dispatcher, self.plan))
        return self.queues

    def model_of(self, stage: str) -> str:
        """The deployment model serving ``stage`` as the tuner has decided (a variant)."""
        if self.variant_tuner is None:
            return stage
        return self.variant_tuner.choice.get(stage, stage)

    # -- feeding ---------------------------------------------------------------------------
    def record(self, t: float | None = None) -> None:
        """One pipeline arrival (now, by the tuner's clock, unless ``t`` is given)."""
        self._arrivals.append(self._clock() if t is None else t)

    def attach(self, service: Any, apps: Iterable[str] | None = None) -> None:
        """Record an arrival whenever a query enters one of ``apps`` (default: all) of a
        ``Service``, export to its metrics registry, and stop with it."""
        names = list(service.apps) if apps is None else list(apps)
        for name in names:
            app = service.app(name)
            app.handler = _recording(app.handler, self.record)
        if self._metrics is None and getattr(service, "metrics", None) is not None:
            self._metrics = _TunerMetrics(self, service.metrics.registry)
        service.on_close(self.stop)

    async def launch(self, service: Any, apps: Iterable[str] | None = None) -> None:
        """Start tuning a ``Service`` whose apps are in place (``start_service`` does this for
        the tuner it was given): arrivals recorded, metrics exported, the loop running."""
        if self.variant_tuner is not None:
            # the estimator prices switches inside a tick: load its kernel now, off the loop
            await asyncio.to_thread(self.variant_tuner.warm)
        self.share_queues()  # before the first query: every one waits in its stage's queue
        self.attach(service, apps)
        self.start()
        plan = self.plan
        log.info(
            "tuner started: windows %s s, planned arrivals %s, stabilization %.0f s, %s",
            [round(w, 3) for w in self.policy.windows],
            [n for _, n in plan.tuner.envelope] if plan.tuner else [],
            self.config.stabilization_delay_s,
            f"ladder of {len(plan.tuner.ladder)} steps (batch sizes and replicas)"
            if self.policy.uses_ladder and plan.tuner
            else "replica counts only",
        )
        if self.variant_tuner is not None:
            log.info(
                "tuner may switch variants: %s (pipeline accuracy floor %s; %s queue)",
                dict(self.variant_tuner.choice.items()),
                self.variant_tuner.floor,
                self.variant_queue,
            )

    # -- the loop --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return self._task

    async def stop(self) -> None:
        for t in (self._task, self._applier):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        self._task = self._applier = None

    @property
    def decisions(self) -> list[TunerDecision]:
        return self.tuner.decisions

    @property
    def replicas(self) -> dict[str, int]:
        """The counts the tuner wants now (applied or being applied)."""
        return self.tuner.replicas

    def tick(self, now_s: float | None = None) -> TunerDecision | None:
        """One step: ingest the recorded arrivals, decide, start applying. The loop calls it
        every ``interval_s``; tests may call it directly."""
        now = self._clock() if now_s is None else now_s
        self._ingest()
        return self._act(*self._decide(now))

    def _ingest(self) -> None:
        batch, self._arrivals = self._arrivals, []
        if batch:
            self.tuner.record(np.sort(np.asarray(batch, dtype=np.float64)))

    def _decide(
        self, now: float
    ) -> tuple[TunerDecision | None, Mapping[str, tuple[str, str]], dict[str, int]]:
        """The policy's step (no I/O): the decision, the stages it switches, and the counts
        before it. Pricing a variant switch runs the estimator (tens of ms), so the loop runs
        this in a thread when variants may switch."""
        before = {self.model_of(m): n for m, n in self.tuner.replicas.items()}
        switched: Mapping[str, tuple[str, str]] = {}
        if self.variant_tuner is None:
            d = self.tuner.tick(now)
        else:
            self.tuner.state, vd = self.variant_tuner.step(
                self.tuner.state, now, self.tuner.envelope.take_peaks()
            )
            d = vd.decision if vd is not None else None
            if vd is not None:
                self.tuner.decisions.append(vd.decision)
                self.variant_decisions.append(vd)
                switched = vd.switched
        return d, switched, before

    def _act(
        self,
        d: TunerDecision | None,
        switched: Mapping[str, tuple[str, str]],
        before: Mapping[str, int],
    ) -> TunerDecision | None:
        """Log, count and start applying a decision (on the event loop)."""
        if d is not None:
            after = {self.model_of(m): n for m, n in d.replicas.items()}
            for old, _ in switched.values():
                after.setdefault(old, 0)
            if self._observer is not None:
                for m, n in after.items():
                    if before.get(m, 0) != n:
                        try:
                            self._observer(m, before.get(m, 0), n, time_s=d.time_s, reason=d.reason)
                        except Exception:  # an observer never stops the tuner
                            log.exception("scaling observer failed")
            log.info("tuner %s at %.3f s: %s", d.action, d.time_s, d.reason, extra={"decision": d})
            if self._metrics is not None:
                self._metrics.decided(d)
                for stage, (_, new) in switched.items():
                    self._metrics.switched(stage, new)
            self._apply_batch(d)
            self._apply(d, switched)
        return d

    def _apply_batch(self, d: TunerDecision) -> None:
        """Batch sizes change at once (the next batch formed): a scale-up raises them before
        its replicas start, which is capacity available now."""
        if not d.batch or self.dispatcher is None:
            return
        for stage, b in d.batch.items():
            m = self.model_of(stage)  # a switched stage: the variant that will serve it
            try:
                policy = self.dispatcher.batching(m)
                if policy.max_batch_size == b:
                    continue
                self.dispatcher.set_batching(m, with_max_batch(policy, b))
            except (InferlineError, TypeError, ValueError) as e:
                log.error("tuner could not set %r max batch size %d: %s", m, b, e)

    async def _loop(self) -> None:
        interval = self.config.interval_s
        nxt = self._clock()
        while True:
            nxt += interval
            await asyncio.sleep(max(0.0, nxt - self._clock()))
            try:
                now = self._clock()
                self._ingest()
                if self.variant_tuner is None:
                    decided = self._decide(now)
                else:  # the estimator releases the GIL: requests go on meanwhile
                    decided = await asyncio.to_thread(self._decide, now)
                self._act(*decided)
            except InferlineError:
                log.exception("tuner tick failed")
            if self._clock() - nxt > 10 * interval:
                nxt = self._clock()  # fell far behind (suspended loop): do not burst ticks

    # -- applying --------------------------------------------------------------------------
    def _apply(
        self, d: TunerDecision, switched: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        prev = {m: n for m, n in self._targets.items()}
        wanted = {self.model_of(m): n for m, n in d.replicas.items()}
        changed = {m: n for m, n in wanted.items() if prev.get(m) != n}
        self._targets.update(changed)
        for stage, (old, new) in (switched or {}).items():
            # a switch back before the first was carried out still drains what it left
            first = self._switches.get(stage, (old, new))[0]
            self._switches[stage] = (first, new)
            self._targets.pop(old, None)  # the old variant goes only after the stage moved
        self._pending_decision = d
        if self._wake is not None:
            self._wake.set()  # a new target ends a retry's wait
        if self._applier is None or self._applier.done():
            self._applier = asyncio.get_running_loop().create_task(self._apply_loop())

    async def _apply_loop(self) -> None:
        self._wake = asyncio.Event()
        delay = self.retry_s
        while self._targets or self._switches:
            self._wake.clear()
            d = self._pending_decision
            assert d is not None
            targets, self._targets = self._targets, {}
            switches, self._switches = self._switches, {}
            t0 = self._clock()
            results = await asyncio.gather(
                *(self._scale(m, n) for m, n in targets.items()), return_exceptions=True
            )
            failed: dict[str, tuple[int, BaseException | str]] = {
                m: (n, r)
                for (m, n), r in zip(targets.items(), results, strict=True)
                if isinstance(r, Exception)
            }
            for stage, (old, new) in switches.items():
                if new in failed:  # the stage stays where it is until its variant serves
                    self._switches.setdefault(stage, (old, new))
                    continue
                err_s = await self._switch(stage, old, new)
                if err_s is not None:
                    failed[old] = (0, err_s)
            err = "; ".join(f"{m}: {r}" for m, (_, r) in failed.items()) or None
            self.applied.append(AppliedDecision(d, t0, self._clock(), err))
            if self._metrics is not None:
                self._metrics.applied(err is None)
            if not err:
                delay = self.retry_s
                continue
            # retry what failed unless a newer decision has set its target meanwhile
            for m, (n, _) in failed.items():
                self._targets.setdefault(m, n)
            log.error("tuner could not apply %s: %s; retrying in %.1f s", d.replicas, err, delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(2.0 * delay, self.retry_max_s)

    async def _scale(self, model: str, n: int) -> None:
        """``backend.scale(model, n)``. A backend without room for all of them refuses the
        whole request (``CapacityError``), which under a burst on a full machine would add no
        replica at all until a retry finds room: then as many as fit are started (bisection
        between the count in place and ``n``, each attempt only adding replicas) and the
        refusal is raised anyway, so that the whole target is retried."""
        try:
            await self._scale_once(model, n)
        except CapacityError as e:
            start = self._in_place.get(model)
            if start is None or start >= n:
                raise
            lo, hi = start, n
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    await self._scale_once(model, mid)
                except CapacityError:
                    hi = mid
                else:
                    lo = mid
            if lo > start:
                raise CapacityError(f"{lo} of {n} replicas fit ({e})", e.free) from None
            raise

    async def _scale_once(self, model: str, n: int) -> None:
        try:
            await self.backend.scale(model, n)
        except CapacityError:
            raise  # refused as a whole: the count in place did not change
        except BaseException:
            self._in_place.pop(model, None)  # a failed scale may have left any count
            raise
        self._in_place[model] = n

    async def _switch(self, stage: str, old: str, new: str) -> str | None:
        """Move ``stage`` to ``new`` (its replicas serve by now), let ``old`` drain, then give
        up ``old``'s replicas; an error text if that last step failed (it is retried). With a
        shared queue the route closes ``old``'s gate: its drain is its batch in flight (its
        queued count is 0, the queue reports on the active variant)."""
        from inferline.deploy._planned import drain

        if self.dispatcher is not None and old != new:
            self.dispatcher.route(stage, new if new != stage else None)
            log.info("tuner moved stage %r from %r to %r", stage, old, new)
            await drain(self.dispatcher, old, self.drain_timeout_s)
        if old == new or self.model_of(stage) == old:
            return None  # switched back meanwhile: the old variant serves again
        try:
            await self.backend.scale(old, 0)
        except Exception as e:  # retried with the other failed targets
            return str(e)
        self._in_place[old] = 0
        return None


def _recording(handler: Any, record: Callable[[], None]) -> Any:
    async def handler_recording_arrivals(x: Any, slo: float) -> Any:
        record()
        return await handler(x, slo)

    return handler_recording_arrivals


class _TunerMetrics:
    """Decisions as Prometheus series in the service's registry; the current envelope is read
    at scrape time."""

    def __init__(self, live: LiveTuner, registry: Any) -> None:
        self._series(registry)
        for m, n in live.replicas.items():
            self._target.labels(m).set(n)
        for m, b in live.tuner.state.batch.items():
            self._batch.labels(m).set(b)
        registry.register(_envelope_collector(live))

    def _series(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Info

        self._decisions = Counter(
            "inferline_tuner_decisions",
            "Tuner scaling decisions, by action",
            ["action"],
            registry=registry,
        )
        self._applied = Counter(
            "inferline_tuner_applied",
            "Tuner decisions applied through backend.scale(), by result",
            ["result"],
            registry=registry,
        )
        self._target = Gauge(
            "inferline_tuner_target_replicas",
            "Replicas the tuner wants per model",
            ["model"],
            registry=registry,
        )
        self._rate = Gauge(
            "inferline_tuner_last_rate_qps",
            "Arrival rate the last decision provisioned for",
            registry=registry,
        )
        self._window = Gauge(
            "inferline_tuner_last_window_seconds",
            "Window whose count drove the last decision",
            registry=registry,
        )
        self._last = Info(
            "inferline_tuner_last_decision", "The last tuner decision", registry=registry
        )
        self._switches = Counter(
            "inferline_tuner_variant_switches",
            "Stages the tuner switched to another model variant, by stage and new variant",
            ["stage", "variant"],
            registry=registry,
        )
        self._batch = Gauge(
            "inferline_tuner_target_max_batch_size",
            "Max batch size the tuner wants per model (a tuner with a ladder)",
            ["model"],
            registry=registry,
        )

    def decided(self, d: TunerDecision) -> None:
        self._decisions.labels(d.action).inc()
        for m, n in d.replicas.items():
            self._target.labels(m).set(n)
        for m, b in d.batch.items():
            self._batch.labels(m).set(b)
        self._rate.set(d.rate_qps)
        self._window.set(d.window_s)
        self._last.info(
            {
                "action": d.action,
                "time_s": f"{d.time_s:.3f}",
                "window_s": f"{d.window_s:g}",
                "rate_qps": f"{d.rate_qps:.1f}",
                "reason": d.reason,
            }
        )

    def switched(self, stage: str, variant: str) -> None:
        self._switches.labels(stage, variant).inc()

    def applied(self, ok: bool) -> None:
        self._applied.labels("ok" if ok else "error").inc()


def _envelope_collector(live: LiveTuner) -> Any:
    """The current traffic envelope and the planning trace's, read at scrape time."""
    from prometheus_client.registry import Collector

    class _Envelope(Collector):
        def collect(self) -> Iterator[Any]:
            from prometheus_client.core import GaugeMetricFamily

            cur = GaugeMetricFamily(
                "inferline_tuner_envelope_arrivals",
                "Arrivals in the last window of each size (current traffic envelope)",
                labels=["window_s"],
            )
            plan = GaugeMetricFamily(
                "inferline_tuner_planned_arrivals",
                "Most arrivals in a window of each size in the planning trace",
                labels=["window_s"],
            )
            env = live.tuner.envelope
            now = live._clock()
            counts = env.counts_at(now)
            # arrivals recorded since the last tick are not in the envelope yet
            pending = np.asarray(live._arrivals, dtype=np.float64)
            planned: Mapping[float, int] = dict(live.policy.inputs.envelope)
            for w, n in zip(env.windows, counts, strict=True):
                n += int(np.count_nonzero(pending > now - w))
                cur.add_metric([f"{w:g}"], float(n))
                if w in planned:
                    plan.add_metric([f"{w:g}"], float(planned[w]))
            yield cur
            yield plan

    return _Envelope()
