"""The serving object behind the HTTP frontend: applications, their pipelines, and metrics.

A ``Service`` holds named ``App``s. An app binds a pipeline (an async function run by the
queue's pipeline driver, or any async handler), a latency SLO and a default output. The
frontend (``_http.py``) only parses HTTP and calls ``Service.predict``; routers that other
subsystems mount (velox, selection feedback, KServe/TF-Serving front doors) get the same
``Service`` and so share its backend, dispatcher, cache and metrics.

``Service`` composes parts that each do one job: the app registry (``_apps``), input
decoding (``_decode``), outcome accounting (``_outcomes``: every accepted query ends in
exactly one outcome, counted once) and health (``_health``); it holds the collaborators
(dispatcher, backend, cache, plugins, plan, plan target, tuner) that routes reach through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from inferline.core import Backend, Plan
from inferline.queueing import Dispatcher, PredictionCache
from inferline.server._apps import App, AppRegistry
from inferline.server._decode import InputSpec, decode_input
from inferline.server._health import health, variant_stages
from inferline.server._metrics import ServiceMetrics
from inferline.server._outcomes import (
    DefaultAnswer,
    Prediction,
    QueryIds,
    QueryRunner,
    json_default,
)

if TYPE_CHECKING:
    from inferline.adapters import PluginHost

__all__ = [
    "App",
    "DefaultAnswer",
    "InputSpec",
    "PlanTarget",
    "Prediction",
    "Service",
    "TunerHandle",
    "json_default",
]

log = logging.getLogger(__name__)


class PlanTarget(Protocol):
    """What a plan is applied to (``PUT /admin/plan``, ``inferline deploy --url``): the models
    of a deployment the server started, or those of an attached Triton or TF Serving server.
    ``apply`` moves them to ``plan``, sets ``service.plan`` to what is in force, and answers
    what it did per model (a value starting with "failed" for one it could not move)."""

    async def apply(self, service: Service, plan: Plan) -> dict[str, str]: ...


class TunerHandle(Protocol):
    """A live tuner, as the service and plan changes drive it (``deploy.LiveTuner``)."""

    @property
    def running(self) -> bool: ...

    def replan(self, plan: Plan) -> None: ...

    def start(self) -> Any: ...

    async def stop(self) -> None: ...


class Service:
    """Applications plus the parts they run on; what the HTTP app and mounted routers use.

    Every collaborator is given here: ``dispatcher``, ``backend`` and ``cache`` (optional: a
    service of pure-Python apps needs none of them; metrics read whichever are present at
    scrape time); ``plugins``, whose observers hear about configuration changes; ``plan``, the
    plan in force at the start (state: applying a plan replaces it); ``plan_target``, what a new
    plan is applied to; ``tuner``, the live tuner (started once the apps are added).
    """

    def __init__(
        self,
        apps: Sequence[App] = (),
        *,
        dispatcher: Dispatcher | None = None,
        backend: Backend | None = None,
        cache: PredictionCache | None = None,
        models: Sequence[str] = (),
        clock: Callable[[], float] = time.perf_counter,
        plugins: PluginHost | None = None,
        plan: Plan | None = None,
        plan_target: PlanTarget | None = None,
        tuner: TunerHandle | None = None,
    ) -> None:
        self._registry = AppRegistry()
        self.apps: dict[str, App] = self._registry.apps  # the registry's live dict
        self.dispatcher = dispatcher
        self.backend = backend
        self.cache = cache
        self.models: list[str] = list(models)
        self._ids = QueryIds()
        self.metrics = ServiceMetrics(self)
        self._queries = QueryRunner(self.metrics, clock, self._ids)
        self.closing = False
        self.plugins = plugins
        self.plan = plan
        self.plan_target = plan_target
        self.tuner = tuner
        self._on_close: list[Callable[[], Awaitable[None]]] = []
        for a in apps:
            self.add_app(a)

    # -- apps ----------------------------------------------------------------------------
    def add_app(self, app: App) -> None:
        self._registry.add(app)

    def app(self, name: str) -> App:
        return self._registry.get(name)

    def new_query_id(self) -> str:
        return self._ids.new()

    # -- predictions ---------------------------------------------------------------------
    def check_input(
        self, app: App, value: Any, field: str, *, plain: bool = False, non_numbers: bool = True
    ) -> Any:
        """Decode the JSON form of an input and check it against the app's input spec
        (``_decode.decode_input`` says what ``plain`` and ``non_numbers`` spare)."""
        return decode_input(app.input_spec, value, field, plain=plain, non_numbers=non_numbers)

    async def predict(
        self, app_name: str, x: Any, slo_s: float | None = None, priority: int = 0
    ) -> Prediction:
        """Run one (already checked) input through an app. Raises only for explicit errors.
        ``priority``: the query's class in every model queue (higher first)."""
        return await self._queries.run(self.app(app_name), x, slo_s, priority)

    # -- health --------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return health(self)

    def variant_stages(self) -> dict[str, list[str]]:
        """With model variants: every variant model and the stages it serves now (empty for
        an idle one); ``{}`` without variants."""
        return variant_stages(self.plan, self.dispatcher)

    # -- lifecycle -----------------------------------------------------------------------
    def on_close(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` (LIFO) when the service closes, e.g. a mounted router's own cleanup."""
        self._on_close.append(fn)

    async def close(self) -> None:
        self.closing = True
        while self._on_close:
            fn = self._on_close.pop()
            try:
                await fn()
            except Exception:
                log.exception("error while closing the service")
        if self.dispatcher is not None:
            await self.dispatcher.close()
        if self.backend is not None:
            await self.backend.close()
