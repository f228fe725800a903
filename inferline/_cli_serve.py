"""``inferline profile | deploy | serve | replay | demo``: the serving side of the CLI."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from inferline.cli import register
from inferline.core import (
    Plan,
    TunerConfig,
    ValidationError,
    load_plan,
    load_trace,
    save,
)
from inferline.core._validate import read_text

from ._cli_args import (
    body_bytes,
    count,
    http_url,
    int_in,
    number_in,
    output_folder,
    output_path,
    port,
    positive,
    slo_ms,
    too_many_arrivals,
)
from ._sim_tuning import add_ladder_knobs, ladder_knobs

log = logging.getLogger(__name__)

_TOKEN_ENV = "INFERLINE_TOKEN"


def _token(args: argparse.Namespace) -> str | None:
    return args.token or os.environ.get(_TOKEN_ENV) or None


# ---------------------------------------------------------------- profile

# batches a point takes at least (--quick: 20): --max-samples below it was refused by the
# profiler's options, naming their fields, not the flag
_MIN_SAMPLES = 50


def _profile(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ._deploy import load_deployment
    from ._profiler import ProfilerOptions
    from ._workflow import profile_deployment

    dep = load_deployment(args.deployment)
    quick = args.quick
    opts = ProfilerOptions(
        max_batch_size=args.max_batch,
        warmup=2 if quick else 5,
        min_samples=20 if quick else _MIN_SAMPLES,
        max_samples=60 if quick else args.max_samples,
        max_seconds_per_point=1.0 if quick else 4.0,
        statistic=args.statistic,
        contention=args.contention,
        hardware=tuple(args.hardware) if args.hardware else None,
        wake_idle_s=wake_idle_s(args),
        wake_samples=10 if quick else 20,
    )
    console = Console(stderr=True)
    stages = None
    if args.variants:
        from inferline.core import PipelineVariants, load_json

        try:
            doc = PipelineVariants.from_dict(load_json(args.variants))
        except ValidationError as e:
            raise ValidationError(f"{args.variants}: {e.field}", e.expected, e.got) from None
        stages = {s: [v.name for v in sv.variants] for s, sv in doc.stages.items()}
        unknown = sorted({n for ns in stages.values() for n in ns} - {m.name for m in dep.models})
        if unknown:
            raise ValidationError(
                f"{args.variants}: stages", f"variants that are models of {dep.name!r}", unknown
            )
    samples = None
    if args.samples is not None:
        samples = dep.load_sample_inputs()[: args.samples]
    with Progress(
        TextColumn("[bold]profiling[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("tracing the pipeline", total=None)

        def progress(model: str, hw: str, b: int, done: int, total: int) -> None:
            bar.update(task, description=f"{model} on {hw}, batch {b}", completed=done, total=total)

        try:
            result, pipeline = run(
                profile_deployment(
                    dep, opts, app=args.app, samples=samples, progress=progress, stages=stages
                )
            )
        except ValidationError as e:
            # the profiler checks the kinds against the backend's, which exists only by now
            if e.field != "hardware" or not args.hardware:
                raise
            raise ValidationError("--hardware", e.expected, e.got) from None
    save(result.profiles, args.output)
    print(f"wrote profiles of {len(result.profiles.models)} models to {args.output}")
    if args.pipeline_out:
        save(pipeline, args.pipeline_out)
        print(f"wrote pipeline {pipeline.name!r} to {args.pipeline_out}")
    if args.fits_out:
        Path(args.fits_out).write_text(
            json.dumps([f.to_dict() for f in result.fits], indent=2) + "\n"
        )
    print_fits(result, console=None)
    return 0


def print_fits(result: Any, console: Any = None) -> None:
    """The latency-vs-batch-size fits as a table (one row per model and hardware)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="batch latency fit (quantile regression: latency = intercept + slope x batch)")
    for col in ("model", "hw", "batch", "p50@min", "p50@max", "fixed", "per item", "R1"):
        t.add_column(col, justify="right" if col not in ("model", "hw") else "left", no_wrap=True)
    t.add_column("linear?", justify="left", no_wrap=True)
    for f in result.fits:
        if f.quantile != 0.5:
            continue
        prof = result.profiles.models[f.model][f.hardware]
        sizes = sorted(prof)
        p50 = [prof[b].p50_s or prof[b].latency_s for b in (sizes[0], sizes[-1])]
        t.add_row(
            f.model,
            f.hardware,
            f"{sizes[0]}..{sizes[-1]}",
            f"{p50[0] * 1e3:.2f} ms",
            f"{p50[1] * 1e3:.2f} ms",
            f"{f.intercept_s * 1e3:.2f} ms",
            f"{f.slope_s * 1e3:.3f} ms",
            f"{f.pseudo_r2:.2f}",
            "yes" if f.linear else f"[yellow]no[/] (off by {f.max_rel_deviation:.0%})",
        )
    (console or Console(width=max(100, Console().width))).print(t)


# ---------------------------------------------------------------- serve / deploy


def run(coro: Any) -> Any:
    from ._app import run_loop

    return run_loop(coro)


async def serve_forever(
    dep: Any,
    plan: Plan | None,
    *,
    host: str,
    port: int,
    token: str | None,
    max_body_bytes: int,
    ready_file: str | None,
    read_timeout_s: float = 30.0,
    tuner: str = "inferline",
    tuner_config: TunerConfig | None = None,
    variant_switching: bool = True,
) -> None:
    from ._admin import make_admin_router
    from ._app import bind_socket, create_app, serve_app
    from ._deploy import import_object, start_service

    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    try:
        svc = await start_service(dep, plan)
    except BaseException:
        sock.close()
        raise
    # The tuner (InferLine §5) keeps the plan's SLO as traffic departs from the planning trace.
    if tuner != "none" and plan is not None and plan.tuner is not None:
        from ._tuning import start_live_tuner

        await start_live_tuner(svc, plan, tuner_config or TunerConfig(), variants=variant_switching)
    routers: list[Any] = [make_admin_router]
    if any(a.selection is not None for a in dep.apps):  # feedback + per-user routes
        from ._selection_routes import make_selection_router

        routers.append(make_selection_router)
    if dep.velox is not None:
        from ._velox_app import start_velox

        routers.append(await start_velox(svc, dep.velox))
    for path in dep.routers:
        routers.append(import_object(path, "routers[]"))
    app = create_app(svc, token=token, max_body_bytes=max_body_bytes, routers=routers)
    shown = host if ":" not in host else f"[{host}]"
    url = f"http://{shown}:{bound}"

    def ready() -> None:
        info = {
            "url": url,
            "pid": os.getpid(),
            "apps": sorted(svc.apps),
            "models": svc.models,
        }
        if ready_file:
            tmp = Path(ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, ready_file)
        print(f"inferline: serving {sorted(svc.apps)} at {url} (docs: {url}/docs)", flush=True)

    await serve_app(app, sock, ready=ready, read_timeout_s=read_timeout_s)


def _serve(args: argparse.Namespace) -> int:
    from ._deploy import load_deployment

    dep = load_deployment(args.deployment)
    plan = load_plan(args.plan) if args.plan else None
    return _serve_with(args, dep, plan)


def warn_open_host(host: str, token: str | None) -> None:
    """Binding beyond loopback without a token: say so (serve and attach)."""
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning(
            "serving on %s without a bearer token: anyone who can reach it may call it", host
        )


def _serve_with(args: argparse.Namespace, dep: Any, plan: Plan | None) -> int:
    token = _token(args)
    # built (and validated) before anything starts
    tuner_config = TunerConfig(**ladder_knobs(args))
    warn_open_host(args.host, token)
    run(
        serve_forever(
            dep,
            plan,
            host=args.host,
            port=args.port,
            token=token,
            max_body_bytes=args.max_body_bytes,
            ready_file=args.ready_file,
            read_timeout_s=args.read_timeout_s,
            tuner=getattr(args, "tuner", "inferline"),
            tuner_config=tuner_config,
            variant_switching=getattr(args, "variant_switching", True),
        )
    )
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from ._deploy import load_deployment, planned_models

    dep = load_deployment(args.deployment)
    plan = load_plan(args.plan)
    names = {m.name for m in dep.models}
    planned = planned_models(plan)
    unknown = sorted(set(planned) - names)
    if unknown:
        where = "variants" if plan.variants is not None else "models"
        raise ValidationError(
            f"{args.plan}: {where}", f"models of deployment {dep.name!r}", unknown
        )
    for m in sorted(names - set(planned)):
        log.warning(
            "plan %s has no configuration for %r: it gets 1 cpu replica, batch 1", args.plan, m
        )
    if args.url:
        import httpx

        headers = {"Authorization": f"Bearer {_token(args)}"} if _token(args) else {}
        try:
            r = httpx.put(
                args.url.rstrip("/") + "/admin/plan",
                json=plan.to_dict(),
                headers=headers,
                timeout=600,
            )
        except httpx.TransportError as e:  # refused, unknown host, timed out: a traceback before
            raise ValidationError("--url", "a reachable inferline server", str(e)) from None
        body = _json_or_none(r)
        applied = body.get("applied") if isinstance(body, dict) else None
        if isinstance(applied, dict):  # also on a 502: which models moved and which did not
            for model, what in applied.items():
                print(f"{model}: {what}")
        if r.status_code != 200:
            raise ValidationError(
                "server", "a 200 answer to PUT /admin/plan", f"{r.status_code} {r.text}"
            )
        return 0
    for model, cfg in planned.items():
        print(f"{model}: {cfg.replicas} x {cfg.hardware}, max batch {cfg.max_batch_size}")
    if args.dry_run:
        return 0
    return _serve_with(args, dep, plan)


def _json_or_none(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


# how much faster than recorded a trace is replayed; how long a request may take to arrive
_speed = number_in(0, 1e6, "a factor", lo_open=True)
_read_timeout = number_in(0, 3600, "seconds", lo_open=True)


def add_listen_args(p: argparse.ArgumentParser, *, grpc: bool = False) -> None:
    """Where a server listens and what it accepts (serve, deploy, attach; ``grpc``: attach's
    gRPC front doors too): one declaration, so the limits and their checks stay the same."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="HTTP port (0: any free port)")
    if grpc:
        p.add_argument(
            "--grpc-port",
            type=int_in(-1, 65535, "a port (-1: none)"),
            default=0,
            help="gRPC front doors' port (0: any, -1: none)",
        )
    p.add_argument("--token", default=None, help=f"require this bearer token (or ${_TOKEN_ENV})")
    p.add_argument(
        "--max-body-bytes",
        type=body_bytes,
        default=1 << 20,
        help=("largest HTTP request body and gRPC message" if grpc else "request body limit")
        + ", bytes (default %(default)s)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=_read_timeout,
        default=30.0,
        help="a request's headers, then its body, must arrive within this; else 408 "
        "(default %(default)s)",
    )
    p.add_argument(
        "--ready-file",
        type=output_path(),
        default=None,
        help=f"write {{url, {'grpc, ' if grpc else ''}pid}} here once serving",
    )


def _add_server_args(p: argparse.ArgumentParser) -> None:
    add_listen_args(p)
    p.add_argument(
        "--tuner",
        choices=("inferline", "none"),
        default="inferline",
        help="scale replicas as traffic changes (needs a plan with tuner inputs; default "
        "%(default)s: on)",
    )
    p.add_argument(
        "--no-variant-switching",
        dest="variant_switching",
        action="store_false",
        help="with a plan made with --variants: keep every stage on the planned variant (by "
        "default the tuner may switch a stage to a cheaper variant instead of adding replicas)",
    )
    add_ladder_knobs(p)


# ---------------------------------------------------------------- replay


def _load_inputs(args: argparse.Namespace) -> list[Any]:
    if args.inputs:
        text = read_text(args.inputs)
        try:
            if args.inputs.endswith(".jsonl"):
                xs = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                xs = json.loads(text)
        except ValueError as e:
            raise ValidationError(
                args.inputs, "JSON (a list of inputs) or JSON lines", str(e)
            ) from None
        if not isinstance(xs, list) or not xs:
            raise ValidationError(args.inputs, "a non-empty list of inputs", type(xs).__name__)
        return xs
    if args.deployment:
        from ._deploy import load_deployment

        return load_deployment(args.deployment).load_sample_inputs()
    raise ValidationError("--inputs/--deployment", "where the request inputs come from", None)


def _check_replay_args(args: argparse.Namespace) -> str | None:
    # both may be given (--inputs sends, --deployment gives the SLO); neither was refused only
    # once the trace had been read
    if not (args.inputs or args.deployment):
        return "one of the arguments --inputs --deployment is required (the request inputs)"
    return None


def _app_slo_s(args: argparse.Namespace) -> float | None:
    """The app's SLO in ``--deployment`` (what the miss rate is measured against when no
    ``--slo-ms`` is given; not sent, the server applies it anyway)."""
    if not args.deployment:
        return None
    from ._deploy import load_deployment

    for a in load_deployment(args.deployment).apps:
        if a.name == args.app:
            return float(a.slo_s)
    return None


def _replay(args: argparse.Namespace) -> int:
    from ._replay import encode_bodies, replay

    trace = load_trace(args.trace)
    if args.limit is not None:
        trace = trace[: args.limit]
    if args.speed != 1.0:
        trace = (trace - trace[0]) / args.speed
    bodies = encode_bodies(_load_inputs(args), args.slo_ms)
    slo_s = args.slo_ms / 1e3 if args.slo_ms else _app_slo_s(args)
    res = run(
        replay(
            trace,
            args.url,
            args.app,
            bodies,
            slo_s=slo_s,
            token=_token(args),
            connections=args.connections,
        )
    )
    summary = res.summary()
    print_replay(summary)
    if args.output:
        out = {
            # NaN (no rate, no latencies) is not JSON: null
            "summary": {k: _finite_or_none(v) for k, v in summary.items()},
            "latency_s": [None if not np.isfinite(v) else float(v) for v in res.latency_s],
            "status": [int(s) for s in res.status],
        }
        Path(args.output).write_text(json.dumps(out) + "\n")
    # Non-zero when any query did not get an HTTP 200 (errors, refusals, no answer).
    return 0 if summary["errors"] == 0 else 1


def _finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _ms(v: float) -> str:
    return f"{v:.2f} ms" if math.isfinite(v) else "n/a (no predictions)"


def print_replay(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="replay")
    t.add_column("metric")
    t.add_column("value", justify="right")
    # A one-query trace (or all at one time) spans no time, so has no rate; still a fair smoke
    # test of a server, so it runs rather than being refused, and the rate says why it is n/a.
    rate = s["offered_qps"]
    rows = [
        ("queries sent", f"{s['queries']}"),
        ("offered rate", f"{rate:.1f} q/s" if math.isfinite(rate) else "n/a (the trace spans 0 s)"),
        ("answered", f"{s['answered']}"),
        ("predictions", f"{s['ok']}"),
        ("default outputs", f"{s['defaults']}"),
        ("errors", f"{s['errors']}  {s['error_kinds'] or ''}"),
        ("status codes", ", ".join(f"{k}: {v}" for k, v in s["status"].items())),
        ("P50 latency", _ms(s["p50_ms"])),
        ("P99 latency", _ms(s["p99_ms"])),
        ("max latency", _ms(s["max_ms"])),
    ]
    if s["slo_ms"] is not None:
        rows.append(("SLO miss rate", f"{s['slo_miss_rate']:.2%} (SLO {s['slo_ms']:.0f} ms)"))
    rows.append(("client send lag P99", f"{s['send_lag_p99_ms']:.2f} ms"))
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)


# ---------------------------------------------------------------- demo


def _demo(args: argparse.Namespace) -> int:
    from .demo.runner import DemoOptions, run_demo

    if not args.debug:
        # The demo narrates its own steps; keep replica start-up, profiler and HTTP logs (and
        # gRPC's notes about forking) out of it.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        for name in ("inferline", "httpx", "matplotlib"):
            logging.getLogger(name).setLevel(logging.WARNING)
    opts = DemoOptions(
        out_dir=args.out,
        quick=args.quick,
        slo_ms=args.slo_ms,
        rate_qps=args.rate,
        duration_s=args.duration_s,
    )
    report = run_demo(opts)
    return 0 if report.get("ok", False) else 1


def _check_demo_args(args: argparse.Namespace) -> str | None:
    """The demo's traces (planning and replay, at ``--rate``) must fit in memory: one too large
    failed only after minutes of profiling."""
    from .demo.runner import DemoOptions

    opts = DemoOptions(quick=args.quick, rate_qps=args.rate, duration_s=args.duration_s)
    r = opts.resolved()
    arrivals = r["rate_qps"] * (opts.planning_trace_s + r["duration_s"])
    return too_many_arrivals(arrivals, "--rate/--duration-s")


# ---------------------------------------------------------------- registration


def add_profiler_arguments(p: argparse.ArgumentParser) -> None:
    """``--statistic``, ``--contention`` and ``--wake-idle-ms``: how a profile is measured
    (``inferline profile`` and the benchmarks that profile, e.g. ``benchmarks/fidelity.py``)."""
    from ._profiler import STATISTICS, ProfilerOptions

    default_gaps = [round(g * 1e3, 3) for g in ProfilerOptions().wake_idle_s]
    p.add_argument(
        "--statistic",
        default="mean",
        choices=sorted(STATISTICS),
        help="what becomes latency_s (default mean)",
    )
    p.add_argument(
        "--contention",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile with extra replicas busy on the free cores (default on, as InferLine)",
    )
    p.add_argument(
        "--wake-idle-ms",
        nargs="*",
        type=positive("an idle gap in ms"),
        default=default_gaps,
        metavar="MS",
        help="also time batches of 1 after these idle gaps, for the wake-up extra the estimator "
        "adds to a batch that starts on an idle replica (default: %(default)s; "
        "none given: skip)",
    )


def wake_idle_s(args: argparse.Namespace) -> tuple[float, ...]:
    """``--wake-idle-ms`` as increasing seconds."""
    return tuple(sorted({g / 1e3 for g in args.wake_idle_ms}))


@register
def _register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("profile", help="profile a deployment's models (batch latency per hardware)")
    p.add_argument("--deployment", required=True, help="deployment JSON (inferline.deployment/1)")
    # outputs are checked up front: profiling takes minutes
    p.add_argument(
        "-o",
        "--output",
        type=output_path(),
        required=True,
        help="where to write the profiles JSON",
    )
    p.add_argument(
        "--pipeline-out",
        type=output_path(),
        default=None,
        help="also write the traced pipeline DAG",
    )
    p.add_argument(
        "--fits-out", type=output_path(), default=None, help="also write the latency fits as JSON"
    )
    p.add_argument("--app", default=None, help="app whose pipeline to trace (default: first)")
    p.add_argument("--max-batch", type=count, default=32, help="largest batch size (powers of 2)")
    p.add_argument(
        "--max-samples",
        type=int_in(_MIN_SAMPLES, what="a count of batches"),
        default=400,
        help=f"most batches per point (at least {_MIN_SAMPLES}; --quick: 60)",
    )
    # -1 dropped the last sample ([:-1]) and 0 left none
    p.add_argument("--samples", type=count, default=None, help="use only N sample queries")
    add_profiler_arguments(p)
    p.add_argument("--hardware", nargs="*", default=None, help="only these hardware kinds")
    p.add_argument("--quick", action="store_true", help="fewer samples (noisier, faster)")
    p.add_argument(
        "--variants",
        default=None,
        metavar="FILE",
        help="model variants per stage (inferline.variants/1): a pipeline call of a stage runs "
        "its first variant while tracing, and every variant is profiled on the stage's inputs",
    )
    p.set_defaults(func=_profile)

    s = sub.add_parser("serve", help="serve a deployment over HTTP")
    s.add_argument("--deployment", required=True, help="deployment JSON (inferline.deployment/1)")
    s.add_argument("--plan", default=None, help="plan JSON to deploy (default: 1 replica each)")
    _add_server_args(s)
    s.set_defaults(func=_serve)

    d = sub.add_parser("deploy", help="apply a plan: to a running server (--url), or serve it")
    d.add_argument("plan", help="plan JSON (inferline.plan/1)")
    d.add_argument(
        "--deployment", required=True, help="deployment JSON (inferline.deployment/1) of the plan"
    )
    d.add_argument(
        "--url",
        type=http_url(("http", "https")),
        default=None,
        help="running server to reconfigure",
    )
    d.add_argument("--dry-run", action="store_true", help="check and print, do not deploy")
    _add_server_args(d)
    d.set_defaults(func=_deploy)

    r = sub.add_parser(
        "replay",
        help="open-loop load: send requests at a trace's times",
        description="Send one request per arrival of TRACE, at its times, never waiting for "
        "answers; print P50/P99, the SLO miss rate and errors. Exit status 1 when any query "
        "did not get an HTTP 200.",
    )
    r.add_argument("trace", help="arrival-time trace (one time in seconds per line)")
    r.add_argument(
        "--url", type=http_url(), required=True, help="server URL, e.g. http://127.0.0.1:8000"
    )
    r.add_argument("--app", required=True, help="app to call (POST URL/apps/APP/predict)")
    r.add_argument("--inputs", default=None, help="JSON list or .jsonl file of inputs")
    r.add_argument("--deployment", default=None, help="take inputs from its sample_inputs")
    r.add_argument(
        "--slo-ms",
        type=slo_ms,
        default=None,
        help="SLO for the miss rate, also sent with each request (default: the app's SLO in "
        "--deployment, not sent; neither: no miss rate)",
    )
    r.add_argument("--token", default=None, help=f"bearer token (or ${_TOKEN_ENV})")
    # 0 connections read as 'server unreachable'; --limit 0 sent all, -1 all but the last
    r.add_argument("--connections", type=count, default=64, help="connections opened up front")
    r.add_argument("--limit", type=count, default=None, help="send only the first N arrivals")
    r.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        help="time compression factor (2: twice as fast; default %(default)s)",
    )
    r.add_argument(
        "-o",
        "--output",
        type=output_path(),
        default=None,
        help="write the summary and latencies JSON",
    )
    r.set_defaults(func=_replay, check_args=_check_replay_args)

    m = sub.add_parser("demo", help="profile, plan, deploy and replay a real digits pipeline")
    m.add_argument(
        "--out", type=output_folder(), default="out/demo", help="output folder (plots, JSON)"
    )
    m.add_argument("--quick", action="store_true", help="reduced mode (for tests)")
    # checked before the demo's minutes of work (a --slo-ms of 0 silently meant 100)
    m.add_argument("--slo-ms", type=slo_ms, default=None, help="latency SLO, ms (default 100)")
    m.add_argument("--rate", type=positive("queries/s"), default=None, help="arrival rate, q/s")
    m.add_argument("--duration-s", type=positive("seconds"), default=None, help="replay length")
    m.set_defaults(func=_demo, check_args=_check_demo_args)
