"""``inferline simulate``: run the estimator on a plan and a trace; tail latency, SLO miss rate, cost and per-model utilization (``--json``: one object).

Extending it (the tuner's ``--tuner`` and ``--timeline-plot``): add arguments in
:func:`add_simulate_arguments`, build the controller in :func:`make_controller` and add any
output in :func:`after_simulation`; each receives the :class:`SimulateContext`.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from inferline.cli._args import seed
from inferline.cli._estimator_args import (
    add_hop_overhead,
    add_inventory_arguments,
    check_inventory_args,
    cores_model,
)
from inferline.core import (
    Controller,
    EstimatorOptions,
    HardwareCatalog,
    InventoryCap,
    Pipeline,
    Plan,
    PlannerOptions,
    Profiles,
    SimResult,
    ValidationError,
    load_catalog,
    load_pipeline,
    load_plan,
    load_profiles,
    load_trace,
    simulate,
    stage_profiles,
)

__all__ = [
    "SimulateContext",
    "add_simulate_arguments",
    "after_simulation",
    "make_controller",
    "register",
]

log = logging.getLogger(__name__)


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@dataclass(frozen=True)
class SimulateContext:
    """Everything ``simulate`` loaded, for the extension hooks."""

    pipeline: Pipeline
    profiles: Profiles
    plan: Plan
    trace: np.ndarray
    catalog: HardwareCatalog
    options: EstimatorOptions


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``inferline simulate``; extensions add theirs here."""
    p.add_argument("--pipeline", required=True, help="pipeline JSON (inferline.pipeline/1)")
    p.add_argument("--profiles", required=True, help="profiles JSON (inferline.profiles/1)")
    p.add_argument("--plan", required=True, help="plan JSON written by `inferline plan`")
    p.add_argument("--trace", required=True, help="arrival trace (one time in seconds per line)")
    p.add_argument("--hardware", default=None, help="hardware catalog JSON overriding defaults")
    p.add_argument("--seed", type=seed, default=0, help="seed of the conditional visits")
    add_hop_overhead(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    add_inventory_arguments(
        p,
        "a tuner in the loop scales up only as far as it fits, as a backend without room "
        "refuses the live tuner (the cut target is retried)",
    )
    from inferline.cli._tuner_args import add_tuner_arguments

    add_tuner_arguments(p)


def make_controller(args: argparse.Namespace, ctx: SimulateContext) -> Controller | None:
    """The controller (tuner) in the loop; none: the plan's replicas stay fixed."""
    from inferline.cli._tuner_args import make_tuner_controller

    return make_tuner_controller(args, ctx)


def after_simulation(args: argparse.Namespace, ctx: SimulateContext, result: SimResult) -> None:
    """Extra outputs after a simulation (plots, files); nothing by default."""
    from inferline.cli._tuner_args import after_tuned_simulation

    after_tuned_simulation(args, ctx, result)


def _check_plan_matches(pipeline: Pipeline, plan: Plan) -> None:
    missing = [m for m in pipeline.models if m not in plan.models]
    if missing:
        raise ValidationError(
            "plan.models", f"a configuration for every model of {pipeline.name!r}", missing
        )
    extra = [m for m in plan.models if m not in pipeline.models]
    if extra:
        raise ValidationError("plan.models", f"only models of {pipeline.name!r}", extra)
    if plan.pipeline != pipeline.name:
        log.warning("plan was made for pipeline %r, simulating %r", plan.pipeline, pipeline.name)


def _simulate(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.pipeline)
    profiles = load_profiles(args.profiles)
    plan = load_plan(args.plan)
    trace = load_trace(args.trace)
    catalog = load_catalog(args.hardware)
    _check_plan_matches(pipeline, plan)
    if plan.variants is not None:
        # the stages start on the variants the plan chose; a variant-aware tuner in the loop
        # may switch them (the profiles keep every variant's own entry)
        profiles = stage_profiles(profiles, plan.variants.choice)
    opts = EstimatorOptions(
        seed=args.seed,
        activation_delay_s=getattr(args, "activation_delay_s", 0.0),
        hop_overhead_s=args.hop_overhead_ms / 1e3,
        wake_up=args.wake_up,
        service_spread=args.service_spread,
        **cores_model(args),
    )
    ctx = SimulateContext(pipeline, profiles, plan, trace, catalog, opts)
    controller = make_controller(args, ctx)
    if controller is not None and args.inventory:
        controller = InventoryCap.for_plan(
            controller,
            plan.models,
            catalog,
            PlannerOptions(
                inventory=args.inventory,
                replica_units=args.cpu_threads,
                gpu_host_units=args.gpu_host_cores,
            ),
        )
    with _console().status(f"simulating {trace.size} queries through {pipeline.name!r}"):
        result = simulate(
            pipeline,
            plan.models,
            profiles,
            trace,
            options=ctx.options,
            catalog=catalog,
            controller=controller,
            variants=getattr(controller, "stage_variants", None),
        )
    if hasattr(controller, "stage_variants"):  # the variant-aware tuner ran: name them
        result = replace(result, variant_switches=controller.named(result.variant_switches))
    summary = result.summary(plan.slo_s, plan.percentile)
    if isinstance(controller, InventoryCap):
        summary["scale_ups_cut_to_inventory"] = controller.capped
    if hasattr(controller, "stage_variants"):
        summary["variant_switches"] = [
            {"time_s": t - float(trace[0]), "stage": st, "variant": v}
            for t, st, v in result.variant_switches
        ]
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(ctx, summary)
    after_simulation(args, ctx, result)
    return 0


def _print_summary(ctx: SimulateContext, summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    plan = ctx.plan
    key = next(k for k in summary if k.startswith("latency_p"))
    late = summary["slo_miss_rate"]
    ok = summary[key] <= plan.slo_s
    head = Table(title=f"{ctx.pipeline.name}: {summary['queries']} queries", show_header=False)
    head.add_column("", justify="left")
    head.add_column("", justify="right")
    colour = "green" if ok else "red"
    head.add_row(f"P{plan.percentile:g} latency", f"[{colour}]{summary[key]:.4f} s[/]")
    head.add_row("SLO", f"{plan.slo_s:g} s")
    head.add_row("SLO miss rate", f"{late * 100:.2f} %")
    head.add_row("cost", f"${summary['cost_per_hour']:.4f}/h")
    models = Table(title="per model")
    for col in ("model", "hardware", "batch", "replicas", "utilization", "mean batch", "queue"):
        models.add_column(col, justify="left" if col in ("model", "hardware") else "right")
    for m in ctx.pipeline.models:
        c = plan.config(m)
        s = summary["models"][m]
        models.add_row(
            m,
            c.hardware,
            str(c.max_batch_size),
            str(c.replicas),
            f"{s['utilization'] * 100:.1f} %",
            f"{s['mean_batch_size']:.2f}",
            f"{s['mean_queue_delay_s'] * 1e3:.2f} ms",
        )
    console = Console()
    console.print(head)
    console.print(models)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser(
        "simulate",
        help="estimate tail latency, SLO misses and cost of a plan on a trace",
        description="Run the discrete-event estimator on a plan and a trace.",
    )
    add_simulate_arguments(s)
    s.set_defaults(func=_simulate, check_args=check_inventory_args)
