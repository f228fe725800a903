"""Applications that serve a selection policy over several models (ensembles, Clipper §3.5).

A deployment app with a ``selection`` block instead of (or besides) a ``pipeline``::

    "apps": {"digits-vote": {
        "slo_ms": 100, "default_output": -1, "input": {"dtype": "float32", "shape": [64]},
        "selection": {"policy": "exp4", "models": ["nb", "tree", "logreg"],
                      "params": {"eta": 0.3}, "confidence_threshold": 0.6,
                      "per_user": true, "store": "selection.sqlite", "seed": 0,
                      "combine_margin_ms": 7, "measure_combine_margin": true}}}

runs every query through a ``SelectionService``: the policy (resolved through the plugin host,
so third-party policies work the same) picks the models, their calls go through the interposed
queue with the query's deadline, and the predictions that arrived are combined shortly before
the deadline (stragglers lower the confidence): at arrival + SLO minus the combine/return
allowance (``selection.CombineAllowance``), ``combine_margin_ms`` plus, unless
``measure_combine_margin`` is false, a tail estimate of the measured time from the combine
target to the app's answer, so that the answer reaches the client within the SLO. The app's
output is an object::

    {"output": 3, "confidence": 0.67, "models_contributed": 2, "models_selected": 3,
     "default": false, "selection_query_id": "...", "user": null}

``store``: ``null``/``"memory"`` (in-process LRU), a SQLite path (durable), or a ``redis://``
URL. Feedback (``POST /apps/{app}/feedback``) and per-user queries (``POST /apps/{app}/select``)
are served by ``inferline.server._selection_routes``.
"""

from __future__ import annotations

import contextvars
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferline.core import (
    ValidationError,
    as_float,
    as_int,
    as_list,
    as_mapping,
    as_str,
    no_extra_keys,
)
from inferline.selection import (
    AllowanceState,
    CombineAllowance,
    SelectionConfig,
    SelectionService,
    make_policy,
    open_store,
)
from inferline.server._apps import App
from inferline.server._outcomes import DefaultAnswer

__all__ = [
    "EnsemblePipeline",
    "SelectionAppSpec",
    "current_user",
    "make_selection_app",
    "selection_services",
]

# The user a query is made for: set by the /select route around ``Service.predict`` so the app's
# handler (which only sees the input and the SLO) can pick that user's policy state.
current_user: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "inferline_selection_user", default=None
)

_KEYS = {
    "policy",
    "models",
    "params",
    "confidence_threshold",
    "per_user",
    "store",
    "seed",
    "log_capacity",
    "combine_margin_ms",
    "measure_combine_margin",
}


@dataclass(frozen=True)
class SelectionAppSpec:
    """The ``selection`` block of a deployment app."""

    policy: str
    models: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    confidence_threshold: float = 0.0
    per_user: bool = False
    store: str | None = None
    seed: int = 0
    log_capacity: int = 100_000
    combine_margin_ms: float = 7.0
    measure_combine_margin: bool = True

    def allowance(self) -> CombineAllowance:
        return CombineAllowance(self.combine_margin_ms / 1e3, self.measure_combine_margin)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"policy": self.policy, "models": list(self.models)}
        if self.params:
            d["params"] = dict(self.params)
        d.update(
            confidence_threshold=self.confidence_threshold,
            per_user=self.per_user,
            store=self.store,
            seed=self.seed,
            log_capacity=self.log_capacity,
            combine_margin_ms=self.combine_margin_ms,
            measure_combine_margin=self.measure_combine_margin,
        )
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "selection") -> SelectionAppSpec:
        m = as_mapping(d, where)
        no_extra_keys(m, _KEYS, where)
        if "policy" not in m:
            raise ValidationError(f"{where}.policy", "a selection policy name", None)
        if "models" not in m:
            raise ValidationError(f"{where}.models", "a list of model names", None)
        models = tuple(
            as_str(x, f"{where}.models[{i}]")
            for i, x in enumerate(as_list(m["models"], f"{where}.models"))
        )
        if not models or len(set(models)) != len(models):
            raise ValidationError(f"{where}.models", "a non-empty list of distinct names", models)
        store = m.get("store")
        if store is not None:
            store = as_str(store, f"{where}.store")
        margin = as_float(m.get("combine_margin_ms", 7.0), f"{where}.combine_margin_ms")
        if not 0.0 <= margin < math.inf:
            raise ValidationError(f"{where}.combine_margin_ms", "a number of ms >= 0", margin)
        measure = m.get("measure_combine_margin", True)
        if not isinstance(measure, bool):
            raise ValidationError(f"{where}.measure_combine_margin", "true or false", measure)
        thr = as_float(m.get("confidence_threshold", 0.0), f"{where}.confidence_threshold")
        if not 0.0 <= thr <= 1.0:
            raise ValidationError(f"{where}.confidence_threshold", "a number in [0, 1]", thr)
        return cls(
            policy=as_str(m["policy"], f"{where}.policy"),
            models=models,
            params=dict(as_mapping(m.get("params", {}), f"{where}.params")),
            confidence_threshold=thr,
            per_user=bool(m.get("per_user", False)),
            store=store,
            seed=as_int(m.get("seed", 0), f"{where}.seed"),
            log_capacity=as_int(m.get("log_capacity", 100_000), f"{where}.log_capacity", minimum=1),
            combine_margin_ms=margin,
            measure_combine_margin=measure,
        )


def selection_services(service: Any) -> dict[str, SelectionService]:
    """The selection services of ``service``'s apps, by app name (created on first use)."""
    reg: dict[str, SelectionService] | None = getattr(service, "selection_services", None)
    if reg is None:
        reg = {}
        service.selection_services = reg
    return reg


def build_policy(name: str, spec: SelectionAppSpec, host: Any) -> Any:
    """``spec``'s policy, resolved in ``host``'s registry (built-ins and plugins); its errors
    name the deployment field (``apps.<name>.selection.policy`` / ``.params``).
    ``start_service`` calls this before it starts any replica."""
    where = f"apps.{name}.selection"
    try:
        return make_policy(
            {"policy": spec.policy, "models": list(spec.models), **dict(spec.params)},
            rng=random.Random(spec.seed),
            factories=host.selection_policies(),
        )
    except ValidationError as e:
        field = e.field if e.field in ("policy", "models") else "params"
        if field == "params" and e.field and " " not in e.field:  # a named parameter
            field = f"params.{e.field}"
        raise ValidationError(f"{where}.{field}", e.expected, e.got) from None


class EnsemblePipeline:
    """The pipeline of a selection app: one ``SelectionService.predict`` per query, combined
    at arrival + SLO minus the combine/return allowance (measured on this app's answers)."""

    def __init__(
        self, sel: SelectionService, allowance: CombineAllowance, clock: Callable[[], float]
    ) -> None:
        self.sel = sel
        self.allowance = allowance
        self.state: AllowanceState = allowance.init()
        self._clock = clock

    def margin_s(self, slo_s: float) -> float:
        """How long before a query's deadline it is combined now."""
        return self.allowance.margin_s(self.state, slo_s)

    async def __call__(self, x: Any, ctx: Any) -> dict[str, Any] | DefaultAnswer:
        user = current_user.get()
        combine_at = ctx.deadline - self.margin_s(ctx.deadline - ctx.arrival)
        p = await self.sel.predict(x, deadline=combine_at, user=user, call=ctx.predict)
        out = p.to_dict()
        out["selection_query_id"] = out.pop("query_id")
        out["user"] = user
        # how long after its combine target this answer leaves (negative, and ignored, when
        # every model answered before it)
        self.state = self.allowance.observe(self.state, self._clock() - combine_at)
        if p.default:  # said at the top of the response and counted in /metrics, too
            return DefaultAnswer(out, p.default_explanation or "selection default", "selection")
        return out


def make_selection_app(
    service: Any,
    name: str,
    spec: SelectionAppSpec,
    dispatcher: Any,
    slo_s: float,
    *,
    host: Any,
    known_models: Any = None,
    cache: Any = None,
    **app_kw: Any,
) -> Any:
    """An ``App`` that runs ``spec``'s policy over its models through ``dispatcher``; its
    ``SelectionService`` is registered in ``selection_services(service)`` under ``name``.
    ``host``: the plugin host whose registry resolves the policy (the caller's, passed in so
    that third-party policies resolve the same everywhere). ``app_kw`` go to ``App``
    (``default_output``, ``input_spec``, ...); the app's default output is also what a
    low-confidence answer falls back to."""
    if known_models is not None:
        unknown = sorted(set(spec.models) - set(known_models))
        if unknown:
            raise ValidationError(
                f"apps.{name}.selection.models",
                f"models of the deployment {sorted(known_models)!r}",
                unknown,
            )
    policy = build_policy(name, spec, host)
    sel = SelectionService(
        name,
        policy,
        None,
        config=SelectionConfig(
            confidence_threshold=spec.confidence_threshold,
            default_output=app_kw.get("default_output"),
            per_user=spec.per_user,
            log_capacity=spec.log_capacity,
        ),
        store=open_store(spec.store),
        clock=dispatcher.clock,
    )
    selection_services(service)[name] = sel

    pipeline = EnsemblePipeline(sel, spec.allowance(), dispatcher.clock)
    service.ensemble_pipelines = {**getattr(service, "ensemble_pipelines", {}), name: pipeline}

    async def close_store() -> None:
        sel.store.close()

    service.on_close(close_store)
    return App.from_pipeline(
        name,
        pipeline,
        dispatcher,
        slo_s,
        cache=cache,
        **{**app_kw, "models": tuple(spec.models)},
    )
