"""Deployment descriptions (format ``inferline.deployment/1``) and wiring them into a Service.

A deployment says what to serve and where; a plan (``inferline.plan/1``) says how much of it::

    {"format": "inferline.deployment/1", "name": "digits",
     "backend": "local://?oversubscribe=1",
     "models": [{"name": "mlp", "source": "inferline.demo.models:mlp", "params": {}}],
     "apps": {"digits": {"pipeline": "inferline.demo.pipeline:digits", "slo_ms": 50,
                         "default_output": null, "input": {"dtype": "float32", "shape": [64]}}},
     "sample_inputs": "inferline.demo.pipeline:sample_inputs",
     "queue": {"max_queue": 1000, "expire_late": false, "max_retries": 1},
     "routers": [],
     "velox": {"store": "velox.sqlite", "models": [...]}}

``pipeline`` is an import path ``package.module:function`` of an ``async def f(x, ctx)``;
with ``pipeline_params`` it is a factory called with them that returns that function.
``sample_inputs`` names a function returning a list of sample queries (profiling, tracing).
``routers`` (optional) name factories ``service -> fastapi.APIRouter`` that ``inferline serve``
mounts next to the built-in routes (e.g. the protocol front doors); ``velox`` (optional) serves
personalized models on the deployment's models (see ``inferline._velox_app``).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferline.core import (
    InferlineError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    Plan,
    ValidationError,
    load_json,
)
from inferline.core._validate import (
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_format,
    no_extra_keys,
    req,
)

from ._service import App, InputSpec, Service

__all__ = [
    "DEPLOYMENT_FORMAT",
    "AppSpec",
    "Deployment",
    "QueueSpec",
    "apply_plan",
    "drain",
    "import_object",
    "load_deployment",
    "planned_models",
    "start_service",
]

log = logging.getLogger(__name__)

DEPLOYMENT_FORMAT = "inferline.deployment/1"
_UNSET = object()


def import_object(path: str, field: str = "import path") -> Any:
    """``package.module:attr`` -> the object (dots after the colon walk attributes)."""
    mod, sep, attr = str(path).partition(":")
    if not sep or not mod or not attr:
        raise ValidationError(field, "'package.module:name'", path)
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as e:
        raise ValidationError(field, "an importable module", f"{mod} ({e})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise NotFoundError(f"attribute of {mod}", part) from None
    return obj


@dataclass(frozen=True)
class AppSpec:
    """An application: pipeline import path, SLO, default output and input checks."""

    name: str
    pipeline: str
    slo_s: float
    default_output: Any = _UNSET
    pipeline_params: Mapping[str, Any] = field(default_factory=dict)
    input: InputSpec | None = None
    respond_by_slo: bool = False
    description: str = ""
    # A selection policy over several models (``inferline._selection_app``); no pipeline then.
    selection: Any = None

    @property
    def has_default(self) -> bool:
        return self.default_output is not _UNSET

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pipeline": self.pipeline, "slo_ms": self.slo_s * 1e3}
        if not self.pipeline:
            del d["pipeline"]
        if self.selection is not None:
            d["selection"] = self.selection.to_dict()
        if self.pipeline_params:
            d["pipeline_params"] = dict(self.pipeline_params)
        if self.has_default:
            d["default_output"] = self.default_output
        if self.input is not None:
            d["input"] = self.input.to_dict()
        if self.respond_by_slo:
            d["respond_by_slo"] = True
        if self.description:
            d["description"] = self.description
        return d

    @classmethod
    def from_dict(cls, name: str, d: Any, where: str) -> AppSpec:
        m = as_mapping(d, where)
        no_extra_keys(
            m,
            {
                "pipeline",
                "slo_ms",
                "pipeline_params",
                "default_output",
                "input",
                "respond_by_slo",
                "description",
                "selection",
            },
            where,
        )
        selection = None
        if m.get("selection") is not None:
            from ._selection_app import SelectionAppSpec

            selection = SelectionAppSpec.from_dict(m["selection"], f"{where}.selection")
        return cls(
            name=name,
            pipeline=""
            if selection is not None and "pipeline" not in m
            else as_str(req(m, "pipeline", where), f"{where}.pipeline"),
            selection=selection,
            slo_s=as_float(req(m, "slo_ms", where), f"{where}.slo_ms", positive=True) / 1e3,
            default_output=m["default_output"] if "default_output" in m else _UNSET,
            pipeline_params=dict(
                as_mapping(m.get("pipeline_params", {}), f"{where}.pipeline_params")
            ),
            input=InputSpec.from_dict(m["input"], f"{where}.input") if m.get("input") else None,
            respond_by_slo=bool(m.get("respond_by_slo", False)),
            description=str(m.get("description", "")),
        )

    def pipeline_fn(self) -> Callable[..., Any]:
        obj = import_object(self.pipeline, f"apps.{self.name}.pipeline")
        if self.pipeline_params:
            obj = obj(**dict(self.pipeline_params))
        if not callable(obj):
            raise ValidationError(f"apps.{self.name}.pipeline", "an async function (x, ctx)", obj)
        return obj  # type: ignore[no-any-return]


@dataclass(frozen=True)
class QueueSpec:
    """Queue settings applied to every model."""

    max_queue: int = 1000
    expire_late: bool = False
    max_retries: int = 1
    cache_entries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_queue": self.max_queue,
            "expire_late": self.expire_late,
            "max_retries": self.max_retries,
            "cache_entries": self.cache_entries,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "queue") -> QueueSpec:
        m = as_mapping(d, where)
        no_extra_keys(m, {"max_queue", "expire_late", "max_retries", "cache_entries"}, where)
        return cls(
            max_queue=as_int(m.get("max_queue", 1000), f"{where}.max_queue", minimum=1),
            expire_late=bool(m.get("expire_late", False)),
            max_retries=as_int(m.get("max_retries", 1), f"{where}.max_retries", minimum=0),
            cache_entries=as_int(m.get("cache_entries", 0), f"{where}.cache_entries", minimum=0),
        )


@dataclass(frozen=True)
class Deployment:
    """What to serve: a backend, its models, the apps over them (format ``inferline.deployment/1``)."""

    name: str
    models: tuple[ModelSpec, ...]
    apps: tuple[AppSpec, ...]
    backend: str = "local://"
    sample_inputs: str = ""
    queue: QueueSpec = QueueSpec()
    # Import paths of ``service -> fastapi.APIRouter`` factories mounted by ``inferline serve``.
    routers: tuple[str, ...] = ()
    # Velox personalization served next to the apps (``inferline._velox_app.VeloxSpec``).
    velox: Any = None

    def __post_init__(self) -> None:
        as_str(self.name, "name")
        if not self.models:
            raise ValidationError("models", "at least one model", [])
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValidationError("models", "unique model names", names)
        apps = [a.name for a in self.apps]
        if len(set(apps)) != len(apps):
            raise ValidationError("apps", "unique app names", apps)

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise NotFoundError("model", name, [m.name for m in self.models])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": DEPLOYMENT_FORMAT,
            "name": self.name,
            "backend": self.backend,
            "models": [m.to_dict() for m in self.models],
            "apps": {a.name: a.to_dict() for a in self.apps},
            "queue": self.queue.to_dict(),
        }
        if self.sample_inputs:
            d["sample_inputs"] = self.sample_inputs
        if self.routers:
            d["routers"] = list(self.routers)
        if self.velox is not None:
            d["velox"] = self.velox.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Deployment:
        m = check_format(d, DEPLOYMENT_FORMAT)
        no_extra_keys(
            m,
            {
                "format",
                "name",
                "backend",
                "models",
                "apps",
                "sample_inputs",
                "queue",
                "routers",
                "velox",
            },
            "",
        )
        models = tuple(
            ModelSpec.from_dict(x, f"models[{i}]")
            for i, x in enumerate(as_list(req(m, "models", ""), "models"))
        )
        apps = tuple(
            AppSpec.from_dict(as_str(k, "apps"), v, f"apps.{k}")
            for k, v in as_mapping(m.get("apps", {}), "apps").items()
        )
        return cls(
            name=as_str(req(m, "name", ""), "name"),
            models=models,
            apps=apps,
            backend=as_str(m.get("backend", "local://"), "backend"),
            sample_inputs=str(m.get("sample_inputs", "")),
            queue=QueueSpec.from_dict(m.get("queue", {})),
            routers=tuple(
                as_str(r, f"routers[{i}]")
                for i, r in enumerate(as_list(m.get("routers", []), "routers"))
            ),
            velox=_velox_spec(m.get("velox")),
        )

    def load_sample_inputs(self) -> list[Any]:
        if not self.sample_inputs:
            raise ValidationError("sample_inputs", "an import path of a function", "")
        obj = import_object(self.sample_inputs, "sample_inputs")
        xs = obj() if callable(obj) else obj
        xs = list(xs)
        if not xs:
            raise ValidationError("sample_inputs", "a non-empty list of inputs", xs)
        return xs


def _velox_spec(d: Any) -> Any:
    if d is None:
        return None
    from ._velox_app import VeloxSpec

    return VeloxSpec.from_dict(d)


def load_deployment(path: str) -> Deployment:
    d = load_json(path)
    try:
        return Deployment.from_dict(d)
    except ValidationError as e:
        raise ValidationError(f"{path}: {e.field}", e.expected, e.got) from None


def planned_models(plan: Plan) -> dict[str, ModelConfig]:
    """The plan's configurations by the deployment model that serves them: a variant stage by
    its chosen variant, the stage's other variants idle (no replicas, the stage's hardware and
    batch size, so a switch only has to start replicas)."""
    if plan.variants is None:
        return dict(plan.models)
    out: dict[str, ModelConfig] = {}
    variants = plan.variants.stage_models()
    for stage, cfg in plan.models.items():
        for name in variants.get(stage, ()):
            out[name] = ModelConfig(cfg.hardware, cfg.max_batch_size, 0)
        out[plan.variants.model_for(stage)] = cfg
    return out


def check_stages_served(plan: Plan | None) -> None:
    """Refuse a plan that gives a pipeline's model no replica: every query for it would wait
    in its queue until the deadline (``simulate`` refuses such a plan too). Idle model
    variants are not in ``plan.models``; ``planned_models`` adds them."""
    if plan is None:
        return
    for name, cfg in sorted(plan.models.items()):
        if cfg.replicas < 1:
            raise ValidationError(
                f"plan.models.{name}.replicas",
                "at least 1: the pipeline sends queries there (idle model variants are "
                "listed in plan.variants, not here)",
                cfg.replicas,
            )


def _configs(dep: Deployment, plan: Plan | None) -> dict[str, ModelConfig]:
    planned = planned_models(plan) if plan is not None else {}
    out = {}
    for spec in dep.models:
        out[spec.name] = planned.get(spec.name, ModelConfig("cpu", 1, 1))
    unknown = sorted(set(planned) - {m.name for m in dep.models})
    if unknown:
        what = "plan.models" if plan is None or plan.variants is None else "plan.variants"
        raise ValidationError(what, f"models of deployment {dep.name!r}", unknown)
    return out


async def drain(dispatcher: Any, model: str, timeout_s: float = 30.0) -> bool:
    """Wait until ``model``'s queue has no query waiting or in a replica (before its replicas
    go, so nothing queued is stranded); False if ``timeout_s`` passed first."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while True:
        st = dispatcher.stats(model)
        if st.queued + st.in_flight == 0:
            return True
        if time.monotonic() >= deadline:
            log.warning("%r still has %d queries after %.0f s", model, st.queued, timeout_s)
            return False
        await asyncio.sleep(0.01)


def _routes(plan: Plan | None) -> dict[str, str]:
    """Stage -> the variant serving it (stages served by a model of another name)."""
    if plan is None or plan.variants is None:
        return {}
    return {s: v for s, v in plan.variants.choice.items() if s != v}


async def start_service(
    dep: Deployment,
    plan: Plan | None = None,
    *,
    backend: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    apps: Sequence[str] | None = None,
    host: Any = None,
) -> Service:
    """Deploy every model (plan's configuration, or one CPU replica with batch 1), create the
    interposed queue and the apps; returns a ready ``Service``. On failure, undoes it all."""
    from inferline.adapters import PluginHost
    from inferline.queueing import Dispatcher, FixedBatching

    host = host if host is not None else PluginHost.default()
    check_stages_served(plan)
    configs = _configs(dep, plan)
    for a in dep.apps:  # a bad selection block fails before any replica starts
        if a.selection is not None and (apps is None or a.name in apps):
            from ._selection_app import build_policy

            build_policy(a.name, a.selection, host)
    if backend is None:
        backend = host.backend_for(dep.backend)
    dispatcher = Dispatcher(clock=clock)
    cache = None
    if dep.queue.cache_entries > 0:
        from inferline.queueing import PredictionCache

        cache = PredictionCache(dep.queue.cache_entries)
    svc = Service(
        dispatcher=dispatcher,
        backend=backend,
        cache=cache,
        models=[m.name for m in dep.models],
        clock=clock,
    )
    # observers registered through the plugin host hear about deploys, plan changes and scaling
    svc.plugins = host
    try:
        import asyncio

        await asyncio.gather(*(backend.deploy(s, configs[s.name]) for s in dep.models))
        note = oversubscription(dep, backend, configs)
        if note is not None:
            log.warning("%s", note)
        for s in dep.models:
            host.notify_config(s.name, None, configs[s.name], backend=dep.backend, reason="deploy")
        for s in dep.models:
            dispatcher.add_model(
                s.name,
                batching=FixedBatching(configs[s.name].max_batch_size),
                max_queue=dep.queue.max_queue,
                expire_late=dep.queue.expire_late,
                max_retries=dep.queue.max_retries,
            )
        for stage, model in _routes(plan).items():
            dispatcher.route(stage, model)
        dispatcher.attach(backend)
        svc.metrics.watch(dispatcher)
        for a in dep.apps:
            if apps is not None and a.name not in apps:
                continue
            kw: dict[str, Any] = {
                "input_spec": a.input,
                "respond_by_slo": a.respond_by_slo,
                "description": a.description,
                "models": tuple(m.name for m in dep.models),
            }
            if a.has_default:
                kw["default_output"] = a.default_output
            if a.selection is not None:
                from ._selection_app import make_selection_app

                kw.pop("models")
                svc.add_app(
                    make_selection_app(
                        svc,
                        a.name,
                        a.selection,
                        dispatcher,
                        a.slo_s,
                        cache=cache,
                        known_models=svc.models,
                        **kw,
                    )
                )
                continue
            svc.add_app(
                App.from_pipeline(a.name, a.pipeline_fn(), dispatcher, a.slo_s, cache=cache, **kw)
            )
    except BaseException:
        await svc.close()
        raise
    svc.plan = plan
    svc.deployment = dep
    return svc


def oversubscription(
    dep: Deployment, backend: Any, configs: Mapping[str, ModelConfig]
) -> str | None:
    """What ``configs`` take beyond the backend's inventory, as a note, or None. Only a
    backend that shares its cores or GPUs (``oversubscribe``) places such a plan at all; an
    estimate that gives every replica a core (or GPU) of its own is optimistic there (the
    2-core demo at a 20 ms SLO: estimated P99 19 ms, served 24.6 ms), one planned with
    ``pinned_cores`` is not."""
    inventory = getattr(backend, "inventory", None)
    if inventory is None:
        return None
    have = inventory()
    use: dict[str, int] = {}
    for name, c in configs.items():
        threads = dep.model(name).threads if c.hardware == "cpu" else 1
        use[c.hardware] = use.get(c.hardware, 0) + c.replicas * threads
    over = [f"{h}: {n} of {have[h]}" for h, n in sorted(use.items()) if n > have.get(h, n)]
    if not over:
        return None
    pins = ",".join(f"{h}={have[h]}" for h in sorted(use) if h in have)
    return (
        f"the plan's replicas take {', '.join(over)} units: they share them. An estimate that "
        f"gives each replica its own is optimistic: plan with --pinned-cores {pins} (how this "
        "runtime places replicas), or --inventory to stay within, or re-plan on `inferline "
        "calibrate` profiles with --service-spread once it has served"
    )


async def apply_plan(svc: Service, plan: Plan) -> dict[str, str]:
    """Move a running service to ``plan``: replica counts and batch sizes change in place; a
    model whose hardware changes is redeployed (its queue keeps its queries meanwhile). With
    model variants, a stage moves to another variant only once that variant's replicas serve,
    and the variant it leaves drains its queue before its replicas go (nothing queued is
    lost)."""
    from inferline.queueing import FixedBatching

    dep: Deployment | None = getattr(svc, "deployment", None)
    if dep is None or svc.backend is None or svc.dispatcher is None:
        raise ValidationError("service", "a service started from a deployment", None)
    check_stages_served(plan)
    configs = _configs(dep, plan)
    planned = planned_models(plan)
    # without a plan the service runs the deployment's defaults (one CPU replica, batch 1)
    olds = _configs(dep, getattr(svc, "plan", None))
    done: dict[str, str] = {}
    routes = _routes(plan)
    stages = set(plan.models) | set(getattr(getattr(svc, "plan", None), "models", {}))

    def active(name: str) -> int:
        """Replicas serving now: a live tuner may have moved the service off the old plan."""
        try:
            return len(svc.backend.replicas(name))
        except InferlineError:
            return olds[name].replicas

    # hardware the backend does not have is refused before anything changes (applying it
    # would remove the model's replicas and fail to start new ones)
    inventory = svc.backend.inventory()
    for name, cfg in configs.items():
        if name in planned and cfg.hardware not in inventory:
            raise ValidationError(
                f"models.{name}.hardware",
                f"hardware this backend has ({', '.join(sorted(inventory))})",
                cfg.hardware,
            )
    # models that shrink do so last: after the others have grown and the stages moved
    leaving = {n for n, c in configs.items() if n in planned and c.replicas < active(n)}

    # a backend that can change a model's batch size and hardware in place (Triton: one
    # reload with the new model configuration) does so; before, only the replica count
    # reached Triton, and a larger planned batch was split into several requests
    reconfigure = getattr(svc.backend, "reconfigure", None)

    async def one(name: str, cfg: ModelConfig) -> None:
        old = olds[name]
        try:
            if reconfigure is not None:
                await reconfigure(name, cfg)
                done[name] = f"{cfg.replicas} replicas" + (
                    f" on {cfg.hardware}" if old.hardware != cfg.hardware else ""
                )
            elif old.hardware != cfg.hardware:
                await svc.backend.remove(name)
                try:
                    await svc.backend.deploy(dep.model(name), cfg)
                except InferlineError:
                    # back on the old hardware, so that the model keeps serving
                    await svc.backend.deploy(dep.model(name), old)
                    raise
                done[name] = f"redeployed on {cfg.hardware}"
            else:
                await svc.backend.scale(name, cfg.replicas)
                done[name] = f"{cfg.replicas} replicas"
            svc.dispatcher.set_batching(name, FixedBatching(cfg.max_batch_size))
            done[name] += f", max batch {cfg.max_batch_size}"
            host = getattr(svc, "plugins", None)
            if host is not None:
                host.notify_config(name, old, cfg, backend=dep.backend, reason="plan applied")
        except InferlineError as e:
            done[name] = f"failed: {e}"
            log.error("applying plan to %r failed: %s", name, e)

    for name, cfg in configs.items():
        if name in planned and name not in leaving:
            await one(name, cfg)
    for stage in stages:
        target = routes.get(stage, stage)
        if svc.dispatcher.resolve(stage) != target:
            if target != stage and done.get(target, "").startswith("failed"):
                done[stage] = f"still served by {svc.dispatcher.resolve(stage)}"
                continue
            svc.dispatcher.route(stage, target if target != stage else None)
            done[stage] = f"served by {target}"
    for name in sorted(leaving):
        if configs[name].replicas == 0:  # nothing would serve what it still has queued
            await drain(svc.dispatcher, name)
        await one(name, configs[name])
    note = oversubscription(dep, svc.backend, configs)
    if note is not None:
        done["inventory"] = note
        log.warning("%s", note)
    failed = {n for n, what in done.items() if n in configs and what.startswith("failed")}
    # what is in force: a model the plan could not move keeps its old configuration
    svc.plan = (
        plan.with_models({n: (olds[n] if n in failed else c) for n, c in plan.models.items()})
        if failed
        else plan
    )
    live = getattr(svc, "live_tuner", None)
    if live is not None:
        if plan.tuner is not None:
            live.replan(plan)
            done["tuner"] = "follows the new plan"
        else:
            await live.stop()
            svc.live_tuner = None
            done["tuner"] = "stopped: the new plan has no tuner inputs"
    return done
