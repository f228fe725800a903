"""``inferline plan`` / ``inferline simulate`` end to end (in process and once as a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferline.cli import main
from inferline.core import (
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    gamma_trace,
    load_plan,
    save,
    save_trace,
    simulate,
)


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    pipe = Pipeline("img", ("pre", "cls"), (("pre", "cls"),), {})
    prof = Profiles.from_latencies(
        {
            "pre": {"cpu": {b: 0.004 * b for b in (1, 2, 4)}},
            "cls": {
                "gpu-v100": {b: 0.01 + 0.002 * b for b in (1, 2, 4, 8)},
                "gpu-k80": {b: 0.02 + 0.006 * b for b in (1, 2, 4, 8)},
            },
        }
    )
    out = {
        "pipeline": tmp_path / "pipe.json",
        "profiles": tmp_path / "prof.json",
        "trace": tmp_path / "plan.trace",
        "eval": tmp_path / "eval.trace",
        "plan": tmp_path / "plan.json",
    }
    save(pipe, out["pipeline"])
    save(prof, out["profiles"])
    save_trace(gamma_trace(80.0, 2.0, 20.0, np.random.default_rng(1)), out["trace"])
    save_trace(gamma_trace(80.0, 2.0, 20.0, np.random.default_rng(2)), out["eval"])
    return out


def _plan_args(f: dict[str, Path], *extra: str) -> list[str]:
    return [
        "plan",
        "--pipeline",
        str(f["pipeline"]),
        "--profiles",
        str(f["profiles"]),
        "--trace",
        str(f["trace"]),
        "-o",
        str(f["plan"]),
        *extra,
    ]


def _sim_args(f: dict[str, Path], *extra: str) -> list[str]:
    return [
        "simulate",
        "--pipeline",
        str(f["pipeline"]),
        "--profiles",
        str(f["profiles"]),
        "--plan",
        str(f["plan"]),
        "--trace",
        str(f["eval"]),
        *extra,
    ]


def test_plan_then_simulate_json(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.1")) == 0
    out = capsys.readouterr().out
    assert "wrote inferline plan" in out and "cls" in out
    plan = load_plan(files["plan"])
    assert plan.strategy == "inferline" and plan.slo_s == 0.1 and plan.tuner is not None
    assert plan.estimated_latency_s <= 0.1
    # the tuner's ladder: re-plans of the planned hardware for higher rates (on by default)
    assert plan.tuner.ladder and "tuner ladder" in out
    # how much room the plan itself has over the sample's rate, for the tuner's trigger
    assert "at the plan's cost the ladder is proven up to" in out and "over the sample's" in out
    assert all(
        c.hardware == plan.models[m].hardware
        for st in plan.tuner.ladder
        for m, c in st.models.items()
    )

    assert main(_sim_args(files, "--json")) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1  # exactly one JSON object
    d = json.loads(lines[0])
    assert set(d) == {"latency_p99_s", "slo_miss_rate", "cost_per_hour", "queries", "models"}
    assert set(d["models"]) == {"pre", "cls"}
    assert 0.0 <= d["models"]["cls"]["utilization"] <= 1.0
    assert d["cost_per_hour"] == pytest.approx(plan.cost_per_hour)
    # the same numbers as the library call
    from inferline.core import load_pipeline, load_profiles, load_trace

    res = simulate(
        load_pipeline(files["pipeline"]),
        plan.models,
        load_profiles(files["profiles"]),
        load_trace(files["eval"]),
    )
    assert d["latency_p99_s"] == pytest.approx(res.percentile(99))
    assert d["queries"] == res.latencies_s.size


def test_simulate_table_and_percentile_key(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.15", "--percentile", "95", "--no-ladder")) == 0
    assert "tuner ladder" not in capsys.readouterr().out
    assert load_plan(files["plan"]).tuner.ladder == ()
    assert main(_sim_args(files)) == 0
    out = capsys.readouterr().out
    assert "P95 latency" in out and "SLO miss rate" in out and "utilization" in out
    assert main(_sim_args(files, "--json")) == 0
    d = json.loads(capsys.readouterr().out)
    assert "latency_p95_s" in d


@pytest.mark.parametrize("strategy", ["cg-mean", "cg-peak"])
def test_baseline_strategies(files, capsys, strategy):
    assert main(_plan_args(files, "--slo-s", "0.1", "--strategy", strategy)) == 0
    plan = load_plan(files["plan"])
    assert plan.strategy == strategy
    reps = {c.replicas for c in plan.models.values()}
    assert len(reps) == 1  # the pipeline is replicated as one unit


def test_hardware_catalog_override(files, tmp_path, capsys):
    cat = tmp_path / "hw.json"
    # a free K80 makes the K80 the obvious choice for the classifier
    cat.write_text(
        json.dumps(
            {
                "format": "inferline.hardware/1",
                "hardware": {"gpu-k80": {"kind": "gpu", "cost_per_hour": 0.0}},
            }
        )
    )
    assert main(_plan_args(files, "--slo-s", "0.2", "--hardware", str(cat))) == 0
    plan = load_plan(files["plan"])
    assert plan.models["cls"].hardware == "gpu-k80"


def test_infeasible_slo_is_one_line_error(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.005")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("inferline: error:") and "infeasible" in err[0]
    assert not files["plan"].exists()


def test_plan_for_another_pipeline_is_rejected(files, capsys):
    other = Plan("x", 0.1, {"pre": ModelConfig("cpu", 1, 1)})
    save(other, files["plan"])
    assert main(_sim_args(files, "--json")) == 2
    err = capsys.readouterr().err
    assert "plan.models" in err and "cls" in err


def test_bad_arguments_exit_nonzero(files, capsys):
    with pytest.raises(SystemExit) as ei:
        main(_plan_args(files, "--slo-s", "-1"))
    assert ei.value.code != 0
    with pytest.raises(SystemExit):
        main(_plan_args(files, "--slo-s", "0.1", "--strategy", "magic"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:
        main(_plan_args(files, "--slo-s", "0.1", "--workers", "0"))
    assert ei.value.code == 2 and "--workers" in capsys.readouterr().err


def test_rate_margin_keeps_throughput_slack(files, capsys):
    """``--rate-margin M``: the plan holds the SLO on the sample sped up by 1 + M, and the
    room note says the margin is on top; a negative margin is a usage error naming it."""
    from inferline.core import compress, load_pipeline, load_profiles, load_trace

    assert main(_plan_args(files, "--slo-s", "0.1", "--rate-margin", "0.25")) == 0
    out = capsys.readouterr().out
    assert "with the rate margin of 25% on top" in out
    plan = load_plan(files["plan"])
    fast = compress(load_trace(files["trace"]), 1.25)
    r = simulate(
        load_pipeline(files["pipeline"]), plan.models, load_profiles(files["profiles"]), fast
    )
    assert r.percentile(99) <= 0.1
    with pytest.raises(SystemExit) as ei:
        main(_plan_args(files, "--slo-s", "0.1", "--rate-margin", "-0.1"))
    assert ei.value.code == 2 and "--rate-margin" in capsys.readouterr().err


def test_ladder_planned_with_one_worker_is_the_same(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.1")) == 0
    threaded = load_plan(files["plan"])
    assert main(_plan_args(files, "--slo-s", "0.1", "--workers", "1")) == 0
    assert load_plan(files["plan"]) == threaded and threaded.tuner.ladder


def test_subprocess_round_trip(files):
    run = subprocess.run(
        [sys.executable, "-m", "inferline", *_plan_args(files, "--slo-s", "0.1")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "inferline", *_sim_args(files, "--json", "--seed", "3")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    d = json.loads(run.stdout)
    assert d["latency_p99_s"] > 0 and d["queries"] > 1000


def test_room_note_names_what_a_tight_plan_risks():
    """The note after the ladder: a plan proven for barely more than its sample gets both
    hints (the room trigger for the tuner, a rate margin for the planner); a plan with room
    gets neither; with a margin, the note says it is on top and does not suggest one."""
    from inferline.cli.plan import _room_note
    from inferline.core import LadderStep, tuner_inputs

    pipe = Pipeline("one", ("m",), (), {})
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.01}}})
    configs = {"m": ModelConfig("cpu", 1, 1)}
    sample = gamma_trace(50.0, 1.0, 30.0, np.random.default_rng(0))
    inputs = tuner_inputs(pipe, prof, configs, sample)
    mean = inputs.mean_rate_qps

    def plan_with_room(room: float) -> Plan:
        step = LadderStep(mean * (1 + room), configs, 0.0665)
        return Plan(
            "one", 0.1, configs, cost_per_hour=0.0665, tuner=replace(inputs, ladder=(step,))
        )

    tight = _room_note(plan_with_room(0.01))
    assert "1.0% over the sample's" in tight
    assert "--tuner-trigger room" in tight and "--rate-margin 0.05" in tight
    roomy = _room_note(plan_with_room(0.3))
    assert "--tuner-trigger" not in roomy and "--rate-margin" not in roomy
    margined = _room_note(plan_with_room(0.01), rate_margin=0.05)
    assert "rate margin of 5% on top" in margined and "--rate-margin" not in margined
    # the steps above cost the same: no word on what the tuner runs at the planned workload
    assert "at the planned workload" not in tight + roomy
    # a dearer step for the headroom: the note says what the tuner will run, and its cost
    two = {"m": ModelConfig("cpu", 1, 2)}
    dear = replace(
        plan_with_room(0.05),
        tuner=replace(
            inputs,
            ladder=(LadderStep(mean * 1.05, configs, 0.0665), LadderStep(mean * 1.6, two, 0.133)),
        ),
    )
    note = _room_note(dear)
    assert f"runs the {mean * 1.6:.1f} q/s step at $0.133/h (the plan: $0.067/h)" in note
    assert "keeps 20% headroom" in note and "--tuner-headroom" in note


def _variant_files(files: dict[str, Path], tmp_path: Path, pre_s: float) -> dict:
    """Profiles with a big and a small variant of ``cls`` (the small 3x faster), and the
    variants document (``tmp_path / "variants.json"``, also returned)."""
    prof = Profiles.from_latencies(
        {
            "pre": {"cpu": {b: pre_s * b for b in (1, 2, 4)}},
            "cls-big": {"gpu-v100": {b: 0.03 + 0.004 * b for b in (1, 2, 4, 8)}},
            "cls-small": {"gpu-v100": {b: 0.01 + 0.002 * b for b in (1, 2, 4, 8)}},
        }
    )
    save(prof, files["profiles"])
    doc = {
        "format": "inferline.variants/1",
        "pipeline": "img",
        "stages": {
            "cls": {
                "variants": [
                    {"name": "cls-big", "accuracy": 0.95},
                    {"name": "cls-small", "accuracy": 0.9},
                ]
            }
        },
    }
    (tmp_path / "variants.json").write_text(json.dumps(doc))
    return doc


def test_plan_with_variants_records_the_choice_for_the_live_tuner(files, tmp_path, capsys):
    """``--variants``: the cheapest combination meeting the floors and the SLO; the plan file
    carries the choice and what the tuner needs to switch stages (docs/variants.md)."""
    doc = _variant_files(files, tmp_path, pre_s=0.004)
    vfile = tmp_path / "variants.json"
    args = _plan_args(files, "--slo-s", "0.1", "--variants", str(vfile), "--workers", "1")
    assert main(args) == 0
    out = capsys.readouterr().out
    plan = load_plan(files["plan"])
    assert plan.variants is not None and plan.variants.choice == {"cls": "cls-small"}
    assert "cls -> cls-small" in out and "cls (cls-small)" in out
    assert plan.tuner is not None and plan.tuner.ladder  # planned on the chosen variant
    assert set(plan.variants.profiles["models"]) == {"pre", "cls-big", "cls-small"}
    # a floor only the big variant meets
    assert main([*args, "--accuracy-floor", "0.93"]) == 0
    capsys.readouterr()
    assert load_plan(files["plan"]).variants.choice == {"cls": "cls-big"}
    # simulate runs the chosen variant's profile
    assert main(_sim_args(files, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["latency_p99_s"] <= 0.1
    # a variants file for another pipeline is refused by field
    doc["pipeline"] = "other"
    vfile.write_text(json.dumps(doc))
    assert main(args) == 2
    assert "variants.json: pipeline: expected the pipeline's name 'img'" in capsys.readouterr().err
    # a floor outside [0, 1] is refused at parse time, an unprofiled variant by field
    doc["pipeline"] = "img"
    vfile.write_text(json.dumps(doc))
    with pytest.raises(SystemExit):
        main([*args, "--accuracy-floor", "1.5"])
    err = capsys.readouterr().err
    assert "argument --accuracy-floor: expected an accuracy in [0, 1], got '1.5'" in err
    doc["stages"]["cls"]["variants"][1]["name"] = "cls-xxx"
    vfile.write_text(json.dumps(doc))
    assert main(args) == 2
    assert "stages.cls.variants[1].name: expected a profiled model" in capsys.readouterr().err


def test_simulate_switches_variants_with_the_tuner_in_the_loop(files, tmp_path, capsys):
    """``simulate --tuner inferline`` on a plan made with ``--variants`` runs the variant-aware
    tuner, as ``serve`` does: a burst switches the stage to the cheaper variant and back;
    ``--no-variant-switching`` adds replicas instead, at a higher cost."""
    _variant_files(files, tmp_path, pre_s=0.002)
    vfile = tmp_path / "variants.json"
    save_trace(gamma_trace(10.0, 1.0, 120.0, np.random.default_rng(1)), files["trace"])
    rng = np.random.default_rng(2)
    parts = [gamma_trace(10.0, 1.0, 40.0, rng), 40 + gamma_trace(120.0, 1.0, 40.0, rng)]
    # the stage returns once no window exceeds the planned envelope: 60 s after the burst
    parts.append(80 + gamma_trace(10.0, 1.0, 90.0, rng))
    save_trace(np.concatenate(parts), files["eval"])
    args = _plan_args(files, "--slo-s", "0.2", "--variants", str(vfile), "--workers", "1")
    assert main(args) == 0
    capsys.readouterr()
    assert load_plan(files["plan"]).variants.choice == {"cls": "cls-big"}
    plot = tmp_path / "timeline.png"
    tuned = ["--tuner", "inferline", "--json"]
    assert main(_sim_args(files, *tuned, "--timeline-plot", str(plot))) == 0
    out = json.loads(capsys.readouterr().out)
    switches = [(s["stage"], s["variant"]) for s in out["variant_switches"]]
    assert switches == [("cls", "cls-small"), ("cls", "cls-big")], out["variant_switches"]
    assert 40.0 < out["variant_switches"][0]["time_s"] < 43.0
    assert plot.stat().st_size > 10_000
    assert main(_sim_args(files, *tuned, "--no-variant-switching")) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "variant_switches" not in plain
    assert out["cost_per_hour"] < plain["cost_per_hour"]
    assert out["slo_miss_rate"] <= plain["slo_miss_rate"] + 0.005
    # the readable output counts the switches
    assert main(_sim_args(files, "--tuner", "inferline")) == 0
    assert "2 variant switches" in capsys.readouterr().out


def test_hop_overhead_is_planned_for_and_simulated(files, capsys):
    """The estimate leaves out the live system's own time per hop unless told: a plan near
    the SLO then missed it live (audit). With --hop-overhead-ms both plan and simulate add
    it; without, the plan says so. Paper mode (no rate margin): the plans compared differ only
    in the hop overhead."""
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", "--rate-margin", "0")) == 0
    assert "--hop-overhead-ms" in capsys.readouterr().out
    bare = load_plan(files["plan"])
    assert main(_sim_args(files, "--json")) == 0
    p99_bare = json.loads(capsys.readouterr().out)["latency_p99_s"]
    assert main(_sim_args(files, "--json", "--hop-overhead-ms", "5")) == 0
    p99_hop = json.loads(capsys.readouterr().out)["latency_p99_s"]
    assert p99_hop == pytest.approx(p99_bare + 2 * 0.005, abs=0.004)  # two hops: pre, cls
    hop = ("--hop-overhead-ms", "5", "--rate-margin", "0")
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", *hop)) == 0
    assert "--hop-overhead-ms" not in capsys.readouterr().out
    with_hop = load_plan(files["plan"])
    assert with_hop.estimated_latency_s >= bare.estimated_latency_s + 0.005
    with pytest.raises(SystemExit) as e:
        main(_plan_args(files, "--slo-s", "0.1", "--hop-overhead-ms", "-1"))
    assert e.value.code == 2


def test_inventory_keeps_the_plan_on_the_hardware_there_is(files, capsys):
    """``--inventory``: the unlimited plan takes two K80s for the classifier; with one K80 and
    one V100 it takes the dearer V100, with one K80 and no V100 no plan fits and the one-line
    error names the inventory, as it does for a CPU core too few for a 2-thread replica; a
    malformed value is a usage error naming the flag."""
    assert main(_plan_args(files, "--slo-s", "0.2", "--no-ladder")) == 0
    free = load_plan(files["plan"])
    assert free.models["cls"].hardware == "gpu-k80" and free.models["cls"].replicas == 2
    inv = "gpu-k80=1,gpu-v100=1"
    assert main(_plan_args(files, "--slo-s", "0.2", "--inventory", inv)) == 0
    fit = load_plan(files["plan"])
    assert fit.models["cls"].hardware == "gpu-v100" and fit.models["cls"].replicas == 1
    # the tuner's ladder (re-plans for higher rates) keeps within the inventory too
    assert fit.tuner.ladder and all(s.models["cls"].replicas == 1 for s in fit.tuner.ladder)
    assert fit.cost_per_hour > free.cost_per_hour
    capsys.readouterr()
    for inv, threads, named in (
        ("gpu-k80=1,gpu-v100=0", "pre=1", "inventory (gpu-k80: 1, gpu-v100: 0)"),
        ("cpu=1", "pre=2", "inventory (cpu: 1)"),
    ):
        files["plan"].unlink(missing_ok=True)
        args = _plan_args(files, "--slo-s", "0.2", "--no-ladder", "--inventory", inv)
        assert main([*args, "--cpu-threads", threads]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err
        assert not files["plan"].exists()
    with pytest.raises(SystemExit) as ei:
        main(_plan_args(files, "--slo-s", "0.2", "--cpu-threads", "pre=2"))
    assert ei.value.code == 2 and "--cpu-threads: needs --inventory" in capsys.readouterr().err
    # --gpu-host-cores: a GPU replica of cls also holds a core, so one core cannot hold the
    # preprocessing replica and cls's host side: without the flag it can
    inv = "cpu=1,gpu-k80=1,gpu-v100=1"
    assert main(_plan_args(files, "--slo-s", "0.2", "--no-ladder", "--inventory", inv)) == 0
    loose = load_plan(files["plan"])
    assert loose.models["pre"].hardware == "cpu" and loose.models["cls"].hardware != "cpu"
    files["plan"].unlink()
    capsys.readouterr()
    args = _plan_args(files, "--slo-s", "0.2", "--no-ladder", "--inventory", inv)
    assert main([*args, "--gpu-host-cores", "cls=1"]) == 2
    assert "inventory (cpu: 1, " in capsys.readouterr().err and not files["plan"].exists()
    with pytest.raises(SystemExit) as ei:
        main(_plan_args(files, "--slo-s", "0.2", "--gpu-host-cores", "cls=1"))
    assert ei.value.code == 2 and "--gpu-host-cores: needs --inventory" in capsys.readouterr().err
    for bad in ("cpu", "cpu=-1", "cpu=1,cpu=2", "cpu=x"):
        with pytest.raises(SystemExit) as ei:
            main(_plan_args(files, "--slo-s", "0.2", "--inventory", bad))
        assert ei.value.code == 2 and "--inventory" in capsys.readouterr().err


def test_plan_and_simulate_use_the_profiles_wake_up_unless_told_not_to(files, capsys):
    from inferline.core import WakeProfile, load_profiles

    prof = load_profiles(files["profiles"])
    wake = {"pre": {"cpu": WakeProfile((0.01, 0.05), (0.002, 0.006))}}
    save(Profiles(prof.models, wake), files["profiles"])
    # the paper's plan (no rate margin): tight enough for the extra to show in the tail
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", "--rate-margin", "0")) == 0
    capsys.readouterr()
    p99 = {}
    for flag in ("--wake-up", "--no-wake-up"):
        assert main(_sim_args(files, "--json", flag)) == 0
        p99[flag] = json.loads(capsys.readouterr().out)["latency_p99_s"]
    # 80 q/s leaves "pre" idle between most queries: its extra shows in the tail
    assert p99["--wake-up"] > p99["--no-wake-up"] + 0.001


def test_simulate_holds_the_tuner_to_an_inventory(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder")) == 0
    capsys.readouterr()
    rng = np.random.default_rng(5)
    burst = np.concatenate(
        [gamma_trace(80.0, 1.0, 10.0, rng), gamma_trace(400.0, 1.0, 10.0, rng, start_s=10.0)]
    )
    save_trace(burst, files["eval"])
    plan = load_plan(files["plan"])
    gpu = plan.models["cls"].hardware
    runs = {}
    for extra in ((), ("--inventory", f"cpu={plan.models['pre'].replicas},{gpu}=2")):
        args = _sim_args(files, "--json", "--tuner", "inferline", "--activation-delay-s", "1")
        assert main([*args, *extra]) == 0
        runs[bool(extra)] = json.loads(capsys.readouterr().out)
    assert "scale_ups_cut_to_inventory" not in runs[False]
    assert runs[True]["scale_ups_cut_to_inventory"] >= 1
    assert runs[True]["cost_per_hour"] < runs[False]["cost_per_hour"]
    # the cores a replica takes count only against an inventory
    with pytest.raises(SystemExit):
        main([*_sim_args(files), "--cpu-threads", "pre=2"])
    assert "--cpu-threads: needs --inventory" in capsys.readouterr().err


def test_plan_and_simulate_draw_service_times_with_service_spread(files, capsys):
    from inferline.core import BatchProfile, load_profiles

    prof = load_profiles(files["profiles"])
    wide = {  # every batch: median 0.9x latency_s, p99 2x
        m: {
            h: {
                b: BatchProfile(bp.latency_s, p50_s=0.9 * bp.latency_s, p99_s=2 * bp.latency_s)
                for b, bp in bs.items()
            }
            for h, bs in hws.items()
        }
        for m, hws in prof.models.items()
    }
    save(Profiles(wide), files["profiles"])
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", "--service-spread")) == 0
    capsys.readouterr()
    out = {}
    for flag in ("--service-spread", "--no-service-spread"):
        assert main(_sim_args(files, "--json", flag)) == 0
        out[flag] = json.loads(capsys.readouterr().out)
    # the drawn tail is longer than latency_s alone, and the plan made with it holds
    assert out["--service-spread"]["latency_p99_s"] > out["--no-service-spread"]["latency_p99_s"]
    assert out["--service-spread"]["latency_p99_s"] <= 0.1
    assert main(_sim_args(files, "--json", "--service-spread", "--seed", "1")) == 0
    other = json.loads(capsys.readouterr().out)["latency_p99_s"]
    assert other != out["--service-spread"]["latency_p99_s"]  # --seed seeds the draws


def test_plan_and_simulate_share_cores_when_told(files, capsys):
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder")) == 0
    capsys.readouterr()
    shared = ("--shared-cores", "cpu=1", "--cpu-threads", "pre=2")
    p99 = {}
    for extra in ((), shared, ("--pinned-cores", "cpu=1")):
        assert main(_sim_args(files, "--json", *extra)) == 0
        p99[extra] = json.loads(capsys.readouterr().out)["latency_p99_s"]
    # pre's replicas take two threads each of one core: each runs at half speed at most
    assert p99[shared] > p99[()] + 0.004
    # two replicas of pre pinned to one core share it: slower than on a core each (the plan
    # above has one replica of pre, so this was guarded by a condition it never met)
    plan = load_plan(files["plan"])
    two_pre = plan.with_models({**plan.models, "pre": replace(plan.models["pre"], replicas=2)})
    save(two_pre, files["plan"])
    pinned = {}
    for extra in ((), ("--pinned-cores", "cpu=1")):
        assert main(_sim_args(files, "--json", *extra)) == 0
        pinned[extra] = json.loads(capsys.readouterr().out)["latency_p99_s"]
    assert pinned[("--pinned-cores", "cpu=1")] > pinned[()]
    # planned for two shared cores (one 2-thread replica of pre runs at full speed)
    files["plan"].unlink()
    two = ("--shared-cores", "cpu=2", "--cpu-threads", "pre=2")
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", *two)) == 0
    assert main(_sim_args(files, "--json", *two)) == 0
    capsys.readouterr()
    # one shared core at half speed cannot serve the planning trace's bursts in 100 ms
    assert main(_plan_args(files, "--slo-s", "0.1", "--no-ladder", *shared)) == 2
    assert "cpu: 1 shared cores, 16 replicas on them at most" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:
        main(_sim_args(files, "--pinned-cores", "cpu=1", "--shared-cores", "cpu=1"))
    assert ei.value.code == 2 and "one or the other" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(_sim_args(files, "--pinned-cores", "cpu=0"))
    assert "--pinned-cores" in capsys.readouterr().err


@pytest.mark.parametrize("server", ["triton", "tfserving"])
def test_plan_for_a_servers_own_batcher(files, tmp_path, capsys, server):
    """``--server`` plans the server's batcher: the plan carries it (``server_batchers``) and
    is feasible by the exact estimator with it; ``--no-early-stop`` plans the same."""
    from inferline.core import load_pipeline, load_profiles, load_trace
    from inferline.core.planning import plan_estimator_options

    args = _plan_args(files, "--slo-s", "0.15", "--server", server)
    assert main(args) == 0, capsys.readouterr().err
    plan = load_plan(files["plan"])
    assert set(plan.server_batchers) == set(plan.models)
    assert {b["kind"] for b in plan.server_batchers.values()} == {server}
    pipe = load_pipeline(files["pipeline"])
    prof = load_profiles(files["profiles"])
    trace = load_trace(files["trace"])
    res = simulate(pipe, plan.models, prof, trace, options=plan_estimator_options(plan))
    assert res.percentile(99.0) <= 0.15
    slow = tmp_path / "slow.json"
    assert main([*args[:-4], "-o", str(slow), *args[-4:], "--no-early-stop"]) == 0
    assert load_plan(slow).models == plan.models
