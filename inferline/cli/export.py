"""``inferline export PLAN --to triton DIR | tfserving DIR | ray-serve FILE``: the plan as the
serving system's own files (``docs/export.md``)."""

from __future__ import annotations

import argparse

from inferline.cli._args import output_folder, output_path
from inferline.core import load_catalog, load_plan

__all__ = ["register"]

_RAY_SUFFIXES = ("yaml", "yml", "json")


def _export(args: argparse.Namespace) -> int:
    from inferline.deploy import export_plan

    target, out = args.to
    result = export_plan(
        load_plan(args.plan),
        target,
        out,
        repository=args.repository,
        copy_models=args.copy_models,
        catalog=load_catalog(args.hardware),
        base_path=args.base_path,
        import_path=args.import_path,
        origin=args.plan,
    )
    for path in result.written:
        print(f"wrote {path}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def _check_export_args(args: argparse.Namespace) -> str | None:
    """The target and its output path, and options that belong to one target, checked at
    parse time (cli._CommandParser): an option another target ignores was a silent no-op."""
    from inferline.deploy import EXPORT_TARGETS

    target, out = args.to
    if target not in EXPORT_TARGETS:
        return f"argument --to: expected one of {', '.join(EXPORT_TARGETS)}, got {target!r}"
    check = (
        output_path(_RAY_SUFFIXES, "a Serve config file")
        if EXPORT_TARGETS[target] == "file"
        else output_folder(f"a folder for the {target} files")
    )
    try:
        check(out)
    except argparse.ArgumentTypeError as e:
        return f"argument --to {target}: {e}"
    if args.copy_models and (target != "triton" or args.repository is None):
        return "argument --copy-models: needs --to triton and --repository"
    if args.repository is not None and target == "ray-serve":
        return "argument --repository: not for ray-serve (its config holds only planned fields)"
    if args.import_path is not None and target != "ray-serve":
        return "argument --import-path: only for --to ray-serve"
    if args.base_path != "/models" and (target != "tfserving" or args.repository is not None):
        return "argument --base-path: only for --to tfserving without --repository"
    return None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="write a plan as Triton, TF Serving or Ray Serve config files",
        description=(
            "Write a plan as the serving system's own files, for deploying from git: Triton "
            "config.pbtxt per model, TF Serving's model config and batching parameters, or a "
            "Ray Serve config."
        ),
    )
    p.add_argument("plan", help="plan JSON (inferline.plan/1)")
    p.add_argument(
        "--to",
        nargs=2,
        required=True,
        metavar=("TARGET", "OUT"),
        help="triton DIR, tfserving DIR or ray-serve FILE (.yaml, .yml or .json)",
    )
    p.add_argument(
        "--repository",
        default=None,
        metavar="SRC",
        help="the operator's files to change only the planned fields of: Triton's model "
        "repository, or TF Serving's model config file",
    )
    p.add_argument(
        "--copy-models",
        action="store_true",
        help="triton: copy each model's files from --repository too (default: configs only)",
    )
    p.add_argument("--hardware", default=None, help="hardware catalog JSON overriding defaults")
    p.add_argument(
        "--base-path",
        default="/models",
        help="tfserving without --repository: the folder holding the models (default /models)",
    )
    p.add_argument(
        "--import-path",
        default=None,
        metavar="MODULE:APP",
        help="ray-serve: the import path of the bound application (default app:app)",
    )
    p.set_defaults(func=_export, check_args=_check_export_args)
