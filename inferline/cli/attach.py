"""``inferline attach URL`` and ``inferline plugins``.

``attach`` connects to a running Triton or TF Serving deployment, discovers the served models,
profiles them through the live server and prints what it found. With ``--pipeline``,
``--slo-ms`` and ``--trace`` it also plans and starts serving through inferline (HTTP, plus the
KServe v2 and TF Serving front doors over HTTP and gRPC) without restarting the backend.
Serving, it first writes the operator's settings to ``--snapshot`` and puts them back when it
stops (SIGTERM, SIGINT or ``inferline detach``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferline.cli._args import count, output_path, slo_ms
from inferline.cli._estimator_args import rate_margin as _rate_margin
from inferline.cli._server_args import add_listen_args
from inferline.cli._steer_args import add_steer_args, check_steer_args
from inferline.core import (
    Pipeline,
    Plan,
    PlannerOptions,
    ValidationError,
    load_json,
    load_pipeline,
    load_plan,
    load_trace,
    save,
)

__all__ = ["TOKEN_ENV", "register"]

TOKEN_ENV = "INFERLINE_TOKEN"
SNAPSHOT_DEFAULT = "inferline-attach-snapshot.json"


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise ValidationError("--option", "KEY=VALUE", p)
        val: Any = v
        if v.lstrip("-").isdigit():
            val = int(v)
        elif v.lower() in ("true", "false"):
            val = v.lower() == "true"
        else:
            try:
                val = float(v)
            except ValueError:
                val = v
        out[k] = val
    return out


def _server_url(text: str) -> str:
    """``attach``'s URL: every host's port, where one is given, in [1, 65535]. Checked here, as
    every option is: the backend refused it only once built, naming its own ``url`` field."""
    for host in urlsplit(text).netloc.split(","):  # TF Serving takes several hosts
        try:
            port = urlsplit(f"//{host}").port
        except ValueError:  # not a number or out of range
            port = 0
        if port == 0:
            raise argparse.ArgumentTypeError(
                f"expected a URL with ports in [1, 65535], got {text!r}"
            )
    return text


class _UrlsAction(argparse.Action):
    """``url``: one URL stays a string (as the steer path and scripts read it); several are
    a fleet's list."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def _urls(url: str | list[str]) -> list[str]:
    return url if isinstance(url, list) else [url]


def _write_snapshot(backend: Any, path: str) -> str | None:
    """The operator's settings as inferline found them, written before anything changes, so
    ``inferline detach URL --snapshot PATH`` can put them back after a crash; None where the
    backend cannot restore (then nothing is written)."""
    take = getattr(backend, "operator_snapshot", None)
    if not callable(take):
        return None
    try:
        snapshot = take()
    except NotImplementedError:
        return None
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(snapshot, indent=2) + "\n")
    os.replace(tmp, out)  # never a half-written snapshot
    print(f"inferline: the operator's settings are in {out} (inferline detach restores them)")
    return str(out)


def _restored(snapshot: str | None) -> None:
    """Restored on stop: the snapshot is spent (a stale one would undo later changes)."""
    print("inferline: restored the operator's settings", flush=True)
    if snapshot:
        Path(snapshot).unlink(missing_ok=True)


def _print_found(att: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"models at {att.url}")
    for col in ("model", "state", "adopted", "replicas", "inputs", "outputs"):
        t.add_column(col)
    for name, f in sorted(att.found.items()):
        cfg = att.models.get(name)
        sig = att.signatures.get(name)

        def desc(ts: Any) -> str:
            return ", ".join(f"{x.name}:{x.dtype}{list(x.shape)}" for x in ts)

        t.add_row(
            name,
            f.get("state", ""),
            "yes" if cfg else "no",
            "" if cfg is None else f"{cfg.replicas} x {cfg.hardware}",
            desc(sig.inputs) if sig else "?",
            desc(sig.outputs) if sig else "?",
        )
    Console(width=max(100, Console().width)).print(t)


def _attach(args: argparse.Namespace) -> int:
    from inferline.cli._server_args import warn_open_host
    from inferline.server import run_loop

    if args.steer and isinstance(args.url, list):  # steering tunes one server's batchers
        raise ValidationError("url", "one server URL with --steer (a fleet: without it)", args.url)
    if args.steer:
        check_steer_args(args)
    elif args.pipeline and not (args.slo_ms and (args.trace or args.plan)):
        raise ValidationError("--pipeline", "--slo-ms and --trace (or --plan) with it", None)
    opts = _options(args.option or [])
    if "models" in opts:  # attach's own flag names the models (and tells discovery of them)
        raise ValidationError("--option models", "--models M1,M2 instead", opts["models"])
    models = [m for m in (args.models or "").split(",") if m] or None
    inputs = _load_inputs(args.inputs)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    warn_open_host(args.host, token)
    if args.steer:
        if args.metrics_url:
            opts["metrics_url"] = args.metrics_url
        return int(run_loop(_steer_main(args, opts, inputs, token)))
    return int(run_loop(_attach_main(args, models, opts, inputs, token)))


def _load_inputs(path: str | None) -> dict[str, Any] | None:
    """``--inputs``: sample inputs per model, read before connecting so a bad file fails fast."""
    if not path:
        return None
    raw = load_json(path)
    if not isinstance(raw, dict):
        raise ValidationError(path, "a JSON object {model: [inputs...]}", type(raw).__name__)
    return raw


async def _attach_main(
    args: argparse.Namespace,
    models: list[str] | None,
    opts: dict[str, Any],
    inputs: dict[str, Any] | None,
    token: str | None,
) -> int:
    """Discover, profile and (with ``--pipeline``) plan and serve; whatever happens, the
    connection to the backend is closed (by the service once one runs, which owns it then)."""
    from inferline.deploy import attach

    # several URLs (a list): a fleet, each model adopted on every server that serves it
    att = await attach(args.url, models=models, **opts)
    svc = None
    try:
        _report_found(att, args.summary_out)
        prof = await _profile(att, inputs, args)
        if not args.pipeline:
            return 0
        pipeline = load_pipeline(args.pipeline)
        plan = _plan_pipeline(att, pipeline, prof, args)
        svc, door, snapshot = await _start_service(att, plan, pipeline, args)
        if args.dry_run:
            return 0
        await _serve(svc, door, snapshot, args, token)
        return 0
    finally:
        if svc is not None:
            await svc.close()
        else:
            await att.backend.close()


def _report_found(att: Any, summary_out: str | None) -> None:
    """Print the discovered models and, with ``--summary-out``, write them as JSON."""
    _print_found(att)
    if summary_out:
        Path(summary_out).write_text(json.dumps(att.summary(), indent=2, default=str) + "\n")


async def _profile(att: Any, inputs: dict[str, Any] | None, args: argparse.Namespace) -> Any:
    """Profile the adopted models through the live server; None with ``--no-profile`` or
    when nothing was adopted."""
    from inferline.measure import ProfilerOptions, print_fits, profile_attachment

    if args.no_profile or not att.models:
        return None
    po = ProfilerOptions(
        max_batch_size=args.max_batch,
        warmup=1 if args.quick else 5,
        min_samples=5 if args.quick else 50,
        max_samples=10 if args.quick else 400,
        max_seconds_per_point=0.5 if args.quick else 4.0,
        wake_samples=5 if args.quick else 20,
    )
    prof = await profile_attachment(att, inputs, po, samples=args.samples)
    print_fits(prof)
    if args.profiles_out:
        save(prof.profiles, args.profiles_out)
        print(f"wrote profiles of {len(prof.profiles.models)} models to {args.profiles_out}")
    return prof


def _plan_pipeline(att: Any, pipeline: Pipeline, prof: Any, args: argparse.Namespace) -> Plan:
    """``--plan`` as given, or a plan made from the profiles and ``--trace``; printed either
    way so the operator sees what is about to be applied."""
    from inferline.deploy import plan_attachment

    if args.plan:
        plan = load_plan(args.plan)
    else:
        if prof is None:
            raise ValidationError("--no-profile", "profiles to plan with (or --plan)", None)
        plan = plan_attachment(
            att,
            pipeline,
            prof.profiles,
            load_trace(args.trace),
            args.slo_ms / 1e3,
            options=PlannerOptions(rate_margin=args.rate_margin),
        )
        if args.plan_out:
            save(plan, args.plan_out)
    for m, cfg in plan.models.items():
        print(f"plan: {m}: {cfg.replicas} x {cfg.hardware}, max batch {cfg.max_batch_size}")
    print(
        f"plan: cost ${plan.cost_per_hour:.3f}/h, estimated P{plan.percentile:g} {plan.estimated_latency_s * 1e3:.1f} ms"
    )
    return plan


async def _start_service(
    att: Any, plan: Plan, pipeline: Pipeline, args: argparse.Namespace
) -> tuple[Any, Any, str | None]:
    """Snapshot the operator's settings, then apply the plan and build the service (before
    binding, so ``--dry-run`` stops here); returns the service, its front door and the
    snapshot's path."""
    from inferline.core import import_object
    from inferline.deploy import start_attachment_service

    fn = import_object(args.pipeline_fn, "--pipeline-fn") if args.pipeline_fn else None
    snapshot = _write_snapshot(att.backend, args.snapshot or SNAPSHOT_DEFAULT)
    svc, door = await start_attachment_service(
        att,
        plan,
        pipeline,
        pipeline_fn=fn,
        app=args.app or "pipeline",
        slo_s=args.slo_ms / 1e3,
        max_rows=args.max_request_rows,  # every door's cap, the native route's too
    )
    return svc, door, snapshot


async def _serve(
    svc: Any, door: Any, snapshot: str | None, args: argparse.Namespace, token: str | None
) -> None:
    """Serve until stopped, then put the operator's settings back."""
    from inferline.deploy import serve_attachment

    await serve_attachment(
        svc,
        door,
        host=args.host,
        port=args.port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        grpc_max_inflight=args.grpc_max_inflight,
        token=token,
        max_body_bytes=args.max_body_bytes,
        door_workers=args.door_workers,
        allowed_hosts=args.allowed_hosts,
        ready=lambda info: _ready(info, snapshot, args),
        read_timeout_s=args.read_timeout_s,
        restore_on_exit=True,
        restored=lambda: _restored(snapshot),
    )


async def _steer_main(
    args: argparse.Namespace, opts: dict[str, Any], inputs: dict[str, Any] | None, token: str | None
) -> int:
    """``--steer``: discover the app (an ensemble's steps), profile, plan for the server's
    batchers, snapshot, apply through the server's API; then the loop (not with --dry-run)."""
    from inferline.deploy import (
        DriftConfig,
        apply_steer_plan,
        plan_steer,
        run_steer,
        steer_target,
    )

    pipeline = load_pipeline(args.pipeline) if args.pipeline else None
    att, target = await steer_target(args.url, args.app, pipeline, **opts)
    try:
        _report_found(att, args.summary_out)
        print(
            f"steer: {target.app}: models {list(target.pipeline.models)}, "
            f"edges {list(target.pipeline.edges)}"
        )
        prof = await _profile(att, inputs, args)
        if args.plan:
            plan = load_plan(args.plan)
        elif prof is None:
            raise ValidationError("--no-profile", "profiles to plan with (or --plan)", None)
        else:
            plan = plan_steer(
                att,
                target,
                prof.profiles,
                load_trace(args.trace),
                args.slo_ms / 1e3,
                PlannerOptions(rate_margin=args.rate_margin),
            )
            if args.plan_out:
                save(plan, args.plan_out)
        _print_steer_plan(plan)
        snap_path = args.snapshot or SNAPSHOT_DEFAULT
        snapshot = _write_snapshot(att.backend, snap_path)
        for m, what in (await apply_steer_plan(att, target, plan)).items():
            print(f"applied: {m}: {what}")
        snapshot = _write_snapshot(att.backend, snap_path)  # now with what apply first touched
        if args.dry_run:
            _ready({"url": None, "app": target.app, "models": list(plan.models)}, snapshot, args)
            return 0
        await run_steer(
            att,
            target,
            plan,
            None if prof is None else prof.profiles,
            host=args.host,
            port=args.port,
            token=token,
            tick_s=args.tick_s,
            drift=DriftConfig(mode=args.on_drift),
            seed=args.seed,
            ready=lambda info: _ready(info, snapshot, args),
            restored=lambda: _restored(snapshot),
        )
        return 0
    finally:
        await att.backend.close()


def _print_steer_plan(plan: Plan) -> None:
    for m, cfg in plan.models.items():
        b = dict(plan.server_batchers.get(m, {}))
        print(
            f"plan: {m}: {cfg.replicas} instances, max batch {cfg.max_batch_size}, preferred "
            f"{b.get('preferred_batch_size') or 'unset'}, queue delay "
            f"{b.get('max_queue_delay_microseconds', 0)} us, queue timeout "
            f"{b.get('default_timeout_microseconds', 0)} us"
        )
    print(
        f"plan: cost ${plan.cost_per_hour:.3f}/h, estimated P{plan.percentile:g} "
        f"{plan.estimated_latency_s * 1e3:.1f} ms (SLO {plan.slo_s * 1e3:.0f} ms)",
        flush=True,
    )


def _ready(info: dict[str, Any], snapshot: str | None, args: argparse.Namespace) -> None:
    """Once listening: write ``--ready-file`` (atomically: scripts poll it) and say where."""
    info["pid"] = os.getpid()
    info["snapshot"] = snapshot
    if args.ready_file:
        tmp = Path(args.ready_file).with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, args.ready_file)
    if args.steer and info["url"] is None:
        print(f"inferline: applied the plan to {info['app']} on {args.url} (dry run)", flush=True)
        return
    if args.steer:
        print(
            f"inferline: steering {info['app']} ({info['models']}) on {args.url}; "
            f"admin at {info['url']} (/metrics, /admin/drift, POST /admin/detach)",
            flush=True,
        )
        return
    print(
        f"inferline: serving {info['apps']} and models {info['models']} of "
        f"{' '.join(_urls(args.url))} "
        f"at {info['url']} (KServe v2 /v2, TF Serving /v1; gRPC {info['grpc']})",
        flush=True,
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    a = sub.add_parser(
        "attach",
        help="attach to a running Triton/TF Serving server: discover, profile, plan, serve",
        description=__doc__,
    )
    # added in this order: it is the order of ``attach --help``
    _add_discovery_options(a)
    _add_profile_options(a)
    _add_plan_options(a)
    _add_serve_options(a)
    add_steer_args(a)
    a.set_defaults(func=_attach)


def _add_discovery_options(a: argparse.ArgumentParser) -> None:
    """The server to attach to and which of its models to adopt."""
    a.add_argument(
        "url",
        type=_server_url,
        nargs="+",
        action=_UrlsAction,
        help="e.g. tfserving://host:8501, tfserving+grpc://host:8500, triton://host:8000; "
        "several (Triton and TF Serving, mixed): a fleet, each model adopted on every server "
        "that serves it, as one model with replicas on each (not with --steer)",
    )
    a.add_argument(
        "--models", default=None, help="comma-separated models to adopt (default: all ready)"
    )
    a.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="backend option (repeatable), e.g. grpc_port=8500",
    )


def _add_profile_options(a: argparse.ArgumentParser) -> None:
    """How the adopted models are profiled, and where discovery and profiles are written."""
    a.add_argument("--inputs", default=None, help="JSON {model: [sample inputs]} for profiling")
    a.add_argument(
        "--samples", type=count, default=32, help="synthetic inputs per model when no --inputs"
    )
    a.add_argument("--max-batch", type=count, default=16, help="largest profiled batch size")
    a.add_argument("--quick", action="store_true", help="few samples per point")
    a.add_argument("--no-profile", action="store_true", help="only discover")
    # outputs, ports and the SLO are checked here: attach connects, profiles and starts the
    # service before it writes, plans or binds
    a.add_argument(
        "--profiles-out",
        type=output_path(),
        default=None,
        help="write the measured profiles JSON here",
    )
    a.add_argument(
        "--summary-out", type=output_path(), default=None, help="write what was found as JSON"
    )


def _add_plan_options(a: argparse.ArgumentParser) -> None:
    """The pipeline to serve and the plan for it: given, or made from ``--trace``."""
    a.add_argument(
        "--pipeline", default=None, help="pipeline DAG JSON over the served models: plan and serve"
    )
    a.add_argument(
        "--pipeline-fn",
        default=None,
        help="module:function pipeline to serve (default: run the DAG)",
    )
    a.add_argument(
        "--app",
        default=None,
        help="app name of the served pipeline (default pipeline); with --steer the model or "
        "Triton ensemble clients call",
    )
    a.add_argument(
        "--slo-ms",
        type=slo_ms,
        default=None,
        help="latency SLO, ms, for planning and the served app (required with --pipeline)",
    )
    a.add_argument("--trace", default=None, help="sample arrival trace for planning")
    a.add_argument(
        "--rate-margin",
        type=_rate_margin,
        default="auto",
        metavar="M",
        help="plan with 1+M times the trace's rate as throughput slack; auto (the default) "
        "sizes M from the trace's variability, 0 is the paper's test (as `inferline plan`)",
    )
    a.add_argument("--plan", default=None, help="use this plan instead of planning")
    a.add_argument(
        "--plan-out",
        type=output_path(),
        default=None,
        help="write the plan made from --trace here",
    )


def _add_serve_options(a: argparse.ArgumentParser) -> None:
    """Serving: the snapshot of the operator's settings and where inferline listens."""
    a.add_argument(
        "--dry-run",
        action="store_true",
        help="plan and apply, do not serve (the plan stays applied: --snapshot has what to restore)",
    )
    a.add_argument(
        "--snapshot",
        type=output_path(),
        default=None,  # not checked unless serving (discovery alone writes nothing)
        metavar="PATH",
        help="where serving writes the operator's settings before changing them (default "
        f"{SNAPSHOT_DEFAULT}); they are put back on SIGTERM/SIGINT or `inferline detach`, "
        "and `inferline detach URL --snapshot PATH` restores them after a crash",
    )
    add_listen_args(a, grpc=True)
