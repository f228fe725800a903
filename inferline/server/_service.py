"""The serving object behind the HTTP frontend: applications, their pipelines, and metrics.

A ``Service`` holds named ``App``s. An app binds a pipeline (an async function run by the
queue's pipeline driver, or any async handler), a latency SLO and a default output. The
frontend (``_app.py``) only parses HTTP and calls ``Service.predict``; routers that other
subsystems mount (velox, selection feedback, KServe/TF-Serving front doors) get the same
``Service`` and so share its backend, dispatcher, cache and metrics.

Outcomes of one query (docs/design.md: every accepted query ends in exactly one of them):
a prediction; the app's default output with an explanation (deadline passed while
``respond_by_slo`` is set, deadline expiry in the queue, a backend failure); or an explicit
error (bad input, unknown app, overload, or a failure of an app without a default).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from inferline.core import (
    Backend,
    BackendError,
    DeadlineExceededError,
    InferlineError,
    NotFoundError,
    OverloadedError,
    Plan,
    ValidationError,
)
from inferline.queueing import Dispatcher, PredictionCache
from inferline.server._metrics import ServiceMetrics

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

Handler = Callable[[Any, float], Awaitable[Any]]

_NO_DEFAULT = object()


@dataclass(frozen=True)
class InputSpec:
    """What an app accepts: a numeric array of a dtype and shape (``None`` = any length).

    The frontend checks inputs against it before anything is queued, so a wrong type or
    shape is a 422 naming the field instead of an error deep inside a replica.
    """

    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "input") -> InputSpec:
        if not isinstance(d, Mapping):
            raise ValidationError(where, "an object with dtype and shape", d)
        extra = set(d) - {"dtype", "shape"}
        if extra:
            raise ValidationError(where, "only keys dtype and shape", sorted(extra))
        dtype = d.get("dtype", "float32")
        try:
            np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValidationError(f"{where}.dtype", "a numpy dtype name", dtype) from None
        shape = d.get("shape")
        if shape is not None:
            if not isinstance(shape, list | tuple) or not all(
                s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 0)
                for s in shape
            ):
                raise ValidationError(f"{where}.shape", "a list of sizes or nulls", shape)
            shape = tuple(shape)
        return cls(str(dtype), shape)

    def describe(self) -> str:
        if self.shape is None:
            return f"an array of {self.dtype}"
        dims = ", ".join("*" if s is None else str(s) for s in self.shape)
        return f"an array of {self.dtype} with shape ({dims}{',' if len(self.shape) == 1 else ''})"

    def check(self, value: Any, field: str, *, non_numbers: bool = True) -> np.ndarray:
        """``value`` (a nested list, or an array from the wire codec) as an array, or raise.

        JSON ``true``/``false`` and strings are not numbers (numpy would read them as 1 and 0,
        and parse ``"1.5"``); ``non_numbers`` False tells that the request held none, which
        spares the walk over the list."""
        kind = np.dtype(self.dtype).kind
        if isinstance(value, np.ndarray):
            arr = value
            if arr.dtype.kind not in "biuf" or (kind in "iu" and arr.dtype.kind == "f"):
                raise ValidationError(field, self.describe(), f"an array of {arr.dtype}")
            arr = arr.astype(self.dtype, copy=False)
        else:
            if not isinstance(value, list):
                raise ValidationError(field, self.describe(), _brief(value))
            try:
                arr = np.asarray(value, dtype=self.dtype)
            except (TypeError, ValueError, OverflowError):
                raise ValidationError(field, self.describe(), _brief(value)) from None
            if kind in "iu" and not _all_ints(value):
                raise ValidationError(field, self.describe(), "non-integer numbers")
            if kind in "fc" and non_numbers and _any_non_number(value):
                raise ValidationError(field, self.describe(), "true/false or strings (not numbers)")
        if self.shape is not None:
            ok = arr.ndim == len(self.shape) and all(
                want is None or want == got
                for want, got in zip(self.shape, arr.shape, strict=False)
            )
            if not ok:
                raise ValidationError(field, self.describe(), f"shape {tuple(arr.shape)}")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValidationError(field, f"{self.describe()} of finite numbers", "NaN or inf")
        return arr


def _all_ints(v: Any) -> bool:
    if isinstance(v, list):
        return all(_all_ints(x) for x in v)
    return isinstance(v, int) and not isinstance(v, bool)


def _any_non_number(v: Any) -> bool:
    if isinstance(v, list):
        return any(_any_non_number(x) for x in v)
    return isinstance(v, bool | str)


def _brief(v: Any) -> Any:
    """``v`` itself when short (the error message reprs it), else a truncated repr."""
    r = repr(v)
    return v if len(r) <= 60 else r[:57] + "..."


@dataclass(frozen=True)
class DefaultAnswer:
    """What a pipeline returns to answer with a default of its own (e.g. a selection app's
    confidence below its threshold): the response says ``default: true`` with ``explanation``
    and ``/metrics`` counts it under ``reason``, like the app's own default output."""

    output: Any
    explanation: str
    reason: str = "pipeline"


@dataclass(frozen=True)
class Prediction:
    """What ``Service.predict`` returns for one query."""

    query_id: str
    output: Any
    default: bool = False
    default_explanation: str | None = None
    latency_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        from inferline.core import value_to_json

        d: dict[str, Any] = {
            "query_id": self.query_id,
            "output": value_to_json(self.output),
            "default": self.default,
        }
        if self.default_explanation is not None:
            d["default_explanation"] = self.default_explanation
        return d

    def to_body(self) -> dict[str, Any]:
        """Like ``to_json`` but with the output as is: for ``json.dumps`` with
        ``default=json_default``, which converts only what JSON cannot hold (arrays, numpy
        scalars, bytes, errors), instead of walking every output."""
        d: dict[str, Any] = {
            "query_id": self.query_id,
            "output": self.output,
            "default": self.default,
        }
        if self.default_explanation is not None:
            d["default_explanation"] = self.default_explanation
        return d


def json_default(v: Any) -> Any:
    """``json.dumps(default=...)`` hook: the wire codec's JSON form of non-JSON values."""
    from inferline.core import value_to_json

    if isinstance(v, set | frozenset):
        raise TypeError(f"a {type(v).__name__} has no JSON form")
    return value_to_json(v)


@dataclass
class App:
    """An application: a handler ``async (input, slo_s) -> output``, an SLO and a default.

    ``respond_by_slo``: answer with the default output as soon as the SLO has passed (Clipper's
    behaviour), instead of waiting for the late prediction. Benchmarks leave it off so they
    measure the real latency. ``max_wait_s`` bounds any query even then.
    """

    name: str
    handler: Handler
    slo_s: float
    default_output: Any = _NO_DEFAULT
    input_spec: InputSpec | None = None
    respond_by_slo: bool = False
    max_wait_s: float = 30.0
    max_batch_inputs: int = 256
    description: str = ""
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValidationError("app name", "a non-empty name without '/'", self.name)
        if not self.slo_s > 0:
            raise ValidationError(f"apps.{self.name}.slo_s", "a number > 0", self.slo_s)

    @property
    def has_default(self) -> bool:
        return self.default_output is not _NO_DEFAULT

    @classmethod
    def from_pipeline(
        cls,
        name: str,
        pipeline: Callable[..., Awaitable[Any]],
        dispatcher: Any,
        slo_s: float,
        *,
        cache: Any = None,
        **kw: Any,
    ) -> App:
        """An app whose handler runs ``pipeline(x, ctx)`` through the queue's pipeline driver."""
        from inferline.queueing import PipelineRunner

        runner = PipelineRunner(dispatcher, pipeline, slo_s=slo_s, cache=cache)

        async def handler(x: Any, slo: float) -> Any:
            return await runner.run(x, slo_s=slo)

        return cls(name, handler, slo_s, **kw)


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
        self.apps: dict[str, App] = {}
        self.dispatcher = dispatcher
        self.backend = backend
        self.cache = cache
        self.models: list[str] = list(models)
        self._clock = clock
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}{int(time.time()) & 0xFFFFF:05x}"
        self.metrics = ServiceMetrics(self)
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
        if app.name in self.apps:
            raise ValidationError("apps", "unique app names", app.name)
        self.apps[app.name] = app

    def app(self, name: str) -> App:
        try:
            return self.apps[name]
        except KeyError:
            raise NotFoundError("app", name, sorted(self.apps)) from None

    def on_close(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` (LIFO) when the service closes, e.g. a mounted router's own cleanup."""
        self._on_close.append(fn)

    def new_query_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    # -- predictions ---------------------------------------------------------------------
    def check_input(
        self, app: App, value: Any, field: str, *, plain: bool = False, non_numbers: bool = True
    ) -> Any:
        """Decode the JSON form of an input and check it against the app's input spec.

        ``plain``: the caller knows the JSON held no object besides the request itself, so
        there is no tagged value (array, bytes) to decode. ``non_numbers``: False when the caller
        knows the JSON held no ``true``/``false`` and no string besides its keys.
        """
        if app.input_spec is not None:
            if isinstance(value, dict):
                from inferline.core import value_from_json

                value = value_from_json(value, field)
            return app.input_spec.check(value, field, non_numbers=non_numbers)
        if plain:
            return value
        from inferline.core import value_from_json

        return value_from_json(value, field)

    async def predict(self, app_name: str, x: Any, slo_s: float | None = None) -> Prediction:
        """Run one (already checked) input through an app. Raises only for explicit errors."""
        app = self.app(app_name)
        slo = app.slo_s if slo_s is None else slo_s
        qid = self.new_query_id()
        t0 = self._clock()
        outcome = "ok"
        try:
            wait = min(slo, app.max_wait_s) if app.respond_by_slo else app.max_wait_s
            try:
                # asyncio.timeout, not wait_for: no extra task per query on the hot path
                async with asyncio.timeout(wait):
                    out = await app.handler(x, slo)
            except TimeoutError:
                why = f"no prediction within {wait * 1e3:.0f} ms (SLO {slo * 1e3:.0f} ms)"
                if not app.has_default:
                    outcome = "error"  # a 504, not a default: count it as one
                    elapsed = self._clock() - t0
                    raise DeadlineExceededError(
                        app.name, elapsed - slo, f"app {app.name!r}: {why}"
                    ) from None
                outcome = "default"
                return self._default(app, qid, t0, why, "timeout")
            except OverloadedError:
                outcome = "overloaded"
                raise
            except ValidationError:
                outcome = "invalid"
                raise
            except DeadlineExceededError as e:
                outcome = "default" if app.has_default else "error"
                if not app.has_default:
                    raise
                return self._default(app, qid, t0, str(e), "deadline")
            except (BackendError, InferlineError) as e:
                outcome = "default" if app.has_default else "error"
                if not app.has_default:
                    raise
                log.warning("app %r: answering default output: %s", app.name, e)
                return self._default(app, qid, t0, f"{type(e).__name__}: {e}", "error")
            if isinstance(out, OverloadedError | ValidationError):
                raise out
            if isinstance(out, DefaultAnswer):
                outcome = "default"
                lat = self._clock() - t0
                self.metrics.observe(app.name, lat, "default")
                self.metrics.defaults(app.name, out.reason)
                return Prediction(qid, out.output, True, out.explanation, lat)
            if isinstance(out, BaseException):
                # A model answered this one input with an error value.
                outcome = "default" if app.has_default else "error"
                if not app.has_default:
                    raise out
                return self._default(app, qid, t0, f"{type(out).__name__}: {out}", "error")
            lat = self._clock() - t0
            self.metrics.observe(app.name, lat, "ok")
            return Prediction(qid, out, False, None, lat)
        except BaseException:
            if outcome == "ok":
                outcome = "error"
            self.metrics.observe(app.name, self._clock() - t0, outcome)
            raise

    def _default(self, app: App, qid: str, t0: float, why: str, kind: str) -> Prediction:
        lat = self._clock() - t0
        self.metrics.observe(app.name, lat, "default")
        self.metrics.defaults(app.name, kind)
        return Prediction(qid, app.default_output, True, why, lat)

    # -- lifecycle -----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        replicas: dict[str, int] = {}
        unresponsive: dict[str, int] = {}
        if self.backend is not None:
            for m in self.models:
                try:
                    handles = self.backend.replicas(m)
                except InferlineError:
                    handles = []
                # a replica that stopped answering its heartbeats (hung, or stopped) is not
                # counted as serving, though the backend has not replaced it yet
                stuck = sum(1 for h in handles if getattr(h, "unresponsive", False))
                replicas[m] = len(handles) - stuck
                if stuck:
                    unresponsive[m] = stuck
        idle = self._idle_variants()
        ok = not self.closing and all(n > 0 for m, n in replicas.items() if m not in idle)
        out: dict[str, Any] = {
            "status": "ok" if ok else ("closing" if self.closing else "degraded"),
            "apps": sorted(self.apps),
            "replicas": replicas,
        }
        if idle:
            out["idle_variants"] = sorted(idle)
        if unresponsive:
            out["unresponsive"] = unresponsive
        return out

    def _idle_variants(self) -> set[str]:
        """Variants that serve no stage now: they run no replicas by design (the plan's idle
        variants, or the one a live switch left), so health does not count them."""
        return {m for m, stages in self.variant_stages().items() if not stages}

    def variant_stages(self) -> dict[str, list[str]]:
        """With model variants: every variant model and the stages it serves now (empty for
        an idle one); ``{}`` without variants."""
        variants = getattr(self.plan, "variants", None)
        if variants is None:
            return {}
        out: dict[str, list[str]] = {}
        for stage, names in variants.stage_models().items():
            serving = (
                self.dispatcher.resolve(stage)
                if self.dispatcher is not None
                else variants.model_for(stage)
            )
            for n in names:
                out.setdefault(n, [])
                if n == serving:
                    out[n].append(stage)
        return out

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
