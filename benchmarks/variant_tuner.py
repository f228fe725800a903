"""The variant-aware tuner against the plain tuner, in simulation (docs/variants.md).

A plan made with model variants (``plan_with_variants``) for the image-processing and
social-media pipelines of ``benchmarks/_pipelines.py``, whose ResNet152 stage may also be
served by a ResNet50-like variant: 0.45x ResNet152's batch latencies on every hardware,
ImageNet top-1 accuracy 0.761 against 0.783 (torchvision's published figures), pipeline
accuracy floor 0.75. At the planned 60 q/s both variants need the same hardware, so the
planner picks ResNet152 (equal cost: the more accurate); a rise then makes the tuner choose
between adding ResNet152 replicas (``plain``: the tuner with variant switching off, as
``--no-variant-switching``) and switching the stage to ResNet50 (``variants``:
``VariantController``, what ``inferline serve`` runs for such a plan).

Cases (live traces; the plan is made on a separate 60 q/s CV 1 sample as long as the live
trace): ``rate-tau<T>`` 60 q/s, a ramp over T s to 150 q/s, 60 s there, back over T s;
``cv1to4``: 60 q/s, CV 1 -> 4 over 60 s, 120 s at CV 4, back. Activation 5 s, SLO 0.3 s.

Printed per case and seed: SLO miss rate and time-averaged cost of both tuners, the
variant tuner's switches, the share of queries that arrived while ResNet50 served the stage
and the resulting mean accuracy, and the longest tuner tick that priced a switch (the estimator
runs inside it; on a live service that tick blocks the event loop).

Run: ``.venv/bin/python benchmarks/variant_tuner.py [--seeds 0 1 2] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._pipelines import PIPELINES
from inferline.core import (
    EstimatorOptions,
    InferLineController,
    Pipeline,
    PipelineVariants,
    Profiles,
    VariantController,
    VariantPlan,
    gamma_trace,
    plan_with_variants,
    plan_with_variants_section,
    simulate,
    stage_profiles,
    varying_trace,
    with_ladder,
)

SLO_S = 0.3
RATE = 60.0
PEAK = 150.0
ACTIVATION_S = 5.0
SPEED = 0.45  # ResNet50's batch latency over ResNet152's
ACCURACY = {"resnet152": 0.783, "resnet50": 0.761}
FLOOR = 0.75


def with_variant(pipeline: Pipeline, profiles: Profiles) -> tuple[Profiles, PipelineVariants]:
    """The pipeline's profiles plus ``resnet50``, and the variants document for the stage."""
    lat = {m: _latencies(profiles, m) for m in profiles.models}
    lat["resnet50"] = {
        hw: {b: x * SPEED for b, x in t.items()} for hw, t in lat["resnet152"].items()
    }
    doc = {
        "format": "inferline.variants/1",
        "pipeline": pipeline.name,
        "accuracy_floor": FLOOR,
        "stages": {
            "resnet152": {
                "variants": [{"name": n, "accuracy": a} for n, a in ACCURACY.items()],
            }
        },
    }
    return Profiles.from_latencies(lat), PipelineVariants.from_dict(doc)


def _latencies(profiles: Profiles, model: str) -> dict[str, dict[int, float]]:
    return {
        hw: {b: profiles.latency(model, hw, b) for b in profiles.batch_sizes(model, hw)}
        for hw in profiles.hardware_for(model)
    }


def cases(seed: int, quick: bool) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, planning sample, live trace)."""
    rng = np.random.default_rng(seed)
    calm, hold = (60.0, 60.0) if quick else (120.0, 60.0)
    shapes = [
        (
            f"rate-tau{tau:g}",
            [(RATE, 1.0, calm), (PEAK, 1.0, tau + hold), (RATE, 1.0, tau + calm)],
            tau,
        )
        for tau in ((10.0,) if quick else (10.0, 60.0))
    ]
    shapes.append(
        (
            "cv1to4",
            [(RATE, 1.0, calm), (RATE, 4.0, 60.0 + 2 * hold), (RATE, 1.0, 60.0 + calm)],
            60.0,
        )
    )
    out = []
    for name, seg, tau in shapes:
        live = varying_trace(seg, rng, transition_s=tau)
        sample = gamma_trace(RATE, 1.0, sum(d for _, _, d in seg), rng)
        out.append((name, sample, live))
    return out


class Timed(VariantController):
    """``VariantController`` that also records how long each tick that switched took."""

    switch_tick_s: list[float]

    def observe(self, now_s, new_arrivals, state=None):  # type: ignore[no-untyped-def]
        if not hasattr(self, "switch_tick_s"):
            self.switch_tick_s = []
        n = len(self.variant_decisions)
        t = time.perf_counter()
        out = super().observe(now_s, new_arrivals, state)
        if len(self.variant_decisions) > n and self.variant_decisions[-1].switched:
            self.switch_tick_s.append(time.perf_counter() - t)
        return out


def cheap_share(arr: np.ndarray, switches: tuple[tuple[float, str, str], ...]) -> float:
    """The share of queries that arrived while ResNet50 served the stage (it serves from a
    switch's activation delay on, until the activation delay after the switch back)."""
    if arr.size == 0:
        return 0.0
    on = np.zeros(arr.size, dtype=bool)
    start: float | None = None
    for t, _, v in switches:
        if v == "resnet50":
            start = t + ACTIVATION_S
        elif start is not None:
            on |= (arr >= start) & (arr < t + ACTIVATION_S)
            start = None
    if start is not None:
        on |= arr >= start
    return float(on.mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        help="trace seeds; every case runs once per seed (default 0 1 2)",
    )
    ap.add_argument("--quick", action="store_true", help="one ramp, shorter phases")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a few seconds: --quick --seeds 0 --pipelines image-processing, the first case "
        "(rate-tau10) only",
    )
    ap.add_argument(
        "--pipelines",
        nargs="*",
        default=["image-processing", "social-media"],
        help="pipelines of _pipelines.py with a resnet152 stage (default image-processing social-media)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.quick, args.seeds, args.pipelines = True, [0], ["image-processing"]
    t_all = time.perf_counter()
    opts = EstimatorOptions(activation_delay_s=ACTIVATION_S)
    head = (
        f"{'pipeline':<17} {'case':<11} {'seed':>4} {'plain miss%':>11} {'plain $/h':>9} "
        f"{'var miss%':>9} {'var $/h':>8} {'saving':>7} {'switches':>8} {'r50 share':>9} "
        f"{'accuracy':>8} {'max switch tick':>15}"
    )
    print(head)
    totals = {"plain": [], "var": [], "plain_miss": [], "var_miss": [], "acc": [], "tick": []}
    for name in args.pipelines:
        pipeline, base = PIPELINES[name]()
        profiles, variants = with_variant(pipeline, base)
        for seed in args.seeds:
            # --smoke: one case shows the script runs (tests/test_benchmark_variant_tuner.py
            # runs and checks both of --quick's)
            for case, sample, live in cases(seed, args.quick)[: 1 if args.smoke else None]:
                vp = plan_with_variants(pipeline, variants, profiles, sample, SLO_S)
                chosen = stage_profiles(profiles, vp.choice)
                lplan = with_ladder(pipeline, chosen, sample, vp.plan)
                vp = VariantPlan(lplan, vp.choice, vp.accuracy)
                plan = plan_with_variants_section(vp, pipeline, variants, profiles, lplan)
                start = float(live[0])
                plain = simulate(
                    pipeline, plan.models, chosen, live, options=opts,
                    controller=InferLineController(plan, start_s=start),
                )  # fmt: skip
                ctl = Timed.from_plan(plan, start_s=start)
                var = simulate(
                    pipeline, plan.models, chosen, live, options=opts, controller=ctl,
                    variants=ctl.stage_variants,
                )  # fmt: skip
                share = cheap_share(live, var.variant_switches)
                acc = share * ACCURACY["resnet50"] + (1 - share) * ACCURACY[vp.choice["resnet152"]]
                ticks = getattr(ctl, "switch_tick_s", [])
                tick = max(ticks) if ticks else 0.0
                pm, vm = plain.miss_rate(SLO_S), var.miss_rate(SLO_S)
                saving = 1 - var.cost_per_hour / plain.cost_per_hour
                print(
                    f"{name:<17} {case:<11} {seed:>4} {pm * 100:>11.3f} {plain.cost_per_hour:>9.3f} "
                    f"{vm * 100:>9.3f} {var.cost_per_hour:>8.3f} {saving * 100:>6.1f}% "
                    f"{len(var.variant_switches):>8} {share * 100:>8.1f}% {acc:>8.4f} "
                    f"{tick * 1e3:>12.0f} ms",
                    flush=True,
                )
                if vp.choice["resnet152"] != "resnet152":
                    print(f"  (the plan chose {vp.choice}: nothing cheaper to switch to)")
                totals["plain"].append(plain.cost_per_hour)
                totals["var"].append(var.cost_per_hour)
                totals["plain_miss"].append(pm)
                totals["var_miss"].append(vm)
                totals["acc"].append(acc)
                totals["tick"].append(tick)
    n = len(totals["plain"])
    print(
        f"\n{n} runs: mean cost plain {np.mean(totals['plain']):.3f} $/h, variants "
        f"{np.mean(totals['var']):.3f} $/h ({(1 - np.mean(totals['var']) / np.mean(totals['plain'])) * 100:.1f}% less); "
        f"mean miss plain {np.mean(totals['plain_miss']) * 100:.3f}%, variants "
        f"{np.mean(totals['var_miss']) * 100:.3f}%; runs above 1% miss: plain "
        f"{sum(m > 0.01 for m in totals['plain_miss'])}, variants "
        f"{sum(m > 0.01 for m in totals['var_miss'])}; mean accuracy {np.mean(totals['acc']):.4f} "
        f"(plain {ACCURACY['resnet152']}); longest switch tick {max(totals['tick']) * 1e3:.0f} ms"
    )
    cmd = " ".join(["benchmarks/variant_tuner.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"({time.perf_counter() - t_all:.0f} s) reproduce: .venv/bin/python {cmd}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
