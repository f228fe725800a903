"""The ``--switching-config`` file of ``inferline serve --switching model-switching``: round trip,
field-named errors, and the CLI refusing a file without the mode (and the mode without a file)."""

import json

import pytest

from inferline.cli import main
from inferline.core import Profiles, ValidationError
from inferline.deploy._switching_serve import ServeSwitching, load_switching

DOC = {
    "format": "inferline.switching/1",
    "app": "digits",
    "stage": "big",
    "variants": [{"name": "big", "accuracy": 0.97}, {"name": "small", "accuracy": 0.85}],
    "profiles": "profiles.json",
    "core_budget": 2,
}


def test_round_trip_and_relative_profiles(tmp_path):
    prof = Profiles.from_latencies({"big": {"cpu": {1: 0.03}}, "small": {"cpu": {1: 0.004}}})
    (tmp_path / "profiles.json").write_text(json.dumps(prof.to_dict()))
    (tmp_path / "sw.json").write_text(json.dumps(DOC))
    cfg = load_switching(tmp_path / "sw.json")
    assert cfg.profiles == str(tmp_path / "profiles.json")
    assert ServeSwitching.from_dict(cfg.to_dict()) == cfg
    assert cfg.controller_config(0.1).deadline_s == 0.1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"variants": [{"name": "big", "accuracy": 1.5}]}, "switching.variants[0].accuracy"),
        ({"variants": [{"name": "big"}]}, "switching.variants[0]"),
        ({"stage": "other"}, "switching.stage"),
        ({"core_budget": 0}, "switching.core_budget"),
        ({"rule": "fastest"}, "switching.rule"),
        ({"format": "x/1"}, "switching.format"),
        ({"interval": 1}, "switching"),
    ],
)
def test_bad_fields_are_named(change, field):
    with pytest.raises(ValidationError) as e:
        ServeSwitching.from_dict({**DOC, **change})
    assert e.value.field == field


def test_serve_refuses_mode_without_file_and_file_without_mode(tmp_path, capsys):
    from inferline.demo.simple import noop_deployment

    dep = tmp_path / "dep.json"
    dep.write_text(json.dumps(noop_deployment()))
    assert main(["serve", "--deployment", str(dep), "--switching", "model-switching"]) != 0
    assert "--switching-config" in capsys.readouterr().err
    (tmp_path / "sw.json").write_text(json.dumps(DOC))
    args = ["serve", "--deployment", str(dep), "--switching-config", str(tmp_path / "sw.json")]
    assert main(args) != 0
    assert "--switching model-switching" in capsys.readouterr().err
