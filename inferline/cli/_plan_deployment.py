"""``inferline plan --deployment FILE``: plan for what that deployment's queue does. With its
``queue.admission`` "predicted", the plan is made with admission on, the queue's buffer and
the smallest ``max_refused`` its apps set (``Deployment.planner_admission``); a flag given on
the command line wins over the file (docs/deadlines.md)."""

from __future__ import annotations

import argparse

from inferline.core import ValidationError

__all__ = ["DEFAULT_ADMISSION_BUFFER_MS", "add_deployment_option", "apply_deployment"]

DEFAULT_ADMISSION_BUFFER_MS = 2.0  # the live queue's default (queue.admission_buffer_ms)


def add_deployment_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--deployment",
        default=None,
        help="deployment JSON whose queue the plan is for: its queue.admission, "
        "admission_buffer_ms and the apps' max_refused apply unless given as flags",
    )


def apply_deployment(args: argparse.Namespace) -> None:
    """Fill ``--admission``, ``--admission-buffer-ms`` and ``--max-refused`` from
    ``--deployment`` where the command line left them unset."""
    if args.deployment:
        from inferline.deploy import load_deployment

        adm = load_deployment(args.deployment).planner_admission()
        if not adm and args.max_refused is not None and not args.admission:
            raise ValidationError(
                "--max-refused", "--admission, or a deployment whose queue.admission is "
                '"predicted"', args.max_refused,
            )  # fmt: skip
        if adm:
            args.admission = True
            if args.admission_buffer_ms is None:
                args.admission_buffer_ms = adm["admission_buffer_s"] * 1e3
            if args.max_refused is None:
                args.max_refused = adm["max_refused"]
    if args.admission_buffer_ms is None:
        args.admission_buffer_ms = DEFAULT_ADMISSION_BUFFER_MS
