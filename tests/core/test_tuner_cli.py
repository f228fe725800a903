"""``inferline simulate --tuner ...`` end to end (in-process CLI), with a timeline plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from inferline.cli import main
from inferline.core import (
    ModelConfig,
    Pipeline,
    Plan,
    Profiles,
    TunerConfig,
    gamma_trace,
    save,
    save_trace,
    tuner_inputs,
)


@pytest.fixture
def files(tmp_path):
    pipe = Pipeline("one", ("m",))
    prof = Profiles.from_latencies({"m": {"cpu": {1: 0.01}}})  # 100 q/s per replica
    rng = np.random.default_rng(0)
    sample = gamma_trace(50.0, 1.0, 60.0, rng)
    configs = {"m": ModelConfig("cpu", 1, 1)}
    plan = Plan("one", 0.1, configs, tuner=tuner_inputs(pipe, prof, configs, sample))
    live = np.concatenate(
        [gamma_trace(50.0, 1.0, 20.0, rng), gamma_trace(250.0, 1.0, 30.0, rng, start_s=20.0)]
    )
    paths = {k: tmp_path / f"{k}.json" for k in ("pipe", "prof", "plan")}
    save(pipe, paths["pipe"])
    save(prof, paths["prof"])
    save(plan, paths["plan"])
    save_trace(live, tmp_path / "live.txt")
    return tmp_path, paths


def _run(capsys, tmp_path, paths, *extra):
    argv = [
        "simulate",
        "--pipeline",
        str(paths["pipe"]),
        "--profiles",
        str(paths["prof"]),
        "--plan",
        str(paths["plan"]),
        "--trace",
        str(tmp_path / "live.txt"),
        "--json",
        *extra,
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_with_and_without_tuners(files, capsys):
    tmp_path, paths = files
    none = _run(capsys, tmp_path, paths)
    plot = tmp_path / "tl.png"
    tuned = _run(
        capsys,
        tmp_path,
        paths,
        "--tuner",
        "inferline",
        "--timeline-plot",
        str(plot),
        "--decisions-out",
        str(tmp_path / "d.json"),
    )
    auto = _run(capsys, tmp_path, paths, "--tuner", "autoscale")
    replicas = _run(
        capsys,
        tmp_path,
        paths,
        "--tuner",
        "inferline",
        "--tuner-reconfigure",
        "replicas",
        "--lookahead-s",
        "0",
        "--down-cap",
        "plan",
    )
    assert replicas["slo_miss_rate"] < none["slo_miss_rate"]
    # 250 q/s on one 100 q/s replica diverges without a tuner
    assert none["slo_miss_rate"] > 0.4 and none["cost_per_hour"] == pytest.approx(0.0665)
    assert tuned["slo_miss_rate"] < 0.5 * none["slo_miss_rate"]  # 5 s activation: a 5x step hurts
    assert auto["slo_miss_rate"] < none["slo_miss_rate"]
    # the time-averaged cost grows with the replicas added
    assert tuned["cost_per_hour"] > none["cost_per_hour"]
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    decisions = json.loads((tmp_path / "d.json").read_text())
    assert decisions and decisions[0]["action"] == "up" and "window" in decisions[0]["reason"]


def test_tuner_knobs_are_validated_by_flag(files, capsys):
    """Refused at parse time by the config's own check, naming the flag (not the field)."""
    tmp_path, paths = files
    argv = ["simulate", "--pipeline", str(paths["pipe"]), "--profiles", str(paths["prof"])]
    argv += ["--plan", str(paths["plan"]), "--trace", str(tmp_path / "live.txt")]
    with pytest.raises(SystemExit):
        main([*argv, "--tuner", "inferline", "--tuner-hysteresis", "-0.1"])
    assert "argument --tuner-hysteresis: expected a number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--tuner", "inferline", "--tuner-headroom", "-1"])
    assert "argument --tuner-headroom: expected a number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--tuner", "inferline", "--tuner-trigger", "sometimes"])
    assert "--tuner-trigger" in capsys.readouterr().err


def test_tuner_flags_build_the_tuner_config():
    import argparse

    from inferline.cli._tuner_args import add_ladder_knobs, ladder_knobs

    ap = argparse.ArgumentParser()
    add_ladder_knobs(ap)
    args = ap.parse_args(["--tuner-trigger", "room", "--tuner-headroom", "0.3"])
    cfg = TunerConfig(**ladder_knobs(args))
    assert (cfg.trigger, cfg.headroom, cfg.hysteresis) == ("room", 0.3, TunerConfig().hysteresis)
    assert TunerConfig(**ladder_knobs(ap.parse_args([]))) == TunerConfig()
    assert TunerConfig(**ladder_knobs(ap.parse_args(["--tuner-settle-s", "off"]))).settle_s is None
    assert TunerConfig(**ladder_knobs(ap.parse_args(["--tuner-settle-s", "2.5"]))).settle_s == 2.5
    with pytest.raises(SystemExit):
        ap.parse_args(["--tuner-settle-s", "-1"])


def test_tuner_down_to_flag_reaches_the_config(capsys):
    import argparse

    from inferline.cli._tuner_args import add_ladder_knobs, ladder_knobs

    ap = argparse.ArgumentParser()
    add_ladder_knobs(ap)
    saving = ap.parse_args(["--tuner-down-to", "saving"])
    assert TunerConfig(**ladder_knobs(saving)).down_to == "saving"
    assert TunerConfig(**ladder_knobs(ap.parse_args([]))).down_to == "step"
    move = ap.parse_args(["--tuner-step-lookahead", "move"])
    assert TunerConfig(**ladder_knobs(move)).step_lookahead == "move"
    assert TunerConfig(**ladder_knobs(ap.parse_args([]))).step_lookahead == "hold"
    by_rate = ap.parse_args(["--tuner-headroom-basis", "rate"])
    assert TunerConfig(**ladder_knobs(by_rate)).headroom_basis == "rate"
    assert TunerConfig(**ladder_knobs(ap.parse_args([]))).headroom_basis == "plan"
    share = ap.parse_args(["--tuner-headroom-rate-share", "0"])
    assert TunerConfig(**ladder_knobs(share)).headroom_rate_share == 0.0
    with pytest.raises(SystemExit):
        ap.parse_args(["--tuner-down-to", "exactly"])
    assert "--tuner-down-to" in capsys.readouterr().err
