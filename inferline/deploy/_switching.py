"""Live model switching on a backend (Zhang et al., "Model-Switching", HotCloud'20).

``LiveSwitcher`` serves one stage that has several variants (e.g. an accurate, slow model and
cheaper ones). Every variant stays deployed: the *active* one with the replicas x threads split
the controller chose, the *idle* ones warm with ``warm_replicas`` replica each (their model
loaded, so a switch needs no cold start) at low CPU priority (``os.setpriority`` on every thread
of their replica processes, nice ``idle_nice``), so a warm spare takes CPU only when the active
variant leaves some.

Each query goes to the active variant through the interposed queue (``Dispatcher``) with its
deadline. A controller loop (every ``interval_s``) estimates the arrival rate from the last
arrivals and asks the pure ``SwitchingController`` (estimator-backed effective-accuracy table)
for the best option; on a change it raises the new variant's priority, scales it to the
option's replicas (redeploying it when the thread count changes), flips routing, then shrinks
the old variant to its warm replicas and lowers its priority. Queries already queued for the old
variant finish there. ``min_dwell_s`` keeps the controller from flapping between two options.

Priorities: lowering a process's priority is always allowed; raising it back needs
``CAP_SYS_NICE`` (root, or ``RLIMIT_NICE``). Where that is refused the switcher logs it once and
restarts the promoted variant's replicas at normal priority instead (a warm start is then lost,
but the variant never serves from a deprioritized process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from inferline.core import ModelConfig, ModelSpec, NotFoundError, ValidationError
from inferline.deploy._batching import with_max_batch
from inferline.selection import (
    RateEstimator,
    SwitchDecision,
    SwitchingConfig,
    SwitchingController,
    SwitchingTable,
    SwitchOption,
)

__all__ = ["LiveSwitcher", "SwitchEvent", "process_nice", "set_nice"]

log = logging.getLogger(__name__)


async def tick_every(
    interval_s: float, tick: Callable[[], Awaitable[object]], logger: logging.Logger, failed: str
) -> None:
    """``tick()`` every ``interval_s`` until cancelled; a tick that raises is logged (``failed``,
    with its traceback, on the caller's ``logger``) and the loop goes on: one bad tick must not
    end a background controller."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(failed)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def _threads_of(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return [pid]


def set_nice(pids: Sequence[int], nice: int) -> bool:
    """Set the nice value of every thread of every process in ``pids`` (on Linux a process's
    priority is per thread, and gRPC/BLAS worker threads already exist). Returns False when
    the OS refused (raising priority without ``CAP_SYS_NICE``); vanished processes are
    ignored."""
    ok = True
    for pid in pids:
        for tid in _threads_of(pid):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:
                continue
            except PermissionError:
                ok = False
    return ok


def process_nice(pid: int) -> int:
    """The nice value of ``pid``'s main thread."""
    return os.getpriority(os.PRIO_PROCESS, pid)


@dataclass(frozen=True)
class SwitchEvent:
    """A switch that was carried out: when (switcher clock), from what to what, and why."""

    time_s: float
    old: SwitchOption | None
    new: SwitchOption
    rate_qps: float
    reason: str
    took_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "old": None if self.old is None else self.old.to_dict(),
            "new": self.new.to_dict(),
            "rate_qps": self.rate_qps,
            "reason": self.reason,
            "took_s": self.took_s,
        }


class LiveSwitcher:
    """One stage with variants on ``backend``; queries via ``predict``; switching in ``run``."""

    def __init__(
        self,
        backend: Any,
        dispatcher: Any,
        specs: Mapping[str, ModelSpec],
        table: SwitchingTable,
        config: SwitchingConfig,
        *,
        warm_replicas: int = 1,
        idle_nice: int = 19,
        interval_s: float = 0.1,
        min_dwell_s: float = 1.0,
        max_queue: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        stage: str | None = None,
    ) -> None:
        """``stage``: a pipeline stage the dispatcher routes to the active variant (how
        ``inferline serve`` runs it: the app's pipeline calls the stage, ``adopt`` and every
        switch move the route); without one, queries come through ``predict``."""
        missing = sorted({o.variant for o in table.options} - set(specs))
        if missing:
            raise ValidationError("specs", "a ModelSpec for every variant in the table", missing)
        if warm_replicas < 1:
            raise ValidationError("warm_replicas", "an integer >= 1 (warm spares)", warm_replicas)
        if not 0 <= idle_nice <= 19:
            raise ValidationError("idle_nice", "a nice value in [0, 19]", idle_nice)
        self.backend = backend
        self.dispatcher = dispatcher
        self.specs = dict(specs)
        self.table = table
        self.config = config
        self.controller = SwitchingController(table, config)
        self.warm_replicas = warm_replicas
        self.idle_nice = idle_nice
        self.interval_s = interval_s
        self.min_dwell_s = min_dwell_s
        self.max_queue = max_queue
        self.clock = clock
        self.variants = sorted(specs)
        self.active: SwitchOption | None = None
        self.events: list[SwitchEvent] = []
        self.decisions: list[SwitchDecision] = []
        self.served: dict[str, int] = dict.fromkeys(self.variants, 0)
        self._threads = {v: specs[v].threads for v in self.variants}
        self._estimator = RateEstimator(config.rate_window)
        self._last_switch = -float("inf")
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._renice_refused = False
        self.stage = stage
        self._metrics: _SwitchMetrics | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, initial: SwitchOption | None = None) -> None:
        """Deploy every variant (``initial``, default the most accurate option at zero load,
        active; the others warm and deprioritized) and start the controller loop."""
        first = initial or self.controller.decide(self.clock(), RateEstimator(2)).option
        for v in self.variants:
            active = v == first.variant
            threads = first.threads if active else self._threads[v]
            spec = replace(self.specs[v], threads=threads)
            self._threads[v] = threads
            replicas = first.replicas if active else self.warm_replicas
            await self.backend.deploy(spec, ModelConfig("cpu", first.max_batch_size, replicas))
            if v not in self.dispatcher.models:
                from inferline.queueing import FixedBatching

                self.dispatcher.add_model(
                    v, batching=FixedBatching(first.max_batch_size), max_queue=self.max_queue
                )
        self.dispatcher.attach(self.backend)
        self.active = first
        self._apply_priorities()
        self.events.append(SwitchEvent(self.clock(), None, first, 0.0, "initial", 0.0))
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def adopt(self, initial: SwitchOption | None = None) -> None:
        """Take over variants that are already deployed and queued (``inferline serve``
        deployed the deployment's models): the first option's variant scaled to its split and
        routed to, the others shrunk to their warm replicas; then the controller loop."""
        first = initial or self.controller.decide(self.clock(), RateEstimator(2)).option
        await self._place(first)
        for v in self.variants:
            if v != first.variant:
                await self.backend.scale(v, self.warm_replicas)
        self.active = first
        self._route(first.variant)
        self._apply_priorities()
        self.events.append(SwitchEvent(self.clock(), None, first, 0.0, "initial", 0.0))
        self._task = asyncio.create_task(self._loop())

    def attach(self, service: Any, app: str) -> None:
        """Count the arrivals of ``service``'s ``app`` (the rate the controller estimates),
        export switches to its ``/metrics``, and stop with it."""
        a = service.app(app)
        inner = a.handler

        async def handler_counting_arrivals(x: Any, slo: float) -> Any:
            self._estimator = self._estimator.add([self.clock()])
            if self.active is not None:
                self.served[self.active.variant] += 1
            return await inner(x, slo)

        a.handler = handler_counting_arrivals
        registry = getattr(getattr(service, "metrics", None), "registry", None)
        if registry is not None:
            self._metrics = _SwitchMetrics(app, self.variants, registry)
            self._metrics.update(self.active, switched=False)
        service.on_close(self.close)

    # -- serving --------------------------------------------------------------------------
    async def predict(self, x: Any, *, slo_s: float | None = None) -> tuple[str, Any]:
        """``(variant, output)`` for ``x``, served by the variant active at arrival."""
        if self.active is None:
            raise ValidationError("switcher", "started (await start())", None)
        now = self.clock()
        self._estimator = self._estimator.add([now])
        variant = self.active.variant
        self.served[variant] += 1
        deadline = now + (self.config.deadline_s if slo_s is None else slo_s)
        out = await self.dispatcher.submit(variant, x, deadline=deadline, arrival=now)
        return variant, out

    def rate(self) -> float:
        return self._estimator.rate(self.clock())

    # -- control --------------------------------------------------------------------------
    async def _loop(self) -> None:
        await tick_every(self.interval_s, self.step, log, "model-switching controller step failed")

    async def step(self) -> SwitchDecision:
        """One controller tick: decide, and switch when the option changed (and the dwell time
        has passed). Also re-applies priorities (a restarted replica comes back at nice 0)."""
        now = self.clock()
        d = self.controller.decide(now, self._estimator)
        self.decisions.append(d)
        if (
            self.active is not None
            and d.option != self.active
            and now - self._last_switch >= self.min_dwell_s
        ):
            await self.switch(d.option, rate=d.rate_qps, reason=d.reason)
        else:
            self._apply_priorities()
        return d

    async def switch(self, option: SwitchOption, *, rate: float = 0.0, reason: str = "") -> None:
        """Make ``option`` active (see the module docstring for the order of steps)."""
        if option.variant not in self.specs:
            raise NotFoundError("variant", option.variant, self.variants)
        async with self._lock:
            t0 = self.clock()
            old = self.active
            new = option.variant
            promoted = self._pids(new)
            if promoted and not set_nice(promoted, 0):
                self._refused()
                await self.backend.remove(new)
                await self._deploy(new, option.threads, option.replicas, option.max_batch_size)
            else:
                await self._place(option)
            self.active = option  # new queries go to the new variant from here on
            self._route(new)
            if old is not None and old.variant != new:
                await self.backend.scale(old.variant, self.warm_replicas)
            self._apply_priorities()
            self._last_switch = self.clock()
            self.events.append(SwitchEvent(t0, old, option, rate, reason, self.clock() - t0))
            if self._metrics is not None:
                self._metrics.update(option, switched=True)
            log.info("model switching: %s -> %s (%s)", old, option, reason)

    async def _place(self, option: SwitchOption) -> None:
        """``option``'s variant at its split (redeployed when the thread count changes) and
        its queue's batch bound."""
        v = option.variant
        if self._threads[v] != option.threads:
            await self.backend.remove(v)
            await self._deploy(v, option.threads, option.replicas, option.max_batch_size)
        else:
            await self.backend.scale(v, option.replicas)
        self.dispatcher.set_batching(
            v, with_max_batch(self.dispatcher.batching(v), option.max_batch_size)
        )

    def _route(self, variant: str) -> None:
        if self.stage is not None:
            self.dispatcher.route(self.stage, variant)

    async def _deploy(self, variant: str, threads: int, replicas: int, batch: int) -> None:
        spec = replace(self.specs[variant], threads=threads)
        await self.backend.deploy(spec, ModelConfig("cpu", batch, replicas))
        self._threads[variant] = threads

    def _pids(self, variant: str) -> list[int]:
        try:
            return [int(getattr(h, "pid", 0)) for h in self.backend.replicas(variant)]
        except NotFoundError:
            return []

    def _apply_priorities(self) -> None:
        if self.active is None:
            return
        for v in self.variants:
            pids = [p for p in self._pids(v) if p > 0]
            if v == self.active.variant:
                # only ever *raised* during a switch; here just make sure none is deprioritized
                low = [p for p in pids if _nice_or_zero(p) != 0]
                if low and not set_nice(low, 0):
                    self._refused()
            else:
                set_nice(pids, self.idle_nice)

    def _refused(self) -> None:
        if not self._renice_refused:
            self._renice_refused = True
            log.warning(
                "raising a replica's CPU priority was refused (needs CAP_SYS_NICE); promoted "
                "variants are restarted at normal priority instead of reusing warm replicas"
            )


class _SwitchMetrics:
    """Switches and the active variant as Prometheus series in the service's registry."""

    def __init__(self, app: str, variants: Sequence[str], registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        self.app = app
        self.variants = list(variants)
        self.switches = Counter(
            "inferline_switching_switches",
            "Model-Switching: variant or replicas x threads changes",
            ["app"],
            registry=registry,
        )
        self.active = Gauge(
            "inferline_switching_active",
            "Model-Switching: 1 for the variant serving the app, 0 for warm spares",
            ["app", "variant"],
            registry=registry,
        )

    def update(self, option: SwitchOption | None, *, switched: bool) -> None:
        if switched:
            self.switches.labels(self.app).inc()
        for v in self.variants:
            on = option is not None and option.variant == v
            self.active.labels(self.app, v).set(1.0 if on else 0.0)


def _nice_or_zero(pid: int) -> int:
    try:
        return process_nice(pid)
    except (ProcessLookupError, PermissionError):
        return 0
