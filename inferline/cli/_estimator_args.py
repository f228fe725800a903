"""Options that plan and simulate share: the serving system's own time per hop, and the cores and GPUs a deployment has (how replicas share them)."""

from __future__ import annotations

import argparse
from typing import Any

from inferline.cli._args import name_counts, number_in

__all__ = [
    "add_hop_overhead",
    "add_inventory_arguments",
    "check_inventory_args",
    "cores_model",
    "rate_margin",
]

rate_margin = number_in(0, 10, "a margin")  # 0.05: plan for 5% above the rate
_hop_ms = number_in(0, 10_000, "milliseconds")


def add_hop_overhead(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hop-overhead-ms",
        type=_hop_ms,
        default=0.0,
        help="the serving system's own time before each model's queue (HTTP, RPC; about 0.6 on "
        "the bundled runtime with wake-up profiles, 2 without), added by the estimator "
        "(default %(default)s)",
    )
    p.add_argument(
        "--wake-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add the profiles' wake-up extras to a batch that starts on an idle replica "
        "(default on; profiles made without them have none). With them, most of what the "
        "bundled runtime adds per hop at low load is the replicas waking up: about 0.6 ms "
        "of --hop-overhead-ms remains",
    )
    p.add_argument(
        "--service-spread",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="draw each batch's service time (seeded by --seed) from a log-normal through the "
        "profile's p50 and p99 for its size instead of taking its latency_s (default off; "
        "batch sizes profiled without both quantiles keep latency_s)",
    )


def check_inventory_args(args: argparse.Namespace) -> str | None:
    """``--cpu-threads`` and ``--gpu-host-cores`` count against an ``--inventory`` (the
    threads also in ``--shared-cores``); a kind is shared or pinned, not both."""
    for flag, given, ok in (
        ("--cpu-threads", args.cpu_threads, args.inventory or args.shared_cores),
        ("--gpu-host-cores", args.gpu_host_cores, args.inventory),
    ):
        if given and not ok:
            return f"argument {flag}: needs --inventory (it counts the cores a replica takes)"
    both = sorted(set(args.shared_cores) & set(args.pinned_cores))
    if both:
        return f"argument --pinned-cores: {both[0]!r} is also in --shared-cores (one or the other)"
    return None


def cores_model(args: argparse.Namespace) -> dict[str, Any]:
    """``EstimatorOptions`` keywords for ``--shared-cores`` and ``--pinned-cores``."""
    return {
        "shared_units": args.shared_cores,
        "replica_units": args.cpu_threads if args.shared_cores else {},
        "pinned_cores": args.pinned_cores,
    }


def add_inventory_arguments(p: argparse.ArgumentParser, effect: str) -> None:
    """``--inventory``, ``--pinned-cores``, ``--shared-cores``, ``--cpu-threads`` and
    ``--gpu-host-cores`` (``plan``, ``simulate``); ``effect`` says what the inventory does for
    the command."""
    kind, model = "hardware kind", "model"
    for flag, names, lo, what in (
        (
            "--inventory",
            kind,
            0,
            "units of each hardware kind the deployment has (cpu=16,gpu-v100=2: cores, GPUs); "
            f"{effect}. Kinds not listed are unlimited (default: all, the paper's cloud)",
        ),
        (
            "--pinned-cores",
            kind,
            1,
            "the estimate pins each replica of KIND to the least-used of N cores (GPUs), as "
            "the bundled runtime places them, and replicas on one core share it (cpu=2 on a "
            "2-core machine). Default: every replica has its own",
        ),
        (
            "--shared-cores",
            kind,
            1,
            "the estimate lets all replicas of KIND share N cores, each busy one taking its "
            "--cpu-threads (replicas the OS schedules freely, e.g. Triton CPU instances)",
        ),
        (
            "--cpu-threads",
            model,
            1,
            "with --inventory or --shared-cores: cores one CPU replica of MODEL takes (its "
            "threads; default 1)",
        ),
        (
            "--gpu-host-cores",
            model,
            0,
            "with --inventory: cores a GPU replica of MODEL also holds (default 0; on the "
            "bundled runtime a replica's threads are pinned to cores of their own, GPU or not)",
        ),
    ):
        word = "KIND" if names == kind else "MODEL"
        p.add_argument(
            flag,
            type=name_counts(names, lo),
            default={},
            metavar=f"{word}=N[,{word}=N]",
            help=what,
        )
