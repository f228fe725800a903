"""Options that plan and simulate share: the serving system's own time per hop, and the cores and GPUs a deployment has (how replicas share them)."""

from __future__ import annotations

import argparse
from typing import Any

from inferline.cli._args import name_counts, number_in
from inferline.core import InferlineError, ValidationError, load_json
from inferline.core.planning import nodes_from_document

__all__ = [
    "add_hop_overhead",
    "add_inventory_arguments",
    "add_nodes_argument",
    "check_inventory_args",
    "cores_model",
    "rate_margin",
]

_margin_number = number_in(0, 10, "'auto' or a margin")  # 0.05: plan for 5% above the rate


def rate_margin(text: str) -> float | str:
    """``--rate-margin``: ``auto`` (from the sample's variability) or a number in [0, 10]."""
    return "auto" if text.strip().lower() == "auto" else _margin_number(text)


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
    """``--cpu-threads`` and ``--gpu-host-cores`` count against an ``--inventory`` or
    ``--inventory-nodes`` (the threads also in ``--shared-cores``); a kind is shared or pinned,
    not both; per-node inventories take neither a flat one nor pooled cores."""
    nodes = getattr(args, "inventory_nodes", ())
    if nodes:
        for flag in ("inventory", "shared_cores", "pinned_cores"):
            if getattr(args, flag):
                dashed = "--" + flag.replace("_", "-")
                return (
                    f"argument {dashed}: not with --inventory-nodes (each replica is placed on "
                    "cores of its own on one node)"
                )
    for flag, given, ok in (
        ("--cpu-threads", args.cpu_threads, args.inventory or nodes or args.shared_cores),
        ("--gpu-host-cores", args.gpu_host_cores, args.inventory or nodes),
    ):
        if given and not ok:
            return (
                f"argument {flag}: needs --inventory or --inventory-nodes (it counts the cores "
                "a replica takes)"
            )
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


def _nodes_file(path: str) -> tuple[Any, ...]:
    try:
        return nodes_from_document(load_json(path))
    except ValidationError as e:
        raise argparse.ArgumentTypeError(f"{path}: {e}") from None
    except InferlineError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_nodes_argument(p: argparse.ArgumentParser) -> None:
    """``--inventory-nodes FILE``: the deployment's machines, one inventory per node."""
    p.add_argument(
        "--inventory-nodes",
        type=_nodes_file,
        default=(),
        metavar="FILE",
        help="the deployment's machines instead of --inventory: an inferline.nodes/1 JSON "
        '({"format": "inferline.nodes/1", "nodes": [{"name": "n1", "hardware": {"cpu": 4, '
        '"gpu-v100": 1}}, ...]}, or a bare list of such nodes), as `inferline nodes URL -o '
        "FILE` writes for a ray:// cluster. The plan must bin into them: a replica (its "
        "--cpu-threads cores, or a GPU and its --gpu-host-cores) never spans nodes, so two "
        "3-core nodes do not take a 4-thread replica (first-fit decreasing; docs/scale-out.md)",
    )
