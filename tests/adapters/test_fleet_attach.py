"""A fleet's attach side without servers: ``attach URL URL --steer`` refused before it
connects, per-member params (``params.members``) and how members' discoveries combine. The
real servers (one Triton, one TF Serving) are in integration/test_fleet_mixed.py."""

from __future__ import annotations

import pytest
from _fleet_fakes import tf_digits_metadata, triton_info

from inferline.adapters.fleet import adopted_config, check_contracts, member_spec, merge_found
from inferline.cli import main
from inferline.core import ModelConfig, ModelSpec, ValidationError

URLS = ["triton+grpc://h1:8001", "tfserving+grpc://h2:8500"]


def test_attach_with_steer_takes_one_server(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["attach", *URLS, "--steer", "--no-profile"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--steer" in err and "h2:8500" in err


def test_member_spec_overlays_scheme_then_url_params() -> None:
    spec = ModelSpec(
        "m",
        source="digits",
        params={
            "outputs": ["p"],
            "members": {
                "tfserving+grpc": {"base_path": "/models/d", "source": "d_tf"},
                URLS[0]: {"outputs": ["q"]},
            },
        },
    )
    tri, tf = (member_spec(spec, u, URLS) for u in URLS)
    assert (tri.source, dict(tri.params)) == ("digits", {"outputs": ["q"]})
    assert (tf.source, dict(tf.params)) == ("d_tf", {"outputs": ["p"], "base_path": "/models/d"})
    assert member_spec(ModelSpec("m", params={"a": 1}), URLS[0], URLS).params == {"a": 1}


@pytest.mark.parametrize(
    ("members", "field"),
    [
        ({"triton": {}}, "m.params.members['triton']"),  # names no member (triton+grpc is)
        ({URLS[1]: ["base_path"]}, f"m.params.members['{URLS[1]}']"),
        (["x"], "m.params.members"),
    ],
)
def test_member_params_that_fit_no_member_are_refused(members: object, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        member_spec(ModelSpec("m", params={"members": members}), URLS[0], URLS)
    assert e.value.field == field


def test_discoveries_merge_by_model_and_adopted_configs_add_up() -> None:
    tf = {"d": {"servers": {"h2": [{"state": "AVAILABLE"}]}}, "old": {"servers": {"h2": []}}}
    other = {"d": {"ready": True}, "x": {"ready": False}}
    merged, ready = merge_found([other, tf])
    assert ready == {"d": [0, 1], "x": [], "old": []}
    assert merged["d"] == {"ready": True}  # the first ready member's entry
    cfg = adopted_config("d", {0: ModelConfig("cpu", 16, 2), 1: ModelConfig("cpu", 8, 1)})
    assert cfg == ModelConfig("cpu", 8, 3)  # every replica, the batch both take
    with pytest.raises(ValidationError, match="hardware"):
        adopted_config("d", {0: ModelConfig("cpu", 8, 1), 1: ModelConfig("gpu", 8, 1)})


def test_a_model_is_adopted_as_one_only_with_one_contract() -> None:
    tf = tf_digits_metadata()
    same = triton_info({"x": [64]}, {"probabilities": [10]})
    check_contracts("d", {URLS[0]: same, URLS[1]: tf, "other://": {"ready": True}})
    other = triton_info({"x": [64]}, {"probs": [10]})  # digits_mlp's output name
    with pytest.raises(ValidationError) as e:
        check_contracts("d", {URLS[0]: other, URLS[1]: tf})
    assert e.value.field == "adopt('d')" and "probs" in str(e.value)
