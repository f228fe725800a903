"""``inferline simulate --tuner inferline|autoscale|none``: a controller in the estimator's loop.

Called from the extension hooks of ``_cli_plan.py`` (``add_simulate_arguments``,
``make_controller``, ``after_simulation``). The estimator integrates replica cost over time,
so the reported ``cost_per_hour`` is the time average over the trace.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from inferline.cli._args import checked_by
from inferline.core import (
    AutoScaleConfig,
    AutoScaleController,
    EstimatorOptions,
    InferLineController,
    ModelConfig,
    TunerConfig,
    VariantController,
    packing_factor,
    pipeline_unit,
)

__all__ = [
    "add_config_flag",
    "add_ladder_knobs",
    "add_tuner_arguments",
    "after_tuned_simulation",
    "ladder_knobs",
    "make_tuner_controller",
]

log = logging.getLogger(__name__)

_DEFAULT = TunerConfig()
_HINTS = get_type_hints(TunerConfig)


def _tuner_field(name: str) -> Callable[[str], float]:
    """A ``TunerConfig`` number, checked by the config itself at parse time: a flag takes what
    the config takes, and a refusal names the flag, not the field."""
    return checked_by(lambda v: replace(_DEFAULT, **{name: v}))


def _or_off(name: str) -> Callable[[str], float | None]:
    """A ``float | None`` ``TunerConfig`` field: seconds, or ``off`` (None)."""
    number = _tuner_field(name)

    def parse(text: str) -> float | None:
        if text.strip().lower() in ("off", "none"):
            return None
        try:
            return number(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (or 'off')") from None

    return parse


def add_config_flag(
    g: Any, name: str, text: str, flag: str | None = None, choices: Sequence[str] | None = None
) -> argparse.Action:
    """One ``TunerConfig`` field as ``--<flag>`` (default: the field's name with dashes): the
    choices of its ``Literal`` type (or ``choices``, a subset), else a number the config accepts;
    the config's default. Derived, so a flag cannot drift from what the config accepts."""
    kind = _HINTS[name]
    default = getattr(_DEFAULT, name)
    if get_origin(kind) is Literal:
        allowed = tuple(choices) if choices is not None else get_args(kind)
        kw: dict[str, Any] = {"choices": allowed}
    elif type(None) in get_args(kind):  # float | None: seconds, or off
        kw = {"type": _or_off(name), "metavar": "S|off"}
    else:
        kw = {"type": _tuner_field(name)}
    return g.add_argument(  # type: ignore[no-any-return]
        "--" + (flag or name.replace("_", "-")),
        default=default,
        help=f"{text}; default {'off' if default is None else default}",
        **kw,
    )


# The ladder's choice flags: (TunerConfig field, help without the default); the flag is
# --tuner-<field>, its choices the field's Literal values.
_CHOICE_KNOBS: tuple[tuple[str, str], ...] = (
    (
        "trigger",
        "scale up when a window exceeds the planned envelope (envelope, the paper's) or also "
        "when the configuration's room over the traffic falls below the band (room)",
    ),
    (
        "down_to",
        "after the stabilization delay, move the configuration to the step for the recent "
        "traffic, adding replicas where it is short, so one without room is left (step), or "
        "move a model only where that saves a replica (saving: about 2%% cheaper in the "
        "benchmark, less safe)",
    ),
    (
        "step_lookahead",
        "after the stabilization delay, a rising rate keeps the configuration and sizes a move "
        "up, but the measured rate must ask for the move (hold), or the rise extrapolated ahead "
        "may start one as well (move: the earlier rule; a step change of the rate then moves it "
        "up and back)",
    ),
    (
        "headroom_basis",
        "the headroom is a share of the plan's mean rate, the same queries per second of room "
        "at every level (plan), or of the current rate (rate: the earlier rule, more room at a "
        "peak)",
    ),
)
# every TunerConfig field add_ladder_knobs sets (as --tuner-<field>)
_LADDER_KNOBS = (
    "headroom",
    "hysteresis",
    *(name for name, _ in _CHOICE_KNOBS),
    "headroom_rate_share",
    "settle_s",
)


def add_ladder_knobs(g: Any) -> None:
    """The ladder tuner's flags (headroom, hysteresis, trigger, scale-down target, settle),
    shared by ``simulate`` and ``serve``. Choices come from the config's types, so the CLI
    cannot drift from what ``TunerConfig`` accepts."""
    g.add_argument(
        "--tuner-headroom",
        type=_tuner_field("headroom"),
        default=_DEFAULT.headroom,
        help="tuner with a ladder: provision the measured rate plus headroom x the basis "
        f"(see --tuner-headroom-basis; default {_DEFAULT.headroom:g})",
    )
    g.add_argument(
        "--tuner-hysteresis",
        type=_tuner_field("hysteresis"),
        default=_DEFAULT.hysteresis,
        help="tuner with a ladder: scale up only once the current configuration's room falls "
        f"below headroom - hysteresis (default {_DEFAULT.hysteresis:g}; 0: no band)",
    )
    for name, text in _CHOICE_KNOBS:
        add_config_flag(
            g, name, f"tuner with a ladder: {text}", flag="tuner-" + name.replace("_", "-")
        )
    g.add_argument(
        "--tuner-headroom-rate-share",
        type=_tuner_field("headroom_rate_share"),
        default=_DEFAULT.headroom_rate_share,
        metavar="S",
        help="tuner with a ladder, headroom basis plan: the headroom is a share of the larger "
        "of the plan's mean rate and S x the rate, so far above the plan the room grows with "
        f"the level (0: the plan's rate alone; default {_DEFAULT.headroom_rate_share:g})",
    )
    g.add_argument(
        "--tuner-settle-s",
        type=_or_off("settle_s"),
        default=_DEFAULT.settle_s,
        metavar="S|off",
        help="tuner with a ladder: this long after a change (the replica activation time) "
        "batch sizes settle on those of a proven step the replicas hold "
        f"(default {_DEFAULT.settle_s:g}; off: larger batch sizes are kept)",
    )


def ladder_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """``TunerConfig`` keywords from :func:`add_ladder_knobs`' flags (defaults if absent)."""
    return {k: getattr(args, f"tuner_{k}", getattr(_DEFAULT, k)) for k in _LADDER_KNOBS}


def add_tuner_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tuning (a controller in the loop)")
    g.add_argument(
        "--tuner",
        choices=("none", "inferline", "autoscale"),
        default="none",
        help="InferLine's tuner, the AutoScale baseline (the plan replicated as a unit), or none",
    )
    g.add_argument(
        "--activation-delay-s",
        type=checked_by(lambda v: EstimatorOptions(activation_delay_s=v)),
        default=5.0,
        help="time for a new replica to start serving (default 5, the paper's)",
    )
    g.add_argument(
        "--tuner-up-rate",
        choices=("window", "scaled", "curve"),
        default=_DEFAULT.up_rate,
        help="rate a scale-up provisions for: the exceeding window's own rate (window, the "
        "paper), the planned rate scaled by the excess (scaled), or per model a service "
        "curve fitted to the arrival envelope so the queueing delay stays as planned (curve, "
        "the earlier InferLine paper; cheapest, no stochastic slack)",
    )
    g.add_argument(
        "--tuner-reconfigure",
        choices=("ladder", "replicas"),
        default=_DEFAULT.reconfigure,
        help="InferLine: batch sizes and replicas from the plan's ladder when it has one "
        "(ladder), or replica counts only, the paper's tuner (replicas)",
    )
    g.add_argument(
        "--lookahead-s",
        type=_tuner_field("lookahead_s"),
        default=_DEFAULT.lookahead_s,
        help="InferLine with a ladder: provision a rising rate this far ahead (0: off)",
    )
    add_ladder_knobs(g)
    g.add_argument(
        "--down-cap",
        choices=("none", "plan"),
        default=_DEFAULT.down_cap,
        help="InferLine, replicas only: cap scale-down at the plan while traffic is within "
        "the planned envelope",
    )
    g.add_argument(
        "--stabilization-s",
        type=_tuner_field("stabilization_delay_s"),
        default=_DEFAULT.stabilization_delay_s,
        help="InferLine: no scale-down until this long after a change",
    )
    g.add_argument(
        "--autoscale-wait-s",
        # the packing factor is a stand-in: the option sets the wait alone
        type=checked_by(lambda v: AutoScaleConfig(1.0, t_wait_s=v)),
        default=15.0,
        help="AutoScale: idle time before a pipeline unit is turned off",
    )
    g.add_argument(
        "--no-variant-switching",
        action="store_true",
        help="InferLine, plan made with --variants: change replicas and batch sizes only, never "
        "switch a stage to another variant (as serve --no-variant-switching)",
    )
    from inferline.cli._args import output_path
    from inferline.measure import plot_formats

    # checked before the simulation, as every output path is
    g.add_argument(
        "--timeline-plot",
        default=None,
        type=output_path(plot_formats, "a plot file"),
        help="write a timeline plot (PNG, SVG...)",
    )
    g.add_argument(
        "--decisions-out",
        default=None,
        type=output_path(),
        help="write the scaling decisions as JSON",
    )


def make_tuner_controller(args: argparse.Namespace, ctx: Any) -> Any:
    tuner = getattr(args, "tuner", "none")
    ctl: Any = None
    start = float(ctx.trace[0]) if ctx.trace.size else 0.0
    if tuner == "inferline":
        cfg = TunerConfig(
            stabilization_delay_s=args.stabilization_s,
            up_rate=args.tuner_up_rate,
            reconfigure=args.tuner_reconfigure,
            lookahead_s=args.lookahead_s,
            down_cap=args.down_cap,
            **ladder_knobs(args),
        )
        if ctx.plan.variants is not None and not getattr(args, "no_variant_switching", False):
            # the variant-aware tuner, as inferline serve runs it (docs/variants.md)
            ctl = VariantController.from_plan(ctx.plan, cfg, start_s=start, catalog=ctx.catalog)
        else:
            ctl = InferLineController(ctx.plan, cfg, start_s=start)
    elif tuner == "autoscale":
        unit, _ = pipeline_unit(ctx.plan.models)
        unit_cfg = {
            m: ModelConfig(c.hardware, c.max_batch_size, unit[m])
            for m, c in ctx.plan.models.items()
        }
        p = packing_factor(
            ctx.pipeline,
            unit_cfg,
            ctx.profiles,
            ctx.plan.slo_s,
            percentile=ctx.plan.percentile,
            options=ctx.options,
            catalog=ctx.catalog,
        )
        log.info("AutoScale: unit %s, packing factor %.2f requests per unit", unit, p)
        ctl = AutoScaleController(ctx.plan, AutoScaleConfig(p, t_wait_s=args.autoscale_wait_s))
    args._tuner_controller = ctl
    return ctl


def after_tuned_simulation(args: argparse.Namespace, ctx: Any, result: Any) -> None:
    ctl = getattr(args, "_tuner_controller", None)
    decisions = list(getattr(ctl, "decisions", []))
    if getattr(args, "decisions_out", None):
        Path(args.decisions_out).write_text(
            json.dumps([d.to_dict() for d in decisions], indent=1) + "\n"
        )
    if getattr(args, "timeline_plot", None):
        from inferline.measure import plot_timeline

        plot_timeline(
            result,
            ctx.plan.slo_s,
            args.timeline_plot,
            decisions=decisions,
            title=f"{ctx.pipeline.name}: tuner {getattr(args, 'tuner', 'none')}",
        )
    if ctl is not None and not getattr(args, "json", False):
        ups = sum(1 for d in decisions if d.action == "up")
        settles = sum(1 for d in decisions if getattr(d, "action", "") == "settle")
        downs = len(decisions) - ups - settles
        switches = getattr(result, "variant_switches", ())
        print(
            f"tuner {args.tuner}: {ups} scale-ups, {downs} scale-downs"
            + (f", {settles} batch-size settles" if settles else "")
            + (f", {len(switches)} variant switches" if switches else "")
        )
        for d in decisions[:20]:
            print(f"  {d.time_s - float(ctx.trace[0]):9.2f} s  {d.reason}")
        if len(decisions) > 20:
            print(f"  ... {len(decisions) - 20} more (--decisions-out FILE for all)")
