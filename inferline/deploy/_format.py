"""Deployment descriptions (format ``inferline.deployment/1``) and wiring them into a Service.

A deployment says what to serve and where; a plan (``inferline.plan/1``) says how much of it::

    {"format": "inferline.deployment/1", "name": "digits",
     "backend": "local://?oversubscribe=1",
     "models": [{"name": "mlp", "source": "inferline.demo.models:mlp", "params": {}}],
     "apps": {"digits": {"pipeline": "inferline.demo.pipeline:digits", "slo_ms": 50,
                         "default_output": null, "input": {"dtype": "float32", "shape": [64]}}},
     "sample_inputs": "inferline.demo.pipeline:sample_inputs",
     "queue": {"max_queue": 1000, "expire_late": false, "max_retries": 1,
               "admission": "off"},
     "routers": [],
     "front_doors": ["kserve", "tfserving"],
     "velox": {"store": "velox.sqlite", "models": [...]}}

``pipeline`` is an import path ``package.module:function`` of an ``async def f(x, ctx)``;
with ``pipeline_params`` it is a factory called with them that returns that function.
``sample_inputs`` names a function returning a list of sample queries (profiling, tracing).
``routers`` (optional) name factories ``service -> fastapi.APIRouter`` that ``inferline serve``
mounts next to the built-in routes; ``front_doors`` (optional) names protocols served next to
inferline's own, ``kserve`` (KServe v2, what tritonclient and perf_analyzer speak) and
``tfserving`` (TF Serving's REST and gRPC APIs): ``inferline serve`` mounts their HTTP routes on
its port and, with ``--grpc-port``, their gRPC services; ``velox`` (optional) serves
personalized models on the deployment's models (see ``inferline.server._velox_app``).

``queue.admission``: ``"predicted"`` refuses at once a query predicted to finish after its
deadline and drops, when a batch is cut, a queued one that would (docs/deadlines.md); an app's
``on_predicted_late`` says whether such a query gets a 429 (``"refuse"``) or its default output
(``"default"``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferline.core import (
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ValidationError,
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_format,
    import_object,
    load_json,
    no_extra_keys,
    req,
)
from inferline.deploy._batching import BatchingSpec, planned_policy
from inferline.queueing import ADMISSION_MODES, AdmissionConfig, BatchingPolicy
from inferline.server import ON_PREDICTED_LATE, InputSpec, check_on_predicted_late

__all__ = [
    "DEPLOYMENT_FORMAT",
    "FRONT_DOORS",
    "AppSpec",
    "Deployment",
    "QueueSpec",
    "import_object",
    "load_deployment",
]

log = logging.getLogger(__name__)

DEPLOYMENT_FORMAT = "inferline.deployment/1"
# Protocols a deployment may serve next to inferline's own routes (``front_doors``).
FRONT_DOORS = ("kserve", "tfserving")
_UNSET = object()


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
    # A selection policy over several models (``inferline.server._selection_app``); no pipeline then.
    selection: Any = None
    # What a query the queue refuses as predicted late gets: "refuse" (429) or "default".
    on_predicted_late: str = "refuse"
    # With queue.admission "predicted": the share of queries a plan may refuse (0.001: 0.1%);
    # None: refusals only count as misses within the percentile (docs/deadlines.md).
    max_refused: float | None = None

    def __post_init__(self) -> None:
        check_on_predicted_late(self.on_predicted_late, self.has_default, self.name)
        if self.max_refused is not None:
            field_ = f"apps.{self.name}.max_refused"
            v = as_float(self.max_refused, field_, lo=0.0)
            if v >= 1.0:
                raise ValidationError(field_, "a share of the queries in [0, 1)", self.max_refused)
            object.__setattr__(self, "max_refused", v)

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
        if self.on_predicted_late != "refuse":
            d["on_predicted_late"] = self.on_predicted_late
        if self.max_refused is not None:
            d["max_refused"] = self.max_refused
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
                "on_predicted_late",
                "max_refused",
            },
            where,
        )

        selection = None
        if m.get("selection") is not None:
            from inferline.server import SelectionAppSpec

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
            on_predicted_late=_one_of(
                m.get("on_predicted_late", "refuse"),
                ON_PREDICTED_LATE,
                f"{where}.on_predicted_late",
            ),
            max_refused=m.get("max_refused"),  # checked in __post_init__
        )

    def pipeline_fn(self) -> Callable[..., Any]:
        obj = import_object(self.pipeline, f"apps.{self.name}.pipeline")
        if self.pipeline_params:
            obj = obj(**dict(self.pipeline_params))
        if not callable(obj):
            raise ValidationError(f"apps.{self.name}.pipeline", "an async function (x, ctx)", obj)
        return obj  # type: ignore[no-any-return]


# ``queue.expire_grace_ms``: the default (the dispatcher's) and the largest accepted. Past the
# cap a hung replica would hold a caller for seconds past its deadline, what expiry prevents.
DEFAULT_EXPIRE_GRACE_MS = 50.0
MAX_EXPIRE_GRACE_MS = 10_000.0
# ``queue.admission_buffer_ms``: Clockwork's buffer between the internal and the client's deadline
DEFAULT_ADMISSION_BUFFER_MS = 2.0
MAX_ADMISSION_BUFFER_MS = 1_000.0


@dataclass(frozen=True)
class QueueSpec:
    """Queue settings applied to every model.

    ``expire_late``: a query still queued at its deadline plus ``expire_grace_ms`` is
    answered then (the app's default output with its explanation, or a 504) by a timer, not
    when a replica frees up (``queueing/_expiry.py``). ``expire_grace_ms``: that grace,
    0 to 10000 ms, 50 by default.

    ``admission``: ``"off"`` (the default) or ``"predicted"``: admission by predicted
    completion and Clockwork's dispatch rule (``inferline.queueing``'s ``AdmissionConfig``,
    docs/deadlines.md). ``admission_buffer_ms``: Clockwork's buffer, subtracted from each
    deadline (0 to 1000 ms, 2 by default). ``admission_tail_quantile``: which quantile of the
    recent batches' overrun the latency estimate adds (0.5 to 1, 0.99 by default)."""

    max_queue: int = 1000
    expire_late: bool = False
    max_retries: int = 1
    cache_entries: int = 0
    expire_grace_ms: float = DEFAULT_EXPIRE_GRACE_MS
    admission: str = "off"
    admission_buffer_ms: float = DEFAULT_ADMISSION_BUFFER_MS
    admission_tail_quantile: float = 0.99

    def __post_init__(self) -> None:
        g = _grace_ms(self.expire_grace_ms, "queue.expire_grace_ms")
        object.__setattr__(self, "expire_grace_ms", g)
        _one_of(self.admission, ADMISSION_MODES, "queue.admission")
        b = _ms_in(self.admission_buffer_ms, MAX_ADMISSION_BUFFER_MS, "queue.admission_buffer_ms")
        object.__setattr__(self, "admission_buffer_ms", b)
        q = as_float(self.admission_tail_quantile, "queue.admission_tail_quantile", lo=0.5, hi=1.0)
        object.__setattr__(self, "admission_tail_quantile", q)

    def admission_config(self) -> AdmissionConfig:
        """The queues' admission settings (``Dispatcher.add_model``'s ``admission``)."""
        return AdmissionConfig(
            self.admission,
            self.admission_buffer_ms / 1e3,
            tail_quantile=self.admission_tail_quantile,
        )

    @property
    def expire_grace_s(self) -> float:
        return self.expire_grace_ms / 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_queue": self.max_queue,
            "expire_late": self.expire_late,
            "expire_grace_ms": self.expire_grace_ms,
            "max_retries": self.max_retries,
            "cache_entries": self.cache_entries,
            "admission": self.admission,
            "admission_buffer_ms": self.admission_buffer_ms,
            # written only when set, so plan and deployment files from before read the same
            **(
                {"admission_tail_quantile": self.admission_tail_quantile}
                if self.admission_tail_quantile != 0.99
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "queue") -> QueueSpec:
        m = as_mapping(d, where)
        keys = {
            "max_queue",
            "expire_late",
            "expire_grace_ms",
            "max_retries",
            "cache_entries",
            "admission",
            "admission_buffer_ms",
            "admission_tail_quantile",
        }
        no_extra_keys(m, keys, where)
        return cls(
            max_queue=as_int(m.get("max_queue", 1000), f"{where}.max_queue", minimum=1),
            expire_late=bool(m.get("expire_late", False)),
            max_retries=as_int(m.get("max_retries", 1), f"{where}.max_retries", minimum=0),
            cache_entries=as_int(m.get("cache_entries", 0), f"{where}.cache_entries", minimum=0),
            expire_grace_ms=_grace_ms(
                m.get("expire_grace_ms", DEFAULT_EXPIRE_GRACE_MS), f"{where}.expire_grace_ms"
            ),
            admission=_one_of(m.get("admission", "off"), ADMISSION_MODES, f"{where}.admission"),
            admission_buffer_ms=_ms_in(
                m.get("admission_buffer_ms", DEFAULT_ADMISSION_BUFFER_MS),
                MAX_ADMISSION_BUFFER_MS,
                f"{where}.admission_buffer_ms",
            ),
            admission_tail_quantile=as_float(
                m.get("admission_tail_quantile", 0.99),
                f"{where}.admission_tail_quantile",
                lo=0.5,
                hi=1.0,
            ),
        )


def _grace_ms(value: Any, field_: str) -> float:
    """A grace in milliseconds, 0 to ``MAX_EXPIRE_GRACE_MS``, or an error naming the field."""
    return _ms_in(value, MAX_EXPIRE_GRACE_MS, field_)


def _ms_in(value: Any, top: float, field_: str) -> float:
    """Milliseconds from 0 to ``top``, or an error naming the field."""
    expected = f"a number of milliseconds from 0 to {top:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field_, expected, value)
    if not 0.0 <= float(value) <= top:  # NaN fails this too
        raise ValidationError(field_, expected, value)
    return float(value)


def _one_of(value: Any, allowed: tuple[str, ...], field_: str) -> str:
    if value not in allowed:
        raise ValidationError(field_, f"one of {list(allowed)}", value)
    return str(value)


def _backend_field(value: Any) -> str:
    """``"backend"``: a URL, or a list of URLs (a fleet, kept as its JSON text, which
    ``open_backend`` reads back; docs/fleets.md)."""
    if isinstance(value, list):
        return json.dumps([as_str(u, f"backend[{i}]") for i, u in enumerate(value)])
    return as_str(value, "backend")


def _backend_out(backend: str) -> Any:
    """The file's form of ``backend``: a fleet's URLs as the list they were written as."""
    if backend.startswith("["):
        return json.loads(backend)
    return backend


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
    # Velox personalization served next to the apps (``inferline.server._velox_app.VeloxSpec``).
    velox: Any = None
    # Protocol front doors served by ``inferline serve`` (names of ``FRONT_DOORS``).
    front_doors: tuple[str, ...] = ()
    # Each model's batching policy (a model entry's ``"batching"``; fixed when absent).
    batching: Mapping[str, BatchingSpec] = field(default_factory=dict)

    def planner_admission(self) -> dict[str, Any]:
        """``PlannerOptions`` fields that make a plan for this deployment exact for its queue:
        with ``queue.admission`` "predicted", admission on with the queue's buffer and the
        smallest ``max_refused`` its apps set; else nothing (docs/deadlines.md)."""
        if self.queue.admission != "predicted":
            return {}
        shares = [a.max_refused for a in self.apps if a.max_refused is not None]
        return {
            "admission": True,
            "admission_buffer_s": self.queue.admission_buffer_ms / 1e3,
            "max_refused": min(shares) if shares else None,
        }

    def __post_init__(self) -> None:
        as_str(self.name, "name")
        for i, door in enumerate(self.front_doors):
            if door not in FRONT_DOORS:
                raise ValidationError(f"front_doors[{i}]", f"one of {list(FRONT_DOORS)}", door)
        if len(set(self.front_doors)) != len(self.front_doors):
            raise ValidationError("front_doors", "each protocol once", list(self.front_doors))
        if not self.models:
            raise ValidationError("models", "at least one model", [])
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValidationError("models", "unique model names", names)
        unknown = sorted(set(self.batching) - set(names))
        if unknown:
            raise ValidationError("batching", "policies of models of the deployment", unknown)

        apps = [a.name for a in self.apps]
        if len(set(apps)) != len(apps):
            raise ValidationError("apps", "unique app names", apps)

    def batching_of(self, model: str) -> BatchingSpec:
        return self.batching.get(model, BatchingSpec())

    def policy_for(self, model: str, config: ModelConfig, slo_s: float) -> BatchingPolicy:
        """The live batching policy of ``model`` under a planned ``config``. Precedence: a
        policy the deployment names for the model (its ``"batching"``, even ``fixed``) is
        kept, with the plan's max batch size as its bound; otherwise the plan's batch-wait
        timeout (``batch_wait_ms`` above 0) gives delayed batching with that wait; otherwise
        fixed batching (the planner's and the estimator's greedy rule)."""
        if model in self.batching:
            return self.batching[model].build(config.max_batch_size, slo_s)
        return planned_policy(config)

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise NotFoundError("model", name, [m.name for m in self.models])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": DEPLOYMENT_FORMAT,
            "name": self.name,
            "backend": _backend_out(self.backend),
            "models": [
                {
                    **m.to_dict(),
                    **(
                        {"batching": self.batching[m.name].to_dict()}
                        if m.name in self.batching
                        else {}
                    ),
                }
                for m in self.models
            ],
            "apps": {a.name: a.to_dict() for a in self.apps},
            "queue": self.queue.to_dict(),
        }
        if self.sample_inputs:
            d["sample_inputs"] = self.sample_inputs
        if self.routers:
            d["routers"] = list(self.routers)
        if self.velox is not None:
            d["velox"] = self.velox.to_dict()
        if self.front_doors:
            d["front_doors"] = list(self.front_doors)
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
                "front_doors",
            },
            "",
        )
        entries = as_list(req(m, "models", ""), "models")
        models = tuple(
            ModelSpec.from_dict(
                {k: v for k, v in x.items() if k != "batching"} if isinstance(x, Mapping) else x,
                f"models[{i}]",
            )
            for i, x in enumerate(entries)
        )
        batching = {
            spec.name: BatchingSpec.from_dict(x["batching"], f"models[{i}].batching")
            for i, (spec, x) in enumerate(zip(models, entries, strict=True))
            if x.get("batching") is not None
        }
        apps = tuple(
            AppSpec.from_dict(as_str(k, "apps"), v, f"apps.{k}")
            for k, v in as_mapping(m.get("apps", {}), "apps").items()
        )
        return cls(
            name=as_str(req(m, "name", ""), "name"),
            models=models,
            apps=apps,
            backend=_backend_field(m.get("backend", "local://")),
            sample_inputs=str(m.get("sample_inputs", "")),
            queue=QueueSpec.from_dict(m.get("queue", {})),
            routers=tuple(
                as_str(r, f"routers[{i}]")
                for i, r in enumerate(as_list(m.get("routers", []), "routers"))
            ),
            velox=_velox_spec(m.get("velox")),
            batching=batching,
            front_doors=tuple(
                as_str(x, f"front_doors[{i}]")
                for i, x in enumerate(as_list(m.get("front_doors", []), "front_doors"))
            ),
        )

    def open_backend(self, host: Any = None) -> Any:
        """This deployment's backend (``backend``), opened through ``host``'s adapters (None:
        this process's plugin host); the caller closes it."""
        from inferline.deploy._host import open_backend, plugin_host

        return open_backend(host if host is not None else plugin_host(), self.backend)

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
    from inferline.server import VeloxSpec

    return VeloxSpec.from_dict(d)


def load_deployment(path: str) -> Deployment:
    d = load_json(path)
    try:
        return Deployment.from_dict(d)
    except ValidationError as e:
        raise ValidationError(f"{path}: {e.field}", e.expected, e.got) from None
