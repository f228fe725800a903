"""``benchmarks/triton_overhead.py``: its options, its sustained-point rule and its headline.

The benchmark itself (a real Triton, perf_analyzer and an ``inferline attach`` process) runs
minutes; these checks cover the parts that decide what it reports.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import triton_overhead as bench
from benchmarks._triton_pa import Point, cpu_seconds, group_pids


def _point(side: str, rate: float, thr: float, p99: float, error: str | None = None) -> Point:
    return Point(side, "http", rate, thr, 1.0, p99, int(thr * 6), None, 0.5, error)


def test_options() -> None:
    a = bench.parse_args(["--quick"])
    assert a.protocols == ("http", "grpc") and a.window_ms == 1000 and a.stop_after == 2
    assert a.rates[0] == 100.0 and a.door_max_batch == a.max_batch == 32
    b = bench.parse_args(["--protocols", "grpc", "--rates", "10,20", "--door-max-batch", "8"])
    assert b.protocols == ("grpc",) and b.rates == (10.0, 20.0) and b.door_max_batch == 8
    with pytest.raises(SystemExit):
        bench.parse_args(["--protocols", "udp"])


def test_a_point_is_sustained_only_within_target_rate_and_without_error() -> None:
    assert _point("triton", 100, 94, 40).meets(50)
    assert not _point("triton", 100, 94, 60).meets(50)  # P99 over target
    assert not _point("triton", 100, 80, 10).meets(50)  # a fifth of the load not answered
    assert not _point("triton", 100, 94, 10, "perf_analyzer exit 1").meets(50)
    p = _point("inferline", 100, 94, 40)
    assert Point.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_headline_takes_the_best_sustained_point_and_flags_unsaturated_sides(capsys) -> None:
    args = bench.parse_args(["--protocols", "http", "--rates", "100,200,400"])
    points = [
        _point("triton", 100, 95, 5),
        _point("inferline", 100, 95, 30),
        _point("triton", 200, 190, 6),
        _point("inferline", 200, 185, 90),  # over target
        _point("triton", 400, 380, 7),
    ]
    out = bench.report(args, points, {})["headline"]["http"]
    assert out["triton"]["rate"] == 400 and out["inferline"]["rate"] == 100
    assert out["ratio"] == pytest.approx(95 / 380) and out["target_met"] is False
    assert out["unsaturated"] == ["triton"]
    assert "NOT met" in capsys.readouterr().out


def test_cpu_accounting_reads_this_process() -> None:
    assert os.getpid() in group_pids(os.getpgid(0))
    before, t0 = cpu_seconds([os.getpid()]), time.process_time()
    while time.process_time() - t0 < 0.1:  # spend ten clock ticks of CPU
        sum(i * i for i in range(10_000))
    assert cpu_seconds([os.getpid()]) >= before + 0.05
