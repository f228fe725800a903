"""Attaching inferline to a running Triton or TF Serving deployment, as plain functions.

The steps ``inferline attach`` runs, for operations scripts (``docs/operations-script.md``)::

    att = await attach("tfserving://10.0.0.5:8501", models=["resnet"])   # discover + adopt
    prof = await profile_attachment(att)                  # through the live server
    plan = plan_attachment(att, pipeline, prof.profiles, trace, slo_s=0.2)
    svc, door = await start_attachment_service(att, plan, pipeline)    # queue + front doors
    ...                                                   # serve (serve_attachment does HTTP)
    await att.backend.restore_operator_settings(); await svc.close()  # settings back; models stay

Nothing restarts the backend: models are adopted as they are (``adopt``), profiled on the
replicas they already have, and the plan is applied in place (replica counts through the
adapter, batch sizes in inferline's queue). Each configuration change is reported to the
plugins' ``inferline_on_config_change`` observers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferline.core import (
    InferlineError,
    ModelConfig,
    NodeInventory,
    Pipeline,
    Plan,
    PlannerOptions,
    ValidationError,
    nodes_from_dicts,
    plan_inferline,
)
from inferline.deploy._batching import planned_policy
from inferline.deploy._fleet_plan import fleet_planner_options, fleet_profiles, place_on_fleet
from inferline.deploy._planned import check_stages_served
from inferline.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S, App, Service
from inferline.server.frontdoors import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_ROWS,
    FrontDoor,
    Signature,
    TensorInfo,
    check_max_rows,
)

__all__ = [
    "Attachment",
    "AttachmentTarget",
    "apply_attachment_plan",
    "attach",
    "dag_pipeline",
    "plan_attachment",
    "serve_attachment",
    "start_attachment_service",
]

log = logging.getLogger(__name__)

_TF = {
    "DT_FLOAT": "float32",
    "DT_DOUBLE": "float64",
    "DT_INT32": "int32",
    "DT_INT64": "int64",
    "DT_UINT8": "uint8",
    "DT_INT8": "int8",
    "DT_INT16": "int16",
    "DT_BOOL": "bool",
    "DT_HALF": "float16",
    "DT_STRING": "object",
}
_KS = {
    "FP32": "float32",
    "FP64": "float64",
    "FP16": "float16",
    "INT32": "int32",
    "INT64": "int64",
    "INT8": "int8",
    "INT16": "int16",
    "UINT8": "uint8",
    "BOOL": "bool",
    "BYTES": "object",
}


@dataclass
class Attachment:
    """A backend attached to a running server, and what was found there."""

    url: str
    backend: Any
    host: Any
    models: dict[str, ModelConfig] = field(default_factory=dict)  # adopted: name -> config
    signatures: dict[str, Signature] = field(default_factory=dict)
    found: dict[str, dict[str, Any]] = field(default_factory=dict)  # every model discovered

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "found": self.found,
            "adopted": {k: v.to_dict() for k, v in self.models.items()},
            "signatures": {k: v.to_dict() for k, v in self.signatures.items()},
        }


@dataclass(frozen=True)
class AttachmentTarget:
    """The plan target of a service over an attached server: the attached models move in
    place (``apply_attachment_plan``)."""

    attachment: Attachment

    async def apply(self, service: Service, plan: Plan) -> dict[str, str]:
        return await apply_attachment_plan(service, self.attachment, plan)


def _normalize(name: str, info: Any) -> tuple[dict[str, Any], Signature | None]:
    """A discovered model (Triton's ``TritonModelInfo``, TF Serving's dict, or any other
    adapter's ``{"ready": bool, ...}``) as a summary and a signature."""
    if isinstance(info, Mapping) and "ready" in info and "servers" not in info:
        ready = info["ready"]
        if not isinstance(ready, bool):
            raise ValidationError(f"discover()[{name!r}].ready", "true or false", ready)
        return {
            "name": name,
            "ready": ready,
            "state": str(info.get("state", "READY" if ready else "UNAVAILABLE")),
            "max_batch_size": info.get("max_batch_size"),
        }, None
    if isinstance(info, Mapping) and "servers" in info:  # TF Serving
        states = sorted({s["state"] for st in info["servers"].values() for s in st})
        sig = None
        sigs = info.get("signatures") or {}
        sd = sigs.get("serving_default") or (next(iter(sigs.values())) if sigs else None)
        if sd:

            def t(alias: str, d: Mapping[str, Any]) -> TensorInfo:
                shape = d.get("shape") or [-1]
                return TensorInfo(
                    alias, _TF.get(d.get("dtype", ""), "float32"), tuple(int(s) for s in shape[1:])
                )

            sig = Signature(
                tuple(t(a, d) for a, d in sorted(sd["inputs"].items())),
                tuple(t(a, d) for a, d in sorted(sd["outputs"].items())),
            )
        ready = "AVAILABLE" in states
        return {
            "name": name,
            "ready": ready,
            "state": ",".join(states),
            "servers": sorted(info["servers"]),
            "base_path": info.get("base_path"),
        }, sig
    # Triton
    io = getattr(info, "io", None)
    sig = None
    if io is not None:
        sig = Signature(
            tuple(
                TensorInfo(s.name, _KS.get(s.datatype, "float32"), tuple(s.dims)) for s in io.inputs
            ),
            tuple(
                TensorInfo(s.name, _KS.get(s.datatype, "float32"), tuple(s.dims))
                for s in io.outputs
            ),
        )
    state = str(getattr(info, "state", ""))
    return {
        "name": name,
        "ready": state == "READY",
        "state": state,
        "instances": getattr(info, "instances", None),
        "max_batch_size": getattr(info, "max_batch_size", None),
    }, sig


async def attach(
    url: str | Sequence[str],
    *,
    models: Sequence[str] | None = None,
    host: Any = None,
    **options: Any,
) -> Attachment:
    """Connect to the server at ``url`` (any backend whose adapter offers ``discover()`` and
    ``adopt()``), discover its models and adopt the ready ones (or just ``models``). A list
    of URLs is a fleet: a model is adopted on every server with it ready (docs/fleets.md)."""
    from inferline.deploy._build import open_backend, plugin_host

    host = host if host is not None else plugin_host()
    backend = open_backend(host, url if isinstance(url, str) else list(url), **options)
    url = url if isinstance(url, str) else str(backend.url)  # a fleet: the URLs' JSON list
    if not all(callable(getattr(backend, f, None)) for f in ("discover", "adopt")):
        raise ValidationError("backend", "an adapter with discover() and adopt() (attachable)", url)
    att = Attachment(url, backend, host)
    if models and hasattr(backend, "extra_models"):
        # a server that cannot list its models (TF Serving without a config file) is asked
        # about the named ones
        backend.extra_models = tuple(dict.fromkeys([*backend.extra_models, *models]))
    try:
        found = await backend.discover()
        sigs = {}
        for name, info in found.items():
            att.found[name], sig = _normalize(name, info)
            if sig is not None:
                sigs[name] = sig
        wanted = list(models) if models else [n for n, f in att.found.items() if f["ready"]]
        if not wanted:
            # an empty attachment would serve nothing and profile nothing, and exit 0
            cannot_list = hasattr(backend, "extra_models")
            raise ValidationError(
                "models",
                "the models to attach (--models M1,M2): "
                + (
                    "this server cannot list its models (TF Serving without a model config)"
                    if cannot_list and not found
                    else "the server has no ready model"
                ),
                {n: f["ready"] for n, f in att.found.items()} or url,
            )
        unknown = [m for m in wanted if m not in att.found or not att.found[m]["ready"]]
        if unknown:
            from inferline.core import NotFoundError

            raise NotFoundError(
                "ready model", unknown, sorted(n for n, f in att.found.items() if f["ready"])
            )
        for name in wanted:
            cfg = await backend.adopt(name)
            att.models[name] = cfg
            if name in sigs:
                att.signatures[name] = sigs[name]
            host.notify_config(name, None, cfg, backend=url, reason="attach")
    except BaseException:
        await backend.close()
        raise
    return att


def _with_inventory(
    backend: Any, options: PlannerOptions, pipeline: Pipeline, catalog: Any
) -> PlannerOptions:
    """``options`` with the backend's inventory, unless it has one already or the backend
    oversubscribes. A fleet gives one per server, a backend with a per-node view (``ray://``)
    one per alive node: the plan bins into them (a replica cannot span nodes); on Ray a GPU
    replica holds its ``replica_units`` of ``cpu`` too. Others give their flat totals."""
    if options.inventory or options.nodes or getattr(backend, "oversubscribe", 0):
        return options
    units = getattr(backend, "replica_units", dict)()
    if (per_server := fleet_planner_options(backend, options, catalog, units)) is not None:
        return per_server
    nodes = getattr(backend, "nodes", None)
    if callable(nodes):
        units = dict(options.replica_units) or units  # a Ray replica's threads: the caller's
        per_node = nodes_from_dicts([n.to_dict() for n in nodes()], "backend.nodes()")
        per_node = tuple(
            NodeInventory(n.name, {h: k for h, k in n.hardware.items() if h in catalog})
            for n in per_node
        )
        host = {m: units.get(m, 1) for m in pipeline.models}
        host.update(options.gpu_host_units)
        return replace(options, nodes=per_node, replica_units=units, gpu_host_units=host)
    has = getattr(backend, "inventory", None)  # attach-only plugins may not say
    if has is None:
        return options
    inventory = {h: n for h, n in has().items() if h in catalog}
    return replace(options, inventory=inventory, replica_units=units)


def plan_attachment(
    att: Attachment,
    pipeline: Pipeline,
    profiles: Any,
    trace: np.ndarray,
    slo_s: float,
    **kw: Any,
) -> Plan:
    """InferLine's planner over the attached models, with the plugins' hardware catalog, within
    the backend's inventory unless it oversubscribes (a plan it cannot place would fail)."""
    missing = [m for m in pipeline.models if m not in att.models]
    if missing:
        raise ValidationError("pipeline.models", f"attached models {sorted(att.models)}", missing)
    catalog = kw.setdefault("catalog", att.host.hardware_catalog())
    profiles = fleet_profiles(att.backend, profiles)  # a fleet: the hop to its servers
    options = kw.get("options") or PlannerOptions()
    options = kw["options"] = _with_inventory(att.backend, options, pipeline, catalog)
    sharing = getattr(att.backend, "core_sharing", None)
    est = options.estimator
    if sharing is not None and not options.nodes and not est.shared_units and not est.pinned_cores:
        # cores shared as the backend places replicas (oversubscribed: pinned together)
        found = {k: {h: n for h, n in v.items() if h in catalog} for k, v in sharing().items()}
        kw["options"] = replace(options, estimator=replace(est, **found))
    return plan_inferline(pipeline, profiles, np.asarray(trace, dtype=float), slo_s, **kw)


def dag_pipeline(pipeline: Pipeline) -> Callable[[Any, Any], Awaitable[Any]]:
    """A pipeline function for a DAG: roots get the query, a model with one parent gets its
    output (several parents: the list of their outputs); answers the sink's output (a dict by
    model when there are several sinks). Every model is visited (scale factors describe
    traffic for planning; conditional control flow needs a pipeline function of your own)."""
    parents: dict[str, list[str]] = {m: [] for m in pipeline.models}
    for a, b in pipeline.edges:
        parents[b].append(a)
    children = {a for a, _ in pipeline.edges}
    sinks = [m for m in pipeline.models if m not in children]

    async def run(x: Any, ctx: Any) -> Any:
        futs: dict[str, asyncio.Future[Any]] = {}

        async def visit(m: str) -> Any:
            ps = parents[m]
            if not ps:
                arg = x
            else:
                outs = [await futs[p] for p in ps]
                arg = outs[0] if len(outs) == 1 else outs
            return await ctx.predict(m, arg)

        for m in pipeline.models:  # DAG order: Pipeline validates it is acyclic
            futs[m] = asyncio.ensure_future(visit(m))
        try:
            results = {m: await futs[m] for m in sinks}
        finally:
            for f in futs.values():
                f.cancel()
        return results[sinks[0]] if len(sinks) == 1 else results

    return run


def check_pipeline_io(pipeline: Pipeline, signatures: Mapping[str, Signature]) -> None:
    """Refuse a pipeline edge whose model output cannot be the next model's input: bytes into
    a numeric input or the other way round, or a different number of elements where both
    are fixed. Before, such a pipeline started and every query failed with a 422. Only the
    one-output -> one-input case is checked (several tensors travel as a dict by name)."""
    for i, (a, b) in enumerate(pipeline.edges):
        sa, sb = signatures.get(a), signatures.get(b)
        if sa is None or sb is None or len(sa.outputs) != 1 or len(sb.inputs) != 1:
            continue
        out, inp = sa.outputs[0], sb.inputs[0]
        text_out, text_in = out.dtype == "object", inp.dtype == "object"
        n_out = math.prod(out.shape) if all(d >= 0 for d in out.shape) else None
        n_in = math.prod(inp.shape) if all(d >= 0 for d in inp.shape) else None
        if text_out != text_in or (n_out is not None and n_in is not None and n_out != n_in):
            raise ValidationError(
                f"pipeline.edges[{i}] ({a} -> {b})",
                f"{b}'s input {inp.name} ({inp.dtype} {list(inp.shape)})",
                f"{a}'s output {out.name} ({out.dtype} {list(out.shape)})",
            )


async def apply_attachment_plan(svc: Service, att: Attachment, plan: Plan) -> dict[str, str]:
    """Move the attached models to ``plan`` in place: replica counts through the adapter,
    batch sizes in the queue. Hardware changes are not made (the server's placement is the
    operator's); each change is reported to the plugins' observers."""
    check_stages_served(plan)
    unknown = sorted(set(plan.models) - set(att.models))
    if unknown:  # before anything changes: silently skipped before
        raise ValidationError("plan.models", f"attached models {sorted(att.models)}", unknown)
    done: dict[str, str] = {}
    # an attached model the plan leaves out keeps its configuration, and the answer says so
    in_force = {**att.models, **plan.models}
    for name, cfg in att.models.items():
        if name not in plan.models:
            done[name] = (
                f"kept: not in the plan ({cfg.replicas} replicas, max batch {cfg.max_batch_size})"
            )
    reconfigure = getattr(att.backend, "reconfigure", None)
    place_on_fleet(att.backend, plan.models, att.host)  # a fleet: the plan's replicas per server
    for name, cfg in plan.models.items():
        old = att.models[name]
        notes = []
        if cfg.hardware != old.hardware:
            notes.append(f"stays on {old.hardware} (plan says {cfg.hardware})")
        replicas = old.replicas
        try:
            # the server's model must take the planned batch in one request (else the
            # queue's batch is split); a smaller one fits, and the operator's setting stays
            server_max = int((await att.backend.stats(name)).get("max_batch_size", 0) or 0)
            if reconfigure is not None and cfg.max_batch_size > server_max > 0:
                await reconfigure(name, ModelConfig(old.hardware, cfg.max_batch_size, cfg.replicas))
                notes.append(f"server max batch {server_max} -> {cfg.max_batch_size}")
                replicas = cfg.replicas
            elif cfg.replicas != old.replicas:
                await att.backend.scale(name, cfg.replicas)
                replicas = cfg.replicas
            if replicas != old.replicas:
                notes.append(f"{replicas} replicas")
        except InferlineError as e:
            notes.insert(0, f"failed: kept {old.replicas} replicas ({type(e).__name__}: {e})")
            log.warning("could not apply the plan to %r: %s", name, e)
        if svc.dispatcher is not None:
            # an attachment names no policies of its own: the plan decides, as for a
            # deployment without "batching" (its batch wait gives delayed batching)
            svc.dispatcher.set_batching(name, planned_policy(cfg))
        notes.append(f"max batch {cfg.max_batch_size}")
        if cfg.batch_wait_ms > 0:
            notes.append(f"batch wait {cfg.batch_wait_ms:g} ms")
        new = ModelConfig(
            old.hardware, cfg.max_batch_size, replicas, batch_wait_ms=cfg.batch_wait_ms
        )
        att.models[name] = new
        in_force[name] = new
        att.host.notify_config(name, old, new, backend=att.url, reason="plan applied")
        done[name] = ", ".join(notes)
    svc.plan = plan.with_models(in_force)
    return done


async def start_attachment_service(
    att: Attachment,
    plan: Plan | None = None,
    pipeline: Pipeline | None = None,
    *,
    pipeline_fn: Callable[[Any, Any], Awaitable[Any]] | None = None,
    app: str = "pipeline",
    slo_s: float | None = None,
    max_queue: int = 1000,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> tuple[Service, FrontDoor]:
    """The interposed queue over the attached models (one puller per live replica), the
    plan applied, and an app running the pipeline; plus the front door for protocol routes.
    ``max_rows``: the most rows one request may carry, on every door and the app's route."""
    from inferline.deploy._build import new_service
    from inferline.queueing import FixedBatching

    check_max_rows(max_rows)  # before anything starts

    if pipeline is not None:  # before anything starts
        check_pipeline_io(pipeline, att.signatures)
    svc = new_service(att.backend, att.host, att.models, plan_target=AttachmentTarget(att))
    d = svc.dispatcher
    assert d is not None
    for name, cfg in att.models.items():
        b = (
            plan.models[name].max_batch_size
            if plan is not None and name in plan.models
            else cfg.max_batch_size
        )
        d.add_model(name, batching=FixedBatching(b), max_queue=max_queue)
    d.attach(att.backend)
    sigs = dict(att.signatures)
    try:
        if plan is not None:
            for name, what in (await apply_attachment_plan(svc, att, plan)).items():
                log.info("%s: %s", name, what)
        fn = pipeline_fn or (dag_pipeline(pipeline) if pipeline is not None else None)
        if fn is not None:
            slo = slo_s if slo_s is not None else (plan.slo_s if plan is not None else 1.0)
            svc.add_app(
                App.from_pipeline(
                    app, fn, d, slo, models=tuple(att.models), max_batch_inputs=max_rows
                )
            )
            if pipeline is not None:
                roots = [m for m in pipeline.models if not any(b == m for _, b in pipeline.edges)]
                sinks = [m for m in pipeline.models if not any(a == m for a, _ in pipeline.edges)]
                if len(roots) == 1 and len(sinks) == 1 and roots[0] in sigs and sinks[0] in sigs:
                    sigs[app] = Signature(sigs[roots[0]].inputs, sigs[sinks[0]].outputs)
    except BaseException:
        await svc.close()
        raise
    model_slo_s = slo_s or (plan.slo_s if plan is not None else 1.0)
    return svc, FrontDoor(svc, sigs, model_slo_s=model_slo_s, max_rows=max_rows)


async def serve_attachment(
    svc: Service,
    door: FrontDoor,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    grpc_port: int | None = 0,
    grpc_max_inflight: int = DEFAULT_MAX_INFLIGHT,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    door_workers: int = 0,  # HTTP door worker processes (ServeSettings.door_workers)
    ready: Callable[[dict[str, Any]], None] | None = None,
    stop: asyncio.Event | None = None,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    allowed_hosts: Sequence[str] | None = None,
    restore_on_exit: bool = False,
    restored: Callable[[], None] | None = None,
) -> None:
    """Serve ``svc`` over HTTP (inferline's routes plus the KServe v2 and TF Serving front
    doors) and, unless ``grpc_port`` is None, gRPC front doors; until ``stop`` is set.

    A backend that can put the operator's settings back (``restore_operator_settings``) gets
    ``POST /admin/detach``: restore, then stop. ``restore_on_exit``: restore too when serving
    stops otherwise (SIGTERM, SIGINT, ``stop``); ``restored()`` is called once it is done."""
    from inferline.deploy._serve import bind, run_http, start_grpc
    from inferline.deploy._settings import ServeSettings
    from inferline.server.frontdoors import make_kserve_router, make_tfserving_router

    settings = ServeSettings(
        host=host,
        port=port,
        token=token,
        max_body_bytes=max_body_bytes,
        allowed_hosts=None if allowed_hosts is None else tuple(allowed_hosts),
        grpc_port=grpc_port,
        grpc_max_inflight=grpc_max_inflight,
        read_timeout_s=read_timeout_s,
        tuner=None,
        door_workers=door_workers,
    )
    stop = stop if stop is not None else asyncio.Event()
    restorer = _Restorer(svc.backend, stop, restored)
    sock = bind(settings)
    shown = host if ":" not in host else f"[{host}]"
    try:
        g = await start_grpc(door, settings)
    except BaseException:
        sock.close()
        raise
    info = {
        "url": f"http://{shown}:{sock.getsockname()[1]}",
        "grpc": None if g is None else f"{shown}:{g.port}",
        "grpc_services": [] if g is None else g.services,
        "apps": sorted(svc.apps),
        "models": sorted(svc.models),
    }
    routers = [restorer.admin_router, make_kserve_router(door), make_tfserving_router(door)]
    try:
        await run_http(
            svc, sock, settings, routers, g, None if ready is None else lambda: ready(info), stop
        )
    finally:
        if restore_on_exit:
            await restorer.restore()


async def _finish(coro: Awaitable[None]) -> None:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile (SIGINT cancels the
    main task while the restore runs: the server was left half restored); the cancellation
    is raised once it is done."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        task.result()  # its own failure first
        raise asyncio.CancelledError
    task.result()


class _Restorer:
    """Puts the operator's settings back once, on ``POST /admin/detach`` (then stops the
    server) or when serving stops; any backend with ``restore_operator_settings``."""

    def __init__(
        self, backend: Any, stop: asyncio.Event, restored: Callable[[], None] | None
    ) -> None:
        self.backend = backend
        self.stop = stop
        self.restored = restored
        self.done = False
        self._lock = asyncio.Lock()

    @property
    def can(self) -> bool:
        return callable(getattr(self.backend, "restore_operator_settings", None))

    async def restore(self) -> None:
        async with self._lock:  # a detach request and a SIGTERM at once restore once
            if self.done or not self.can:
                return
            try:
                await _finish(self.backend.restore_operator_settings())
            except asyncio.CancelledError:  # raised once restored (SIGINT meanwhile)
                self._done()
                raise
            self._done()

    def _done(self) -> None:
        self.done = True
        log.info("restored the operator's settings on %s", getattr(self.backend, "url", ""))
        if self.restored is not None:
            self.restored()

    async def detach(self) -> dict[str, Any]:
        await self.restore()
        self.stop.set()
        return {"backend": str(getattr(self.backend, "url", ""))}

    def admin_router(self, svc: Service) -> Any:
        from inferline.server import make_admin_router

        return make_admin_router(svc, self.detach if self.can else None)
