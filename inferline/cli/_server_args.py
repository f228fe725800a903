"""Options of the commands that run a server (``serve``, ``deploy``, ``attach``): where it
listens, what it accepts, its token, its tuner."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from inferline.cli._args import (
    body_bytes,
    int_in,
    number_in,
    output_path,
    port,
)
from inferline.cli._tuner_args import add_ladder_knobs

__all__ = [
    "TOKEN_ENV",
    "add_listen_args",
    "add_server_args",
    "host_list",
    "run_loop",
    "token_of",
    "warn_open_host",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "INFERLINE_TOKEN"


def token_of(args: argparse.Namespace) -> str | None:
    return args.token or os.environ.get(TOKEN_ENV) or None


def warn_open_host(host: str, token: str | None) -> None:
    """Binding beyond loopback without a token: say so (serve and attach)."""
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        log.warning(
            "serving on %s without a bearer token: anyone who can reach it may call it", host
        )


_read_timeout = number_in(0, 3600, "seconds", lo_open=True)


def host_list(text: str) -> list[str]:
    """``--allowed-hosts``: comma-separated ``Host`` names (``*.example.com``, ``*``)."""
    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names or any(any(c in h for c in " /@") for h in names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated host names (or *), got {text!r}"
        )
    return names


# inferline.server.frontdoors.DEFAULT_MAX_INFLIGHT, without importing gRPC to build the parser
GRPC_MAX_INFLIGHT = 1024


def add_listen_args(
    p: argparse.ArgumentParser, *, grpc: bool = False, grpc_default: int = 0
) -> None:
    """Where a server listens and what it accepts (serve, deploy, attach; ``grpc``: the gRPC
    front doors' port too, ``grpc_default`` when not given): one declaration, so the limits
    and their checks stay the same."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="HTTP port (0: any free port)")
    if grpc:
        p.add_argument(
            "--grpc-port",
            type=int_in(-1, 65535, "a port (-1: none)"),
            default=grpc_default,
            help="gRPC front doors' port (0: any, -1: none; default %(default)s)",
        )
        p.add_argument(
            "--grpc-max-inflight",
            type=int_in(1),
            default=GRPC_MAX_INFLIGHT,
            metavar="N",
            help="inference calls in flight on the gRPC front doors, past which a call is "
            "answered RESOURCE_EXHAUSTED at once and counted in inferline_overloaded_total "
            "(default %(default)s)",
        )
    p.add_argument("--token", default=None, help=f"require this bearer token (or ${TOKEN_ENV})")
    p.add_argument(
        "--allowed-hosts",
        type=host_list,
        default=None,
        help="Host header names the HTTP server answers to, comma-separated (*.example.com "
        "for subdomains, * for any); others get 421, so a web page cannot reach the admin API "
        "by DNS rebinding (default: the address it is bound to and localhost)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=body_bytes,
        default=1 << 20,
        help=("largest HTTP request body and gRPC message" if grpc else "request body limit")
        + ", bytes (default %(default)s)",
    )
    p.add_argument(
        "--max-request-rows",
        type=int_in(1, 1 << 20, "a row count"),
        default=256,
        help="most rows (queries) one request may carry, on the native predict route and "
        "every KServe / TF Serving door, HTTP and gRPC (default %(default)s)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=_read_timeout,
        default=30.0,
        help="a request's headers, then its body, must arrive within this; else 408 "
        "(default %(default)s)",
    )
    p.add_argument(
        "--door-workers",
        type=int_in(0, 64, "a process count"),
        default=0,
        metavar="N",
        help="door worker processes: N processes accept on the HTTP port and, with "
        "--grpc-port, the KServe gRPC port (SO_REUSEPORT), parse, guard, decode and encode, "
        "and hand the requests to this process's one EDF queue over a local socket "
        "(default 0: this process serves both itself)",
    )
    p.add_argument(
        "--ready-file",
        type=output_path(),
        default=None,
        help=f"write {{url, {'grpc, ' if grpc else ''}pid}} here once serving",
    )


def add_server_args(p: argparse.ArgumentParser) -> None:
    # the gRPC doors of a deployment's "front_doors" start only when a port is asked for
    add_listen_args(p, grpc=True, grpc_default=-1)
    p.add_argument(
        "--tuner",
        choices=("inferline", "none"),
        default="inferline",
        help="scale replicas as traffic changes (needs a plan with tuner inputs; default "
        "%(default)s: on)",
    )
    p.add_argument(
        "--switching",
        choices=("tuner", "model-switching", "off"),
        default="tuner",
        help="how a stage with model variants switches between them: 'tuner' (default) the "
        "tuner may move a stage of a plan made with --variants to a cheaper variant instead of "
        "adding replicas; 'model-switching' the variant of highest effective accuracy at the "
        "measured rate within a core budget (Zhang et al.; needs --switching-config); 'off' "
        "every stage stays on its planned variant (docs/variants.md)",
    )
    p.add_argument(
        "--no-variant-switching",
        dest="switching",
        action="store_const",
        const="off",
        help="same as --switching off",
    )
    p.add_argument(
        "--switching-config",
        default=None,
        metavar="FILE",
        help="with --switching model-switching: the app, stage, variants with their measured "
        "accuracy and profiles (format inferline.switching/1, docs/variants.md)",
    )
    p.add_argument(
        "--variant-queue",
        choices=("shared", "per_variant"),
        default="shared",
        help="with --switching tuner: a variant stage's variants share one queue, so queries "
        "queued at a switch go to the new variant (default), or keep one queue per variant "
        "(per_variant: they finish on the old one; docs/variants.md)",
    )
    add_ladder_knobs(p)


def run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop (the server's loop), importing the server only when a command
    runs one: ``inferline --help`` and the planning commands stay light."""
    from inferline.server import run_loop as run

    return run(coro)
