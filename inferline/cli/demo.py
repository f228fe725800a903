"""``inferline demo``: profile, plan, deploy and replay a real digits pipeline on this machine."""

from __future__ import annotations

import argparse
import logging
import os

from inferline.cli._args import (
    output_folder,
    positive,
    slo_ms,
    too_many_arrivals,
)

__all__ = ["register"]


def _demo(args: argparse.Namespace) -> int:
    from inferline.demo.runner import DemoOptions, run_demo

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
    from inferline.demo.runner import DemoOptions

    opts = DemoOptions(quick=args.quick, rate_qps=args.rate, duration_s=args.duration_s)
    r = opts.resolved()
    arrivals = r["rate_qps"] * (opts.planning_trace_s + r["duration_s"])
    return too_many_arrivals(arrivals, "--rate/--duration-s")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
