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
    from inferline.deploy._format import load_deployment

    dep = load_deployment(args.deployment)
    plan = load_plan(args.plan) if args.plan else None
    return serve_with(args, dep, plan)


def serve_with(args: argparse.Namespace, dep: Any, plan: Plan | None) -> int:
    token = token_of(args)
    # built (and validated) before anything starts
    tuner_config = TunerConfig(**ladder_knobs(args))
    warn_open_host(args.host, token)
    from inferline.deploy import serve

    run_loop(
        serve(
            dep,
            plan,
            host=args.host,
            port=args.port,
            token=token,
            max_body_bytes=args.max_body_bytes,
            max_request_rows=args.max_request_rows,
            ready_file=args.ready_file,
            read_timeout_s=args.read_timeout_s,
            ready=_print_serving,
            tuner=None if getattr(args, "tuner", "inferline") == "none" else tuner_config,
            variant_switching=getattr(args, "variant_switching", True),
        )
    )
    return 0


def _print_serving(info: dict[str, Any]) -> None:
    url = info["url"]
    print(f"inferline: serving {info['apps']} at {url} (docs: {url}/docs)", flush=True)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("serve", help="serve a deployment over HTTP")
    s.add_argument("--deployment", required=True, help="deployment JSON (inferline.deployment/1)")
    s.add_argument("--plan", default=None, help="plan JSON to deploy (default: 1 replica each)")
    add_server_args(s)
    s.set_defaults(func=_serve)
