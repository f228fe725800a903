"""A served ensemble with a straggler, through ``inferline serve`` (its own process, uvloop) and
the open-loop replay client over real sockets.

The app has a ``selection`` block over two models of the bundled runtime: ``fast`` answers at
once, ``slow`` is a Sleep replica busy for 1 s per batch (ten times the 100 ms SLO), so it
never answers in time and every query is combined from what arrived by the combine time.
The selection app combines at arrival + SLO minus its combine/return allowance, so that the
answer (combined, encoded, sent) reaches the client within the SLO: P99 over 120 queries at
40 q/s must stay within the SLO, and every answer is a prediction or a default with an
explanation.

Catches: combining at arrival + SLO with no margin (the issue measured 35 of 80 answers over
a 100 ms SLO, P99 103.7 ms; here, on a 2-core machine, 120 of 120 over, P50 102.5 ms, P99
105 ms); only the fixed 5 ms allowance without the measured part (P99 101.7 ms, 4 over);
a selection app that waits for the straggler (answers at ~1 s). With the default allowance:
P50 93-95 ms, P99 96.0-98.9 ms, none over (7 ms fixed since 5 ms put 2-3 of 120 over by
0.3-0.6 ms in 1 of 3 runs on a busier day). ``INFERLINE_TEST_COMBINE_MARGIN_MS`` sets another
fixed allowance, for measuring.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import numpy as np
import pytest

from inferline.measure import ServerProcess, encode_bodies, replay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SLO_MS = 100.0
N, RATE = 120, 40.0
EX = "inferline.adapters.local.examples"
INPUTS = [[1.0, 5.0, 2.0], [3.0, 0.5, 0.25], [0.0, 0.0, 9.0]]
LABELS = [1, 0, 2]  # what ``fast`` (2 * input) votes for: the argmax


def _deployment(selection_extra: dict) -> dict:
    return {
        "format": "inferline.deployment/1",
        "name": "straggler-vote",
        "backend": "local://?oversubscribe=1",
        "models": [
            {"name": "fast", "source": f"{EX}:scale", "params": {"factor": 2.0}},
            {"name": "slow", "source": f"{EX}:sleep", "params": {"base_s": 1.0}},
        ],
        "apps": {
            "vote": {
                "slo_ms": SLO_MS,
                "default_output": -1,
                "input": {"dtype": "float32", "shape": [3]},
                "selection": {
                    "policy": "exp4",
                    "models": ["fast", "slow"],
                    "confidence_threshold": 0.0,
                    **selection_extra,
                },
            }
        },
        "queue": {"max_queue": 10_000, "expire_late": False, "max_retries": 1},
    }


def _serve_and_replay(tmp_path, selection_extra: dict):
    tmp_path.mkdir(parents=True, exist_ok=True)
    dp = tmp_path / "deployment.json"
    dp.write_text(json.dumps(_deployment(selection_extra)))
    bodies = encode_bodies(INPUTS)
    answers: dict[int, tuple[int, bytes]] = {}

    def on_answer(i: int, status: int, body: bytes) -> None:
        answers[i] = (status, body)

    with ServerProcess(dp, log_path=tmp_path / "server.log") as srv:
        # warm-up: the first queries pay one-off costs (imports, connections)
        asyncio.run(replay(np.arange(10) / 20.0, srv.url, "vote", bodies, slo_s=SLO_MS / 1e3))
        arrivals = np.arange(N) / RATE
        res = asyncio.run(
            replay(arrivals, srv.url, "vote", bodies, slo_s=SLO_MS / 1e3, on_answer=on_answer)
        )
    return res, answers


def test_ensemble_with_a_straggler_answers_within_the_slo(tmp_path) -> None:
    extra: dict = {}
    if "INFERLINE_TEST_COMBINE_MARGIN_MS" in os.environ:  # for measuring other margins
        extra["combine_margin_ms"] = float(os.environ["INFERLINE_TEST_COMBINE_MARGIN_MS"])
    # The rules are checked on every run; the P99 bound gets up to three runs: in a suite run
    # beside other engineers' benchmarks (load average ~4 on 2 cores) 4 of 120 came 0.4-8 ms
    # late once. All three runs over the SLO is a failure.
    for attempt in range(3):
        res, answers = _serve_and_replay(tmp_path / f"run{attempt}", extra)
        p99, over = _check_answers(res, answers)
        if p99 <= SLO_MS:
            return
        assert attempt < 2, f"P99 {p99:.1f} ms over the {SLO_MS:.0f} ms SLO ({over} over)"


def _check_answers(res: Any, answers: dict[int, tuple[int, bytes]]) -> tuple[float, int]:
    """Every query answered with a prediction combined from ``fast`` alone, or the default
    with an explanation; the P99 in ms and how many were over the SLO."""
    lat = res.latency_s * 1e3
    over = int((lat > SLO_MS).sum())
    p99 = float(np.percentile(lat, 99))
    print(
        f"\nensemble: {res.n} queries, P50 {np.percentile(lat, 50):.1f} ms, P99 {p99:.1f} ms, "
        f"max {lat.max():.1f} ms, {over} over the {SLO_MS:.0f} ms SLO; "
        f"send lag max {res.send_lag_s.max() * 1e3:.1f} ms"
    )
    for i in np.flatnonzero(lat > SLO_MS):
        print(f"  query {i}: {lat[i]:.1f} ms, send lag {res.send_lag_s[i] * 1e3:.1f} ms")
    assert res.status_counts() == {"200": N}, res.status_counts()
    assert len(answers) == N
    for i, (_status, body) in answers.items():
        d = json.loads(body)
        out = d["output"]
        # a prediction combined from the fast model alone (the straggler never contributes),
        # or the default output with an explanation: never a silent gap
        if d["default"]:
            assert d.get("default_explanation"), d
        else:
            assert out["models_selected"] == 2 and out["models_contributed"] == 1, (i, out)
            assert out["output"] == LABELS[i % len(LABELS)], (i, out)  # argmax of 2 * input
            assert out["confidence"] == pytest.approx(0.5)
    return p99, over
