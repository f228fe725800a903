"""``inferline plan``: choose hardware, batch size and replicas per model for an SLO.

It runs a planning strategy (InferLine's planner or the CG-Mean / CG-Peak baselines) on a sample
trace and writes a plan file, with the tuner's ladder unless ``--no-ladder``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from inferline.cli._args import count, number_in, output_path, seed
from inferline.cli._estimator_args import (
    add_hop_overhead,
    add_inventory_arguments,
    add_nodes_argument,
    check_inventory_args,
    cores_model,
    rate_margin,
)
from inferline.cli._plan_deployment import add_deployment_option, apply_deployment
from inferline.core import (
    STRATEGIES,
    EstimatorOptions,
    HardwareCatalog,
    Pipeline,
    PipelineVariants,
    Plan,
    PlannerOptions,
    PlanProgress,
    Profiles,
    ValidationError,
    VariantPlan,
    load_catalog,
    load_json,
    load_pipeline,
    load_profiles,
    load_trace,
    make_plan,
    place_on_nodes,
    plan_with_variants,
    plan_with_variants_section,
    save,
    stage_profiles,
)
from inferline.core.planning import AUTO_MARGIN, resolve_margin

__all__ = ["SLACK_HINT", "register"]

log = logging.getLogger(__name__)


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


# ---------------------------------------------------------------- plan


def _plan(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.pipeline)
    profiles = load_profiles(args.profiles)
    trace = load_trace(args.trace)
    catalog = load_catalog(args.hardware)
    apply_deployment(args)
    options = _planner_options(args)
    t0 = time.monotonic()
    plan, vplan = _plan_with_progress(args, pipeline, profiles, trace, catalog, options)
    elapsed = time.monotonic() - t0
    save(plan, args.output)
    print(
        f"wrote {plan.strategy} plan for {pipeline.name!r} to {args.output}: "
        f"${plan.cost_per_hour:.4f}/h, estimated P{plan.percentile:g} "
        f"{plan.estimated_latency_s:.4f} s (SLO {plan.slo_s:g} s), planned in {elapsed:.1f} s"
    )
    if vplan is not None:
        _print_variants(vplan)
    _print_configs(pipeline, plan, catalog)
    _print_server_batchers(plan)
    _print_notes(args, plan, catalog, options, trace)
    return 0


def _planner_options(args: argparse.Namespace) -> PlannerOptions:
    """The planner's and its estimator's settings from ``plan``'s options."""
    return PlannerOptions(
        estimator=EstimatorOptions(
            seed=args.seed,
            hop_overhead_s=args.hop_overhead_ms / 1e3,
            wake_up=args.wake_up,
            service_spread=args.service_spread,
            **cores_model(args),
        ),
        escape=not args.paper_only,
        widen=not args.paper_only,
        batch_wait=args.batch_wait and not args.paper_only,
        rate_margin=args.rate_margin,
        inventory=args.inventory,
        replica_units=args.cpu_threads,
        gpu_host_units=args.gpu_host_cores,
        nodes=args.inventory_nodes,
        server=args.server,
        early_stop=args.early_stop,
        screen=args.screen,
        screen_margin=args.screen_margin,
        workers=args.search_workers,
        admission=args.admission,
        admission_buffer_s=args.admission_buffer_ms / 1e3,
        max_refused=args.max_refused,
    )


def _plan_with_progress(
    args: argparse.Namespace,
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    catalog: HardwareCatalog,
    options: PlannerOptions,
) -> tuple[Plan, VariantPlan | None]:
    """The plan (with its ladder and variants section), under a spinner on stderr that names
    the planner's current step: planning can take minutes. Also the variant plan, if any."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[strategy]}[/] {task.description}"),
        TimeElapsedColumn(),
        console=_console(),
        transient=True,
        # no refresh thread: the planner forks its search workers only from a process with
        # one thread (forking a threaded one can deadlock), so the bar redraws on each step
        auto_refresh=False,
    ) as bar:
        task = bar.add_task("starting", total=None, strategy=args.strategy)

        def say(description: str) -> None:
            bar.update(task, description=description, refresh=True)

        def progress(p: PlanProgress) -> None:
            say(
                f"{p.phase} step {p.iteration}: ${p.cost_per_hour:.3f}/h, "
                f"{p.simulations} simulations - {p.message}"
            )

        variants = vplan = None
        plan_profiles = profiles
        if args.variants:
            vplan, variants = _plan_variants(
                args, pipeline, profiles, trace, catalog, options, progress
            )
            plan, plan_profiles = vplan.plan, stage_profiles(profiles, vplan.choice)
        else:
            plan = make_plan(
                args.strategy,
                pipeline,
                profiles,
                trace,
                args.slo_s,
                percentile=args.percentile,
                catalog=catalog,
                options=options,
                progress=progress,
            )
        if args.strategy == "inferline" and not args.no_ladder:
            plan = _with_ladder(args, pipeline, plan_profiles, trace, plan, catalog, options, say)
        if vplan is not None and variants is not None:
            plan = plan_with_variants_section(vplan, pipeline, variants, profiles, plan)
    return plan, vplan


def _with_ladder(
    args: argparse.Namespace,
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    plan: Plan,
    catalog: HardwareCatalog,
    options: PlannerOptions,
    say: Callable[[str], None],
) -> Plan:
    """``plan`` with the tuner's ladder: re-plans of its hardware at higher rates."""
    from inferline.core import plan_ladder

    def step_done(f: float, step: Any) -> None:
        what = f"${step.cost_per_hour:.3f}/h" if step is not None else "infeasible"
        say(f"tuner ladder: {f:g}x the sample's rate {what}")

    steps = plan_ladder(
        pipeline,
        profiles,
        trace,
        plan,
        catalog=catalog,
        options=options,
        progress=step_done,
        workers=args.workers,
    )
    assert plan.tuner is not None
    return replace(plan, tuner=replace(plan.tuner, ladder=steps))


def _print_notes(
    args: argparse.Namespace,
    plan: Plan,
    catalog: HardwareCatalog,
    options: PlannerOptions,
    trace: np.ndarray,
) -> None:
    """What the table does not say: the placement on ``--nodes``, the rate margin used, the
    tuner's ladder and its room, and the per-hop overhead left out."""
    if options.nodes:
        placed = place_on_nodes(plan.models, catalog, options)
        print(
            "on the nodes (first-fit decreasing): "
            + "; ".join(
                f"{n}: " + (", ".join(f"{m} x{k}" for m, k in ms.items()) or "nothing")
                for n, ms in placed.items()
            )
        )
    margin = float(resolve_margin(options, trace).rate_margin)
    if options.rate_margin == AUTO_MARGIN and args.strategy == "inferline":
        print(
            f"rate margin: auto, {margin:.1%} (judged on the sample sped up by that much: the "
            "spread of its 5 s rates, plus a floor, says a fresh realization of the same process "
            "can need that much; `--rate-margin 0` is the paper's test)"
        )
    if plan.tuner is not None and plan.tuner.ladder:
        print(
            "tuner ladder (same hardware, batch x replicas): "
            + "; ".join(
                f"{st.rate_qps:.1f} q/s ${st.cost_per_hour:.3f}/h" for st in plan.tuner.ladder
            )
        )
        print(_room_note(plan, margin))
    if args.hop_overhead_ms == 0:
        print(_HOP_NOTE)


# The estimate covers queueing and batch latency only; a live system adds its own time per
# model a query visits (HTTP, RPC, event loop). Plans near the SLO missed it live without this.
_HOP_NOTE = (
    "note: the estimate leaves out the serving system's own time per model visited (HTTP, "
    "RPC, queue: about 2 ms per hop on the bundled runtime, as `inferline demo` measures); "
    "pass --hop-overhead-ms to plan with it, or keep the estimate well below the SLO"
)


def _plan_variants(
    args: argparse.Namespace,
    pipeline: Pipeline,
    profiles: Profiles,
    trace: np.ndarray,
    catalog: HardwareCatalog,
    options: PlannerOptions,
    progress: Any = None,
) -> tuple[VariantPlan, PipelineVariants]:
    """The cheapest combination of variants meeting the floors and the SLO (docs/variants.md)."""
    doc = load_json(args.variants)  # its errors name the file already
    try:
        variants = PipelineVariants.from_dict(doc)
    except ValidationError as e:
        raise ValidationError(f"{args.variants}: {e.field}", e.expected, e.got) from None
    try:
        variants.check(pipeline, profiles)
    except ValidationError as e:
        raise ValidationError(f"{args.variants}: {e.field}", e.expected, e.got) from None
    vplan = plan_with_variants(
        pipeline,
        variants,
        profiles,
        trace,
        args.slo_s,
        accuracy_floor=args.accuracy_floor,
        strategy=args.strategy,
        catalog=catalog,
        percentile=args.percentile,
        options=options,
        progress=progress,
    )
    return vplan, variants


def _print_variants(vplan: VariantPlan) -> None:
    print(
        "variants: "
        + ", ".join(f"{s} -> {v}" for s, v in vplan.choice.items())
        + f" (pipeline accuracy {vplan.accuracy:.4f}); combinations:"
    )
    for choice, acc, cost, note in vplan.considered:
        what = f"${cost:.3f}/h" if cost is not None else "-"
        names = ", ".join(f"{s}={v}" for s, v in choice.items())
        print(f"  {names}: accuracy {acc:.4f}, {what} ({note})")


# Below this room over the sample's rate the note suggests ``--rate-margin``: in
# benchmarks/plan_generalization.py 17% of fresh runs of margin-0 plans missed the SLO, 2% with
# a 0.05 margin (+0-5% cost).
SLACK_HINT = 0.05


def _room_note(plan: Plan, rate_margin: float = 0.0) -> str:
    """How much more than the sample's mean rate the plan's cost is proven for, and what that
    means for the tuner (the plan is the cheapest configuration for the sample, so it may have
    almost no room; docs/tuner.md, "where the tuner stands")."""
    from inferline.core import TunerConfig

    assert plan.tuner is not None
    mean = plan.tuner.mean_rate_qps
    # the ladder keeps the plan as a step unless a configuration as cheap serves more
    same_cost = [
        st.rate_qps for st in plan.tuner.ladder if st.cost_per_hour <= plan.cost_per_hour * 1.0001
    ]
    proven = max([mean, *same_cost])
    room = proven / mean - 1.0
    cfg = TunerConfig()
    band = cfg.headroom - cfg.hysteresis
    text = (
        f"at the plan's cost the ladder is proven up to {proven:.1f} q/s, {room:.1%} over the "
        f"sample's {mean:.1f} q/s"
    )
    if rate_margin > 0:
        text += f" (with the rate margin of {rate_margin:.0%} on top)"
    if room < band:
        text += (
            f"; with less room than the tuner's band ({band:.0%}), a rise from the planned "
            "workload overloads it before a window exceeds the planned envelope: the tuner "
            f"leaves it {cfg.stabilization_delay_s:g} s after a change (`--tuner-down-to step`, "
            "the default), `--tuner-trigger room` at once (docs/tuner.md)"
        )
    text += _steady_note(plan, cfg)
    if rate_margin == 0 and room < SLACK_HINT:
        text += (
            f"; under {SLACK_HINT:.0%} of throughput slack, another sample of the same traffic "
            "can miss the SLO: `--rate-margin auto` (the default) sizes the slack from the "
            f"sample's variability, `--rate-margin {SLACK_HINT:g}` sets it "
            "(benchmarks/plan_generalization.py)"
        )
    return text


def _steady_note(plan: Plan, cfg: object) -> str:
    """What the default tuner runs at the sample's own rate, where that costs more than the
    plan: it keeps its headroom over the traffic (``down_to="step"``), so a plan with less room
    runs on a dearer step at the planned workload. Said here so the bill is no surprise."""
    from inferline.core import TunerConfig, TunerPolicy

    assert isinstance(cfg, TunerConfig) and plan.tuner is not None
    policy = TunerPolicy.from_plan(plan, cfg)
    if not policy.uses_ladder:
        return ""
    _, _, i = policy.target(policy.room(plan.tuner.mean_rate_qps, cfg.headroom))
    if i == 0 or i > len(plan.tuner.ladder):
        return ""
    step = plan.tuner.ladder[i - 1]
    if step.cost_per_hour <= plan.cost_per_hour * 1.0001:
        return ""
    return (
        f"; at the planned workload the tuner keeps {cfg.headroom:.0%} headroom over the "
        f"traffic and so runs the {step.rate_qps:.1f} q/s step at ${step.cost_per_hour:.3f}/h "
        f"(the plan: ${plan.cost_per_hour:.3f}/h); `--tuner-headroom` on simulate and serve "
        "sets that room, `--tuner-down-to saving` stays on the plan until a window exceeds the "
        "planned envelope (docs/tuner.md)"
    )


def _print_server_batchers(plan: Plan) -> None:
    """A plan made for a server's own batcher (``--server``): its settings per model."""
    for name, b in sorted(plan.server_batchers.items()):
        knobs = ", ".join(f"{k} {v}" for k, v in b.items() if k not in ("kind", "max_batch_size"))
        print(f"{name}: {b['kind']} batcher, max batch {b['max_batch_size']}, {knobs}")


def _print_configs(pipeline: Pipeline, plan: Plan, catalog: HardwareCatalog) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"plan ({plan.strategy})")
    waits = any(c.batch_wait_ms > 0 for c in plan.models.values())
    cols = ("model", "hardware", "max batch", *(("batch wait ms",) if waits else ()), "replicas")
    for col in (*cols, "$/h"):
        t.add_column(col, justify="left" if col in ("model", "hardware") else "right")
    for m in pipeline.models:
        c = plan.config(m)
        served = plan.variants.model_for(m) if plan.variants is not None else m
        t.add_row(
            m if served == m else f"{m} ({served})",
            c.hardware,
            str(c.max_batch_size),
            *((f"{c.batch_wait_ms:g}" if c.batch_wait_ms else "-",) if waits else ()),
            str(c.replicas),
            f"{c.cost_per_hour(catalog):.4f}",
        )
    Console().print(t)


# ---------------------------------------------------------------- registration


_slo_s = number_in(0, 3600, "seconds", lo_open=True)
# P0 is the fastest query: planning for it is no latency objective
_percentile = number_in(0, 100, "a percentile", lo_open=True)


def _check_plan_args(args: argparse.Namespace) -> str | None:
    """Rules over several of ``plan``'s options, checked at parse time (cli._CommandParser)."""
    if args.accuracy_floor is not None and args.variants is None:
        # without variants there is no choice for the floor to steer: it was silently ignored
        return "argument --accuracy-floor: needs --variants"
    if args.max_refused is not None and not (args.admission or args.deployment):
        return "argument --max-refused: needs --admission (or --deployment with admission)"
    if args.admission and args.server is not None:
        return "argument --admission: not with --server (the server's batcher has its own rules)"
    return check_inventory_args(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="choose hardware, batch size and replicas per model for an SLO",
        description="Plan a pipeline for a latency SLO on a sample trace and write a plan file.",
    )
    # added in this order: it is the order of ``plan --help``
    _add_input_options(p)
    _add_planner_options(p)
    add_inventory_arguments(
        p,
        "the plan never needs more, and the answer names the inventory when no plan fits",
    )
    add_nodes_argument(p)
    _add_ladder_options(p)
    _add_variant_options(p)
    p.add_argument(
        "-o", "--output", type=output_path(), required=True, help="where to write the plan JSON"
    )
    p.set_defaults(func=_plan, check_args=_check_plan_args)


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """What is planned: the pipeline, its profiles, the sample trace, the SLO, the hardware."""
    p.add_argument("--pipeline", required=True, help="pipeline JSON (inferline.pipeline/1)")
    p.add_argument("--profiles", required=True, help="profiles JSON (inferline.profiles/1)")
    p.add_argument("--trace", required=True, help="sample arrival trace used for planning")
    p.add_argument("--slo-s", type=_slo_s, required=True, help="latency objective, seconds")
    p.add_argument(
        "--percentile", type=_percentile, default=99.0, help="tail percentile (default 99)"
    )
    p.add_argument("--hardware", default=None, help="hardware catalog JSON overriding defaults")


def _add_planner_options(p: argparse.ArgumentParser) -> None:
    """How the plan is searched for and judged."""
    p.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        default="inferline",
        help="InferLine's planner or the CG-Mean / CG-Peak baselines (default %(default)s)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the conditional visits")
    add_hop_overhead(p)
    p.add_argument(
        "--paper-only",
        action="store_true",
        help="InferLine's Algorithms 1-2 only (no escape from local optima, no slack polish)",
    )
    p.add_argument(
        "--server",
        choices=["triton", "tfserving"],
        default=None,
        help="plan the server's own batcher instead of inferline's queue: Triton's dynamic "
        "batcher (instances, max batch, preferred sizes, queue delay, a queue timeout from the "
        "SLO) or TF Serving's batch scheduler (instances, max batch, batch timeout, threads, "
        "queue bound); the plan carries them as server_batchers, and `inferline export` writes "
        "them (docs/steer-planning.md)",
    )
    p.add_argument(
        "--early-stop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop simulating a candidate once more queries have certainly missed the SLO than "
        "the percentile allows (the same verdict and plan, less time; default on)",
    )
    p.add_argument(
        "--screen",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a trace of 500,000 queries or more, judge candidates on its busiest windows "
        "plus a random sample of the rest, confirming close verdicts and the final plan on "
        "the whole trace (a failed plan is searched again exactly; default on; "
        "docs/planner.md)",
    )
    p.add_argument(
        "--screen-margin",
        type=float,
        default=0.5,
        help="a screened candidate whose estimated miss share is within this fraction of the "
        "percentile's allowance is judged on the whole trace (default %(default)s)",
    )
    p.add_argument(
        "--search-workers",
        type=int,
        default=2,
        help="processes evaluating the search's next candidates ahead of it on a trace of "
        "200,000 queries or more (the plan does not depend on their number; default "
        "%(default)s)",
    )
    _add_admission_options(p)
    p.add_argument(
        "--batch-wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let the planner give a model a batch-wait timeout (delayed batching, "
        "batch_wait_ms in the plan; serve installs it) where that makes the plan cheaper: "
        "a plan is never dearer with it, and carries a wait only where the SLO needs it at the "
        "lower cost (default on; --no-batch-wait: greedy batching everywhere; docs/planner.md)",
    )
    p.add_argument(
        "--rate-margin",
        type=rate_margin,
        default=AUTO_MARGIN,
        metavar="M",
        help="judge configurations on the sample sped up by 1+M, keeping that much throughput "
        "slack. auto (the default): M from the spread of the sample's 5 s windowed rates, "
        "0.03 plus 2 x sqrt(2) standard errors of its mean rate (a fresh realization's rate "
        "differs by both errors), at most 0.5: about 0.056 for 120 s of Poisson traffic at "
        "100 q/s, 0.13 at CV 4. A number overrides it; 0 is the paper's test. The cheapest plan for one "
        "sample can sit near saturation and miss the SLO on the next realization of the same "
        "process (benchmarks/plan_generalization.py)",
    )


def _add_admission_options(p: argparse.ArgumentParser) -> None:
    """Planning for the live queue's admission by predicted completion (docs/deadlines.md)."""
    p.add_argument(
        "--admission",
        action="store_true",
        help='plan for queue.admission "predicted": the estimator refuses as the live queue '
        "does, a refusal counts as a miss (misses plus refusals within the percentile); "
        "no batch waits",
    )
    p.add_argument(
        "--admission-buffer-ms",
        type=number_in(0, 1000, "milliseconds"),
        default=None,
        help="admission's buffer before the deadline, ms (default: --deployment's, else 2)",
    )
    p.add_argument(
        "--max-refused",
        type=number_in(0, 1, "a share of the queries"),
        default=None,
        help="with --admission: at most this share of the queries refused (0.001: 0.1%%)",
    )
    add_deployment_option(p)


def _add_ladder_options(p: argparse.ArgumentParser) -> None:
    """The tuner's ladder written with the plan."""
    p.add_argument(
        "--no-ladder",
        action="store_true",
        help="skip the tuner's ladder (re-plans of the planned hardware at higher rates, "
        "so the tuner can change batch sizes as well as replicas; docs/tuner.md)",
    )
    p.add_argument(
        "--workers",
        type=count,
        default=None,
        help="threads planning the ladder's rate factors at once (default: one per CPU)",
    )


def _add_variant_options(p: argparse.ArgumentParser) -> None:
    """Model variants per stage and the accuracy they must keep (docs/variants.md)."""
    p.add_argument(
        "--variants",
        default=None,
        metavar="FILE",
        help="model variants per stage (inferline.variants/1): plan the cheapest combination "
        "meeting the accuracy floors and the SLO; the plan records the choice so that the live "
        "tuner can switch stages (docs/variants.md)",
    )
    p.add_argument(
        "--accuracy-floor",
        type=number_in(0, 1, "an accuracy"),
        default=None,
        metavar="A",
        help="with --variants: floor on the pipeline accuracy (overrides the document's)",
    )
