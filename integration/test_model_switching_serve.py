"""Model-Switching through a real ``inferline serve --switching model-switching``: two digits
classifiers trained in their replica processes (an RBF SVM made expensive by 30 ms per batch,
and naive Bayes), their accuracy measured by the server on held-out images at start (declared 0.5
each). A rate step moves the app to the cheap variant; the table is rebuilt from live timings.
Queries are held-out images on which the two models disagree, so each answer says which real
model produced it."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks._digits

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data, fit_classifier
from inferline.core import Profiles
from inferline.measure import ServerProcess, encode_bodies, replay

pytestmark = pytest.mark.integration

SLO_MS = 150.0


def _files(tmp_path, acc, held_x, held_y):
    np.savez(tmp_path / "held_out.npz", x=held_x.astype(np.float32), y=held_y)
    dep = {
        "format": "inferline.deployment/1",
        "name": "switching-it",
        "backend": "local://?oversubscribe=1",
        "models": [
            {"name": "big", "source": SRC, "params": {"kind": "svc", "delay_s": 0.03}},
            {"name": "small", "source": SRC, "params": {"kind": "nb"}},
        ],
        "apps": {
            "digits": {
                "pipeline": "inferline.demo.simple:passthrough",
                "pipeline_params": {"model": "big"},
                "slo_ms": SLO_MS,
                "input": {"dtype": "float32", "shape": [64]},
            }
        },
    }
    # big: what its container costs per query here (sleep + model + RPC); small: 1 ms, half its
    # cost or less (2-2.5 ms measured), so the live table must correct it (a rebuild the test can
    # count on). Not lower: the table's rate grid starts at 1/50 of the fastest option's
    # capacity, and a grid starting above big's capacity would start on small.
    prof = Profiles.from_latencies({"big": {"cpu": {1: 0.036}}, "small": {"cpu": {1: 0.001}}})
    sw = {
        "format": "inferline.switching/1",
        "app": "digits",
        "stage": "big",
        "variants": [{"name": v, "accuracy": a} for v, a in acc.items()],
        "profiles": "profiles.json",
        "core_budget": 1,
        "rate_window": 16,
        "interval_s": 0.1,
        "min_dwell_s": 0.5,
        "sim_queries": 600,
        "held_out": "held_out.npz",
        "rebuild_s": 1.0,
    }
    (tmp_path / "profiles.json").write_text(json.dumps(prof.to_dict()))
    (tmp_path / "dep.json").write_text(json.dumps(dep))
    (tmp_path / "switching.json").write_text(json.dumps(sw))
    return tmp_path / "dep.json", tmp_path / "switching.json"


# time (~17 s): real classifiers trained in the replica processes, then a rate step replayed
# long enough for the switching controller to switch and be measured on both sides.
def test_rate_step_switches_to_the_cheap_real_model(tmp_path):
    _, _, xte, yte = digits_data()
    # the same fits as in the replica processes (same seed, same split)
    models = {"big": fit_classifier("svc"), "small": fit_classifier("nb")}
    pred = {k: m.predict(xte / 16.0) for k, m in models.items()}
    acc = {k: round(float(np.mean(p == yte)), 4) for k, p in pred.items()}
    assert acc["big"] > acc["small"] + 0.05
    differ = np.flatnonzero(pred["big"] != pred["small"])
    assert differ.size >= 20
    held = slice(0, 60)  # the declared accuracy is 0.5: the measured one must replace it
    dep, sw = _files(tmp_path, {"big": 0.5, "small": 0.5}, xte[held], yte[held])

    rng = np.random.default_rng(0)
    calm = np.cumsum(rng.exponential(1 / 4.0, 12))  # ~3 s at 4 q/s
    spike = calm[-1] + np.cumsum(rng.exponential(1 / 120.0, 480))  # ~4 s at 120 q/s
    times = np.concatenate([calm, spike])
    idx = differ[np.arange(times.size) % differ.size]
    labels = np.full(times.size, -1)

    def got(i: int, status: int, body: bytes) -> None:
        if status == 200:
            out = json.loads(body)
            out = out.get("output") if isinstance(out, dict) else out
            labels[i] = int(out[0] if isinstance(out, list) else out)

    log = tmp_path / "serve.log"
    args = ["--switching", "model-switching", "--switching-config", str(sw)]
    with ServerProcess(dep, extra_args=args, log_path=log) as srv:
        res = asyncio.run(
            replay(times, srv.url, "digits", encode_bodies(list(xte[idx])), on_answer=got)
        )
        import httpx

        metrics = httpx.get(f"{srv.url}/metrics", timeout=10).text
        table = httpx.get(f"{srv.url}/admin/switching", timeout=10).json()
    text = log.read_text()
    assert res.ok.mean() > 0.95, res.summary()
    # every answer is one of the two real models' predictions for its image
    answered = labels >= 0
    is_big = labels == pred["big"][idx]
    is_small = labels == pred["small"][idx]
    assert np.all(is_big[answered] | is_small[answered])
    # calm: the accurate model serves; late in the spike: the cheap one
    first = slice(0, calm.size)
    late = times >= spike[0] + 2.0
    assert is_big[first][answered[first]].mean() >= 0.9, labels[first]
    assert is_small[late & answered].mean() >= 0.8, text[-2000:]
    assert re.search(
        r"model switching: SwitchOption\(variant='big'.*-> SwitchOption\(variant='small'", text
    )
    # the variants share the stage's one queue (the default): the variant is chosen per batch
    assert "(stage 'big', one shared queue)" in text, text[:3000]
    assert re.search(r'inferline_switching_switches_total\{app="digits"\} [1-9]', metrics), metrics
    # one variant active (after the replay the lull may already have brought "big" back)
    active = re.findall(r'inferline_switching_active\{app="digits",variant="\w+"\} (\S+)', metrics)
    assert sorted(float(a) for a in active) == [0.0, 1.0], metrics
    # accuracy measured through the server on the held-out images, as the fits predict it
    for k, p in pred.items():
        a = table["accuracy"][k]
        assert a["value"] == pytest.approx(np.mean(p[held] == yte[held])), a
        assert a["source"] == "measured on 60 held-out queries"
    # the table was rebuilt from the live timings: small's profile was under half its cost
    assert table["built"]["source"] == "live", table["rebuilds"]
    assert table["rebuilds"][0]["source"] == "startup"
    assert table["built"]["factors"]["small"] > 1.1, table["built"]
    assert re.search(r"switching table rebuilt from live timings: .*small service", text)
