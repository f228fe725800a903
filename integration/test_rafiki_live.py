"""Rafiki's actor-critic ensemble selector served live: ``"policy": "rafiki"`` in a deployment,
through ``inferline serve`` (its own process) and the open-loop replay client.

Three digits classifiers trained at start (``benchmarks/rafiki_live.py``'s ensemble: models
that also sleep per batch so that two cores can overload all of them); the policy is
pretrained in Rafiki's simulator from the declared profile when the server starts. A low rate
(4 q/s, all models affordable) then a high one (60 q/s, above what all models on every query
can serve, within what one model per query can): every query must be answered with a
prediction (not the default) and ``GET /apps/vote/selection`` must show the policy's live
status, and the mean models per query under the high rate must be clearly below the low
rate's (at least 1.8 at low, 0.5 fewer at high). The agent is pretrained for 250 updates at
server start (about 40 s here); with 60 it had not yet adapted (one model at both rates).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np
import pytest

from benchmarks import rafiki_live as bench
from inferline.measure import ServerProcess, encode_bodies, replay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LOW, HIGH = (4.0, 12.0), (60.0, 10.0)  # (rate q/s, seconds)


# time (~40 s): 250 pretraining updates, then two live phases (12 s at 4 q/s, 10 s at 60 q/s):
# shorter phases leave too few queries to tell the two rates' subset sizes apart.
def test_rafiki_uses_fewer_models_under_a_high_rate(tmp_path) -> None:
    args = argparse.Namespace(
        slo_ms=500.0, beta=1.0, r_ref=40.0, train_updates=250, seed=0, quick=True
    )
    acc, xte, _ = bench.subset_accuracy(0)
    dp, pp = tmp_path / "dep.json", tmp_path / "plan.json"
    dp.write_text(json.dumps(bench.deployment("rafiki", args, acc)))
    pp.write_text(json.dumps(bench.plan()))
    t_low = np.arange(0, LOW[1], 1 / LOW[0])
    t_high = LOW[1] + np.arange(0, HIGH[1], 1 / HIGH[0])
    times = np.concatenate([t_low, t_high])
    sel = np.zeros(times.size, int)
    outs: dict[int, dict] = {}

    def got(i: int, status: int, body: bytes) -> None:
        if status == 200:
            outs[i] = json.loads(body)
            sel[i] = int(outs[i]["output"]["models_selected"])

    bodies = encode_bodies([xte[i % len(xte)] for i in range(times.size)])
    with ServerProcess(dp, pp, log_path=tmp_path / "server.log", start_timeout_s=240) as srv:
        asyncio.run(replay(np.arange(10) / 5.0, srv.url, "vote", bodies[:10], slo_s=0.5))
        res = asyncio.run(replay(times, srv.url, "vote", bodies, slo_s=0.5, on_answer=got))
        import urllib.request

        with urllib.request.urlopen(srv.url + "/apps/vote/selection", timeout=10) as r:
            status = json.loads(r.read())
    assert res.status_counts() == {"200": times.size}, res.status_counts()
    defaults = [i for i, d in outs.items() if d["default"] or d["output"]["default"]]
    assert not defaults, f"{len(defaults)} default answers, e.g. {outs[defaults[0]]}"
    assert all(0 <= d["output"]["output"] <= 9 for d in outs.values())
    low = sel[: t_low.size].mean()
    # the first seconds of the high phase still see the low phase's empty queues
    high = sel[t_low.size + int(HIGH[0] * 2) :].mean()
    print(f"\nrafiki live: models per query {low:.2f} at {LOW[0]:g} q/s, {high:.2f} at {HIGH[0]:g}")
    print(f"status: {status['status']}")
    assert status["policy"] == "rafiki" and status["status"]["decisions"] >= times.size
    assert set(sel.tolist()) <= {1, 2, 3}, sorted(set(sel.tolist()))
    # measured: 3.00 at 4 q/s, 1.00 at 60 q/s (250 updates; 60 updates gave 1.00 and 1.00)
    assert low >= 1.8, f"{low:.2f} models per query at {LOW[0]:g} q/s"
    assert high <= low - 0.5, (low, high)
