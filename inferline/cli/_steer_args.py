"""``inferline attach URL --steer``'s own options (the rest are attach's)."""

from __future__ import annotations

import argparse

__all__ = ["add_steer_args", "check_steer_args"]


def add_steer_args(a: argparse.ArgumentParser) -> None:
    g = a.add_argument_group(
        "steer (the server's own batchers and instances; inferline out of the data path)"
    )
    g.add_argument(
        "--steer",
        action="store_true",
        help="plan the server's own batcher and instance counts for --app, apply them through "
        "its API and stay running as the control loop (clients keep calling the server)",
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        help="the server's Prometheus page (default http://HOST:8002/metrics for Triton)",
    )
    g.add_argument(
        "--tick-s", type=float, default=1.0, help="how often the loop reads the server's counters"
    )
    g.add_argument(
        "--on-drift",
        choices=("off", "alert", "replan"),
        default="alert",
        help="estimated vs measured P99 apart: only report (alert) or re-plan (replan)",
    )
    g.add_argument("--seed", type=int, default=None, help="seed of the loop's arrival spreading")


def check_steer_args(args: argparse.Namespace) -> None:
    """``--steer`` needs the app, the SLO and a trace (or a plan); not inferline's serving."""
    from inferline.core import ValidationError

    if not args.app:
        raise ValidationError("--app", "the model or ensemble clients call (with --steer)", None)
    if not (args.slo_ms and (args.trace or args.plan)):
        raise ValidationError("--steer", "--slo-ms and --trace (or --plan) with it", None)
    if args.pipeline_fn:
        raise ValidationError("--pipeline-fn", "nothing with --steer (the server runs it)", None)
    if not args.tick_s > 0:
        raise ValidationError("--tick-s", "a number > 0", args.tick_s)
