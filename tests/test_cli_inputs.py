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
REPLAY = ["replay", "t", "--url", "http://127.0.0.1:1", "--app", "a"]
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
    ],
)
def test_nonsensical_numbers_are_refused_at_parse_time(argv, flag, bad, capsys):
    line = _refused([*argv, f"{flag}={bad}"], capsys)
    assert f"argument {flag}: expected" in line and repr(bad) in line, line


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


def test_varying_trace_still_writes(tmp_path, capsys):
    out = tmp_path / "v.trace"
    argv = ["trace", "varying", "--segment", "10,1,2", "--segment", "20,1,2", "-o", str(out)]
    assert main([*argv, "--transition-s", "0.5"]) == 0
    assert out.read_text().count("\n") > 10


def _one_query_result():
    from inferline._replay import ReplayResult

    return ReplayResult(
        scheduled_s=np.array([0.0]),
        sent_s=np.array([0.0]),
        done_s=np.array([0.004]),
        status=np.array([200]),
        default=np.array([False]),
    )


def test_replay_of_one_query_says_why_there_is_no_rate(capsys):
    from inferline._cli_serve import print_replay

    print_replay(_one_query_result().summary())
    out = capsys.readouterr().out
    assert "n/a (the trace spans 0 s)" in out
    assert "nan" not in out.lower()
    assert "4.00 ms" in out  # the latency is still shown


def test_replay_writes_strict_json_for_one_query(tmp_path, monkeypatch, capsys):
    """NaN is not JSON: a one-query replay's ``-o`` file has null for the rate."""
    import inferline._cli_serve as cli_serve
    import inferline._replay as replay_mod

    trace = tmp_path / "one.trace"
    trace.write_text("0.0\n")
    inputs = tmp_path / "in.json"
    inputs.write_text("[1]")
    out = tmp_path / "r.json"
    monkeypatch.setattr(replay_mod, "replay", lambda *a, **kw: None)
    monkeypatch.setattr(cli_serve, "run", lambda _coro: _one_query_result())
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

    from inferline._cli_args import count, int_in, output_path, port

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
    from inferline._cli_args import output_path

    monkeypatch.chdir(tmp_path)
    assert output_path()("plan.json") == "plan.json"
    Path("sub").mkdir()
    assert output_path()("sub/plan.json") == "sub/plan.json"
