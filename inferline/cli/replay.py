"""``inferline replay TRACE``: open-loop load at a trace's arrival times; P50/P99, SLO miss rate and errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from inferline.cli._args import (
    count,
    http_url,
    number_in,
    output_path,
    slo_ms,
)
from inferline.cli._server_args import TOKEN_ENV, run_loop, token_of
from inferline.core import (
    ValidationError,
    load_trace,
    read_text,
)

__all__ = ["register"]

# how much faster than recorded a trace is replayed; how long a request may take to arrive
_speed = number_in(0, 1e6, "a factor", lo_open=True)


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
        from inferline.deploy import load_deployment

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
    from inferline.deploy import load_deployment

    for a in load_deployment(args.deployment).apps:
        if a.name == args.app:
            return float(a.slo_s)
    return None


def _replay(args: argparse.Namespace) -> int:
    from inferline.measure import encode_bodies, replay

    trace = load_trace(args.trace)
    if args.limit is not None:
        trace = trace[: args.limit]
    if args.speed != 1.0:
        trace = (trace - trace[0]) / args.speed
    bodies = encode_bodies(_load_inputs(args), args.slo_ms)
    slo_s = args.slo_ms / 1e3 if args.slo_ms else _app_slo_s(args)
    res = run_loop(
        replay(
            trace,
            args.url,
            args.app,
            bodies,
            slo_s=slo_s,
            token=token_of(args),
            connections=args.connections,
        )
    )
    summary = res.summary()
    from inferline.measure import finite_or_none, print_replay

    print_replay(summary)
    if args.output:
        out = {
            # NaN (no rate, no latencies) is not JSON: null
            "summary": {k: finite_or_none(v) for k, v in summary.items()},
            "latency_s": [None if not np.isfinite(v) else float(v) for v in res.latency_s],
            "status": [int(s) for s in res.status],
        }
        Path(args.output).write_text(json.dumps(out) + "\n")
    # Non-zero when any query did not get an HTTP 200 (errors, refusals, no answer).
    return 0 if summary["errors"] == 0 else 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    r.add_argument("--token", default=None, help=f"bearer token (or ${TOKEN_ENV})")
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
