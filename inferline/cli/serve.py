"""``inferline serve``: serve a deployment (and a plan) over HTTP until stopped."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from inferline.cli._server_args import add_server_args, run_loop, token_of, warn_open_host
from inferline.cli._tuner_args import ladder_knobs
from inferline.core import (
    Plan,
    TunerConfig,
    load_plan,
)

__all__ = ["register", "serve_with"]

log = logging.getLogger(__name__)


def _serve(args: argparse.Namespace) -> int:
    from inferline.deploy import load_deployment

    dep = load_deployment(args.deployment)
    plan = load_plan(args.plan) if args.plan else None
    return serve_with(args, dep, plan)


def serve_with(args: argparse.Namespace, dep: Any, plan: Plan | None) -> int:
    token = token_of(args)
    # built (and validated) before anything starts
    tuner_config = TunerConfig(**ladder_knobs(args))
    drift, profiles, pipeline = _drift_args(args)
    switching = _switching_args(args)
    warn_open_host(args.host, token)
    from inferline.deploy import Loops, ServeSettings, plugin_host, serve_deployment

    tuner = None if getattr(args, "tuner", "inferline") == "none" else tuner_config
    variant_switching = getattr(args, "switching", "tuner") == "tuner"
    variant_queue = getattr(args, "variant_queue", "shared")
    settings = ServeSettings(
        host=args.host,
        port=args.port,
        token=token,
        max_body_bytes=args.max_body_bytes,
        max_request_rows=args.max_request_rows,
        allowed_hosts=None if args.allowed_hosts is None else tuple(args.allowed_hosts),
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        grpc_max_inflight=args.grpc_max_inflight,
        ready_file=args.ready_file,
        read_timeout_s=args.read_timeout_s,
        tuner=tuner,
        variant_switching=variant_switching,
        drift=drift,
        door_workers=getattr(args, "door_workers", 0),
        variant_queue=variant_queue,
    )
    loops = Loops(tuner, variant_switching, drift, profiles, pipeline, switching, variant_queue)
    run_loop(
        serve_deployment(dep, plan, settings, host=plugin_host(), loops=loops, ready=_print_serving)
    )
    return 0


def _switching_args(args: argparse.Namespace) -> Any:
    """``--switching model-switching`` with its ``--switching-config`` file, read and checked
    before anything starts; None for the tuner's variant moves or none."""
    from inferline.core import ValidationError

    mode = getattr(args, "switching", "tuner")
    path = getattr(args, "switching_config", None)
    if mode != "model-switching":
        if path:
            raise ValidationError("--switching-config", "--switching model-switching", mode)
        return None
    if not path:
        raise ValidationError(
            "--switching-config", "a switching file (inferline.switching/1)", None
        )
    from inferline.deploy import load_switching

    return load_switching(path)


def _drift_args(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The drift loop's config, profiles and pipeline from ``--on-drift``, ``--drift-config``,
    ``--profiles``, ``--pipeline`` (validated before anything starts)."""
    import json
    from pathlib import Path

    from inferline.core import load_pipeline, load_profiles
    from inferline.deploy import DriftConfig

    mode = getattr(args, "on_drift", "alert")
    path = getattr(args, "drift_config", None)
    base = DriftConfig.from_dict(json.loads(Path(path).read_text())) if path else DriftConfig()
    config = DriftConfig.from_dict({**base.to_dict(), "mode": mode})
    profiles = load_profiles(args.profiles) if getattr(args, "profiles", None) else None
    pipeline = load_pipeline(args.pipeline) if getattr(args, "pipeline", None) else None
    return config, profiles, pipeline


def _print_serving(info: dict[str, Any]) -> None:
    url = info["url"]
    doors = f", front doors {info['front_doors']}" if info.get("front_doors") else ""
    grpc = f", gRPC {info['grpc']}" if info.get("grpc") else ""
    print(f"inferline: serving {info['apps']} at {url}{doors}{grpc} (docs: {url}/docs)", flush=True)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("serve", help="serve a deployment over HTTP")
    s.add_argument("--deployment", required=True, help="deployment JSON (inferline.deployment/1)")
    s.add_argument("--plan", default=None, help="plan JSON to deploy (default: 1 replica each)")
    add_server_args(s)
    s.add_argument(
        "--on-drift",
        choices=["off", "alert", "replan"],
        default="alert",
        help="when the estimated and measured P99 of an app stay apart: alert (log, count, "
        "GET /admin/drift; default), replan (also recalibrate the profiles to the live "
        "service times and re-plan when the plan no longer fits), off. Needs --plan, "
        "--profiles and --pipeline",
    )
    s.add_argument("--profiles", default=None, help="profiles JSON the drift loop estimates with")
    s.add_argument("--pipeline", default=None, help="pipeline JSON the drift loop estimates with")
    s.add_argument(
        "--drift-config",
        default=None,
        help="JSON of the drift loop's knobs (window_s, tick_s, threshold, sustain, "
        "cooldown_s, min_queries, min_batches, plan_trace_s, hop_overhead_s, service_spread)",
    )
    s.set_defaults(func=_serve)
