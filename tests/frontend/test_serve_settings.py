"""``ServeSettings``: the one settings object ``inferline serve`` builds from its options and the
composition root reads; frozen, JSON round trip, bad fields named."""

from __future__ import annotations

import json

import pytest

from inferline.core import TunerConfig, ValidationError
from inferline.deploy import DriftConfig, ServeSettings


def test_settings_round_trip_through_json():
    for s in (
        ServeSettings(),
        ServeSettings(tuner=None, drift=None),
        ServeSettings(
            host="::1",
            port=0,
            token="t0k",
            max_body_bytes=4096,
            max_request_rows=8,
            allowed_hosts=("svc.local",),
            grpc_port=0,
            grpc_max_inflight=16,
            ready_file="/tmp/ready.json",
            read_timeout_s=2.5,
            tuner=TunerConfig(interval_s=0.5),
            variant_switching=False,
            drift=DriftConfig(mode="replan"),
        ),
    ):
        text = json.dumps(s.to_dict())
        back = ServeSettings.from_dict(json.loads(text))
        assert back == s
        assert back.to_dict() == s.to_dict()


def test_settings_are_frozen_and_allowed_hosts_a_tuple():
    s = ServeSettings(allowed_hosts=["a", "b"])  # type: ignore[arg-type]
    assert s.allowed_hosts == ("a", "b")
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"port": -1}, "port"),
        ({"port": True}, "port"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"max_request_rows": 0}, "max_rows"),
        ({"grpc_port": "x"}, "grpc_port"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
        ({"host": ""}, "host"),
        ({"grpc_max_inflight": 0}, "grpc_max_inflight"),
    ],
)
def test_a_bad_setting_is_named(kw, field):
    with pytest.raises(ValidationError) as e:
        ServeSettings(**kw)
    assert e.value.field == field


def test_from_dict_names_unknown_keys_and_bad_nested_configs():
    with pytest.raises(ValidationError, match="nope"):
        ServeSettings.from_dict({"nope": 1})
    with pytest.raises(ValidationError) as e:
        ServeSettings.from_dict({"tuner": {"interval_s": "soon"}})
    assert "tuner" in e.value.field
    with pytest.raises(ValidationError):
        ServeSettings.from_dict([])


def test_the_cli_default_bound_of_grpc_calls_is_the_doors():
    """``--grpc-max-inflight``'s default is a literal (building the parser imports no gRPC):
    it must stay the door's own default; serve, deploy and attach all take it."""
    from inferline.cli import build_parser
    from inferline.cli._server_args import GRPC_MAX_INFLIGHT
    from inferline.server.frontdoors import DEFAULT_MAX_INFLIGHT

    assert GRPC_MAX_INFLIGHT == DEFAULT_MAX_INFLIGHT == ServeSettings().grpc_max_inflight
    p = build_parser()
    for argv in (["serve", "--deployment", "d.json"], ["attach", "triton://127.0.0.1:8000"]):
        args, _ = p.parse_known_args([*argv, "--grpc-max-inflight", "7"])
        assert args.grpc_max_inflight == 7
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--deployment", "d.json", "--grpc-max-inflight", "0"])
