"""Bad CLI input is refused at parse time, before any work, with one ``argument --x:
expected ...`` line and exit status 2 (audit: tracebacks after minutes of profiling, ports
checked only once replicas ran, nonsensical numbers accepted)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferline.cli import build_parser, main

# the required arguments of each command; none is read before parsing ends
PLAN = ["plan", "--pipeline", "p", "--profiles", "p", "--trace", "t", "--slo-s", "1"]
SIM = ["simulate", "--pipeline", "p", "--profiles", "p", "--plan", "p", "--trace", "t"]
PROFILE = ["profile", "--deployment", "d"]
SERVE = ["serve", "--deployment", "d"]
DEPLOY = ["deploy", "plan.json", "--deployment", "d"]
ATTACH = ["attach", "triton://h:8000"]
REPLAY = ["replay", "t", "--url", "http://127.0.0.1:1", "--app", "a", "--inputs", "i"]
CALIBRATE = ["calibrate", "--profiles", "p", "--plan", "q", "-o", "x"]
GAMMA = ["trace", "gamma", "--rate", "1", "--duration-s", "1"]
VARYING = ["trace", "varying", "--segment", "1,1,1"]
FROM_CSV = ["trace", "from-csv", "c.csv"]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a refused command line (argparse: usage, then the error)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# every option that names a file to write
OUTPUTS = [
    (PLAN, "-o"),
    ([*PLAN, "-o", "x"], "-o"),  # the last -o counts
    (SIM, "--decisions-out"),
    (GAMMA, "-o"),
    (VARYING, "-o"),
    (FROM_CSV, "-o"),
    (PROFILE, "-o"),
    ([*PROFILE, "-o", "x"], "--pipeline-out"),
    ([*PROFILE, "-o", "x"], "--fits-out"),
    (SERVE, "--ready-file"),
    (DEPLOY, "--ready-file"),
    (ATTACH, "--ready-file"),
    (ATTACH, "--profiles-out"),
    (ATTACH, "--summary-out"),
    (ATTACH, "--plan-out"),
    (REPLAY, "-o"),
]


@pytest.mark.parametrize(("argv", "flag"), OUTPUTS)
def test_an_output_in_a_missing_folder_is_refused_up_front(argv, flag, tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "out.json"
    line = _refused([*argv, flag, str(missing)], capsys)
    assert flag in line and "expected a file in an existing folder" in line, line
    assert str(missing.parent) in line
    # a folder where a file is meant
    line = _refused([*argv, flag, str(tmp_path)], capsys)
    assert "expected a file, got the folder" in line, line


def test_a_plot_path_is_checked_for_its_folder_and_format(tmp_path, capsys):
    line = _refused([*SIM, "--timeline-plot", str(tmp_path / "t.xyz")], capsys)
    assert "--timeline-plot: expected a plot file ending in one of" in line
    assert ".png" in line and ".svg" in line
    line = _refused([*SIM, "--timeline-plot", str(tmp_path / "no" / "t.png")], capsys)
    assert "--timeline-plot: expected a plot file in an existing folder" in line
    args = build_parser().parse_args([*SIM, "--timeline-plot", str(tmp_path / "t.PNG")])
    assert args.timeline_plot == str(tmp_path / "t.PNG")


def test_the_plan_command_refuses_a_missing_folder_in_a_subprocess(tmp_path):
    """As a user sees it: one error line after the usage, status 2, no traceback."""
    out = tmp_path / "missing" / "plan.json"
    p = subprocess.run(
        [sys.executable, "-m", "inferline", *PLAN, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("inferline plan: error: argument -o")


@pytest.mark.parametrize(
    ("argv", "flag", "bad"),
    [
        # ports: checked before replicas start (serve, deploy, attach)
        (SERVE, "--port", "70000"),
        (SERVE, "--port", "-1"),
        (DEPLOY, "--port", "65536"),
        (ATTACH, "--port", "70000"),
        (ATTACH, "--grpc-port", "-2"),
        (ATTACH, "--grpc-port", "70000"),
        # request size limits
        (SERVE, "--max-body-bytes", "-1"),
        (SERVE, "--max-body-bytes", "0"),
        (ATTACH, "--max-body-bytes", "-1"),
        (ATTACH, "--max-body-bytes", str(2**31)),  # gRPC takes a C int
        # SLOs, percentiles, rates, durations
        (REPLAY, "--slo-ms", "0"),
        (REPLAY, "--slo-ms", "-5"),
        (REPLAY, "--slo-ms", "nan"),
        (REPLAY, "--slo-ms", "inf"),
        (ATTACH, "--slo-ms", "0"),
        ([*PLAN, "-o", "x"], "--percentile", "0"),
        ([*PLAN, "-o", "x"], "--percentile", "100.5"),
        ([*PLAN, "-o", "x"], "--percentile", "nan"),
        (["demo"], "--slo-ms", "-1"),
        (["demo"], "--rate", "0"),
        (["demo"], "--duration-s", "nan"),
        # counts
        (REPLAY, "--connections", "0"),
        (REPLAY, "--limit", "0"),
        (REPLAY, "--limit", "-1"),
        ([*PROFILE, "-o", "x"], "--samples", "-1"),
        ([*PROFILE, "-o", "x"], "--max-batch", "0"),
        ([*PROFILE, "-o", "x"], "--max-samples", "-1"),
        (ATTACH, "--samples", "0"),
        (ATTACH, "--max-batch", "1.5"),
        ([*PLAN, "-o", "x"], "--workers", "0"),
        # trace generation
        (["trace", "varying", "-o", "x"], "--segment", "1,1,0"),
        (["trace", "varying", "-o", "x"], "--segment", "1,1,nan"),
        (["trace", "varying", "-o", "x"], "--segment", "1,1"),
        ([*VARYING, "-o", "x"], "--transition-s", "-1"),
        ([*VARYING, "-o", "x"], "--transition-s", "nan"),
        # refused by the core's checks once, naming the field (cv, rate, target_rate) or with
        # a traceback (an infinite length, a CV that hung or divided by zero, a negative seed)
        (["trace", "gamma", "--duration-s", "1", "-o", "x"], "--rate", "0"),
        (["trace", "gamma", "--rate", "1", "-o", "x"], "--duration-s", "inf"),
        ([*GAMMA, "-o", "x"], "--cv", "-1"),
        ([*GAMMA, "-o", "x"], "--cv", "1e5"),
        ([*GAMMA, "-o", "x"], "--cv", "1e-200"),
        ([*GAMMA, "-o", "x"], "--seed", "-1"),
        ([*VARYING, "-o", "x"], "--seed", "-1"),
        (["trace", "varying", "-o", "x"], "--segment", "1,1e5,1"),
        ([*FROM_CSV, "-o", "x"], "--rate", "-1"),
        # seeds: the estimator's options named 'seed'
        ([*PLAN, "-o", "x"], "--seed", "-1"),
        (SIM, "--seed", "-1"),
        (SIM, "--seed", "1.5"),
        # the tuner's numbers: refused by TunerConfig & co. naming their fields
        (SIM, "--activation-delay-s", "-1"),
        (SIM, "--activation-delay-s", "nan"),
        (SIM, "--stabilization-s", "-1"),
        (SIM, "--lookahead-s", "inf"),
        (SIM, "--autoscale-wait-s", "-1"),
        (SIM, "--tuner-headroom", "-1"),
        (SIM, "--tuner-hysteresis", "-0.1"),
        (SIM, "--tuner-headroom-rate-share", "-1"),
        (SIM, "--tuner-settle-s", "inf"),
        (SERVE, "--tuner-headroom", "nan"),
        (DEPLOY, "--tuner-hysteresis", "-1"),
        # plan --variants' floor: checked only once the variants file was read
        ([*PLAN, "-o", "x", "--variants", "v"], "--accuracy-floor", "1.5"),
        ([*PLAN, "-o", "x", "--variants", "v"], "--accuracy-floor", "-0.1"),
        # fewer than the 50 batches a point takes: refused naming min_samples/max_samples
        ([*PROFILE, "-o", "x"], "--max-samples", "10"),
        ([*PROFILE, "-o", "x"], "--wake-idle-ms", "0"),
        ([*PROFILE, "-o", "x"], "--wake-idle-ms", "-5"),
        # URLs: a bad port was a traceback from the HTTP client, after loading everything
        (["replay", "t", "--app", "a"], "--url", "http://h:99999"),
        (["replay", "t", "--app", "a"], "--url", "http://h:x"),
        (["replay", "t", "--app", "a"], "--url", "https://h:1"),  # the client speaks http
        (DEPLOY, "--url", "notaurl"),
        (CALIBRATE, "--url", "ftp://h:1"),
        (CALIBRATE, "--min-batches", "0"),
    ],
)
def test_nonsensical_numbers_are_refused_at_parse_time(argv, flag, bad, capsys):
    line = _refused([*argv, f"{flag}={bad}"], capsys)
    assert f"argument {flag}: expected" in line and repr(bad) in line, line


def test_accuracy_floor_needs_variants(capsys):
    """Without --variants the floor was silently ignored."""
    line = _refused([*PLAN, "-o", "x", "--accuracy-floor", "0.9"], capsys)
    assert line.endswith("error: argument --accuracy-floor: needs --variants"), line
    # part of parsing, as every rule over several options (cli._CommandParser)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*PLAN, "-o", "x", "--accuracy-floor", "0.9"])
    a = build_parser().parse_args([*PLAN, "-o", "x", "--variants", "v", "--accuracy-floor", "1"])
    assert (a.variants, a.accuracy_floor) == ("v", 1.0)


def test_a_trace_too_large_to_hold_is_refused_up_front(capsys):
    """A rate x length past memory was an allocation traceback."""
    line = _refused(["trace", "gamma", "--rate", "1e12", "--duration-s", "10", "-o", "x"], capsys)
    assert "argument --rate/--duration-s: expected at most 100,000,000 arrivals" in line, line
    line = _refused(
        ["trace", "varying", "--segment", "1,1,1", "--segment", "1e9,1,1", "-o", "x"], capsys
    )
    assert "argument --segment: expected at most 100,000,000 arrivals" in line, line
    a = build_parser().parse_args(
        ["trace", "gamma", "--rate", "1e4", "--duration-s", "1e4", "-o", "x"]
    )
    assert a.rate * a.duration_s == 1e8


def test_demo_traces_too_large_to_hold_are_refused_up_front(capsys):
    """The demo's planning and replay traces at --rate exhausted memory only after minutes of
    profiling; the same bound as ``trace gamma`` (the planning trace is 60 s, --quick 30 s)."""
    line = _refused(["demo", "--rate", "1e6", "--duration-s", "50"], capsys)
    assert "argument --rate/--duration-s: expected at most 100,000,000 arrivals" in line, line
    assert line.endswith("got 1.1e+08"), line
    line = _refused(["demo", "--rate", "2e6"], capsys)  # the default 25 s replay
    assert line.endswith("got 1.7e+08"), line
    a = build_parser().parse_args(["demo", "--quick", "--rate", "1e6", "--duration-s", "70"])
    assert (a.rate, a.duration_s) == (1e6, 70.0)  # 30 + 70 s: exactly the bound


def test_replay_needs_inputs_or_a_deployment_at_parse_time(capsys):
    """Refused only once the trace had been read (a missing one was the error shown)."""
    argv = ["replay", "no-such.trace", "--url", "http://h:1", "--app", "a"]
    line = _refused(argv, capsys)
    assert line.endswith(
        "error: one of the arguments --inputs --deployment is required (the request inputs)"
    ), line
    for more in (["--inputs", "i"], ["--deployment", "d"], ["--inputs", "i", "--deployment", "d"]):
        assert build_parser().parse_args([*argv, *more]).app == "a"


@pytest.mark.parametrize(
    "url", ["triton://h:99999", "triton://h:x", "triton://h:0", "tfserving://h:8501,g:99999"]
)
def test_attach_refuses_a_url_port_out_of_range(url, capsys):
    """Was ``url: expected a numeric port`` from the adapter, naming its field, for a number."""
    line = _refused(["attach", url], capsys)
    assert line.endswith(f"argument url: expected a URL with ports in [1, 65535], got {url!r}")
    for ok in ("triton://h", "triton+grpc://[::1]:8001", "tfserving://h:8501,g:8500", "x"):
        assert build_parser().parse_args(["attach", ok]).url == ok


def test_profile_refuses_a_hardware_kind_the_backend_lacks(tmp_path, monkeypatch, capsys):
    """``--hardware cpu nope`` dropped 'nope' silently (only all unknown was refused, naming
    the profiler's field): the backend's kinds are known once it runs, before any profiling."""
    import inferline.deploy as _deploy
    import inferline.measure as _measure
    from inferline.measure import profile_models

    class Backend:
        def inventory(self) -> dict[str, int]:
            return {"cpu": 4, "gpu": 0}

    async def profile_deployment(dep, opts, **_kw):
        return await profile_models(Backend(), [], {}, opts), None

    monkeypatch.setattr(_deploy, "load_deployment", lambda _p: _Dep())
    monkeypatch.setattr(_measure, "profile_deployment", profile_deployment)
    argv = [*PROFILE, "-o", str(tmp_path / "p.json"), "--hardware"]
    for kinds, got in ((["cpu", "nope"], ["nope"]), (["gpu"], ["gpu"])):
        assert main([*argv, *kinds]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        expected = f"--hardware: expected kinds the backend has, among ['cpu'], got {got!r}"
        assert err == f"inferline: error: {expected}", err


def test_demo_out_must_be_a_folder_it_can_write(tmp_path, monkeypatch, capsys):
    """``demo --out FILE`` failed at its mkdir with a traceback (the demo itself is not run)."""
    a_file = tmp_path / "f.txt"
    a_file.write_text("")
    line = _refused(["demo", "--out", str(a_file)], capsys)
    assert f"argument --out: expected a folder, got the file {str(a_file)!r}" in line, line
    line = _refused(["demo", "--out", str(a_file / "sub")], capsys)
    assert f"expected a folder that can be written, got {str(a_file / 'sub')!r}" in line
    assert f"({str(a_file)!r} is a file)" in line
    # a missing folder is made, an existing one written into
    for ok in (tmp_path / "new" / "demo", tmp_path):
        assert build_parser().parse_args(["demo", "--out", str(ok)]).out == str(ok)
    # an unwritable parent (os.access: the tests may run as root, who may write anywhere)
    import inferline.cli._args as cli_args

    monkeypatch.setattr(cli_args.os, "access", lambda *_: False)
    line = _refused(["demo", "--out", str(tmp_path / "new" / "demo")], capsys)
    assert "argument --out: expected a folder that can be written" in line, line
    assert f"({str(tmp_path)!r} is not writable)" in line


@pytest.mark.parametrize("what", ["folder", "binary"])
def test_an_input_that_is_no_text_file_is_one_line(what, tmp_path, capsys):
    """A folder or a binary file where a file is read was a traceback (every loader)."""
    bad = tmp_path
    if what == "binary":
        bad = tmp_path / "b.json"
        bad.write_bytes(b"\xff\xfe\x00")
    expected = "a file, got 'a folder'" if what == "folder" else "a UTF-8 text file, got 'binary"
    for argv in (
        ["trace", "describe", str(bad)],
        [*PLAN[:2], str(bad), *PLAN[3:], "-o", str(tmp_path / "p.json")],  # --pipeline
        ["serve", "--deployment", str(bad)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"inferline: error: {bad}: expected {expected}"), err
    assert main(["trace", "from-csv", str(tmp_path), "-o", str(tmp_path / "t")]) == 2
    assert "expected a readable CSV file" in capsys.readouterr().err


def test_replay_inputs_folder_and_deploy_unreachable_url_are_one_line(
    tmp_path, monkeypatch, capsys
):
    trace = tmp_path / "t.trace"
    trace.write_text("0.0\n")
    argv = ["replay", str(trace), "--url", "http://127.0.0.1:1", "--app", "a"]
    assert main([*argv, "--inputs", str(tmp_path)]) == 2
    assert f"{tmp_path}: expected a file, got 'a folder'" in capsys.readouterr().err

    import httpx

    import inferline.cli.deploy as _cli_deploy
    import inferline.deploy as _deploy

    def refused(*_a, **_kw):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    monkeypatch.setattr(httpx, "put", refused)
    monkeypatch.setattr(_deploy, "load_deployment", lambda _p: _Dep())
    monkeypatch.setattr(_cli_deploy, "load_plan", lambda _p: _plan())
    assert main(["deploy", "p.json", "--deployment", "d", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "--url: expected a reachable inferline server, got '[Errno 111]" in err, err


class _Dep:
    """What ``deploy --url`` reads of a deployment."""

    class _Model:
        name = "m"

    name = "d"
    models = (_Model(),)


def _plan():
    from inferline.core import ModelConfig, Plan

    return Plan("p", 0.1, {"m": ModelConfig("cpu", 1, 1)})


def test_sensible_edge_values_still_parse():
    p = build_parser()
    a = p.parse_args([*SERVE, "--port", "0", "--max-body-bytes", "1"])
    assert (a.port, a.max_body_bytes) == (0, 1)
    a = p.parse_args([*ATTACH, "--port", "65535", "--grpc-port", "-1", "--slo-ms", "0.5"])
    assert (a.port, a.grpc_port, a.slo_ms) == (65535, -1, 0.5)
    a = p.parse_args([*REPLAY, "--slo-ms", "100", "--limit", "1", "--connections", "1"])
    assert (a.slo_ms, a.limit, a.connections) == (100.0, 1, 1)
    assert p.parse_args([*PLAN, "-o", "x", "--percentile", "100"]).percentile == 100.0
    a = p.parse_args(["trace", "varying", "--segment", "2,0.5,3", "-o", "x", "--transition-s", "0"])
    assert a.segment == [(2.0, 0.5, 3.0)] and a.transition_s == 0.0
    a = p.parse_args([*GAMMA, "-o", "x", "--cv", "0.001", "--seed", "12345678901234567891"])
    assert (a.cv, a.seed) == (0.001, 12345678901234567891)  # a seed read exactly
    a = p.parse_args(
        [*SIM, "--tuner-settle-s", "off", "--tuner-headroom", "0", "--lookahead-s", "0"]
    )
    assert (a.tuner_settle_s, a.tuner_headroom, a.lookahead_s) == (None, 0.0, 0.0)
    for rule in ("window", "scaled", "curve"):  # every rule the policy accepts
        assert p.parse_args([*SIM, "--tuner-up-rate", rule]).tuner_up_rate == rule
    assert p.parse_args([*PROFILE, "-o", "x", "--max-samples", "50"]).max_samples == 50
    from inferline.cli.profile import wake_idle_s

    assert wake_idle_s(p.parse_args([*PROFILE, "-o", "x", "--wake-idle-ms"])) == ()
    a = p.parse_args([*PROFILE, "-o", "x", "--wake-idle-ms", "50", "2", "2"])
    assert wake_idle_s(a) == (0.002, 0.05)
    assert wake_idle_s(p.parse_args([*PROFILE, "-o", "x"])) == (0.005, 0.02, 0.1)
    a = p.parse_args([*DEPLOY, "--url", "https://h/base"])
    assert a.url == "https://h/base"


def test_varying_trace_still_writes(tmp_path, capsys):
    out = tmp_path / "v.trace"
    argv = ["trace", "varying", "--segment", "10,1,2", "--segment", "20,1,2", "-o", str(out)]
    assert main([*argv, "--transition-s", "0.5"]) == 0
    assert out.read_text().count("\n") > 10


def _one_query_result():
    from inferline.measure import ReplayResult

    return ReplayResult(
        scheduled_s=np.array([0.0]),
        sent_s=np.array([0.0]),
        done_s=np.array([0.004]),
        status=np.array([200]),
        default=np.array([False]),
    )


def test_replay_of_one_query_says_why_there_is_no_rate(capsys):
    from inferline.measure import print_replay

    print_replay(_one_query_result().summary())
    out = capsys.readouterr().out
    assert "n/a (the trace spans 0 s)" in out
    assert "nan" not in out.lower()
    assert "4.00 ms" in out  # the latency is still shown


def test_replay_writes_strict_json_for_one_query(tmp_path, monkeypatch, capsys):
    """NaN is not JSON: a one-query replay's ``-o`` file has null for the rate."""
    import inferline.cli.replay as cli_replay
    import inferline.measure as replay_mod

    trace = tmp_path / "one.trace"
    trace.write_text("0.0\n")
    inputs = tmp_path / "in.json"
    inputs.write_text("[1]")
    out = tmp_path / "r.json"
    monkeypatch.setattr(replay_mod, "replay", lambda *a, **kw: None)
    monkeypatch.setattr(cli_replay, "run_loop", lambda _coro: _one_query_result())
    argv = ["replay", str(trace), "--url", "http://x", "--app", "a", "--inputs", str(inputs)]
    assert main([*argv, "-o", str(out)]) == 0
    capsys.readouterr()

    def no_nan(name: str) -> float:
        raise AssertionError(f"{name} in the JSON")

    doc = json.loads(out.read_text(), parse_constant=no_nan)
    assert doc["summary"]["offered_qps"] is None
    assert math.isclose(doc["summary"]["p50_ms"], 4.0)


def test_serve_help_states_that_the_tuner_is_on_by_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default inferline: on" in text


def test_the_shared_types_name_the_range():
    import argparse

    from inferline.cli._args import count, int_in, output_path, port

    assert count("1e3") == 1000 and port("0") == 0
    for parse, text, msg in [
        (count, "0", "expected a count >= 1, got '0'"),
        (port, "65536", "expected a port in [0, 65535], got '65536'"),
        (int_in(-1, 9, "a port (-1: none)"), "x", "expected a port (-1: none) in [-1, 9], got 'x'"),
        (output_path({"png"}), "x.jpg", "expected a file ending in one of .png, got 'x.jpg'"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(msg)):
            parse(text)


def test_outputs_in_the_current_folder_are_fine(tmp_path, monkeypatch):
    from inferline.cli._args import output_path

    monkeypatch.chdir(tmp_path)
    assert output_path()("plan.json") == "plan.json"
    Path("sub").mkdir()
    assert output_path()("sub/plan.json") == "sub/plan.json"


def test_attach_to_a_tf_serving_url_without_models_says_to_name_them(capsys):
    """TF Serving cannot list its models: without --models nothing was attached, and the
    command printed an empty table and exited 0 (nothing listens on port 1 here either)."""
    assert main(["attach", "tfserving://127.0.0.1:1", "--no-profile"]) == 2
    err = capsys.readouterr().err
    assert "models: expected the models to attach (--models M1,M2)" in err, err
    assert "cannot list its models" in err and "Traceback" not in err


def test_calibrate_names_an_unreachable_server(tmp_path, capsys):
    """A refused connection is one line naming --url, after the files were read."""
    from inferline.core import BatchProfile, ModelConfig, Plan, Profiles, save

    prof, plan = tmp_path / "p.json", tmp_path / "q.json"
    save(Profiles({"m": {"cpu": {1: BatchProfile(0.001)}}}), prof)
    save(Plan("x", 0.1, {"m": ModelConfig("cpu", 1, 1)}), plan)
    argv = ["calibrate", "--profiles", str(prof), "--plan", str(plan), "-o", str(tmp_path / "o")]
    assert main([*argv, "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "--url: expected a reachable inferline server" in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()
