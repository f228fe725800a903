"""``inferline profile``: batch latency of a deployment's models per hardware and batch size (InferLine §4.1), with the latency fits."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferline.cli._args import (
    count,
    int_in,
    output_path,
    positive,
)
from inferline.cli._server_args import run_loop
from inferline.core import (
    ValidationError,
    save,
)

__all__ = ["add_profiler_arguments", "register", "wake_idle_s"]

# batches a point takes at least (--quick: 20): --max-samples below it was refused by the
# profiler's options, naming their fields, not the flag
_MIN_SAMPLES = 50


def _profile(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from inferline.deploy import load_deployment
    from inferline.measure import ProfilerOptions, profile_deployment

    dep = load_deployment(args.deployment)
    quick = args.quick
    opts = ProfilerOptions(
        max_batch_size=args.max_batch,
        warmup=2 if quick else 5,
        min_samples=20 if quick else _MIN_SAMPLES,
        max_samples=60 if quick else args.max_samples,
        max_seconds_per_point=1.0 if quick else 4.0,
        statistic=args.statistic,
        contention=args.contention,
        hardware=tuple(args.hardware) if args.hardware else None,
        wake_idle_s=wake_idle_s(args),
        wake_samples=10 if quick else 20,
    )
    console = Console(stderr=True)
    stages = None
    if args.variants:
        from inferline.core import PipelineVariants, load_json

        try:
            doc = PipelineVariants.from_dict(load_json(args.variants))
        except ValidationError as e:
            raise ValidationError(f"{args.variants}: {e.field}", e.expected, e.got) from None
        stages = {s: [v.name for v in sv.variants] for s, sv in doc.stages.items()}
        unknown = sorted({n for ns in stages.values() for n in ns} - {m.name for m in dep.models})
        if unknown:
            raise ValidationError(
                f"{args.variants}: stages", f"variants that are models of {dep.name!r}", unknown
            )
    samples = None
    if args.samples is not None:
        samples = dep.load_sample_inputs()[: args.samples]
    with Progress(
        TextColumn("[bold]profiling[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("tracing the pipeline", total=None)

        def progress(model: str, hw: str, b: int, done: int, total: int) -> None:
            bar.update(task, description=f"{model} on {hw}, batch {b}", completed=done, total=total)

        try:
            result, pipeline = run_loop(
                profile_deployment(
                    dep, opts, app=args.app, samples=samples, progress=progress, stages=stages
                )
            )
        except ValidationError as e:
            # the profiler checks the kinds against the backend's, which exists only by now
            if e.field != "hardware" or not args.hardware:
                raise
            raise ValidationError("--hardware", e.expected, e.got) from None
    save(result.profiles, args.output)
    print(f"wrote profiles of {len(result.profiles.models)} models to {args.output}")
    if args.pipeline_out:
        save(pipeline, args.pipeline_out)
        print(f"wrote pipeline {pipeline.name!r} to {args.pipeline_out}")
    if args.fits_out:
        Path(args.fits_out).write_text(
            json.dumps([f.to_dict() for f in result.fits], indent=2) + "\n"
        )
    from inferline.measure import print_fits

    print_fits(result, console=None)
    return 0


def add_profiler_arguments(p: argparse.ArgumentParser) -> None:
    """``--statistic``, ``--contention`` and ``--wake-idle-ms``: how a profile is measured
    (``inferline profile`` and the benchmarks that profile, e.g. ``benchmarks/fidelity.py``)."""
    from inferline.measure import STATISTICS, ProfilerOptions

    default_gaps = [round(g * 1e3, 3) for g in ProfilerOptions().wake_idle_s]
    p.add_argument(
        "--statistic",
        default="mean",
        choices=sorted(STATISTICS),
        help="what becomes latency_s (default mean)",
    )
    p.add_argument(
        "--contention",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="profile with extra replicas busy on the free cores (default on, as InferLine)",
    )
    p.add_argument(
        "--wake-idle-ms",
        nargs="*",
        type=positive("an idle gap in ms"),
        default=default_gaps,
        metavar="MS",
        help="also time batches of 1 after these idle gaps, for the wake-up extra the estimator "
        "adds to a batch that starts on an idle replica (default: %(default)s; "
        "none given: skip)",
    )


def wake_idle_s(args: argparse.Namespace) -> tuple[float, ...]:
    """``--wake-idle-ms`` as increasing seconds."""
    return tuple(sorted({g / 1e3 for g in args.wake_idle_ms}))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("profile", help="profile a deployment's models (batch latency per hardware)")
    p.add_argument("--deployment", required=True, help="deployment JSON (inferline.deployment/1)")
    # outputs are checked up front: profiling takes minutes
    p.add_argument(
        "-o",
        "--output",
        type=output_path(),
        required=True,
        help="where to write the profiles JSON",
    )
    p.add_argument(
        "--pipeline-out",
        type=output_path(),
        default=None,
        help="also write the traced pipeline DAG",
    )
    p.add_argument(
        "--fits-out", type=output_path(), default=None, help="also write the latency fits as JSON"
    )
    p.add_argument("--app", default=None, help="app whose pipeline to trace (default: first)")
    p.add_argument("--max-batch", type=count, default=32, help="largest batch size (powers of 2)")
    p.add_argument(
        "--max-samples",
        type=int_in(_MIN_SAMPLES, what="a count of batches"),
        default=400,
        help=f"most batches per point (at least {_MIN_SAMPLES}; --quick: 60)",
    )
    # -1 dropped the last sample ([:-1]) and 0 left none
    p.add_argument("--samples", type=count, default=None, help="use only N sample queries")
    add_profiler_arguments(p)
    p.add_argument("--hardware", nargs="*", default=None, help="only these hardware kinds")
    p.add_argument("--quick", action="store_true", help="fewer samples (noisier, faster)")
    p.add_argument(
        "--variants",
        default=None,
        metavar="FILE",
        help="model variants per stage (inferline.variants/1): a pipeline call of a stage runs "
        "its first variant while tracing, and every variant is profiled on the stage's inputs",
    )
    p.set_defaults(func=_profile)
